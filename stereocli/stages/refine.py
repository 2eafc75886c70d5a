"""Refinement of a float32 disparity map (NaN = invalid): left-right check,
speckle filter, filling of rejected pixels, median filter."""
import math

import numpy as np
from numba import njit, prange

from . import CACHE, shared

BACKGROUND, NEAREST = 1, 2  # fill modes: take the smaller neighbour disparity, or the closer one
FILL_MODES = {"background": BACKGROUND, "nearest": NEAREST}


@shared
def lr_check_at(disp, disp_r, y, x, max_diff):
    """NaN unless the right map, at the pixel this one matches, agrees within max_diff."""
    d = disp[y, x]
    if not d == d:
        return d
    w = disp.shape[1]
    xr = np.int32(math.floor(np.float32(x) - d + np.float32(0.5)))
    if xr < 0 or xr >= w:
        return np.float32(math.nan)
    dr = disp_r[y, xr]
    if not abs(d - dr) <= max_diff:
        return np.float32(math.nan)
    return d


@shared
def median_at(disp, y, x, r, window):
    """Median of the valid values in the (2r+1)^2 window (NaN if none); an invalid
    centre stays invalid. `window` is scratch of length (2r+1)^2."""
    c = disp[y, x]
    if not c == c:
        return c
    h, w = disp.shape
    n = 0
    for j in range(-r, r + 1):
        yy = min(max(y + j, 0), h - 1)
        for i in range(-r, r + 1):
            v = disp[yy, min(max(x + i, 0), w - 1)]
            if v == v:
                # insertion sort
                k = n
                while k > 0 and window[k - 1] > v:
                    window[k] = window[k - 1]
                    k -= 1
                window[k] = v
                n += 1
    if n % 2 == 1:
        return window[n // 2]
    return np.float32(0.5) * (window[n // 2 - 1] + window[n // 2])


@shared
def fill_row_at(disp, y, x, mode):
    """Value for an invalid pixel from the nearest valid pixels left and right on its
    row: mode BACKGROUND takes the smaller disparity, NEAREST the closer."""
    c = disp[y, x]
    if c == c:
        return c
    w = disp.shape[1]
    left = np.float32(math.nan)
    dl = 0
    for i in range(x - 1, -1, -1):
        v = disp[y, i]
        if v == v:
            left = v
            dl = x - i
            break
    right = np.float32(math.nan)
    dr = 0
    for i in range(x + 1, w):
        v = disp[y, i]
        if v == v:
            right = v
            dr = i - x
            break
    return fill_choice(left, dl, right, dr, mode)


@shared
def fill_choice(left, dl, right, dr, mode):
    """The fill value from the nearest valid pixels on the left and on the right of an
    invalid one (value or NaN if none, distance): BACKGROUND takes the smaller
    disparity, NEAREST the closer (the left on a tie)."""
    if not left == left:
        return right
    if not right == right:
        return left
    if mode == BACKGROUND:
        return min(left, right)
    return left if dl <= dr else right


@njit(parallel=True, cache=CACHE)
def lr_check_cpu(disp, disp_r, max_diff):
    h, w = disp.shape
    out = np.empty_like(disp)
    for y in prange(h):
        for x in range(w):
            out[y, x] = lr_check_at(disp, disp_r, y, x, max_diff)
    return out


@shared
def keep_confidence_at(conf, disp, y, x):
    """The confidence of a pixel whose disparity survived, 0 for a rejected one."""
    return conf[y, x] if disp[y, x] == disp[y, x] else np.float32(0.0)


@njit(parallel=True, cache=CACHE)
def keep_confidence_cpu(conf, disp):
    h, w = disp.shape
    out = np.empty((h, w), np.float32)
    for y in prange(h):
        for x in range(w):
            out[y, x] = keep_confidence_at(conf, disp, y, x)
    return out


@njit(cache=CACHE, inline="always")
def _sort2(a, b):
    return min(a, b), max(a, b)


@njit(cache=CACHE, inline="always")
def _median9(p0, p1, p2, p3, p4, p5, p6, p7, p8):
    """The 5th smallest of nine numbers (no NaN): a 19-exchange network (Paeth), the
    same value median_at's sort picks."""
    p1, p2 = _sort2(p1, p2)
    p4, p5 = _sort2(p4, p5)
    p7, p8 = _sort2(p7, p8)
    p0, p1 = _sort2(p0, p1)
    p3, p4 = _sort2(p3, p4)
    p6, p7 = _sort2(p6, p7)
    p1, p2 = _sort2(p1, p2)
    p4, p5 = _sort2(p4, p5)
    p7, p8 = _sort2(p7, p8)
    p0, p3 = _sort2(p0, p3)
    p5, p8 = _sort2(p5, p8)
    p4, p7 = _sort2(p4, p7)
    p3, p6 = _sort2(p3, p6)
    p1, p4 = _sort2(p1, p4)
    p2, p5 = _sort2(p2, p5)
    p4, p7 = _sort2(p4, p7)
    p4, p2 = _sort2(p4, p2)
    p6, p4 = _sort2(p6, p4)
    p4, p2 = _sort2(p4, p2)
    return p4


@njit(parallel=True, cache=CACHE)
def median_cpu(disp, r):
    """median_at for every pixel. 3x3 inside the image: a sorting network over whole
    rows (vectorises), and median_at only where the window holds an invalid pixel."""
    h, w = disp.shape
    out = np.empty_like(disp)
    for y in prange(h):
        window = np.empty((2 * r + 1) * (2 * r + 1), np.float32)
        if r != 1 or y == 0 or y == h - 1 or w < 3:
            for x in range(w):
                out[y, x] = median_at(disp, y, x, r, window)
            continue
        a0, a1, a2 = disp[y - 1, 0:w - 2], disp[y - 1, 1:w - 1], disp[y - 1, 2:w]
        b0, b1, b2 = disp[y, 0:w - 2], disp[y, 1:w - 1], disp[y, 2:w]
        c0, c1, c2 = disp[y + 1, 0:w - 2], disp[y + 1, 1:w - 1], disp[y + 1, 2:w]
        o = out[y, 1:w - 1]
        for x in range(w - 2):
            o[x] = _median9(a0[x], a1[x], a2[x], b0[x], b1[x], b2[x], c0[x], c1[x], c2[x])
        for x in range(w - 2):  # windows with an invalid (NaN) pixel: the general rule
            total = a0[x] + a1[x] + a2[x] + b0[x] + b1[x] + b2[x] + c0[x] + c1[x] + c2[x]
            if total != total:
                o[x] = median_at(disp, y, x + 1, r, window)
        out[y, 0] = median_at(disp, y, 0, r, window)
        out[y, w - 1] = median_at(disp, y, w - 1, r, window)
    return out


@njit(parallel=True, cache=CACHE)
def fill_cpu(disp, mode):
    """fill_row_at for every pixel, in two sweeps per row (the nearest valid pixel on
    the right, then on the left) instead of a search per pixel: O(w) however long the
    invalid runs are."""
    h, w = disp.shape
    out = np.empty_like(disp)
    for y in prange(h):
        row = disp[y]
        o = out[y]
        right_v = np.empty(w, np.float32)
        right_x = np.empty(w, np.int64)
        v_r, x_r = np.float32(math.nan), w
        for x in range(w - 1, -1, -1):
            right_v[x] = v_r
            right_x[x] = x_r
            if row[x] == row[x]:
                v_r, x_r = row[x], x
        v_l, x_l = np.float32(math.nan), -1
        for x in range(w):
            c = row[x]
            if c == c:
                o[x] = c
                v_l, x_l = c, x
            else:
                o[x] = fill_choice(v_l, x - x_l, right_v[x], right_x[x] - x, mode)
    return out


@njit(cache=CACHE)
def speckle_labels_cpu(disp, max_diff):
    """4-connected regions of valid pixels whose neighbours differ by at most max_diff.
    Returns (labels int32 HxW, -1 invalid; sizes per label)."""
    h, w = disp.shape
    labels = np.full((h, w), -1, np.int32)
    sizes = np.zeros(h * w, np.int32)
    stack = np.empty(h * w, np.int32)
    n = 0
    for y0 in range(h):
        for x0 in range(w):
            if labels[y0, x0] >= 0 or not disp[y0, x0] == disp[y0, x0]:
                continue
            labels[y0, x0] = n
            top = 0
            stack[0] = y0 * w + x0
            top = 1
            size = 0
            while top > 0:
                top -= 1
                p = stack[top]
                y = p // w
                x = p - y * w
                size += 1
                v = disp[y, x]
                for k in range(4):
                    yy = y + (1 if k == 0 else (-1 if k == 1 else 0))
                    xx = x + (1 if k == 2 else (-1 if k == 3 else 0))
                    if yy >= 0 and yy < h and xx >= 0 and xx < w and labels[yy, xx] < 0:
                        u = disp[yy, xx]
                        if u == u and abs(u - v) <= max_diff:
                            labels[yy, xx] = n
                            stack[top] = yy * w + xx
                            top += 1
            sizes[n] = size
            n += 1
    return labels, sizes[:n]


@njit(parallel=True, cache=CACHE)
def speckle_apply_cpu(disp, labels, sizes, max_size):
    h, w = disp.shape
    out = np.empty_like(disp)
    for y in prange(h):
        for x in range(w):
            lab = labels[y, x]
            out[y, x] = np.float32(math.nan) if lab < 0 or sizes[lab] <= max_size else disp[y, x]
    return out
