"""Refinement of a float32 disparity map (NaN = invalid): left-right check,
speckle filter, filling of rejected pixels, median filter."""
import math

import numpy as np
from numba import njit, prange

from ..config import WMF_MAX_RADIUS
from . import CACHE, shared

BACKGROUND, NEAREST, SLOPE, DIRECTIONS = 1, 2, 3, 4  # fill modes: the smaller neighbour disparity,
# the closer one, or BACKGROUND after border_slope_cpu has continued the surfaces into the left
# border strip; DIRECTIONS: after border_slope_cpu, the 2-D fill (fill2d_at)
FILL_MODES = {"background": BACKGROUND, "nearest": NEAREST, "slope": SLOPE, "2d": DIRECTIONS}

# The 2-D fill (Hirschmueller 2008, section 4.3): an invalid pixel takes the second
# lowest of the nearest valid disparities found along 8 directions (dy, dx) (a
# background value that one stray low value does not decide), the lowest if only one
# direction finds any. On the shared scenes 16 directions measured the same (bad-2
# mean 3.70 against 3.66 with the quality preset).
FILL2D_DIRECTIONS = np.array([(0, 1), (0, -1), (1, 0), (-1, 0), (1, 1), (1, -1), (-1, 1), (-1, -1)], np.int32)

# border_slope_cpu: the valid pixels a slope is fitted to, their band around the first one,
# the largest residual (RMS, px) and slope (px per px) kept, and the window of fits whose
# median is taken (rows, columns either side). Prototyped on the shared scenes: bad-2 stayed
# within 0.01 for RMS 0.3-0.6 and slopes 0.2-0.3.
SLOPE_FIT_PIXELS = 40
SLOPE_BAND = 1.0
SLOPE_MAX = 0.3
SLOPE_RMS = 0.3
SLOPE_ROWS, SLOPE_COLS = 8, 10
SLOPE_WINDOW = (2 * SLOPE_ROWS + 1) * 2 * SLOPE_COLS
# the fits in fixed point, 1 / SLOPE_ONE px (exact integer sums, the same on both devices)
SLOPE_ONE = 65536
SLOPE_BAND_FIXED = round(SLOPE_BAND * SLOPE_ONE)
SLOPE_MAX_FIXED = round(SLOPE_MAX * SLOPE_ONE)
SLOPE_RMS2_FIXED = round((SLOPE_RMS * SLOPE_ONE) ** 2)

# Edge-aware weighted median (stage weighted_median): at disparity edges, where the
# disparity spans WMF_EDGE px or more within WMF_EDGE_R pixels (there the cost window
# spreads the foreground over the background), the weighted median of the disparities
# of a (2r+1)^2 window sampled every WMF_STEP pixels, each weighted by its colour
# likeness to the centre in the left image: WMF_ONE * exp(-(sum over B, G, R of |diff|)
# / (3 * WMF_SIGMA)), rounded, from a table built on the host (wmf_weights), so that
# both devices add the same integers. The median's 1 px bin is found first, the
# result is the weighted mean of the samples in it (subpixel values survive).
# Prototyped on the shared scenes (radius 6-10, sigma 5-12, edge 1-3 px: bad-2 means
# within 0.1 of each other, every scene better than without).
WMF_STEP = 2
WMF_EDGE = 2.0
WMF_EDGE_R = 2
WMF_SIGMA = 8.0
WMF_ONE = 1024
WMF_MAX_SAMPLES = (2 * WMF_MAX_RADIUS // WMF_STEP + 1) ** 2
WMF_WEIGHT_BITS = 11  # a sample's word: its bin (signed, relative to the centre's) above its weight <= WMF_ONE
WMF_WEIGHT_MASK = (1 << WMF_WEIGHT_BITS) - 1
WMF_BIN_LIMIT = (1 << (31 - WMF_WEIGHT_BITS)) - 1  # bins further from the centre's count as this far


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
def fill_choice(left, dl, right, dr, mode, x, w):
    """The fill value of the invalid pixel x of a row of width w, from the nearest valid
    pixels on its left and on its right (value or NaN if none, distance).

    First the image borders: a pixel has no match when x - d falls outside the right
    image, so where the surface on the right, continued to x, would have x - d < 0, the
    pixel is in the strip along the left border that the right camera does not see,
    and takes that surface's disparity, whatever lies to its left (often a wrong small
    disparity: there only d <= x could be tried); likewise the surface on the left where
    x - d >= w (negative disparities, the right border). Otherwise BACKGROUND takes the
    smaller disparity (occlusions lie behind), NEAREST the closer (the left on a tie)."""
    if right == right and right > x:
        return right
    if left == left and left <= x - w:
        return left
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
    """fill_choice for every invalid pixel, in two sweeps per row (the nearest valid pixel on
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
                o[x] = fill_choice(v_l, x - x_l, right_v[x], right_x[x] - x, mode, x, w)
    return out


SPECKLE_BANDS = 64  # bands of rows labelled in parallel by speckle_sizes_cpu, unless told
# The CPU backend asks for one band per thread: each band's first and last rows' labels
# are joined in one thread, and 64 bands cost 10-14 % of the stage against 4 on the
# 2-core machine (teddy, one and two threads: 1.07 -> 0.97 ms, 0.55 -> 0.47).


@njit(cache=CACHE, inline="always")
def _close(v, u, max_diff):
    """Whether two neighbouring disparities are in one speckle region: both valid, close enough."""
    return v == v and u == u and abs(u - v) <= max_diff


@njit(cache=CACHE, inline="always")
def _joined(disp, y, x, yy, xx, max_diff):
    """_close for the pixels (x, y) and (xx, yy)."""
    return _close(disp[y, x], disp[yy, xx], max_diff)


@njit(cache=CACHE)
def _root(parent, a):
    """The root of a's set, halving the path on the way (one thread: it writes parent)."""
    while parent[a] != a:
        parent[a] = parent[parent[a]]
        a = parent[a]
    return a


@njit(cache=CACHE, inline="always")
def _find(parent, a):
    """The root of a's set, parent only read (threads may look up at once)."""
    while parent[a] != a:
        a = parent[a]
    return a


@njit(parallel=True, cache=CACHE)
def speckle_sizes_cpu(disp, max_diff, bands=SPECKLE_BANDS):
    """For every pixel, the size of its 4-connected region of valid pixels whose
    neighbours differ by at most max_diff (0 for an invalid pixel) -> int32 HxW.
    Bands of rows are flood-filled in parallel, each region labelled by the index of
    its first pixel, and each band lists the labels on its first and last rows; regions
    that meet across a band's edge are then joined (union-find over those labels only,
    so the serial part grows with the width, not the area) and their sizes added: the
    same regions as one flood fill."""
    h, w = disp.shape
    labels = np.empty(h * w, np.int32)  # -1 until labelled (each band clears its rows)
    sizes = np.empty(h * w, np.int32)  # by label: pixels within its band, then in all
    bands = max(1, min(bands, h))
    seen = np.empty(h * w, np.bool_)  # by label: listed already (each band clears its own)
    parent = np.empty(h * w, np.int32)  # union-find, used at the listed labels only
    total = np.empty(h * w, np.int32)
    edge = np.empty((bands, 2 * w), np.int32)  # band b's labels on its first and last rows
    n_edge = np.zeros(bands, np.int64)
    D = disp.ravel()  # (flat, by unsigned offsets: no negative-index checks)
    for b in prange(bands):
        y_lo = b * h // bands
        y_hi = (b + 1) * h // bands
        labels[y_lo * w:y_hi * w] = -1
        # the pixels to visit, as row and column (dividing a flat index back into them
        # took about a tenth of the fill)
        stack_y = np.empty((y_hi - y_lo) * w, np.int32)
        stack_x = np.empty((y_hi - y_lo) * w, np.int32)
        for y0 in range(y_lo, y_hi):
            for x0 in range(w):
                p0 = y0 * w + x0
                if labels[p0] >= 0 or not disp[y0, x0] == disp[y0, x0]:
                    continue
                labels[p0] = p0
                stack_y[0] = y0
                stack_x[0] = x0
                top = 1
                size = 0
                while top > 0:
                    top -= 1
                    y = stack_y[top]
                    x = stack_x[top]
                    size += 1
                    v = disp[y, x]  # (valid: only valid pixels are pushed)
                    for k in range(4):  # (unrolled by LLVM: the offsets are constants)
                        yy = y + (1 if k == 0 else (-1 if k == 1 else 0))
                        xx = x + (1 if k == 2 else (-1 if k == 3 else 0))
                        if yy >= y_lo and yy < y_hi and xx >= 0 and xx < w:
                            q = np.uint64(yy * w + xx)
                            if labels[q] < 0 and _close(v, D[q], max_diff):
                                labels[q] = p0
                                stack_y[top] = yy
                                stack_x[top] = xx
                                top += 1
                sizes[p0] = size
        seen[y_lo * w:y_hi * w] = False  # (a band's labels are indices of its own pixels)
        ne = 0
        for y in (y_lo, y_hi - 1):
            for q in range(y * w, (y + 1) * w):
                lab = labels[q]
                if lab >= 0 and not seen[lab]:
                    seen[lab] = True
                    edge[b, ne] = lab
                    parent[lab] = lab
                    total[lab] = 0
                    ne += 1
        n_edge[b] = ne
    # the label pairs that meet across each band's first row, listed in parallel (once
    # along a run of the same two labels), then joined in one thread: a region can cross
    # many bands. (Scanning the rows in that thread was most of the serial part: at 16
    # threads the stage scaled 3.8x at teddy.)
    pairs = np.empty((bands, w, 2), np.int32)
    n_pairs = np.zeros(bands, np.int64)
    for b in prange(1, bands):
        y = b * h // bands  # the band's first row, below the previous band's last
        la = lb = -1
        k = 0
        for x in range(w):
            if _joined(disp, y - 1, x, y, x, max_diff):
                a, c = labels[(y - 1) * w + x], labels[y * w + x]
                if a != la or c != lb:
                    la, lb = a, c
                    pairs[b, k, 0] = a
                    pairs[b, k, 1] = c
                    k += 1
        n_pairs[b] = k
    for b in range(1, bands):
        for k in range(n_pairs[b]):
            ra = _root(parent, pairs[b, k, 0])
            rb = _root(parent, pairs[b, k, 1])
            if ra != rb:
                parent[max(ra, rb)] = min(ra, rb)
    roots = np.empty((bands, 2 * w), np.int32)  # each listed label's root, found in parallel
    for b in prange(bands):  # (no joins follow: parent is only read here)
        for i in range(n_edge[b]):
            roots[b, i] = _find(parent, edge[b, i])
    for b in range(bands):  # (serial: the bands' labels add into shared totals)
        for i in range(n_edge[b]):
            total[roots[b, i]] += sizes[edge[b, i]]
    for b in prange(bands):  # each listed label's region size (the others' is their band's)
        for i in range(n_edge[b]):
            sizes[edge[b, i]] = total[roots[b, i]]
    out = np.empty((h, w), np.int32)
    for y in prange(h):
        for x in range(w):
            lab = labels[y * w + x]
            out[y, x] = sizes[lab] if lab >= 0 else 0
    return out


@njit(parallel=True, cache=CACHE)
def speckle_apply_cpu(disp, region_sizes, max_size):
    """NaN where the pixel's region (speckle_sizes_cpu) has at most max_size pixels."""
    h, w = disp.shape
    out = np.empty_like(disp)
    for y in prange(h):
        for x in range(w):
            n = region_sizes[y, x]
            out[y, x] = np.float32(math.nan) if n == 0 or n <= max_size else disp[y, x]
    return out


@shared
def fixed(v):
    """A disparity in fixed point (units of 1 / SLOPE_ONE px, rounded)."""
    return np.int64(math.floor(v * SLOPE_ONE + 0.5))


@shared
def slope_run_start(disp, y, e):
    """The first pixel of the invalid run of row y that ends at the valid pixel e, when
    fill_choice's border rule fills that run (its surface has d > x there); else -1."""
    d = disp[y, e]
    if e == 0 or not d == d or disp[y, e - 1] == disp[y, e - 1] or not d > 0:
        return -1
    k = min(e - 1, np.int64(math.ceil(d)) - 1)  # the run must reach k, the last x < d
    if disp[y, k] == disp[y, k]:
        return -1  # (most runs inside the image end here, after one look)
    x = e - 1
    while x > 0 and not disp[y, x - 1] == disp[y, x - 1]:
        x -= 1
    return x if d > x else -1


@shared
def slope_fit_at(disp, y, e):
    """The slope (float32, px per px) of the surface starting at the valid pixel e of row y:
    a least-squares line through the first SLOPE_FIT_PIXELS valid pixels from e (within
    3x as many columns) whose disparity stays within SLOPE_BAND + SLOPE_MAX * distance
    of d(e), clamped to +-SLOPE_MAX; NaN when fewer than 5 remain or the line misses them
    by more than SLOPE_RMS (RMS).

    The sums are exact integers (disparities in fixed point, relative to d(e)) and the
    residual comes from them in closed form, n * SSR = (n Syy - Sy^2) - (n Sxy - Sx Sy)^2 / den,
    so no floating multiply feeds an add: a GPU, which fuses those into one rounding,
    computes the same slope as the CPU."""
    w = disp.shape[1]
    d0 = fixed(disp[y, e])
    n = sx = sxx = sy = sxy = syy = np.int64(0)
    seen = 0
    x = e
    end = min(w, e + 3 * SLOPE_FIT_PIXELS)
    while x < end and seen < SLOPE_FIT_PIXELS:
        v = disp[y, x]
        if v == v:
            seen += 1
            k = np.int64(x - e)
            q = fixed(v) - d0
            if abs(q) < SLOPE_BAND_FIXED + k * SLOPE_MAX_FIXED:
                n += 1
                sx += k
                sxx += k * k
                sy += q
                sxy += k * q
                syy += q * q
        x += 1
    den = n * sxx - sx * sx
    if n < 5 or den <= 0:
        return np.float32(math.nan)
    p = np.float64(n * sxy - sx * sy)
    ssr_n = np.float64(n * syy - sy * sy) - p * p / np.float64(den)
    if ssr_n > np.float64(n * n * SLOPE_RMS2_FIXED):
        return np.float32(math.nan)
    b = p / np.float64(den) / SLOPE_ONE
    return np.float32(min(max(b, -SLOPE_MAX), SLOPE_MAX))


@shared
def sorted_median(buf, n):
    """The median of buf[:n] (n >= 1), sorted in place (insertion sort: n is small)."""
    for i in range(1, n):
        v = buf[i]
        j = i - 1
        while j >= 0 and buf[j] > v:
            buf[j + 1] = buf[j]
            j -= 1
        buf[j + 1] = v
    return middle(buf[n // 2 - 1] if n > 1 else buf[0], buf[n // 2], n)


@shared
def middle(lo, hi, n):
    """The median of n >= 1 sorted values, from the two in the middle: lo at n // 2 - 1
    and hi at n // 2 (hi alone when n is odd)."""
    if n % 2 == 1:
        return hi
    return np.float32(0.5) * (lo + hi)


@shared
def slope_window_cell(y, e, i):
    """(row, column) of cell i (0 <= i < SLOPE_WINDOW) of the window of slopes that the
    run ending at e of row y takes its median from: SLOPE_ROWS rows either side of y,
    SLOPE_COLS columns left of e and SLOPE_COLS - 1 right of it, row by row. Cells
    outside the image are skipped."""
    return y - SLOPE_ROWS + i // (2 * SLOPE_COLS), e - SLOPE_COLS + i % (2 * SLOPE_COLS)


@shared
def slope_continue(disp, first, y, e, s, out, start, step, lo, hi):
    """The run of row y that ends at e (first[y, e] its start) continued from d(e) along
    the slope s (float64; s has 24 significant bits, so each product is exact), held
    within the search range [lo, hi] (float32), wherever that still lies outside the
    right image (d > x): its columns first[y, e] + start, + step, ... (the GPU's threads
    share a run out so)."""
    d0 = np.float64(disp[y, e])
    for x in range(first[y, e] + start, e, step):
        v = min(max(np.float32(d0 + s * (x - e)), lo), hi)
        if v > x:
            out[y, x] = v


@shared
def slope_apply_at(disp, first, slopes, y, e, buf, out, lo, hi):
    """The run of row y that ends at e (first[y, e] its start) continued from d(e) along
    the median of the slopes fitted within SLOPE_ROWS rows and SLOPE_COLS columns (0 if
    none), within [lo, hi], wherever that still lies outside the right image (d > x).
    buf: scratch for SLOPE_WINDOW values."""
    h, w = disp.shape
    n = 0
    for i in range(SLOPE_WINDOW):
        yy, xx = slope_window_cell(y, e, i)
        if yy >= 0 and yy < h and xx >= 0 and xx < w:
            v = slopes[yy, xx]
            if v == v:
                buf[n] = v
                n += 1
    s = np.float64(sorted_median(buf, n)) if n > 0 else 0.0
    slope_continue(disp, first, y, e, s, out, 0, 1, lo, hi)


@shared
def fill2d_at(disp, dirs, y, x):
    """The 2-D fill of the invalid pixel (x, y): the second lowest of the nearest valid
    disparities along the directions dirs[k] = (dy, dx) (the lowest if one direction
    finds any, NaN if none does)."""
    h, w = disp.shape
    lo1 = np.float32(math.inf)
    lo2 = np.float32(math.inf)
    found = 0
    for k in range(dirs.shape[0]):
        dy = dirs[k, 0]
        dx = dirs[k, 1]
        yy = y + dy
        xx = x + dx
        while 0 <= yy < h and 0 <= xx < w:
            v = disp[yy, xx]
            if v == v:
                found += 1
                if v < lo1:
                    lo2 = lo1
                    lo1 = v
                elif v < lo2:
                    lo2 = v
                break
            yy += dy
            xx += dx
    if found == 0:
        return np.float32(math.nan)
    return lo1 if found == 1 else lo2


@njit(parallel=True, cache=CACHE)
def fill2d_cpu(disp, dirs):
    """fill2d_at at every invalid pixel."""
    h, w = disp.shape
    out = disp.copy()
    for y in prange(h):
        for x in range(w):
            if disp[y, x] != disp[y, x]:
                out[y, x] = fill2d_at(disp, dirs, y, x)
    return out


@njit(parallel=True, cache=CACHE)
def border_slope_cpu(disp, lo=-np.inf, hi=np.inf):
    """The strip along the left border that the right camera does not see, continued
    along its surface's slope instead of at a constant disparity (fill mode SLOPE, then
    the background fill): slope_run_start finds the runs that fill_choice's border rule
    fills, slope_fit_at fits a slope where each ends, and slope_apply_at continues the
    run along the median of the fits nearby, within the search range [lo, hi]. The GPU
    runs the same three functions."""
    h, w = disp.shape
    out = np.empty_like(disp)
    slopes = np.empty((h, w), np.float32)
    first = np.empty((h, w), np.int32)
    for y in prange(h):  # (the arrays are filled here, a row per task, not by one thread first)
        out[y] = disp[y]
        slopes[y] = np.nan
        first[y] = -1
        for e in range(1, w):
            if disp[y, e] == disp[y, e] and disp[y, e - 1] != disp[y, e - 1]:  # (slope_run_start's first test)
                x0 = slope_run_start(disp, y, e)
                if x0 >= 0:
                    first[y, e] = x0
                    slopes[y, e] = slope_fit_at(disp, y, e)
    for y in prange(h):
        buf = np.empty(SLOPE_WINDOW, np.float32)
        for e in range(w):
            if first[y, e] >= 0:
                slope_apply_at(disp, first, slopes, y, e, buf, out, np.float32(lo), np.float32(hi))
    return out


def wmf_weights(sigma=WMF_SIGMA):
    """The weight of each colour difference 0..765 (sum over three channels), int32."""
    return np.round(WMF_ONE * np.exp(-np.arange(766) / (3.0 * sigma))).astype(np.int32)


@shared
def disparity_edge_at(disp, y, x):
    """True where the valid disparities within WMF_EDGE_R pixels (a square) span WMF_EDGE px or more."""
    h, w = disp.shape
    lo = np.float32(math.inf)
    hi = np.float32(-math.inf)
    for j in range(max(0, y - WMF_EDGE_R), min(h, y + WMF_EDGE_R + 1)):
        for i in range(max(0, x - WMF_EDGE_R), min(w, x + WMF_EDGE_R + 1)):
            v = disp[j, i]
            if v == v:
                lo = min(lo, v)
                hi = max(hi, v)
    return np.float64(hi) - np.float64(lo) >= WMF_EDGE


@shared
def wmf_centre(guide, nc, y, x):
    """The colour (B, G, R) of the guide at (x, y); a grey guide's grey three times."""
    g0 = np.int32(guide[y, x * nc])
    g1 = np.int32(guide[y, x * nc + 1]) if nc == 3 else g0
    g2 = np.int32(guide[y, x * nc + 2]) if nc == 3 else g0
    return g0, g1, g2


@shared
def wmf_weight(guide, nc, lut, j, i, g0, g1, g2):
    """The weight of the sample (i, j) for a centre of colour (g0, g1, g2): lut[sum over
    B, G, R of |difference|] (a grey guide: its difference counted three times)."""
    if nc == 3:
        dc = np.uint32(abs(np.int32(np.int32(guide[j, 3 * i]) - g0)) + abs(np.int32(np.int32(guide[j, 3 * i + 1]) - g1))
                       + abs(np.int32(np.int32(guide[j, 3 * i + 2]) - g2)))
    else:
        dc = np.uint32(3 * abs(np.int32(np.int32(guide[j, i]) - g0)))
    return lut[dc]  # (32-bit and unsigned: no 64-bit arithmetic or negative-index fix-up on the GPU)


@shared
def weighted_median_at(disp, guide, nc, lut, y, x, r, samples):
    """The weighted median disparity around the valid pixel (x, y) (see WMF_STEP): its
    1 px bin is the lowest bin b with 2 * weight(bins <= b) >= the total weight (found
    by bisection), the value the weighted mean of that bin's samples. guide: the left
    image as H x (W * nc) uint8, nc = 3 (B, G, R) or 1 (grey, its difference counted
    three times); samples: int32 scratch for WMF_MAX_SAMPLES samples, each its bin
    (relative to the centre's) and weight in one word (4 bytes a sample: the GPU keeps
    them in cache)."""
    h, w = disp.shape
    c = np.int32(math.floor(disp[y, x]))
    g0, g1, g2 = wmf_centre(guide, nc, y, x)
    # In 32 bits, the samples indexed unsigned (the GPU runs 64-bit arithmetic as two
    # instructions, and a signed index costs a negative-index fix-up per sample): a bin
    # is below 2**20 in size and a weight at most WMF_ONE, so a word and the total fit
    n = np.uint32(0)
    tot = np.int32(0)
    lo = np.int32(WMF_BIN_LIMIT)
    hi = np.int32(-WMF_BIN_LIMIT)
    for j in range(max(0, y - r), min(h, y + r + 1), WMF_STEP):
        for i in range(max(0, x - r), min(w, x + r + 1), WMF_STEP):
            d = disp[j, i]
            if d == d:
                wt = np.int32(wmf_weight(guide, nc, lut, j, i, g0, g1, g2))
                b = np.int32(np.int32(math.floor(d)) - c)
                b = min(max(b, np.int32(-WMF_BIN_LIMIT)), np.int32(WMF_BIN_LIMIT))
                tot = np.int32(tot + wt)
                lo = min(lo, b)
                hi = max(hi, b)
                samples[n] = np.int32((b << WMF_WEIGHT_BITS) | wt)
                n = np.uint32(n + np.uint32(1))
    while lo < hi:
        mid = np.int32((lo + hi) >> 1)
        lim = np.int32((mid + 1) << WMF_WEIGHT_BITS)  # a sample's bin is <= mid where its word is below this
        below = np.int32(0)
        k = np.uint32(0)
        while k < n:
            v = samples[k]
            if v < lim:
                below = np.int32(below + (v & WMF_WEIGHT_MASK))
            k = np.uint32(k + np.uint32(1))
        if 2 * below >= tot:
            hi = mid
        else:
            lo = np.int32(mid + 1)
    ws = np.int32(0)
    wd = 0.0
    k = np.uint32(0)
    for j in range(max(0, y - r), min(h, y + r + 1), WMF_STEP):  # the same samples, in the same order
        for i in range(max(0, x - r), min(w, x + r + 1), WMF_STEP):
            d = disp[j, i]
            if d == d:
                v = samples[k]
                if v >> WMF_WEIGHT_BITS == lo:
                    wt = np.int32(v & WMF_WEIGHT_MASK)
                    ws = np.int32(ws + wt)
                    wd += wt * np.float64(d)  # an exact product: a fused multiply-add rounds the same
                k = np.uint32(k + np.uint32(1))
    if ws == 0:  # every sample of the bin weighs 0: the centre's own value
        return disp[y, x]
    return np.float32(wd / ws)


WMF_INVALID = np.int32(-(1 << 30))  # weighted_median_cpu's floor(d) of a NaN


@njit(parallel=True, cache=CACHE)
def weighted_median_cpu(disp, guide, nc, lut, r, threads=1):
    """weighted_median_at at the disparity edges (disparity_edge_at, here
    from separable extremes: NaN read as +inf for the minimum and -inf for the maximum,
    so the loops have no branch); elsewhere the map as it is."""
    h, w = disp.shape
    e = WMF_EDGE_R
    lo = np.empty((h, w), np.float32)
    hi = np.empty((h, w), np.float32)
    fl = np.empty((h, w), np.int32)  # floor(d), WMF_INVALID where d is NaN
    fmin = np.full(h, WMF_BIN_LIMIT, np.int32)
    fmax = np.full(h, -WMF_BIN_LIMIT, np.int32)
    for y in prange(h):  # elementwise loops over x (they vectorise)
        a = np.empty(w + 2 * e, np.float32)
        b = np.empty(w + 2 * e, np.float32)
        a[:e] = np.inf
        a[w + e:] = np.inf
        b[:e] = -np.inf
        b[w + e:] = -np.inf
        f0 = np.int32(WMF_BIN_LIMIT)
        f1 = np.int32(-WMF_BIN_LIMIT)
        for x in range(w):
            v = disp[y, x]
            ok = v == v
            a[x + e] = v if ok else np.inf
            b[x + e] = v if ok else -np.inf
            f = min(max(np.int32(math.floor(v)) if ok else np.int32(0), -WMF_BIN_LIMIT // 2), WMF_BIN_LIMIT // 2)
            fl[y, x] = f if ok else WMF_INVALID
            f0 = min(f0, f if ok else np.int32(WMF_BIN_LIMIT))
            f1 = max(f1, f if ok else np.int32(-WMF_BIN_LIMIT))
        fmin[y] = f0
        fmax[y] = f1
        for x in range(w):
            lo[y, x] = a[x]
            hi[y, x] = b[x]
        for i in range(1, 2 * e + 1):
            for x in range(w):
                lo[y, x] = min(lo[y, x], a[x + i])
                hi[y, x] = max(hi[y, x], b[x + i])
    span = max(0, fmax.max() - fmin.min())  # bins lie in [-span, span]
    out = np.empty_like(disp)  # (each row copied by its task below, not by one thread here)
    # The rows interleaved `threads` apart (the caller's numba.get_num_threads(), which
    # called here would keep the function out of the cache): the loop below gives each
    # thread a run of consecutive entries, so its rows then spread over the whole image,
    # and so do the depth edges (the work). (8 apart, a thread's rows spanned half the
    # image at 16 threads, and the stage scaled 5.4-6.5x from 1 to 16 on the H100
    # machine's host.)
    stride = max(1, min(threads, h))
    order = np.empty(h, np.int64)
    t = 0
    for s in range(stride):
        for y in range(s, h, stride):
            order[t] = y
            t += 1
    D = disp.ravel()  # flat arrays, indexed by unsigned offsets: no negative-index wrap-around
    F = fl.ravel()
    G = guide.ravel()
    for q in prange(h):
        y = order[q]
        out[y] = disp[y]
        bins = np.empty(WMF_MAX_SAMPLES, np.int32)  # the samples' bins, to clear the histograms
        hist = np.zeros(2 * span + 1, np.int32)
        histd = np.zeros(2 * span + 1, np.float64)
        j0, j1 = max(0, y - e), min(h, y + e + 1)
        mn = lo[j0].copy()
        mx = hi[j0].copy()
        for j in range(j0 + 1, j1):
            for x in range(w):
                mn[x] = min(mn[x], lo[j, x])
                mx[x] = max(mx[x], hi[j, x])
        wy0, wy1 = max(0, y - r), min(h, y + r + 1)
        for x in range(w):
            v = disp[y, x]
            if not (v == v and np.float64(mx[x]) - np.float64(mn[x]) >= WMF_EDGE):
                continue
            # weighted_median_at's value with one pass over the window instead of one per
            # bisection step: each sample's weight, and its weight times its disparity, are
            # added to histograms of the bins (hist, histd at bin + span; all zero on entry
            # and on return) as it is gathered; the median bin is the first at which the
            # running weight reaches half, and its weighted sum was added in
            # weighted_median_at's order (the same float: that loop adds exact zeros for
            # the other bins). Written out here, wmf_centre and wmf_weight included, rather
            # than called: passing arrays to a call costs reference counting at every pixel
            # (about 35 of 165 ns on tsukuba). Tsukuba, 1 thread: 3.96 ms as a call per
            # pixel, 2.9 written out, 1.8 with fewer stores per sample, 1.7 without the
            # final loop over the samples.
            p0 = np.uint64(y * w + x)
            c = F[p0]
            g0 = np.int32(G[p0 * np.uint64(nc)])
            g1 = np.int32(G[p0 * np.uint64(nc) + np.uint64(1)]) if nc == 3 else g0
            g2 = np.int32(G[p0 * np.uint64(nc) + np.uint64(2)]) if nc == 3 else g0
            n = np.uint64(0)
            tot = 0
            blo = np.int32(WMF_BIN_LIMIT)
            i0, i1 = max(0, x - r), min(w, x + r + 1)
            for j in range(wy0, wy1, WMF_STEP):
                for i in range(i0, i1, WMF_STEP):
                    pq = np.uint64(j * w + i)
                    f = F[pq]
                    if f != WMF_INVALID:
                        if nc == 3:
                            pg = pq * np.uint64(3)
                            dc = (abs(np.int32(G[pg]) - g0) + abs(np.int32(G[pg + np.uint64(1)]) - g1)
                                  + abs(np.int32(G[pg + np.uint64(2)]) - g2))
                        else:
                            dc = 3 * abs(np.int32(G[pq]) - g0)
                        wt = lut[np.uint64(dc)]  # wmf_weight
                        b = f - c
                        hb = np.uint64(b + span)
                        hist[hb] += wt
                        histd[hb] += wt * np.float64(D[pq])
                        tot += wt
                        blo = min(blo, b)
                        bins[n] = b
                        n += np.uint64(1)
            if n == 0:  # no valid sample (the centre is not one at odd offsets from a border): its own value
                continue
            below = 0
            m = blo
            while True:  # the lowest bin with 2 * weight(bins <= it) >= tot
                below += hist[np.uint64(m + span)]
                if 2 * below >= tot:
                    break
                m += 1
            hm = np.uint64(m + span)
            ws = hist[hm]
            wd = histd[hm]
            for k in range(n):  # the histograms cleared for the next pixel
                hist[np.uint64(bins[k] + span)] = 0
                histd[np.uint64(bins[k] + span)] = 0.0
            if ws != 0:  # else every sample of the bin weighs 0: the centre's own value
                out[y, x] = np.float32(wd / ws)
    return out
