"""CUDA kernels of every stage. The per-pixel arithmetic is the stages' shared
functions, compiled here a second time as device functions (from `.py_func`), so
the CPU and GPU run the same code; only the loops and launches differ.

Imported only by the CUDA backend (it needs numba-cuda).
"""
import math
import os

from numba import config, cuda, int32, float32

from ..stages import aggregate as _agg
from ..stages import cost as _cost
from ..stages import preprocess as _pre
from ..stages import refine as _ref
from ..stages import select as _sel


def _dev(f):
    return cuda.jit(device=True, inline=True)(f.py_func)


# the shared per-pixel arithmetic, as device functions
conv_x_at = _dev(_pre.conv_x_at)
conv_y_at = _dev(_pre.conv_y_at)
bilateral_x_at = _dev(_pre.bilateral_x_at)
bilateral_y_at = _dev(_pre.bilateral_y_at)
dog_value = _dev(_pre.dog_value)
census_at = _dev(_cost.census_at)
census_cost_value = _dev(_cost.census_cost_value)
pixel_diff = _dev(_cost.pixel_diff)
scaled_cost = _dev(_cost.scaled_cost)
zncc_cost_value = _dev(_cost.zncc_cost_value)
zssd_value = _dev(_cost.zssd_value)
penalty2 = _dev(_agg.penalty2)
sgm_value = _dev(_agg.sgm_value)
wta_at = _dev(_sel.wta_at)
wta_right_at = _dev(_sel.wta_right_at)
lr_check_at = _dev(_ref.lr_check_at)
median_at = _dev(_ref.median_at)
fill_row_at = _dev(_ref.fill_row_at)

SIM = bool(config.ENABLE_CUDASIM)
TPB = 256
BIG = 65535
# SGM: one group of SGM_LANES threads per path line (a warp on a GPU); lane l keeps
# disparities l*k .. l*k + k - 1 (k <= MAXK, the largest lane-array size) in registers and swaps edge values and
# the minimum with its neighbours through warp shuffles. The simulator has no
# shuffles and its barriers are slow: there a group is one thread by default
# (STEREOCLI_SIM_LANES=4 tests the exchange through a shared-memory twin).
if SIM:
    SGM_LANES = int(os.environ.get("STEREOCLI_SIM_LANES", "1"))
    MAXK = 16
    SGM_WARPS = 1  # groups per block: the twin's syncthreads must be a group barrier
else:
    SGM_LANES = 32
    MAXK = 8
    SGM_WARPS = 4
MAX_SGM_DISPARITIES = SGM_LANES * MAXK


# ------------------------------------------------------------- warp exchange
if SIM:
    @cuda.jit(device=True)
    def warp_min(v, scratch, w, lane):
        if SGM_LANES == 1:
            return v
        scratch[w, lane] = v
        cuda.syncthreads()
        m = scratch[w, 0]
        for i in range(1, SGM_LANES):
            m = min(m, scratch[w, i])
        cuda.syncthreads()
        return m

    @cuda.jit(device=True)
    def from_lane_below(v, scratch, w, lane):
        if SGM_LANES == 1:
            return int32(BIG)
        scratch[w, lane] = v
        cuda.syncthreads()
        r = scratch[w, lane - 1] if lane > 0 else int32(BIG)
        cuda.syncthreads()
        return r

    @cuda.jit(device=True)
    def from_lane_above(v, scratch, w, lane):
        if SGM_LANES == 1:
            return int32(BIG)
        scratch[w, lane] = v
        cuda.syncthreads()
        r = scratch[w, lane + 1] if lane < SGM_LANES - 1 else int32(BIG)
        cuda.syncthreads()
        return r
else:
    @cuda.jit(device=True, inline=True)
    def warp_min(v, scratch, w, lane):
        v = min(v, cuda.shfl_xor_sync(0xFFFFFFFF, v, 16))
        v = min(v, cuda.shfl_xor_sync(0xFFFFFFFF, v, 8))
        v = min(v, cuda.shfl_xor_sync(0xFFFFFFFF, v, 4))
        v = min(v, cuda.shfl_xor_sync(0xFFFFFFFF, v, 2))
        v = min(v, cuda.shfl_xor_sync(0xFFFFFFFF, v, 1))
        return v

    @cuda.jit(device=True, inline=True)
    def from_lane_below(v, scratch, w, lane):
        r = cuda.shfl_up_sync(0xFFFFFFFF, v, 1)
        return r if lane > 0 else int32(BIG)

    @cuda.jit(device=True, inline=True)
    def from_lane_above(v, scratch, w, lane):
        r = cuda.shfl_down_sync(0xFFFFFFFF, v, 1)
        return r if lane < 31 else int32(BIG)


@cuda.jit(device=True, inline=True)
def _volume_index(i, w, n):
    """Flat index of an element of a (h, w, n) volume -> (y, x, d); d varies fastest,
    so consecutive threads touch consecutive bytes."""
    return i // (n * w), (i // n) % w, i % n


# ------------------------------------------------------------- preprocessing
@cuda.jit(cache=True)
def conv_x_kernel(src, k, out):
    x, y = cuda.grid(2)
    if y < src.shape[0] and x < src.shape[1]:
        out[y, x] = conv_x_at(src, y, x, k)


@cuda.jit(cache=True)
def dog_y_kernel(t1, t2, k1, k2, out):
    x, y = cuda.grid(2)
    if y < t1.shape[0] and x < t1.shape[1]:
        out[y, x] = dog_value(conv_y_at(t1, y, x, k1), conv_y_at(t2, y, x, k2))


@cuda.jit(cache=True)
def bilateral_x_kernel(src, r, inv_ss, inv_sc, out):
    x, y = cuda.grid(2)
    if y < src.shape[0] and x < src.shape[1]:
        out[y, x] = bilateral_x_at(src, y, x, r, inv_ss, inv_sc)


@cuda.jit(cache=True)
def bilateral_y_kernel(src, r, inv_ss, inv_sc, out):
    x, y = cuda.grid(2)
    if y < src.shape[0] and x < src.shape[1]:
        out[y, x] = bilateral_y_at(src, y, x, r, inv_ss, inv_sc)


@cuda.jit(cache=True)
def subtract_mean_kernel(img, mean, out):
    x, y = cuda.grid(2)
    if y < img.shape[0] and x < img.shape[1]:
        out[y, x] = img[y, x] - mean[y, x] + float32(128.0)


# ------------------------------------------------------------- costs
@cuda.jit(cache=True)
def census_kernel(img, wx, wy, out):
    x, y = cuda.grid(2)
    if y < img.shape[0] and x < img.shape[1]:
        out[y, x] = census_at(img, y, x, wx, wy)


@cuda.jit(cache=True)
def census_volume_kernel(cl, cr, min_d, scale, vol):
    i = cuda.grid(1)
    h, w, n = vol.shape
    if i < h * w * n:
        y, x, d = _volume_index(i, w, n)
        xr = x - min_d - d
        if xr >= 0 and xr < w:
            vol[y, x, d] = census_cost_value(cl[y, x], cr[y, xr], scale)
        else:
            vol[y, x, d] = 255


@cuda.jit(cache=True)
def diff_volume_kernel(L, R, min_d, kind, vol):
    i = cuda.grid(1)
    h, w, n = vol.shape
    if i < h * w * n:
        y, x, d = _volume_index(i, w, n)
        xr = min(max(x - min_d - d, 0), w - 1)
        vol[y, x, d] = pixel_diff(L, R, y, x, xr, kind)


@cuda.jit(cache=True)
def box_x_kernel(V, rx, out):
    """Running sum along x; one thread per (y, d). Same float order as box_mean_cpu."""
    i = cuda.grid(1)
    h, w, n = V.shape
    if i < h * n:
        d = i % n
        y = i // n
        acc = float32(0.0)
        for k in range(-rx, rx + 1):
            acc += V[y, min(max(k, 0), w - 1), d]
        for x in range(w):
            out[y, x, d] = acc
            acc = acc + (V[y, min(x + rx + 1, w - 1), d] - V[y, max(x - rx, 0), d])


@cuda.jit(cache=True)
def box_y_kernel(T, ry, inv, out):
    i = cuda.grid(1)
    h, w, n = T.shape
    if i < w * n:
        d = i % n
        x = i // n
        acc = float32(0.0)
        for k in range(-ry, ry + 1):
            acc += T[min(max(k, 0), h - 1), x, d]
        for y in range(h):
            out[y, x, d] = acc * inv
            acc = acc + (T[min(y + ry + 1, h - 1), x, d] - T[max(y - ry, 0), x, d])


@cuda.jit(cache=True)
def finalize_kernel(M, min_d, kind, ml, ml2, mr, mr2, vol):
    i = cuda.grid(1)
    h, w, n = M.shape
    if i < h * w * n:
        y, x, d = _volume_index(i, w, n)
        xr = x - min_d - d
        if xr < 0 or xr >= w:
            vol[y, x, d] = 255
        elif kind == 0:
            vol[y, x, d] = scaled_cost(M[y, x, d])
        elif kind == 1:
            vol[y, x, d] = scaled_cost(math.sqrt(max(M[y, x, d], float32(0.0))))
        elif kind == 2:
            vol[y, x, d] = scaled_cost(zssd_value(M[y, x, d], ml[y, x], mr[y, xr]))
        else:
            vol[y, x, d] = zncc_cost_value(M[y, x, d], ml[y, x], ml2[y, x], mr[y, xr], mr2[y, xr])


@cuda.jit(cache=True)
def table_volume_kernel(ql, qr, table, min_d, vol):
    i = cuda.grid(1)
    h, w, n = vol.shape
    if i < h * w * n:
        y, x, d = _volume_index(i, w, n)
        xr = x - min_d - d
        if xr >= 0 and xr < w:
            vol[y, x, d] = table[ql[y, x], qr[y, xr]]
        else:
            vol[y, x, d] = 255


@cuda.jit(cache=True)
def joint_histogram_kernel(ql, qr, disp, hist):
    x, y = cuda.grid(2)
    h, w = ql.shape
    if y < h and x < w:
        d = disp[y, x]
        if d == d:
            xr = int32(math.floor(float32(x) - d + float32(0.5)))
            if xr >= 0 and xr < w:
                cuda.atomic.add(hist, (int32(ql[y, x]), int32(qr[y, xr])), 1)


# ------------------------------------------------------------- aggregation
@cuda.jit(cache=True)
def box_u8_x_kernel(C, r, out):
    i = cuda.grid(1)
    h, w, n = C.shape
    if i < h * n:
        d = i % n
        y = i // n
        acc = int32(0)
        for k in range(-r, r + 1):
            acc += C[y, min(max(k, 0), w - 1), d]
        for x in range(w):
            out[y, x, d] = acc
            acc += int32(C[y, min(x + r + 1, w - 1), d]) - int32(C[y, max(x - r, 0), d])


@cuda.jit(cache=True)
def box_u8_y_kernel(T, r, out):
    i = cuda.grid(1)
    h, w, n = T.shape
    if i < w * n:
        d = i % n
        x = i // n
        area = (2 * r + 1) * (2 * r + 1)
        acc = int32(0)
        for k in range(-r, r + 1):
            acc += T[min(max(k, 0), h - 1), x, d]
        for y in range(h):
            out[y, x, d] = (acc + area // 2) // area
            acc += T[min(y + r + 1, h - 1), x, d] - T[max(y - r, 0), x, d]


def _make_sgm_kernel(maxk):
    """The SGM line kernel with lane arrays of `maxk` values (a compile-time size, so
    the unrolled loops keep them in registers); one is built per size."""

    @cuda.jit(device=True, inline=True)
    def load_costs(C, y, x, d0, n, c):
        for j in range(maxk):
            d = d0 + j
            c[j] = int32(C[y, x, d]) if d < n else int32(0)

    @cuda.jit(device=True, inline=True)
    def start_line(S, y, x, d0, n, k, cur, c, scratch, w, lane):
        """L = C (costs in c) at the first pixel of a path; S = L; returns the group's min."""
        m = int32(BIG)
        for j in range(maxk):
            d = d0 + j
            if j < k and d < n:
                v = c[j]
                cur[j] = v
                m = min(m, v)
                S[y, x, d] = v
            else:
                cur[j] = int32(BIG)
        return warp_min(m, scratch, w, lane)

    @cuda.jit(device=True, inline=True)
    def step_line(S, y, x, d0, n, k, prev, cur, c, mp, p1, p2e, scratch, w, lane):
        """One SGM step of a lane group: cur = update(prev) with costs c; S = cur; returns min(cur)."""
        last = prev[0]
        for j in range(maxk):  # prev[k - 1] without a dynamic index
            if j == k - 1:
                last = prev[j]
        below = from_lane_below(last, scratch, w, lane)
        above = from_lane_above(prev[0], scratch, w, lane)
        m = int32(BIG)
        for j in range(maxk):
            d = d0 + j
            if j < k and d < n:
                lo = prev[j - 1] if j > 0 else below
                hi = prev[j + 1] if j + 1 < k else above
                v = sgm_value(c[j], prev[j], lo, hi, mp, p1, p2e)
                cur[j] = v
                m = min(m, v)
                S[y, x, d] = v
            else:
                cur[j] = int32(BIG)
        return warp_min(m, scratch, w, lane)

    @cuda.jit(device=True, inline=True)
    def walk(C, guide, p1, p2, adaptive, S, y, x, dx, dy, d0, n, k, a, b, c, c2, scratch, w, lane):
        """Aggregate one path from (y, x) along (dx, dy) to the image edge, writing L to S.
        The L arrays (a, b) and cost arrays (c, c2) alternate in a loop unrolled by two
        so that each stays in registers; the next pixel's costs are loaded before this
        pixel's update. Returns the last pixel (y, x)."""
        h, wd = guide.shape
        load_costs(C, y, x, d0, n, c)
        m = start_line(S, y, x, d0, n, k, a, c, scratch, w, lane)
        ny = y + dy
        nx = x + dx
        if ny < 0 or ny >= h or nx < 0 or nx >= wd:
            return y, x
        load_costs(C, ny, nx, d0, n, c)
        while True:
            py, px = y, x
            y, x = ny, nx
            ny = y + dy
            nx = x + dx
            more = not (ny < 0 or ny >= h or nx < 0 or nx >= wd)
            if more:
                load_costs(C, ny, nx, d0, n, c2)
            p2e = penalty2(p1, p2, adaptive, guide[y, x], guide[py, px])
            m = step_line(S, y, x, d0, n, k, a, b, c, m, p1, p2e, scratch, w, lane)
            if not more:
                return y, x
            # the same with the roles of (a, b) and (c, c2) swapped
            py, px = y, x
            y, x = ny, nx
            ny = y + dy
            nx = x + dx
            more = not (ny < 0 or ny >= h or nx < 0 or nx >= wd)
            if more:
                load_costs(C, ny, nx, d0, n, c)
            p2e = penalty2(p1, p2, adaptive, guide[y, x], guide[py, px])
            m = step_line(S, y, x, d0, n, k, b, a, c2, m, p1, p2e, scratch, w, lane)
            if not more:
                return y, x

    @cuda.jit(cache=True)
    def sgm_lines_kernel(C, guide, p1, p2, adaptive, Sd, dirs, starts):
        """All path lines of all direction pairs in one launch: one lane group per line
        (starts[i] = (y, x, pair q)). Pair q = dirs[q] = (dx, dy) walks the line along r
        into Sd[2q], then back along -r into Sd[2q + 1]: only stores, and no two groups
        write the same element. sgm_sum_kernel adds the direction volumes."""
        scratch = cuda.shared.array((SGM_WARPS, SGM_LANES), int32)
        a = cuda.local.array(maxk, int32)
        b = cuda.local.array(maxk, int32)
        c = cuda.local.array(maxk, int32)
        c2 = cuda.local.array(maxk, int32)
        w = cuda.threadIdx.x // SGM_LANES
        lane = cuda.threadIdx.x % SGM_LANES
        line = cuda.blockIdx.x * SGM_WARPS + w
        if line >= starts.shape[0]:
            return
        n = C.shape[2]
        k = (n + SGM_LANES - 1) // SGM_LANES
        d0 = lane * k
        q = starts[line, 2]
        dx = dirs[q, 0]
        dy = dirs[q, 1]
        y, x = walk(C, guide, p1, p2, adaptive, Sd[2 * q], starts[line, 0], starts[line, 1], dx, dy, d0, n, k,
                    a, b, c, c2, scratch, w, lane)
        walk(C, guide, p1, p2, adaptive, Sd[2 * q + 1], y, x, -dx, -dy, d0, n, k, a, b, c, c2, scratch, w, lane)

    return sgm_lines_kernel


# lane-array sizes: the smallest that holds ceil(D / SGM_LANES) is used
SGM_SIZES = (16,) if SIM else (1, 2, 4, 8)
SGM_KERNELS = {m: _make_sgm_kernel(m) for m in SGM_SIZES}


def sgm_kernel_for(ndisp):
    k = (ndisp + SGM_LANES - 1) // SGM_LANES
    return SGM_KERNELS[min(m for m in SGM_SIZES if m >= k)]


@cuda.jit(cache=True)
def sgm_sum_kernel(Sp, S):
    i = cuda.grid(1)
    npairs, h, w, n = Sp.shape
    if i < h * w * n:
        y, x, d = _volume_index(i, w, n)
        acc = int32(0)
        for q in range(npairs):
            acc += Sp[q, y, x, d]
        S[y, x, d] = acc


# ------------------------------------------------------------- selection
@cuda.jit(cache=True)
def wta_kernel(S, min_d, uniqueness, subpixel, out):
    x, y = cuda.grid(2)
    if y < S.shape[0] and x < S.shape[1]:
        out[y, x] = wta_at(S, y, x, min_d, uniqueness, subpixel)


@cuda.jit(cache=True)
def wta_right_kernel(S, min_d, out):
    x, y = cuda.grid(2)
    if y < S.shape[0] and x < S.shape[1]:
        out[y, x] = wta_right_at(S, y, x, min_d)


# ------------------------------------------------------------- refinement
@cuda.jit(cache=True)
def lr_check_kernel(disp, disp_r, max_diff, out):
    x, y = cuda.grid(2)
    if y < disp.shape[0] and x < disp.shape[1]:
        out[y, x] = lr_check_at(disp, disp_r, y, x, max_diff)


@cuda.jit(cache=True)
def fill_kernel(disp, mode, out):
    x, y = cuda.grid(2)
    if y < disp.shape[0] and x < disp.shape[1]:
        out[y, x] = fill_row_at(disp, y, x, mode)


@cuda.jit(cache=True)
def median_kernel(disp, r, out):
    window = cuda.local.array(25, float32)
    x, y = cuda.grid(2)
    if y < disp.shape[0] and x < disp.shape[1]:
        out[y, x] = median_at(disp, y, x, r, window)


# Speckle filter: connected components by union-find with atomicMin (Playne & Hawick),
# then region sizes by atomic counts. Same regions as the CPU flood fill.
@cuda.jit(device=True)
def _find(labels, p):
    while labels[p] != p:
        p = labels[p]
    return p


@cuda.jit(device=True)
def _union(labels, a, b):
    done = False
    while not done:
        a = _find(labels, a)
        b = _find(labels, b)
        if a < b:
            old = cuda.atomic.min(labels, b, a)
            done = old == b
            b = old
        elif b < a:
            old = cuda.atomic.min(labels, a, b)
            done = old == a
            a = old
        else:
            done = True


@cuda.jit(cache=True)
def ccl_init_kernel(disp, labels):
    x, y = cuda.grid(2)
    h, w = disp.shape
    if y < h and x < w:
        p = y * w + x
        labels[p] = p if disp[y, x] == disp[y, x] else -1


@cuda.jit(cache=True)
def ccl_merge_kernel(disp, max_diff, labels):
    x, y = cuda.grid(2)
    h, w = disp.shape
    if y < h and x < w:
        v = disp[y, x]
        if v == v:
            p = y * w + x
            if x + 1 < w:
                u = disp[y, x + 1]
                if u == u and abs(u - v) <= max_diff:
                    _union(labels, p, p + 1)
            if y + 1 < h:
                u = disp[y + 1, x]
                if u == u and abs(u - v) <= max_diff:
                    _union(labels, p, p + w)


@cuda.jit(cache=True)
def ccl_count_kernel(labels, sizes):
    i = cuda.grid(1)
    if i < labels.shape[0] and labels[i] >= 0:
        r = _find(labels, i)
        labels[i] = r
        cuda.atomic.add(sizes, r, 1)


@cuda.jit(cache=True)
def speckle_apply_kernel(disp, labels, sizes, max_size, out):
    x, y = cuda.grid(2)
    h, w = disp.shape
    if y < h and x < w:
        lab = labels[y * w + x]
        if lab < 0 or sizes[_find(labels, lab)] <= max_size:
            out[y, x] = float32(math.nan)
        else:
            out[y, x] = disp[y, x]
