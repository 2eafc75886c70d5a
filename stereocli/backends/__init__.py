"""Backends: what differs between the CPU and the GPU (arrays, launches, transfers).

A backend exposes the same operations (one per stage step), declared once in
`protocol.Backend`; the pipeline calls them and never asks which device it runs on.
CPU: `cpu.py` over the drivers in `stereocli/stages/`; GPU: `cuda/` (one kernel
module per stage, named like the stages).
"""
from __future__ import annotations

import atexit
import os
import sys
import threading

from ..errors import StereoError

# Device nodes of an NVIDIA driver on Linux (/dev/dxg: a GPU shared into WSL2).
_NVIDIA_NODES = ("/dev/nvidiactl", "/dev/nvidia0", "/dev/dxg")


def _surely_no_gpu() -> bool:
    """A Linux machine with no NVIDIA device node has no usable GPU: say so without
    importing numba.cuda and probing the driver (about 0.3 s of every CPU run)."""
    return (sys.platform.startswith("linux") and os.environ.get("NUMBA_ENABLE_CUDASIM", "0") == "0"
            and not any(os.path.exists(p) for p in _NVIDIA_NODES))


def gpu_likely(device: str) -> bool:
    """Whether get_backend(device) will likely give the CUDA backend, told without
    probing the driver: 'cuda', or 'auto' where a GPU may be (and not the simulator)."""
    if device == "cuda":
        return True
    return device == "auto" and os.environ.get("NUMBA_ENABLE_CUDASIM", "0") == "0" and not _surely_no_gpu()


def cuda_status() -> tuple[bool, str]:
    """(usable, reason): whether the CUDA backend can run here, and why not."""
    if _surely_no_gpu():
        return False, "no NVIDIA GPU or driver was found (no /dev/nvidia* device)"
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
        if _CUDA and (device == "cuda" or not _simulator()):  # (made once: no driver probe per call)
            return _CUDA[0]
        if not _surely_no_gpu():
            _prepare_cuda_compiler()
        ok, why = cuda_status()
        if ok and device == "auto" and _simulator():
            ok, why = False, "NUMBA_ENABLE_CUDASIM=1 (the CUDA simulator is for tests; ask for it with --device cuda)"
        if ok:
            return _cuda_backend()
        if device == "cuda":
            raise StereoError(f"--device cuda: {why}; use --device cpu or auto")
        if warn is not None:
            warn(f"using the CPU: {why}")
    return _cpu_backend()


_PREPARING = []


def _prepare_cuda_compiler() -> None:
    """Load numba-cuda's typing and lowering registries in a thread, once per process.

    The first kernel call does it otherwise, even when every kernel comes from the
    cache: about 1.3 s of Python imports on the H100 machine's host (half of it SciPy,
    which numba-cuda imports where it is installed). Started by get_backend before it
    probes the driver, it overlaps the driver's start-up and the creation of the GPU
    context (C calls that release the GIL). It holds the compiler lock, so a kernel
    call waits for it instead of racing it."""
    if _PREPARING or _simulator():
        return
    try:  # imported here, not in the thread: two threads importing one package can deadlock
        from numba.cuda.core.compiler_lock import global_compiler_lock
        from numba.cuda.descriptor import cuda_target
    except Exception:  # noqa: BLE001 - not importable, or another layout: the first kernel call does it
        return

    def work():
        try:
            with global_compiler_lock:
                cuda_target.typing_context.refresh()
                cuda_target.target_context.refresh()
        except Exception:  # noqa: BLE001 - the first kernel call does it again and reports what fails
            pass

    t = threading.Thread(target=work, name="stereo-cuda-prepare", daemon=True)
    _PREPARING.append(t)
    t.start()
    atexit.register(t.join)  # never end the process in the middle of its imports


_CUDA = []
_CPU = []
_CPU_LOCK = threading.Lock()


def _cpu_backend():
    """One CPU backend per process, as for CUDA: it keeps the volumes a match is done
    with for the next match of their size (CpuBackend.recycle), which a new backend per
    call threw away, so that every stereocli.match call (and every command a background
    worker serves) made its volumes afresh and touched their pages in for the first time.
    H100 machine's host, 16 threads, stereocli.match against pipeline.run on one kept
    backend in the same process, best of 4, two rounds: cones@1482x1000/128 95.0 / 99.4
    against 80.7 / 80.2 ms before, 80.5 / 89.2 against 79.3 / 84.6 after;
    cones@741x500/64 17.2 / 17.0 against 16.0 / 15.5 before (2-core machine: 74 against
    51). Teddy's volumes are under the sizes kept, so it did not change."""
    with _CPU_LOCK:
        if not _CPU:
            from .cpu import CpuBackend
            _CPU.append(CpuBackend())
        return _CPU[0]


def _cuda_backend():
    """One CUDA backend per process: its stream and its cached line tables are reused."""
    if not _CUDA:
        from .cuda import CudaBackend
        _CUDA.append(CudaBackend())
    return _CUDA[0]


def _simulator() -> bool:
    from numba import config
    return bool(config.ENABLE_CUDASIM)

