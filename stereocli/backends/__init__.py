"""Backends: what differs between the CPU and the GPU (arrays, launches, transfers).

A backend exposes the same operations (one per stage step); the pipeline calls
them and never asks which device it runs on.
"""
from __future__ import annotations

from ..errors import StereoError


def cuda_status() -> tuple[bool, str]:
    """(usable, reason): whether the CUDA backend can run here, and why not."""
    try:
        from numba import cuda
    except Exception as e:  # pragma: no cover - depends on the install
        return False, f"numba-cuda is not importable ({e}); install it with: pip install 'stereocli[cuda]'"
    try:
        if not cuda.is_available():
            return False, "no usable CUDA GPU or driver was found"
    except Exception as e:  # pragma: no cover
        return False, f"CUDA is not usable: {e}"
    return True, "ok"


def get_backend(device: str = "auto", warn=None):
    """Backend for 'cpu', 'cuda' or 'auto' (CUDA when usable, else CPU; `warn` hears why)."""
    if device not in ("auto", "cpu", "cuda"):
        raise StereoError(f"--device must be auto, cpu or cuda, not {device!r}")
    if device in ("auto", "cuda"):
        ok, why = cuda_status()
        if ok and device == "auto" and _simulator():
            ok, why = False, "NUMBA_ENABLE_CUDASIM=1 (the CUDA simulator is for tests; ask for it with --device cuda)"
        if ok:
            return _cuda_backend()
        if device == "cuda":
            raise StereoError(f"--device cuda: {why}; use --device cpu or auto")
        if warn is not None:
            warn(f"using the CPU: {why}")
    from .cpu import CpuBackend
    return CpuBackend()


_CUDA = []


def _cuda_backend():
    """One CUDA backend per process: its stream and its cached line tables are reused."""
    if not _CUDA:
        from .cuda import CudaBackend
        _CUDA.append(CudaBackend())
    return _CUDA[0]


def _simulator() -> bool:
    from numba import config
    return bool(config.ENABLE_CUDASIM)

