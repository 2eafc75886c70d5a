"""Disparity selection: winner-takes-all with a uniqueness test and parabola subpixel fit.

Works on any aggregated volume S[y, x, d] (uint16 from SGM or uint8 from block
matching). Only the disparities whose right pixel lies inside the image compete.
"""
import math

import numpy as np
from numba import njit, prange

from . import CACHE, shared
from .cost import inside_range


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


NO_RUNNER = 0x7FFFFFFF  # `other` when no cost lies more than one disparity from the best


@shared
def margin_confidence(bc, other):
    """Confidence in [0, 1] of a winner from its cost curve (PKRN-style): the share by
    which the runner-up `other` (the smallest cost more than one disparity from the best)
    exceeds the best cost `bc`, (other - bc) / other. 1 when there is no runner-up (a
    range of at most three disparities), 0 when both costs are 0."""
    if other == NO_RUNNER:
        return np.float32(1.0)
    if other <= 0:
        return np.float32(0.0)
    return np.float32(other - bc) / np.float32(other)


NO_KEY = np.uint32(0xFFFFFFFF)


@njit(parallel=True, cache=CACHE)
def select_cpu(S, min_d, uniqueness, subpixel, right, confidence):
    """Winner-takes-all for the left image, and with `right` for the right image, in one
    pass over S -> (left HxW float32, right HxW float32 or 0x0, confidence HxW float32
    or 0x0). The confidence (with `confidence`) is margin_confidence of each left pixel's
    winner, 0 where it has none.

    Left pixel (x, y): the first index `best` of the smallest cost among the disparities
    cost.inside_range allows, NaN when there is none or when it does not win by `uniqueness`
    percent over every cost more than one disparity away, parabola subpixel fit
    (wta_finish, shared with the GPU). Right pixel xr: the integer disparity d with the
    smallest S[y, xr + min_d + d, d], the smallest such d on ties (NaN when no left pixel
    matches it). Both minima are taken over keys cost << 16 | d, whose minimum is the
    smallest cost at its smallest d; the right keys are kept reversed, so that one left
    pixel's disparities update consecutive entries and the loops vectorise."""
    h, w, n = S.shape
    out = np.empty((h, w), np.float32)
    out_r = np.empty((h if right else 0, w if right else 0), np.float32)
    out_c = np.empty((h if confidence else 0, w if confidence else 0), np.float32)
    Sf = S.ravel()  # indexed by unsigned offsets: no view (a reference count) per pixel
    dk = np.arange(n, dtype=np.uint32)  # (the keys' disparity bits loaded as uint32: from the
    # loop's 64-bit index LLVM made the whole key loop 64-bit lanes, 8 to a vector; read only)
    di = np.arange(n, dtype=np.int32)
    for y in prange(h):
        rkeys = np.full(w, NO_KEY, np.uint32)  # rkeys[w - 1 - xr]: best key of right pixel xr
        for x in range(w):
            lo, hi = inside_range(w, n, x, min_d)
            if hi < lo:
                out[y, x] = np.float32(math.nan)
                if confidence:
                    out_c[y, x] = np.float32(0.0)
                continue
            base = np.uint64((y * w + x) * n + lo)  # Sf[base + i]: S[y, x, lo + i]
            k0 = np.uint64(w - 1 - x + min_d + lo)  # rkeys index of the right pixel of disparity lo
            key = NO_KEY
            for i in range(hi - lo + 1):
                ui = np.uint64(i)
                k = np.uint32((np.uint32(Sf[base + ui]) << np.uint32(16)) | dk[lo + i])
                key = np.uint32(min(key, k))
                rkeys[k0 + ui] = min(rkeys[k0 + ui], k)
            best = np.int32(key & np.uint32(0xFFFF))
            bc = np.int32(key >> np.uint32(16))
            other = np.int32(NO_RUNNER)
            if uniqueness > 0.0 or confidence:  # one masked loop over every d (it vectorises
                b0 = np.int32(best - lo - 1)     # whole; two loops around the best had scalar tails)
                b1 = np.int32(best - lo + 1)     # (the offsets from di, int32: see dk)
                for i in range(hi - lo + 1):
                    c = np.int32(Sf[base + np.uint64(i)])
                    other = min(other, c if di[i] < b0 or di[i] > b1 else np.int32(NO_RUNNER))
            c0 = np.int32(S[y, x, best - 1]) if best > lo else np.int32(0)
            c2 = np.int32(S[y, x, best + 1]) if best < hi else np.int32(0)
            out[y, x] = wta_finish(best, bc, other, c0, c2, lo, hi, min_d, uniqueness, subpixel)
            if confidence:
                out_c[y, x] = margin_confidence(bc, other)
        if right:
            for xr in range(w):
                key = rkeys[w - 1 - xr]
                out_r[y, xr] = np.float32(math.nan) if key == NO_KEY else \
                    np.float32(np.int32(key & np.uint32(0xFFFF)) + min_d)
    return out, out_r, out_c
