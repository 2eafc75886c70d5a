"""Pipeline stages, one module each: preprocess, cost, aggregate, select, refine.

Each module holds
  * the per-pixel arithmetic as small plain functions decorated with `shared`:
    compiled with numba.njit for the CPU drivers, and again with
    numba.cuda.jit(device=True) by `stereocli.backends.cuda` (from `.py_func`),
    so the two backends run the same arithmetic;
  * the CPU drivers (`@njit(parallel=True, cache=CACHE)` loops over rows/columns;
    CACHE is False when the user's kernel cache folder cannot be written, see
    `stereocli.cache`).
A shared function may call other shared functions: the CUDA backend compiles its
source again with those calls pointing to their device twins.
"""
import numba

from ..cache import ENABLED as CACHE

SHARED = []


def shared(fn):
    """Compile `fn` for the CPU (inlined) and register it for the CUDA backend."""
    cpu = numba.njit(inline="always", cache=CACHE)(fn)
    SHARED.append(cpu)
    return cpu
