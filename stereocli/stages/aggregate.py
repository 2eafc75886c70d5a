"""Cost aggregation: Semi-Global Matching over 4, 8 or 16 paths.

For each path direction r the aggregated cost is
    L(p, d) = C(p, d) + min(L(p-r, d), L(p-r, d+-1) + P1, min_k L(p-r, k) + P2') - min_k L(p-r, k)
where P2' is P2, or with adaptive P2 scaled down by the grey step |I(p) - I(p-r)|.
Each L stays below 256 + P2 (uint16); their sum over all paths S fits uint16
(config.validate bounds P2 for that).
"""
import numpy as np
from numba import njit, prange

from . import shared

# (dx, dy): the previous pixel on the path is (x - dx, y - dy)
DIRECTIONS = {
    4: [(1, 0), (-1, 0), (0, 1), (0, -1)],
    8: [(1, 0), (-1, 0), (0, 1), (0, -1), (1, 1), (-1, 1), (1, -1), (-1, -1)],
    16: [(1, 0), (-1, 0), (0, 1), (0, -1), (1, 1), (-1, 1), (1, -1), (-1, -1),
         (2, 1), (-2, 1), (1, 2), (-1, 2), (2, -1), (-2, -1), (1, -2), (-1, -2)],
}


def split_directions(paths: int):
    """-> (down, up): int32 arrays of (dx, |dy|) for the paths swept top to bottom (dy > 0)
    and bottom to top (dy < 0). The two horizontal paths are always there and run apart."""
    dirs = DIRECTIONS[paths]
    down = np.array([(dx, dy) for dx, dy in dirs if dy > 0], np.int32).reshape(-1, 2)
    up = np.array([(dx, -dy) for dx, dy in dirs if dy < 0], np.int32).reshape(-1, 2)
    return down, up


@shared
def penalty2(p1, p2, adaptive, g, g_prev):
    """P2 for one step; with adaptive P2 it shrinks with the grey step (never below P1)."""
    if adaptive:
        step = abs(np.int32(g) - np.int32(g_prev))
        return max(p1, (p2 * 16) // (16 + step))
    return p2


@shared
def sgm_value(c, l_prev, l_lo, l_hi, min_prev, p1, p2):
    """One SGM update: c + min(L(d), L(d-1)+P1, L(d+1)+P1, minL+P2) - minL (all int32)."""
    m = min(l_prev, min(l_lo, l_hi) + p1)
    m = min(m, min_prev + p2)
    return c + m - min_prev


@njit(cache=True, inline="always")
def _step(cost, prev, out, p1, p2):
    """out[:] = SGM update of `prev` (a path's L at the previous pixel) with costs `cost`; returns min(out)."""
    n = cost.shape[0]
    mp = np.int32(65535)
    for d in range(n):
        mp = min(mp, np.int32(prev[d]))
    big = np.int32(65535)
    mn = np.int32(65535)
    for d in range(n):
        lo = np.int32(prev[d - 1]) if d > 0 else big
        hi = np.int32(prev[d + 1]) if d < n - 1 else big
        v = sgm_value(np.int32(cost[d]), np.int32(prev[d]), lo, hi, mp, p1, p2)
        out[d] = v
        mn = min(mn, v)
    return mn


@njit(parallel=True, cache=True)
def sgm_horizontal_cpu(C, guide, p1, p2, adaptive, S):
    """S = L(->) + L(<-), each row independently."""
    h, w, n = C.shape
    for y in prange(h):
        a = np.empty(n, np.uint16)
        b = np.empty(n, np.uint16)
        for d in range(n):
            a[d] = C[y, 0, d]
            S[y, 0, d] = C[y, 0, d]
        for x in range(1, w):
            p2e = penalty2(p1, p2, adaptive, guide[y, x], guide[y, x - 1])
            _step(C[y, x], a, b, p1, p2e)
            for d in range(n):
                S[y, x, d] = b[d]
            a, b = b, a
        for d in range(n):
            a[d] = C[y, w - 1, d]
            S[y, w - 1, d] += C[y, w - 1, d]
        for x in range(w - 2, -1, -1):
            p2e = penalty2(p1, p2, adaptive, guide[y, x], guide[y, x + 1])
            _step(C[y, x], a, b, p1, p2e)
            for d in range(n):
                S[y, x, d] += b[d]
            a, b = b, a


@njit(parallel=True, cache=True)
def sgm_sweep_cpu(C, guide, p1, p2, adaptive, S, dirs, backward):
    """Adds to S the paths `dirs` = (dx, |dy|), sweeping rows top to bottom, or bottom
    to top with `backward` (the previous pixel is then (x - dx, y + |dy|)). Rows are sequential, pixels of a row run in parallel. A ring of three
    rows per direction holds the previous L (|dy| <= 2)."""
    h, w, n = C.shape
    nd = dirs.shape[0]
    buf = np.empty((nd, 3, w, n), np.uint16)
    for step in range(h):
        y = h - 1 - step if backward else step
        slot = step % 3
        for x in prange(w):
            for k in range(nd):
                dx = dirs[k, 0]
                dy = dirs[k, 1]
                px = x - dx
                ps = step - dy
                out = buf[k, slot, x]
                if ps < 0 or px < 0 or px >= w:
                    for d in range(n):
                        out[d] = C[y, x, d]
                else:
                    py = y + dy if backward else y - dy
                    p2e = penalty2(p1, p2, adaptive, guide[y, x], guide[py, px])
                    _step(C[y, x], buf[k, ps % 3, px], out, p1, p2e)
                for d in range(n):
                    S[y, x, d] += out[d]


@njit(parallel=True, cache=True)
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
