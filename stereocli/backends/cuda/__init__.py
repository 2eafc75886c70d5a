"""The CUDA backend (`backend.py`) and its kernels, one module per stage named like
`stereocli/stages/`: preprocess, cost, aggregate (SGM), select, refine; `common.py`
holds what they share (device twins of the stages' shared functions, warp exchange,
launch constants). Needs numba-cuda (or Numba's CUDA simulator)."""
from .backend import CudaBackend, PathVolumes, gpu_summary

__all__ = ["CudaBackend", "PathVolumes", "gpu_summary"]
