"""Disparity selection: winner-takes-all with a uniqueness test and parabola subpixel fit.

Works on any aggregated volume S[y, x, d] (uint16 from SGM or uint8 from block
matching). Only the disparities whose right pixel lies inside the image compete.
"""
import math

import numpy as np
from numba import njit, prange

from . import CACHE, shared


@shared
def wta_range(w, n, x, min_d):
    """The disparity indices lo..hi whose right pixel x - min_d - d lies in the image."""
    return max(0, x - (w - 1) - min_d), min(n - 1, x - min_d)


@shared
def wta_finish(best, bc, other, c0, c2, lo, hi, min_d, uniqueness, subpixel):
    """The disparity from the reductions over d: `best` the first index of the smallest
    cost `bc`, `other` the smallest cost more than one disparity away from it, c0 and c2
    the costs at best - 1 and best + 1 (read only when lo < best < hi). NaN when the
    best cost does not win by `uniqueness` percent; parabola subpixel fit."""
    if uniqueness > 0.0:
        if np.float32(other) * (np.float32(100.0) - uniqueness) < np.float32(bc) * np.float32(100.0):
            return np.float32(math.nan)
    disp = np.float32(best + min_d)
    if subpixel and best > lo and best < hi:
        den = c0 + c2 - 2 * bc
        if den > 0:
            disp += np.float32(c0 - c2) / np.float32(2 * den)
    return disp


@shared
def wta_at(S, y, x, min_d, uniqueness, subpixel):
    """Disparity of the left pixel (x, y), NaN when no disparity is possible or
    the best cost does not win by `uniqueness` percent over every cost more than
    one disparity away. (The GPU reduces over d with a warp, then shares wta_finish.)"""
    lo, hi = wta_range(S.shape[1], S.shape[2], x, min_d)
    if hi < lo:
        return np.float32(math.nan)
    bc = np.int32(S[y, x, lo])
    for d in range(lo + 1, hi + 1):  # minimum first (vectorises), then its first index
        bc = min(bc, np.int32(S[y, x, d]))
    best = lo
    while np.int32(S[y, x, best]) != bc:
        best += 1
    other = np.int32(0x7FFFFFFF)
    if uniqueness > 0.0:
        for d in range(lo, best - 1):
            other = min(other, np.int32(S[y, x, d]))
        for d in range(best + 2, hi + 1):
            other = min(other, np.int32(S[y, x, d]))
    c0 = np.int32(S[y, x, best - 1]) if best > lo else np.int32(0)
    c2 = np.int32(S[y, x, best + 1]) if best < hi else np.int32(0)
    return wta_finish(best, bc, other, c0, c2, lo, hi, min_d, uniqueness, subpixel)


@shared
def wta_right_at(S, y, xr, min_d):
    """Integer disparity of the right pixel (xr, y) from the left-referenced volume:
    argmin over d of S[y, xr + min_d + d, d]; NaN when no left pixel matches."""
    w = S.shape[1]
    n = S.shape[2]
    best = -1
    bc = np.int32(0x7FFFFFFF)
    for d in range(n):
        x = xr + min_d + d
        if x >= 0 and x < w:
            c = np.int32(S[y, x, d])
            if c < bc:
                bc = c
                best = d
    if best < 0:
        return np.float32(math.nan)
    return np.float32(best + min_d)


@njit(parallel=True, cache=CACHE)
def wta_cpu(S, min_d, uniqueness, subpixel):
    h, w, _ = S.shape
    out = np.empty((h, w), np.float32)
    for y in prange(h):
        for x in range(w):
            out[y, x] = wta_at(S, y, x, min_d, uniqueness, subpixel)
    return out


@njit(parallel=True, cache=CACHE)
def wta_right_cpu(S, min_d):
    h, w, _ = S.shape
    out = np.empty((h, w), np.float32)
    for y in prange(h):
        for x in range(w):
            out[y, x] = wta_right_at(S, y, x, min_d)
    return out
