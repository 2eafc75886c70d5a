"""Cost aggregation: Semi-Global Matching over 4, 8 or 16 paths.

For each path direction r the aggregated cost is
    L(p, d) = C(p, d) + min(L(p-r, d), L(p-r, d+-1) + P1, min_k L(p-r, k) + P2') - min_k L(p-r, k)
where P2' is P2, or with adaptive P2 scaled down by the grey step |I(p) - I(p-r)|.
Each L stays below 256 + P2 (uint16); their sum over all paths S fits uint16
(config.validate bounds P2 for that).
"""
import functools

import numba
import numpy as np
from numba import njit, prange

from . import CACHE, shared
from .cost import census_pixel_costs
from .stack import STACK_ELEMENTS, stack_rows

# (dx, dy): the previous pixel on the path is (x - dx, y - dy)
DIRECTIONS = {
    4: [(1, 0), (-1, 0), (0, 1), (0, -1)],
    8: [(1, 0), (-1, 0), (0, 1), (0, -1), (1, 1), (-1, 1), (1, -1), (-1, -1)],
    16: [(1, 0), (-1, 0), (0, 1), (0, -1), (1, 1), (-1, 1), (1, -1), (-1, -1),
         (2, 1), (-2, 1), (1, 2), (-1, 2), (2, -1), (-2, -1), (1, -2), (-1, -2)],
}


@shared
def penalty2(p1, p2, adaptive, g, g_prev):
    """P2 for one step; with adaptive P2 it shrinks with the grey step (never below P1)."""
    if adaptive:
        step = abs(np.int32(g) - np.int32(g_prev))
        return max(p1, (p2 * 16) // (16 + step))
    return p2


@shared
def sgm_value(c, l_prev, l_lo, l_hi, min_prev, p1, p2):
    """One SGM update: c + min(L(d), L(d-1)+P1, L(d+1)+P1, minL+P2) - minL (all int32).
    Every intermediate is cast back to int32 (Numba widens int32 arithmetic to int64),
    so the GPU's compare-and-select chains stay 32-bit; the values never come near 2**31."""
    m = min(l_prev, np.int32(min(l_lo, l_hi) + p1))
    m = min(m, np.int32(min_prev + p2))
    return np.int32(c + m - min_prev)


# The L of the disparities beyond both ends: above every L (L <= max C + P2 <= 255 +
# 16127, config's largest P2), and EDGE + P1 still fits in uint16, so the CPU's sweeps
# can run in uint16 (_sgm16).
EDGE = 0x8000


@njit(cache=CACHE, inline="always")
def _sgm16(c, l_prev, l_lo, l_hi, min_prev, p1, p2):
    """sgm_value in uint16 arithmetic (all arguments uint16), for the CPU's sweeps: the
    same values, as none exceeds 2**15 + P1 (see EDGE); twice the lanes per vector (the
    horizontal sweep of a 450x375x64 volume, one thread: 15.1-16.7 -> 12.0-12.8 ms on
    the H100 machine's host, 4.45 -> 4.13 ms on the 2-core machine)."""
    m = min(l_prev, np.uint16(min(l_lo, l_hi) + p1))
    m = min(m, np.uint16(min_prev + p2))
    return np.uint16(c + m - min_prev)


@njit(cache=CACHE, inline="always")
def _step(C, cy, S, y, x, buf, src, dst, mp, p1, p2, first):
    """buf[dst, 1:n+1] = SGM update of buf[src, 1:n+1] (the path's L at the previous
    pixel, whose minimum is mp) with the costs C[cy, x] (cy: y, or the row of a buffer
    of costs computed on the fly); S[y, x] = that (first path) or
    += it, in the same loop (a separate pass over the buffer cost the vertical sweeps
    10-20 %). Returns its minimum. Columns 0 and n+1 of buf hold EDGE, so one loop of n
    trips covers every disparity (no scalar edge or remainder code per pixel), and
    everything is indexed in place (a view per pixel would cost a reference count)."""
    n = C.shape[2]
    mn = np.uint16(EDGE)
    for d in range(n):
        v = _sgm16(np.uint16(C[cy, x, d]), buf[src, d + 1], buf[src, d], buf[src, d + 2], mp, p1, p2)
        buf[dst, d + 1] = v
        S[y, x, d] = v if first else S[y, x, d] + v
        mn = min(mn, v)
    return mn


@njit(cache=CACHE, inline="always")
def _start(C, cy, S, y, x, buf, dst, first):
    """First pixel of a path: L = C[cy, x], and S[y, x] = L (first path) or += L. Returns min(L)."""
    n = C.shape[2]
    mn = np.uint16(EDGE)
    for d in range(n):
        v = np.uint16(C[cy, x, d])
        buf[dst, d + 1] = v
        S[y, x, d] = v if first else S[y, x, d] + v
        mn = min(mn, v)
    return mn


def direction_pairs(paths: int):
    """Directions r with -r left out (the pair is aggregated together): [(dx, dy)]."""
    out = []
    for dx, dy in DIRECTIONS[paths]:
        if (-dx, -dy) not in out:
            out.append((dx, dy))
    return out


def line_starts(h: int, w: int, dx: int, dy: int) -> np.ndarray:
    """First pixels (y, x) of the path lines of direction (dx, dy): those whose
    predecessor (x - dx, y - dy) lies outside the image. Every pixel lies on exactly
    one line p0, p0 + r, p0 + 2r, ..."""
    y, x = np.mgrid[0:h, 0:w]
    py, px = y - dy, x - dx
    start = (py < 0) | (py >= h) | (px < 0) | (px >= w)
    return np.stack([y[start], x[start]], axis=1).astype(np.int32)


@functools.lru_cache(maxsize=64)
def p2_table(p1, p2, adaptive):
    """P2 by grey step 0..255 (penalty2 divides: once here, not per pixel); the GPU
    uploads the same table. Computed by penalty2's Python source: calling the compiled
    function would load Numba's CPU target (about 0.4 s) in every GPU run. Kept per
    (p1, p2, adaptive): its 256 Python calls cost 0.3 ms, about 1 % of a one-thread
    match of teddy (callers only read it)."""
    return np.array([penalty2.py_func(p1, p2, adaptive, s, 0) for s in range(256)], np.int32)


@njit(parallel=True, cache=CACHE)
def sgm_line_pair_cpu(C, guide, p1, p2tab, S, dx, dy, starts, first):
    """Aggregates the paths r = (dx, dy) and -r into S (S = ... when `first`, else
    S += ...), P2 from p2tab (p2_table). One task per line: walk it along r, then back
    along -r."""
    h, w, n = C.shape
    p1 = np.uint16(p1)
    for i in prange(starts.shape[0]):
        buf = np.full((2, n + 2), EDGE, np.uint16)  # the path's L at the previous pixel (row src) and this one
        y, x = _walk(C, S, guide, starts[i, 0], starts[i, 1], dx, dy, buf, p1, p2tab, first)
        _walk(C, S, guide, y, x, -dx, -dy, buf, p1, p2tab, False)  # and back from the line's last pixel


@njit(cache=CACHE, inline="always")
def _walk(C, S, guide, y, x, dx, dy, buf, p1, p2tab, first):
    """One path: from (y, x) along (dx, dy) to the image border; returns the last pixel."""
    h, w, _ = C.shape
    src = 0
    m = _start(C, y, S, y, x, buf, src, first)
    while True:
        ny = y + dy
        nx = x + dx
        if ny < 0 or ny >= h or nx < 0 or nx >= w:
            return y, x
        p2e = np.uint16(p2tab[abs(np.int32(guide[ny, nx]) - np.int32(guide[y, x]))])
        m = _step(C, ny, S, ny, nx, buf, src, 1 - src, m, p1, p2e, first)
        src = 1 - src
        y = ny
        x = nx


@njit(parallel=True, cache=CACHE)
def box_sum_u8_cpu(C, r):
    """Box aggregation of a uint8 cost volume over (2r+1)^2, as the rounded mean (uint8); edges replicated."""
    h, w, n = C.shape
    tmp = np.empty((h, w, n), np.int32)
    for y in prange(h):
        acc = np.zeros(n, np.int32)
        for i in range(-r, r + 1):
            for d in range(n):
                acc[d] += C[y, min(max(i, 0), w - 1), d]
        for x in range(w):
            a = min(x + r + 1, w - 1)
            b = max(x - r, 0)
            for d in range(n):
                tmp[y, x, d] = acc[d]
                acc[d] += np.int32(C[y, a, d]) - np.int32(C[y, b, d])
    out = np.empty((h, w, n), np.uint8)
    area = (2 * r + 1) * (2 * r + 1)
    for x in prange(w):
        acc = np.zeros(n, np.int32)
        for j in range(-r, r + 1):
            for d in range(n):
                acc[d] += tmp[min(max(j, 0), h - 1), x, d]
        for y in range(h):
            a = min(y + r + 1, h - 1)
            b = max(y - r, 0)
            for d in range(n):
                out[y, x, d] = (acc[d] + area // 2) // area
                acc[d] += tmp[a, x, d] - tmp[b, x, d]
    return out


# ---------------------------------------------------------------- CPU SGM in three sweeps
# The line-by-line driver above walks each path direction on its own: 8 paths read the
# cost volume 8 times and read and write the sum 16 times. The sweeps below give the
# same sums (the same recursion per direction; integer sums do not depend on their
# order) with the volumes touched 3 and 5 times: one pass over rows for both horizontal
# directions (rows in parallel), then a raster pass downwards for every direction that
# comes from the row above and, in the same steps, one upwards for those from the row
# below (the pixels of the two rows in parallel), each keeping only the previous row's
# path costs. OpenCV's 8-path mode walks the image this way, on one thread. With 8
# paths the downward and upward passes go in tiles of up to 32 rows (a fork per tile
# row instead of per row: sgm_vertical3_cpu).


@njit(parallel=True, cache=CACHE)
def sgm_horizontal_cpu(C, guide, p1, p2tab, S, tasks, codes=None):
    """S = L(+x) + L(-x): both horizontal paths of every row, in `tasks` parallel runs of
    neighbouring rows, two rows at a time (_horizontal_rows). The costs from the volume
    C, or with `codes` (cost.CensusCodes) computed for the two rows as their turn comes,
    into a buffer of two rows made once per run. (Numba drops the `codes` branches when
    codes is None, but types both when it is not: C must then still be a uint8 volume,
    which goes unused.)"""
    h, w, n = S.shape
    p1 = np.uint16(p1)
    tasks = max(1, min(tasks, h))
    for t in prange(tasks):
        Cy = np.empty((2, w, n) if codes is not None else (1, 1, 1), np.uint8)
        end = (t + 1) * h // tasks
        for y in range(t * h // tasks, end, 2):
            two = y + 1 < end  # (else a run's odd last row, walked alone)
            y1 = y + 1 if two else y
            costs, cy = (C, y) if codes is None else (Cy, 0)  # the rows' costs: rows cy, cy + 1 of costs
            if codes is not None:
                for k in range(y1 - y + 1):
                    for x in range(w):
                        census_pixel_costs(codes, y + k, x, Cy, k)
            if two:  # (a literal each: the odd row's walk leaves out the second row's code)
                _horizontal_rows(costs, cy, cy + 1, guide, p1, p2tab, S, y, y1, True)
            else:
                _horizontal_rows(costs, cy, cy, guide, p1, p2tab, S, y, y1, False)


@njit(cache=CACHE, inline="always")
def _horizontal_rows(C, cy0, cy1, guide, p1, p2tab, S, y0, y1, two):
    """sgm_horizontal_cpu's work on rows y0 and y1 (`two`; else y0 alone), their costs
    in rows cy0 and cy1 of C: S[y] = L(+x), then S[y] += L(-x), each path's L at the
    previous pixel and this one in a small buffer on the stack (stack.py; on the heap
    past STACK_ELEMENTS). H100 machine's host, this sweep in the default pipeline
    (`profile_cpu.py`), heap -> stack, two rounds alternated (thirty-third session), one
    row at a time, one thread: tsukuba 6.87 / 6.37 -> 2.94 / 5.33 ms, venus 6.28 / 10.33
    -> 5.01 / 7.93, teddy 12.36 / 13.31 -> 7.44 / 10.68, cones@741x500/64 28.4 / 28.8 ->
    17.1 / 24.0 (a slow start of that host: its figures swung by a third between
    rounds); 16 threads: 0.48 / 0.51 -> 0.34 / 0.37, 0.76 / 0.73 -> 0.55 / 0.58, 0.94 /
    0.91 -> 0.73 / 0.73, 2.14 / 2.07 -> 1.70 / 1.82."""
    n = S.shape[2]
    if 4 * (n + 2) <= STACK_ELEMENTS:
        _horizontal_walks(C, cy0, cy1, guide, p1, p2tab, S, y0, y1, two, stack_rows(4, n + 2))
    else:
        _horizontal_walks(C, cy0, cy1, guide, p1, p2tab, S, y0, y1, two, np.empty((4, n + 2), np.uint16))


@njit(cache=CACHE, inline="always")
def _horizontal_walks(C, cy0, cy1, guide, p1, p2tab, S, y0, y1, two, buf):
    """_horizontal_rows' walks, with buf (2 rows of n + 2 a walk) for the path costs.
    The two rows' walks step together, pixel by pixel: each step of a walk waits on its
    last (its minimum), so two independent walks overlap in the core. 2-core machine,
    one thread, this sweep alone (best of 7, three times), one row at a time / two, the
    code before and after in alternated processes (forty-seventh session): tsukuba / 16
    1.67-1.69 / 1.43-1.54 ms, venus / 32 3.02-3.16 / 2.45-2.64, teddy / 64 3.67-4.08 /
    3.35-3.65, teddy / 128 6.14-6.69 / 6.24-7.28 (no gain: there a step's loop over d is
    long enough to overlap itself). A scratch version walking four rows at a time was
    slower than two below 128 disparities (venus 2.48-2.54 against 2.36 in one process).
    From 64 disparities on a pixel's update
    indexes the arrays in place (_step); below, it goes through 1-D views (_step_views).
    2-core machine, one thread, this sweep: in place, 16 and 32 disparities ran 3-4x as
    long as through views; through views, 64 and 128 ran 20-35 % longer than in place."""
    _, w, n = S.shape
    for j in range(n + 2):
        for r in range(4):
            buf[r, j] = EDGE
    m0 = _start(C, cy0, S, y0, 0, buf, 0, True)
    m1 = _start(C, cy1, S, y1, 0, buf, 2, True) if two else m0
    src = 0
    for x in range(1, w):
        m0, m1 = _steps(C, cy0, cy1, guide, p1, p2tab, S, y0, y1, two, buf, src, x, x - 1, m0, m1, True)
        src = 1 - src
    m0 = _start(C, cy0, S, y0, w - 1, buf, 0, False)
    m1 = _start(C, cy1, S, y1, w - 1, buf, 2, False) if two else m0
    src = 0
    for x in range(w - 2, -1, -1):
        m0, m1 = _steps(C, cy0, cy1, guide, p1, p2tab, S, y0, y1, two, buf, src, x, x + 1, m0, m1, False)
        src = 1 - src


@njit(cache=CACHE, inline="always")
def _steps(C, cy0, cy1, guide, p1, p2tab, S, y0, y1, two, buf, src, x, xp, m0, m1, first):
    """One step of _horizontal_walks' walks at pixel x (from xp), row y0's path costs in
    buf rows 0 and 1, row y1's (`two`) in rows 2 and 3 -> their minima."""
    n = S.shape[2]
    q0 = np.uint16(p2tab[abs(np.int32(guide[y0, x]) - np.int32(guide[y0, xp]))])
    q1 = np.uint16(p2tab[abs(np.int32(guide[y1, x]) - np.int32(guide[y1, xp]))])
    if n >= 64:
        m0 = _step(C, cy0, S, y0, x, buf, src, 1 - src, m0, p1, q0, first)
        if two:
            m1 = _step(C, cy1, S, y1, x, buf, 2 + src, 3 - src, m1, p1, q1, first)
    else:
        m0 = _step_views(C, cy0, S, y0, x, buf, src, 1 - src, m0, p1, q0, first)
        if two:
            m1 = _step_views(C, cy1, S, y1, x, buf, 2 + src, 3 - src, m1, p1, q1, first)
    return m0, m1


@njit(cache=CACHE, inline="always")
def _step_views(C, cy, S, y, x, buf, src, dst, mp, p1, p2, first):
    """_step through 1-D views of the arrays: faster below 64 disparities, slower above."""
    n = C.shape[2]
    a = buf[src]
    b = buf[dst]
    Sp = S[y, x]
    Cp = C[cy, x]
    mn = np.uint16(EDGE)
    for d in range(n):
        v = _sgm16(np.uint16(Cp[d]), a[d + 1], a[d], a[d + 2], mp, p1, p2)
        b[d + 1] = v
        Sp[d] = v if first else Sp[d] + v
        mn = min(mn, v)
    return mn


@njit(cache=CACHE, inline="always")
def _row_pixel(C, cy, guide, p1, p2tab, S, lines, mins, src, dst, q, first, y, x, dxs, dy):
    """S[y, x] += L(r)[y, x] for r = (dxs[k], dy), from the previous row's path costs of
    sweep q (row _line_row(src, q, k, x) of lines, EDGE-padded; mins[src, q, k, x] their
    minima), the costs C[cy, x]; `first`: y is the sweep's first row."""
    w = C.shape[1]
    nd = dxs.shape[0]
    for k in range(nd):
        px = x - dxs[k]
        row = _line_row(dst, q, k, x, nd, w)
        if first or px < 0 or px >= w:  # the first pixel of its line: L = C
            mins[dst, q, k, x] = _start(C, cy, S, y, x, lines, row, False)
        else:
            p2e = np.uint16(p2tab[abs(np.int32(guide[y, x]) - np.int32(guide[y - dy, px]))])
            mins[dst, q, k, x] = _step(C, cy, S, y, x, lines, _line_row(src, q, k, px, nd, w), row,
                                       mins[src, q, k, px], p1, p2e, False)


@njit(cache=CACHE, inline="always")
def _line_row(parity, q, k, x, nd, w):
    """The row of sgm_vertical_cpu's path-cost buffer for [parity, sweep q, direction k, pixel x]."""
    return ((parity * 2 + q) * nd + k) * w + x


@njit(cache=CACHE, inline="always")
def _row_pixel3(C, cy, guide, p1, p2tab, S, lines, mins, src, dst, q, first, y, x, dy, zero):
    """_row_pixel for dxs = (0, 1, -1), the three directions in one loop over d: the
    costs read and S updated once for all three (the 8-path vertical sweeps of a
    450x375x64 volume on the 2-core machine: 9.0-9.2 -> 7.5-8.1 ms on one thread,
    4.8-5.2 -> 3.8-4.1 on two). A path's first pixel takes its update from row `zero` of
    lines with minimum 0 and P2 0: C + min(..., 0 + 0) - 0 = C, what _start gives,
    whatever the row holds. The costs: C[cy, x]."""
    w = C.shape[1]
    n = C.shape[2]
    g = np.int32(guide[y, x])
    s0 = s1 = s2 = zero
    m0 = m1 = m2 = np.uint16(0)
    q0 = q1 = q2 = np.uint16(0)
    if not first:
        s0 = _line_row(src, q, 0, x, 3, w)
        m0 = mins[src, q, 0, x]
        q0 = np.uint16(p2tab[abs(g - np.int32(guide[y - dy, x]))])
        if x >= 1:
            s1 = _line_row(src, q, 1, x - 1, 3, w)
            m1 = mins[src, q, 1, x - 1]
            q1 = np.uint16(p2tab[abs(g - np.int32(guide[y - dy, x - 1]))])
        if x + 1 < w:
            s2 = _line_row(src, q, 2, x + 1, 3, w)
            m2 = mins[src, q, 2, x + 1]
            q2 = np.uint16(p2tab[abs(g - np.int32(guide[y - dy, x + 1]))])
    r0 = _line_row(dst, q, 0, x, 3, w)
    r1 = _line_row(dst, q, 1, x, 3, w)
    r2 = _line_row(dst, q, 2, x, 3, w)
    n0 = n1 = n2 = np.uint16(EDGE)
    for d in range(n):
        c = np.uint16(C[cy, x, d])
        v0 = _sgm16(c, lines[s0, d + 1], lines[s0, d], lines[s0, d + 2], m0, p1, q0)
        v1 = _sgm16(c, lines[s1, d + 1], lines[s1, d], lines[s1, d + 2], m1, p1, q1)
        v2 = _sgm16(c, lines[s2, d + 1], lines[s2, d], lines[s2, d + 2], m2, p1, q2)
        lines[r0, d + 1] = v0
        lines[r1, d + 1] = v1
        lines[r2, d + 1] = v2
        # each sum cast back to uint16: `S += v0 + v1 + v2` (Numba widens uint16 sums to
        # int64) had LLVM widen the vector to 64-bit lanes (vpmovzxwq / vpmovqw); H100
        # machine's host, one thread, SGM of teddy 24.3-24.7 -> 21.1-21.3 ms
        S[y, x, d] = np.uint16(S[y, x, d] + np.uint16(np.uint16(v0 + v1) + v2))
        n0 = min(n0, v0)
        n1 = min(n1, v1)
        n2 = min(n2, v2)
    mins[dst, q, 0, x] = n0
    mins[dst, q, 1, x] = n1
    mins[dst, q, 2, x] = n2


@njit(parallel=True, cache=CACHE)
def _cost_rows(codes, down, up, Cb):
    """Cb[0] = the census costs of row `down`, Cb[1] those of row `up`."""
    w = Cb.shape[1]
    for j in prange(2 * w):
        if j < w:
            census_pixel_costs(codes, down, j, Cb, 0)
        else:
            census_pixel_costs(codes, up, j - w, Cb, 1)


@njit(parallel=True, cache=CACHE)
def sgm_vertical_cpu(C, guide, p1, p2tab, S, dxs, codes=None):
    """S += L(r) for r = (dxs[k], 1) (from the row above: a sweep down) and (dxs[k], -1)
    (from the row below: a sweep up). Step i takes row i of the sweep down and row
    h - 1 - i of the sweep up, all their pixels in parallel (one fork per step, not per
    row and sweep); each pixel from the previous row's path costs of its sweep. The
    costs from the volume C, or with `codes` (C then unused) computed for the step's two
    rows into a two-row buffer (row 0: the sweep down's, 1: the sweep up's)."""
    h, w, n = S.shape
    nd = dxs.shape[0]
    p1 = np.uint16(p1)
    lines = np.full((2 * 2 * nd * w, n + 2), EDGE, np.uint16)  # row _line_row(parity, sweep, direction, x)
    mins = np.zeros((2, 2, nd, w), np.uint16)
    Cb = C if codes is None else np.empty((2, w, n), np.uint8)
    for i in range(h):
        dst = i & 1
        src = 1 - dst
        down, up = i, h - 1 - i
        cd, cu = (down, up) if codes is None else (0, 1)  # their rows of Cb
        if codes is not None:  # (a fork of its own: inside the pixels' loop they ran 1.8x as long)
            _cost_rows(codes, down, up, Cb)
        if down != up:
            for j in prange(2 * w):
                if j < w:
                    _row_pixel(Cb, cd, guide, p1, p2tab, S, lines, mins, src, dst, 0, i == 0, down, j, dxs, 1)
                else:
                    _row_pixel(Cb, cu, guide, p1, p2tab, S, lines, mins, src, dst, 1, i == 0, up, j - w, dxs, -1)
        else:  # the middle row of an odd height: both sweeps add to it, one after the other
            for x in prange(w):
                _row_pixel(Cb, cd, guide, p1, p2tab, S, lines, mins, src, dst, 0, i == 0, down, x, dxs, 1)
            for x in prange(w):
                _row_pixel(Cb, cu, guide, p1, p2tab, S, lines, mins, src, dst, 1, i == 0, up, x, dxs, -1)


@njit(cache=CACHE, inline="always")
def _tile3(Cb, codes, guide, p1, p2tab, S, lines, mins, q, b, B, phase, s, e, zero):
    """sgm_vertical3_cpu's task: steps s..e-1 of sweep q (0: down, 1: up) over
    band b's tile of the phase (0: the band narrowing by a pixel at each side per step;
    1: the gap between bands b - 1 and b widening as much, the pixels the first phase
    left out). Every pixel's three predecessors in the row before are done by then:
    in this tile, earlier, or in the first phase's tiles."""
    if phase == 1 and b == 0:  # (no gap before the first band)
        return
    h, w, n = S.shape
    c0 = b * w // B
    c1 = (b + 1) * w // B
    dy = 1 if q == 0 else -1
    for i in range(s, e):
        j = i - s
        dst = i & 1
        y = i if q == 0 else h - 1 - i
        if phase == 0:
            lo = c0 + j if b > 0 else 0
            hi = c1 - j if b < B - 1 else w
        else:
            lo = c0 - j
            hi = c0 + j
        for x in range(lo, hi):
            cy = y
            if codes is not None:
                census_pixel_costs(codes, y, x, Cb, q)
                cy = q
            _row_pixel3(Cb, cy, guide, p1, p2tab, S, lines, mins, 1 - dst, dst, q, i == 0, y, x, dy, zero)


@njit(parallel=True, cache=CACHE)
def sgm_vertical3_cpu(C, guide, p1, p2tab, S, B, K, codes=None):
    """sgm_vertical_cpu for dxs = (0, 1, -1) (8 paths), each pixel's three directions in
    one loop over d (_row_pixel3), with one fork per K steps and phase instead of one per
    step: the columns in B bands, each step's rows in two phases of tiles (diamond
    tiling, see _tile3) whose pixels depend only on pixels of earlier steps done in the
    same tile or in an earlier phase. K <= (narrowest band) / 2 + 1 keeps the gaps of
    the second phase apart. Both sweeps' tiles run in one fork, but for the steps whose
    rows of the sweep down meet those of the sweep up (the middle of the image: both
    add to S there), which take a fork per sweep."""
    h, w, n = S.shape
    p1 = np.uint16(p1)
    zero = 2 * 2 * 3 * w  # (the last row: see _row_pixel3)
    lines = np.full((zero + 1, n + 2), EDGE, np.uint16)  # row _line_row(parity, sweep, direction, x)
    mins = np.zeros((2, 2, 3, w), np.uint16)
    Cb = C if codes is None else np.empty((2, w, n), np.uint8)  # (row q: sweep q's pixel costs, by x)
    for s in range(0, h, K):
        e = min(s + K, h)
        apart = e - 1 < h - e or h - 1 - s < s  # rows s..e-1 and h-e..h-1-s share none
        for phase in range(2):
            if apart:
                for t in prange(2 * B):
                    _tile3(Cb, codes, guide, p1, p2tab, S, lines, mins, t // B, t % B, B, phase, s, e, zero)
            else:
                for q in range(2):
                    for b in prange(B):
                        _tile3(Cb, codes, guide, p1, p2tab, S, lines, mins, q, b, B, phase, s, e, zero)


# Steps per fork of sgm_vertical3_cpu (at most; the bands may allow fewer). H100
# machine's host, 16 threads, 1482x1000x128, the three sweeps: 8 steps 61.6 ms, 16
# 46.1, 32 47.5, 46 46.6 (a fork per step, the raster passes before: 89.0 in that run).
TILE_STEPS = 32


def vertical_tiles(w, threads):
    """(bands, steps per fork) for sgm_vertical3_cpu: a band per thread (at least 4
    columns wide), as many steps per fork as the bands allow, at most TILE_STEPS."""
    B = max(1, min(threads, w // 4))
    if B == 1:
        return 1, TILE_STEPS
    return B, max(1, min(TILE_STEPS, (w // B) // 2))


@njit(parallel=True, cache=CACHE)
def sgm_vertical_lines_cpu(C, guide, p1, p2tab, S, dx, per_task, threads):
    """S += L(dx, 1) + L(-dx, -1): the same sums as sgm_vertical_cpu gives for one dx,
    with the lines of that direction (x - dx*y constant) in blocks of `per_task`
    neighbouring lines, each block a task that sweeps down and then up the rows: one
    fork for the whole image instead of one per row (with many threads a row's work
    is too small to pay for a fork). Each pixel of a block's row comes from the same
    line's previous row, so the blocks are independent; a row of a block is a run of
    neighbouring pixels, so memory is still read in rows. Thread k takes blocks k,
    k + T, k + 2T, ... (T threads): a prange gives each thread a run of neighbouring
    iterations, and a diagonal direction's lines grow from one pixel at the image's
    corners to a full column in the middle, so runs of blocks would load the threads
    given the middle about twice as much as the average. (`threads`: T, from the caller:
    numba.get_num_threads() in here would keep the function out of the cache.)"""
    h, w, n = C.shape
    u0 = -dx * (h - 1) if dx > 0 else 0  # line u = x - dx*y, over all pixels
    u1 = w - 1 - dx * (h - 1) if dx < 0 else w - 1
    tasks = (u1 - u0 + per_task) // per_task
    p1 = np.uint16(p1)
    T = max(1, min(threads, tasks))
    for k in prange(T):
        for t in range(k, tasks, T):
            a = u0 + t * per_task
            b = min(a + per_task, u1 + 1)
            buf = np.full((2 * (b - a), n + 2), EDGE, np.uint16)  # row 2k + parity: line a + k's L
            mins = np.zeros(2 * (b - a), np.uint16)
            for sweep in range(2):
                dy = 1 if sweep == 0 else -1
                for i in range(h):
                    y = i if sweep == 0 else h - 1 - i
                    dst = i & 1
                    src = 1 - dst
                    for u in range(a, b):
                        x = u + dx * y
                        if x < 0 or x >= w:
                            continue
                        j = 2 * (u - a)
                        px = x - dx * dy  # the previous pixel of the path, in row y - dy
                        if i == 0 or px < 0 or px >= w:  # the first pixel of its line: L = C
                            mins[j + dst] = _start(C, y, S, y, x, buf, j + dst, False)
                        else:
                            p2e = np.uint16(p2tab[abs(np.int32(guide[y, x]) - np.int32(guide[y - dy, px]))])
                            mins[j + dst] = _step(C, y, S, y, x, buf, j + src, j + dst, mins[j + src], p1, p2e,
                                                  False)


# Which vertical sweeps: in tiles (sgm_vertical3_cpu, 8 paths: a fork per 32 rows and
# phase) or raster passes (sgm_vertical_cpu, 4 paths: a fork per row), which touch the
# volumes twice; by lines (sgm_vertical_lines_cpu: one fork per direction) six times.
# On the H100 machine's 16-core host, 16 threads, 8 paths, the three sweeps alternated
# in one process (fourteenth session, random costs), min ms tiles / lines / raster:
# 450x375x64 5.1 / 3.3 / 7.5, 741x500x64 9.0 / 7.8 / 15.8, 1280x720x128 31.2 / 37.6 /
# 52.5, 1482x1000x128 44.3 / 64.1 / 60.4 (8 threads: 83.4 / 99.0 / 91.0); the
# volumes up to 2^25 cells stay in its 300 MiB L3, and there the lines' single
# direction per loop is the cheaper one. One thread, and two on the 2-core machine,
# favour the tiles (or raster passes: at one thread they are the same walk), and so do
# 8 paths over 16 disparities at any count (TILES_MAX_DISPARITIES). All give the same
# sums.
LINES_MIN_THREADS = 4
# Lines per block of sgm_vertical_lines_cpu: on the H100 machine's host, 16 threads,
# 450x375x64, one direction's pass: 8 lines 1.15 ms, 16 0.79-0.86, 24 0.75-0.87, 32
# 0.69-0.73, 48 0.87-1.12, 64 1.45 (741x500: 24-32 best too). At most that many, and as
# many blocks as make whole rounds of the threads: 741 columns in blocks of 32 were 24
# blocks, two rounds for 8 threads and one for the other 8 (blocks of 24: two for all).
LINES_PER_TASK = 32


def lines_per_task(h, w, dx, threads) -> int:
    lines = w + abs(dx) * (h - 1)
    rounds = -(-lines // (threads * LINES_PER_TASK))
    return max(8, -(-lines // (threads * rounds)))


LINES_MAX_CELLS = 1 << 25  # W*H*D
# 8 paths over this many disparities or fewer keep the tiles at any thread count. There a
# step's vector work is small beside its fixed work (guide values, minima, indices),
# which the lines repeat for each of the three directions and the tiles share: one
# thread, 384x288x16, lines 13.7-14.2 ms against tiles 5.3-5.8 (450x375x64: 18.1-20.6
# against 16.9-18.3). H100 machine's host, random costs, the three vertical directions,
# 16 threads, ms lines / tiles (B16, the default), two rounds (thirty-third session):
# 384x288x16 2.43-2.54 / 2.08-2.14; 434x383x32 2.08-2.28 / 2.87-3.09 and 450x375x64
# 2.67-2.96 / 3.30-3.65 (lines kept there).
TILES_MAX_DISPARITIES = 16


def vertical_by_lines(C, paths) -> bool:
    """Whether sgm_cpu runs the vertical sweeps of `paths` directions over the volume C
    by lines (LINES_MIN_THREADS, LINES_MAX_CELLS, TILES_MAX_DISPARITIES)."""
    if paths == 8 and C.shape[2] <= TILES_MAX_DISPARITIES:
        return False
    return numba.get_num_threads() >= LINES_MIN_THREADS and C.size <= LINES_MAX_CELLS


def sgm_cpu(C, guide, p1, p2, adaptive, paths, by_lines=None, out=None, codes=None):
    """The uint16 sum over `paths` directions: 4 or 8 in three sweeps (see above); 16
    (whose knight-move lines skip rows) line by line. `by_lines`: how the vertical
    sweeps run (None: vertical_by_lines decides; the sums are the same). Into `out`
    (h, w, n) uint16 when given (every element is written). With `codes`
    (cost.CensusCodes; 4 or 8 paths, C None) the census costs are computed as the sweeps
    reach each pixel, three times in all, instead of read from a volume: the same sums
    without the volume's byte per cell (the vertical sweeps in tiles or raster passes)."""
    if codes is not None:
        if paths not in (4, 8):
            raise ValueError("census codes instead of a cost volume: 4 or 8 paths only")
        h, w = codes.cl.shape
        n = codes.ndisp
        by_lines = False
        C = np.empty((1, 1, 1), np.uint8)  # (unused: Numba types both branches on codes, see sgm_horizontal_cpu)
    else:
        h, w, n = C.shape
    S = np.empty((h, w, n), np.uint16) if out is None else out
    p2tab = p2_table(p1, p2, adaptive)
    if paths in (4, 8):
        sgm_horizontal_cpu(C, guide, np.int32(p1), p2tab, S, numba.get_num_threads(), codes)
        dxs = [0] if paths == 4 else [0, 1, -1]
        if vertical_by_lines(C, paths) if by_lines is None else by_lines:
            for dx in dxs:
                threads = numba.get_num_threads()
                sgm_vertical_lines_cpu(C, guide, np.int32(p1), p2tab, S, dx, lines_per_task(h, w, dx, threads),
                                       threads)
        else:
            if paths == 8:
                sgm_vertical3_cpu(C, guide, np.int32(p1), p2tab, S, *vertical_tiles(w, numba.get_num_threads()),
                                  codes)
            else:
                sgm_vertical_cpu(C, guide, np.int32(p1), p2tab, S, np.array(dxs, np.int64), codes)
        return S
    for i, (dx, dy) in enumerate(direction_pairs(paths)):
        sgm_line_pair_cpu(C, guide, np.int32(p1), p2tab, S, dx, dy, line_starts(h, w, dx, dy), i == 0)
    return S


# ---------------------------------------------------------------- More Global Matching
# MGM (Facciolo, de Franchis, Meinhardt, BMVC 2015): each pass's recursion takes two
# neighbours a and b of p that the pass has already visited, instead of SGM's one:
#     L(p, d) = C(p, d) + (T_a(d) + T_b(d)) // 2,
#     T_q(d) = min(L(q, d), L(q, d+-1) + P1, min_k L(q, k) + P2') - min_k L(q, k),
# P2' from the grey step between p and q (as SGM's). Where one neighbour lies outside
# the image its T counts alone (C + T_q), where both do L = C. Information reaches p
# from a whole quadrant (or a 90-degree cone) instead of one line, which removes SGM's
# streaks. Each pass is a raster scan: the four "quadrant" passes have one neighbour on
# the current line (a 2-D dependency: a line is walked pixel after pixel), the four
# "cone" passes have both on the previous line (a line's pixels are independent).
# 4 paths: the quadrant passes; 8: all. Neighbour offsets (dx, dy), as in the authors' code.
MGM_PASSES = [((-1, 0), (0, -1)), ((1, 0), (0, 1)), ((0, 1), (-1, 0)), ((0, -1), (1, 0)),
              ((-1, -1), (1, -1)), ((1, -1), (1, 1)), ((1, 1), (-1, 1)), ((-1, 1), (-1, -1))]


@shared
def mgm_value(c, ta, tb, has_a, has_b):
    """L = C + the mean of the two neighbours' terms (rounded down), or the one term that exists."""
    if has_a and has_b:
        return np.int32(c + ((ta + tb) >> 1))
    if has_a:
        return np.int32(c + ta)
    if has_b:
        return np.int32(c + tb)
    return np.int32(c)


def mgm_plan(a, b):
    """How a pass with neighbour offsets a, b is walked: (row_major, su, sv, (adu, adv),
    (bdu, bdv)). Lines u (rows when row_major, else columns) in the order su (+1: 0 up),
    pixels v along a line in the order sv; a neighbour's offset in (u, v). A neighbour
    on the current line comes first (adu == 0); b always lies on the previous line."""
    (ax, ay), (bx, by) = a, b
    row_major = not (ay == 0 and by == 0) and not (ax != 0 and bx != 0 and ax == bx)
    if row_major:
        pa, pb = (ay, ax), (by, bx)
    else:
        pa, pb = (ax, ay), (bx, by)
    if pb[0] == 0:
        pa, pb = pb, pa
    su = -pb[0]
    sv = -pa[1] if pa[0] == 0 else 1
    return row_major, su, sv, pa, pb


@njit(cache=CACHE, inline="always")
def _mgm_pixel(C, guide, p1, p2tab, S, lines, mins, tmp, cur, prv, u, v, U, V, row_major, adu, adv, bdu, bdv, first):
    """L and S at line u, pixel v of a pass (see mgm_plan); lines[cur or prv, v]: the
    current and previous line's L (EDGE-padded), mins their minima."""
    n = C.shape[2]
    u = np.int64(u)  # a prange index is unsigned: mixed with u it would make float coordinates
    v = np.int64(v)
    y = u if row_major else v
    x = v if row_major else u
    g = np.int32(guide[y, x])
    ua, va, ub, vb = u + adu, v + adv, u + bdu, v + bdv
    has_a = 0 <= ua < U and 0 <= va < V
    has_b = 0 <= ub < U and 0 <= vb < V
    la = cur if adu == 0 else prv
    ma = np.int32(0)
    mb = np.int32(0)
    p2a = np.int32(0)
    p2b = np.int32(0)
    if has_a:
        ma = mins[la, va]
        p2a = p2tab[abs(g - np.int32(guide[ua, va] if row_major else guide[va, ua]))]
    if has_b:
        mb = mins[prv, vb]
        p2b = p2tab[abs(g - np.int32(guide[ub, vb] if row_major else guide[vb, ub]))]
    mn = np.int32(EDGE)
    if has_a and has_b:  # the common case: two loops over 1-D views, each of which LLVM vectorises
        A = lines[la, va]  # (one loop that read the line buffer and wrote it and S did not:
        B = lines[prv, vb]  # too many possible overlaps for its run-time checks)
        T = tmp[v]
        Cp = C[y, x]
        for d in range(n):
            ta = sgm_value(np.int32(0), np.int32(A[d + 1]), np.int32(A[d]), np.int32(A[d + 2]), ma, p1, p2a)
            tb = sgm_value(np.int32(0), np.int32(B[d + 1]), np.int32(B[d]), np.int32(B[d + 2]), mb, p1, p2b)
            T[d] = mgm_value(np.int32(Cp[d]), ta, tb, True, True)
        O = lines[cur, v]
        Sp = S[y, x]
        for d in range(n):
            val = T[d]
            O[d + 1] = val
            Sp[d] = val if first else Sp[d] + val
            mn = min(mn, val)
    else:  # an image border: one neighbour or none
        q = la if has_a else prv
        vq = va if has_a else vb
        mq = ma if has_a else mb
        p2q = p2a if has_a else p2b
        one = has_a or has_b
        for d in range(n):
            t = np.int32(0)
            if one:
                t = sgm_value(np.int32(0), np.int32(lines[q, vq, d + 1]), np.int32(lines[q, vq, d]),
                              np.int32(lines[q, vq, d + 2]), mq, p1, p2q)
            val = mgm_value(np.int32(C[y, x, d]), t, t, has_a, has_b)
            lines[cur, v, d + 1] = val
            S[y, x, d] = val if first else S[y, x, d] + val
            mn = min(mn, val)
    mins[cur, v] = mn


@njit(parallel=True, cache=CACHE)
def mgm_pass_cpu(C, guide, p1, p2tab, S, row_major, su, sv, adu, adv, bdu, bdv, first):
    """One MGM pass (see mgm_plan) into S (S = L when `first`, else S += L), keeping only
    the previous and the current line's L. A quadrant pass walks each line pixel after
    pixel (one thread); a cone pass takes a line's pixels in parallel."""
    h, w, n = C.shape
    U, V = (h, w) if row_major else (w, h)
    lines = np.full((2, V, n + 2), EDGE, np.uint16)
    mins = np.zeros((2, V), np.int32)
    tmp = np.empty((V, n), np.int32)  # a pixel's new L, before it goes to lines and S
    for i in range(U):
        u = i if su > 0 else U - 1 - i
        cur = i & 1
        prv = 1 - cur
        if adu == 0:
            for k in range(V):
                v = k if sv > 0 else V - 1 - k
                _mgm_pixel(C, guide, p1, p2tab, S, lines, mins, tmp, cur, prv, u, v, U, V, row_major,
                           adu, adv, bdu, bdv, first)
        else:
            for v in prange(V):
                _mgm_pixel(C, guide, p1, p2tab, S, lines, mins, tmp, cur, prv, u, v, U, V, row_major,
                           adu, adv, bdu, bdv, first)


@njit(cache=CACHE, inline="always")
def _mgm_cell(C, guide, p1, p2tab, S, y, x, A, ma, ga, has_a, B, mb, gb, has_b, O, T, first):
    """L and S at (x, y) from its neighbours' L (A, B: EDGE-padded vectors, minima ma, mb,
    grey levels ga, gb) into O (EDGE-padded); returns min(L). T: scratch of n int32."""
    n = C.shape[2]
    g = np.int32(guide[y, x])
    p2a = p2tab[abs(g - ga)] if has_a else np.int32(0)
    p2b = p2tab[abs(g - gb)] if has_b else np.int32(0)
    Cp = C[y, x]
    if has_a and has_b:  # two loops: each vectorises (see _mgm_pixel); the common case without a branch
        for d in range(n):
            ta = sgm_value(np.int32(0), np.int32(A[d + 1]), np.int32(A[d]), np.int32(A[d + 2]), ma, p1, p2a)
            tb = sgm_value(np.int32(0), np.int32(B[d + 1]), np.int32(B[d]), np.int32(B[d + 2]), mb, p1, p2b)
            T[d] = mgm_value(np.int32(Cp[d]), ta, tb, True, True)
    else:
        for d in range(n):
            ta = np.int32(0)
            tb = np.int32(0)
            if has_a:
                ta = sgm_value(np.int32(0), np.int32(A[d + 1]), np.int32(A[d]), np.int32(A[d + 2]), ma, p1, p2a)
            if has_b:
                tb = sgm_value(np.int32(0), np.int32(B[d + 1]), np.int32(B[d]), np.int32(B[d + 2]), mb, p1, p2b)
            T[d] = mgm_value(np.int32(Cp[d]), ta, tb, has_a, has_b)
    Sp = S[y, x]
    mn = np.int32(EDGE)
    for d in range(n):
        val = T[d]
        O[d + 1] = val
        Sp[d] = val if first else Sp[d] + val
        mn = min(mn, val)
    return mn


# mgm_quadrant_cpu's tiles: small enough for many tiles on an anti-diagonal (teddy: 15 of
# 16 x 32). The tiles cost their bookkeeping: the 4 quadrant passes on a 450x375/64 volume
# take 28 ms in tiles on one thread, 18 ms walked line by line (mgm_pass_cpu, which one
# thread therefore runs), 15 ms in tiles on two threads (2-core machine).
MGM_TILE_LINES, MGM_TILE_PIXELS = 16, 32


@njit(parallel=True, cache=CACHE)
def mgm_quadrant_cpu(C, guide, p1, p2tab, S, su, sv, first, bu, bv):
    """A quadrant pass (row-major; neighbours: the previous pixel of the line and the same
    pixel of the previous line, in the orders su, sv) in tiles of bu lines x bv pixels
    as a wavefront: a tile needs the one before it on its lines and the one above it, so
    the tiles of an anti-diagonal run in parallel. Each block of lines keeps its last
    two lines' L (rows), each line the L of its last pixel done (col)."""
    h, w, n = C.shape
    U, V = h, w
    na = (U + bu - 1) // bu
    nb = (V + bv - 1) // bv
    rows = np.full((na, 2, V, n + 2), EDGE, np.uint16)
    rmin = np.zeros((na, 2, V), np.int32)
    col = np.full((U, n + 2), EDGE, np.uint16)
    cmin = np.zeros(U, np.int32)
    tmp = np.empty((na, n), np.int32)
    for t in range(na + nb - 1):
        for a in prange(max(0, t - nb + 1), min(na, t + 1)):
            b = t - a
            i0 = a * bu
            k0 = b * bv
            k1 = min(V, k0 + bv)
            for i in range(i0, min(U, i0 + bu)):
                y = i if su > 0 else U - 1 - i
                yb = y - su
                cur = i & 1
                pa = a if i > i0 else a - 1  # the previous line's block (its parity: 1 - cur)
                for k in range(k0, k1):
                    x = k if sv > 0 else V - 1 - k
                    xa = x - sv
                    has_a = k > 0
                    has_b = i > 0
                    if k == k0:
                        A = col[i]
                        ma = cmin[i]
                    else:
                        A = rows[a, cur, xa]
                        ma = rmin[a, cur, xa]
                    B = rows[pa, 1 - cur, x] if has_b else col[i]
                    mb = rmin[pa, 1 - cur, x] if has_b else np.int32(0)
                    ga = np.int32(guide[y, xa]) if has_a else np.int32(0)
                    gb = np.int32(guide[yb, x]) if has_b else np.int32(0)
                    rmin[a, cur, x] = _mgm_cell(C, guide, p1, p2tab, S, y, x, A, ma, ga, has_a, B, mb, gb, has_b,
                                                rows[a, cur, x], tmp[a], first)
                xl = k1 - 1 if sv > 0 else V - k1  # the tile's last pixel on the line
                col[i, :] = rows[a, cur, xl]
                cmin[i] = rmin[a, cur, xl]


def mgm_cpu(C, guide, p1, p2, adaptive, paths):
    """The uint16 sum of the MGM passes (4 paths: the quadrant passes, 8: all)."""
    h, w, n = C.shape
    S = np.empty((h, w, n), np.uint16)
    p2tab = p2_table(p1, p2, adaptive)
    for i, (a, b) in enumerate(MGM_PASSES[:paths]):
        row_major, su, sv, (adu, adv), (bdu, bdv) = mgm_plan(a, b)
        if adu == 0 and row_major and numba.get_num_threads() > 1:  # a quadrant pass, in tiles
            mgm_quadrant_cpu(C, guide, np.int32(p1), p2tab, S, su, sv, i == 0, MGM_TILE_LINES, MGM_TILE_PIXELS)
        else:
            mgm_pass_cpu(C, guide, np.int32(p1), p2tab, S, row_major, su, sv, adu, adv, bdu, bdv, i == 0)
    return S
