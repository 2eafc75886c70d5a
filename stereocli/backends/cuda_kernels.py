"""CUDA kernels of every stage. The per-pixel arithmetic is the stages' shared
functions, compiled here a second time as device functions (from `.py_func`), so
the CPU and GPU run the same code; only the loops and launches differ.

Imported only by the CUDA backend (it needs numba-cuda).
"""
import math
import os
import types

from numba import config, cuda, float32, int32, int64, uint32, uint64

from ..stages import aggregate as _agg
from ..stages import cost as _cost
from ..stages import preprocess as _pre
from ..stages import refine as _ref
from ..stages import select as _sel
from ..stages import SHARED


_DEVICE = {}  # id of a CPU-compiled shared function -> its device twin


def _dev(f):
    """The device function of a shared function: its Python source compiled again with
    cuda.jit, with the shared functions it calls replaced by their device twins."""
    if id(f) not in _DEVICE:
        py = f.py_func
        env = dict(py.__globals__)
        for name in py.__code__.co_names:
            if any(env.get(name) is g for g in SHARED):
                env[name] = _dev(env[name])
        fn = types.FunctionType(py.__code__, env, py.__name__, py.__defaults__, py.__closure__)
        _DEVICE[id(f)] = cuda.jit(device=True, inline=True)(fn)
    return _DEVICE[id(f)]


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
finalize_at = _dev(_cost.finalize_at)
sgm_value = _dev(_agg.sgm_value)
wta_range = _dev(_sel.wta_range)
wta_finish = _dev(_sel.wta_finish)
wta_right_at = _dev(_sel.wta_right_at)
lr_check_at = _dev(_ref.lr_check_at)
median_at = _dev(_ref.median_at)
fill_row_at = _dev(_ref.fill_row_at)

SIM = bool(config.ENABLE_CUDASIM)
TPB = 256
BIG = 65535
# SGM: one group of G lanes per path line, 32 / G lines per warp (as libSGM does); lane
# l keeps disparities 16l .. 16l + 15 in registers and swaps edge values and the minimum
# with its neighbours through warp shuffles. The simulator has no shuffles and its
# barriers are slow: there a group is one thread by default (STEREOCLI_SIM_LANES=4
# tests the exchange through a shared-memory twin), one group per block.
if SIM:
    SGM_LANES = int(os.environ.get("STEREOCLI_SIM_LANES", "1"))
    SGM_WARPS = 1  # groups per block: the twin's syncthreads must be a group barrier
else:
    SGM_LANES = 32
    SGM_WARPS = 4
# disparities per lane (at most); under the simulator's multi-lane test, 2, so that few disparities span lanes
SGM_K = 2 if SIM and SGM_LANES > 1 else 16
MAX_SGM_DISPARITIES = SGM_LANES * SGM_K


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
def to_float_kernel(src, out):
    x, y = cuda.grid(2)
    if y < src.shape[0] and x < src.shape[1]:
        out[y, x] = float32(src[y, x])



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
def census_volume4_kernel(cl, cr, min_d, scale, vol4):
    """The census volume four disparities per thread, written as one uint32 (D % 4 == 0);
    the Hamming distance with the popc instruction (the CPU's census_cost_value counts
    the bits in software: the same number)."""
    i = cuda.grid(1)
    h, w, n4 = vol4.shape
    if i < h * w * n4:
        y, x, wi = _volume_index(i, w, n4)
        a = cl[y, x]
        word = uint32(0)
        for b in range(4):
            xr = x - min_d - (4 * wi + b)
            v = uint32(255)
            if xr >= 0 and xr < w:
                v = uint32(scale[cuda.popc(a ^ cr[y, xr])])
            word |= v << uint32(8 * b)
        vol4[y, x, wi] = word


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
        vol[y, x, d] = finalize_at(M, y, x, d, min_d, kind, ml, ml2, mr, mr2)


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


def _group_exchange(G):
    """Min over a group of G lanes and the edge values of the neighbouring lanes, for
    groups of G aligned lanes inside a warp (several path lines per warp)."""
    if SIM:
        return warp_min, from_lane_below, from_lane_above

    @cuda.jit(device=True, inline=True)
    def group_min(v, scratch, w, gl):
        off = G // 2
        while off > 0:
            v = min(v, cuda.shfl_xor_sync(0xFFFFFFFF, v, off))
            off //= 2
        return v

    @cuda.jit(device=True, inline=True)
    def below(v, scratch, w, gl):
        r = cuda.shfl_up_sync(0xFFFFFFFF, v, 1)
        return r if gl > 0 else int32(BIG)

    @cuda.jit(device=True, inline=True)
    def above(v, scratch, w, gl):
        r = cuda.shfl_down_sync(0xFFFFFFFF, v, 1)
        return r if gl < G - 1 else int32(BIG)

    return group_min, below, above


def _make_sgm_kernel(G, K, vec):
    """The SGM line kernel for groups of G lanes, each lane holding K disparities in
    registers (a group covers G * K disparities). `vec`: the cost volume is read as
    uint32 words (4 costs) and the path volume written as uint64 words (4 values),
    which needs D % 4 == 0 and K % 4 == 0."""
    GROUPS = 1 if SIM else 32 // G  # path lines per warp
    group_min, from_below, from_above = _group_exchange(G)

    @cuda.jit(device=True, inline=True)
    def load(C, C4, y, x, wd, d0, n, c):
        """The costs of pixel (y, x) into c (C4: the volume as flat uint32 words)."""
        if vec:
            base = (y * wd + x) * (n >> 2)
            for i in range(K // 4):
                wi = (d0 >> 2) + i
                word = C4[base + wi] if wi < (n >> 2) else uint32(0)
                for b in range(4):
                    c[4 * i + b] = int32((word >> uint32(8 * b)) & uint32(0xFF))
        else:
            for j in range(K):
                d = d0 + j
                c[j] = int32(C[y, x, d]) if d < n else int32(0)

    @cuda.jit(device=True, inline=True)
    def store(S, S4, y, x, wd, d0, n, v):
        if vec:
            base = (y * wd + x) * (n >> 2)
            for i in range(K // 4):
                wi = (d0 >> 2) + i
                if wi < (n >> 2):
                    S4[base + wi] = (uint64(v[4 * i] & 0xFFFF) | (uint64(v[4 * i + 1] & 0xFFFF) << uint64(16))
                                    | (uint64(v[4 * i + 2] & 0xFFFF) << uint64(32))
                                    | (uint64(v[4 * i + 3] & 0xFFFF) << uint64(48)))
        else:
            for j in range(K):
                d = d0 + j
                if d < n:
                    S[y, x, d] = v[j]

    @cuda.jit(device=True, inline=True)
    def begin(C, C4, guide, S, S4, y, x, dx, dy, length, d0, n, cur, c, cn, scratch, w, gl):
        """First pixel of a path: L = C there; starts the loads of the next pixel's costs
        (into cn) and guide value. Returns (min L of the group, guide here, guide at the
        next pixel)."""
        wd = guide.shape[1]
        g = int32(0)
        gn = int32(0)
        if length > 0:
            g = int32(guide[y, x])
        if length > 1:
            gn = int32(guide[y + dy, x + dx])
        if length > 0:
            load(C, C4, y, x, wd, d0, n, c)
        if length > 1:
            load(C, C4, y + dy, x + dx, wd, d0, n, cn)
        m = int32(BIG)
        for j in range(K):
            v = c[j] if d0 + j < n else int32(BIG)
            cur[j] = v
            m = min(m, v)
        if length > 0:
            store(S, S4, y, x, wd, d0, n, cur)
        return group_min(m, scratch, w, gl), g, gn

    @cuda.jit(device=True, inline=True)
    def advance(C, C4, guide, p1, p2tab, S, S4, y, x, dx, dy, s, length, d0, n, m, gp, g, prev, cur,
                c, cn, scratch, w, gl):
        """Step s of a path, at pixel (y, x) coming from (y - dy, x - dx): cur = SGM update
        of prev with the costs loaded a step ago; starts the load of the next pixel's
        (deeper prefetch measured no faster on an H100). A group past the end of its line computes
        but loads and stores nothing (the shuffles need every lane of the warp).
        gp, g: the guide values of the previous and this pixel (loaded a step ahead, like
        the costs). Returns (min cur of the group, g, the next pixel's guide value)."""
        wd = guide.shape[1]
        active = s < length
        for j in range(K):
            prev[j] = cur[j]
            c[j] = cn[j]
        if s + 1 < length:
            load(C, C4, y + dy, x + dx, wd, d0, n, cn)
        gn = int32(0)
        if s + 1 < length:
            gn = int32(guide[y + dy, x + dx])
        p2e = p2tab[abs(g - gp)]  # penalty2 of every grey step, tabulated by the host
        lo0 = from_below(prev[K - 1], scratch, w, gl)
        hiK = from_above(prev[0], scratch, w, gl)
        mloc = int32(BIG)
        for j in range(K):
            lo = prev[j - 1] if j > 0 else lo0
            hi = prev[j + 1] if j + 1 < K else hiK
            v = sgm_value(c[j], prev[j], lo, hi, m, p1, p2e)
            v = v if d0 + j < n else int32(BIG)
            cur[j] = v
            mloc = min(mloc, v)
        if active:
            store(S, S4, y, x, wd, d0, n, cur)
        return group_min(mloc, scratch, w, gl), g, gn

    @cuda.jit(device=True, inline=True)
    def line_length(y, x, dx, dy, h, wd):
        steps = 1 << 30
        if dx > 0:
            steps = min(steps, (wd - 1 - x) // dx)
        elif dx < 0:
            steps = min(steps, x // (-dx))
        if dy > 0:
            steps = min(steps, (h - 1 - y) // dy)
        elif dy < 0:
            steps = min(steps, y // (-dy))
        return steps + 1

    @cuda.jit(device=True, inline=True)
    def warp_max(v):
        if SIM:
            return v
        for off in (16, 8, 4, 2, 1):
            v = max(v, cuda.shfl_xor_sync(0xFFFFFFFF, v, off))
        return v

    @cuda.jit(cache=True)
    def sgm_lines_kernel(C, C4, guide, p1, p2table, Sd, Sd4, dirs, starts):
        """All path lines of all direction pairs in one launch, GROUPS lines per warp
        (starts[i] = (y, x, pair q), longest first). Pair q = dirs[q] = (dx, dy) walks the
        line along r into Sd[2q] and, at the same time, back along -r into Sd[2q + 1]:
        only stores, and no two groups write the same element. sgm_sum_kernel adds the
        direction volumes."""
        scratch = cuda.shared.array((SGM_WARPS, SGM_LANES), int32)  # the simulator's exchange
        p2tab = cuda.shared.array(256, int32)
        for i in range(cuda.threadIdx.x, 256, cuda.blockDim.x):
            p2tab[i] = p2table[i]
        cuda.syncthreads()  # before any thread returns
        prev = cuda.local.array(K, int32)  # the walk along r
        cur = cuda.local.array(K, int32)
        c = cuda.local.array(K, int32)  # costs of this pixel and of the next
        cn = cuda.local.array(K, int32)
        prev2 = cuda.local.array(K, int32)  # the walk back along -r, interleaved with it
        cur2 = cuda.local.array(K, int32)
        c2 = cuda.local.array(K, int32)
        cn2 = cuda.local.array(K, int32)
        tid = cuda.threadIdx.x
        if SIM:
            w, gl, grp = 0, tid, 0
        else:
            w = tid // 32
            gl = (tid % 32) % G
            grp = (tid % 32) // G
        first = (cuda.blockIdx.x * SGM_WARPS + w) * GROUPS
        nlines = starts.shape[0]
        if first >= nlines:
            return  # the whole warp is idle
        line = first + grp
        valid = line < nlines
        li = line if valid else first
        h, wd = guide.shape
        n = C.shape[2]
        y0 = starts[li, 0]
        x0 = starts[li, 1]
        q = starts[li, 2]
        dx = dirs[q, 0]
        dy = dirs[q, 1]
        length = line_length(y0, x0, dx, dy, h, wd) if valid else 0
        maxlen = warp_max(length)
        d0 = gl * K
        ye = y0 + (length - 1) * dy
        xe = x0 + (length - 1) * dx
        Sf, Sf4, Sb, Sb4 = Sd[2 * q], Sd4[2 * q], Sd[2 * q + 1], Sd4[2 * q + 1]
        # the two walks are independent chains: stepping them together hides each one's latency
        m, gp, g = begin(C, C4, guide, Sf, Sf4, y0, x0, dx, dy, length, d0, n, cur, c, cn, scratch, w, gl)
        m2, gp2, g2 = begin(C, C4, guide, Sb, Sb4, ye, xe, -dx, -dy, length, d0, n, cur2, c2, cn2, scratch, w,
                            gl)
        y, x, yb, xb = y0, x0, ye, xe
        for s in range(1, maxlen):
            y += dy
            x += dx
            yb -= dy
            xb -= dx
            m, gp, g = advance(C, C4, guide, p1, p2tab, Sf, Sf4, y, x, dx, dy, s, length, d0, n, m,
                               gp, g, prev, cur, c, cn, scratch, w, gl)
            m2, gp2, g2 = advance(C, C4, guide, p1, p2tab, Sb, Sb4, yb, xb, -dx, -dy, s, length, d0, n,
                                  m2, gp2, g2, prev2, cur2, c2, cn2, scratch, w, gl)

    return sgm_lines_kernel


_SGM_KERNELS = {}
# Disparities per lane K: the smallest of 4, 8, 16 with 16 * K >= D, so that a group
# has at most 16 lanes (two or more lines per warp) and each lane enough independent
# work. Measured on an H100 (benchmarks/gpu.py with STEREOCLI_SGM_K=4/8/16 forcing K):
# K = 16 wins only at 256 disparities; K = 4 and 8 are within 5 % of each other below.


def sgm_kernel_for(ndisp):
    """(kernel, G, vec) for D disparities: G lanes per path line, K disparities per lane."""
    if SIM:
        G, K = SGM_LANES, SGM_K
    else:
        K = int(os.environ.get("STEREOCLI_SGM_K", "0")) or next((k for k in (4, 8) if 16 * k >= ndisp), 16)
        G = 1
        while G * K < ndisp:
            G *= 2
        if G > 32:
            raise ValueError(f"{ndisp} disparities need more than 32 lanes of {K}")
    vec = (not SIM) and ndisp % 4 == 0 and K % 4 == 0
    if (G, K, vec) not in _SGM_KERNELS:
        _SGM_KERNELS[(G, K, vec)] = _make_sgm_kernel(G, K, vec)
    return _SGM_KERNELS[(G, K, vec)], G, vec


def sgm_lines_per_block(G):
    return 1 if SIM else SGM_WARPS * (32 // G)


@cuda.jit(cache=True)
def sgm_sum4_kernel(Sp4, S4):
    """The direction volumes added four disparities at a time as packed uint64 words:
    exact, because a sum never exceeds 65535 (config bounds paths * (255 + P2)), so no
    carry crosses from one 16-bit value into the next."""
    i = cuda.grid(1)
    npairs, h, w, n4 = Sp4.shape
    if i < h * w * n4:
        y, x, wi = _volume_index(i, w, n4)
        acc = uint64(0)
        for q in range(npairs):
            acc += Sp4[q, y, x, wi]
        S4[y, x, wi] = acc


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
    """One warp per pixel (one lane group in the simulator): the lanes stride over d,
    then reduce (cost << 32 | d) with shuffles, which gives the smallest cost and its
    first index at once; the same for the uniqueness test's runner-up. Lane 0 ends
    with the CPU's wta_finish."""
    scratch = cuda.shared.array((SGM_WARPS, SGM_LANES), int64)
    w = cuda.threadIdx.x // SGM_LANES
    lane = cuda.threadIdx.x % SGM_LANES
    pix = cuda.blockIdx.x * SGM_WARPS + w
    h, wd, n = S.shape
    if pix >= h * wd:
        return  # a whole warp: every lane has the same pixel
    y = pix // wd
    x = pix % wd
    lo, hi = wta_range(wd, n, x, min_d)
    if hi < lo:
        if lane == 0:
            out[y, x] = float32(math.nan)
        return
    key = int64(0x7FFFFFFFFFFFFFFF)
    for d in range(lo + lane, hi + 1, SGM_LANES):
        key = min(key, (int64(S[y, x, d]) << int64(32)) | int64(d))
    key = warp_min(key, scratch, w, lane)
    best = int32(key & int64(0xFFFFFFFF))
    bc = int32(key >> int64(32))
    other = int64(0x7FFFFFFF)
    if uniqueness > float32(0.0):
        for d in range(lo + lane, hi + 1, SGM_LANES):
            if d < best - 1 or d > best + 1:
                other = min(other, int64(S[y, x, d]))
        other = warp_min(other, scratch, w, lane)
    if lane == 0:
        out[y, x] = wta_finish(S, y, x, best, bc, int32(other), lo, hi, min_d, uniqueness, subpixel)


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
