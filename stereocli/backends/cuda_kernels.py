"""CUDA kernels of every stage. The per-pixel arithmetic is the stages' shared
functions, compiled here a second time as device functions (from `.py_func`), so
the CPU and GPU run the same code; only the loops and launches differ.

Imported only by the CUDA backend (it needs numba-cuda).
"""
import math
import os
import types

from numba import config, cuda, float32, int32, uint32, uint64

from ..stages import aggregate as _agg
from ..stages import cost as _cost
from ..stages import preprocess as _pre
from ..stages import refine as _ref
from ..stages import select as _sel
from ..stages import CACHE, SHARED

OUTSIDE = _cost.OUTSIDE  # the cost of a match outside the right image


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
inside_range = _dev(_cost.inside_range)
right_x = _dev(_cost.right_x)
wta_finish = _dev(_sel.wta_finish)
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

    @cuda.jit(device=True)
    def from_lane(v, src, scratch, w, lane):
        if SGM_LANES == 1:
            return v
        scratch[w, lane] = v
        cuda.syncthreads()
        r = scratch[w, src]
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
    def from_lane(v, src, scratch, w, lane):
        return cuda.shfl_sync(0xFFFFFFFF, v, src)


@cuda.jit(device=True, inline=True)
def _volume_index(w, n):
    """(y, x, d, inside) of this thread's element of a (h, w, n) volume, d fastest (so
    consecutive threads touch consecutive bytes), launched by CudaBackend._launch_rows:
    one grid row per image row, the division in unsigned 32 bits (a 64-bit one costs
    more than the element's work)."""
    i = uint32(cuda.blockIdx.x) * uint32(cuda.blockDim.x) + uint32(cuda.threadIdx.x)
    x = i // uint32(n)
    return int32(cuda.blockIdx.y), int32(x), int32(i - x * uint32(n)), x < uint32(w)


# ------------------------------------------------------------- preprocessing
@cuda.jit(cache=CACHE)
def to_float_kernel(src, out):
    x, y = cuda.grid(2)
    if y < src.shape[0] and x < src.shape[1]:
        out[y, x] = float32(src[y, x])



@cuda.jit(cache=CACHE)
def conv_x_kernel(src, k, out):
    x, y = cuda.grid(2)
    if y < src.shape[0] and x < src.shape[1]:
        out[y, x] = conv_x_at(src, y, x, k)


@cuda.jit(cache=CACHE)
def dog_y_kernel(t1, t2, k1, k2, out):
    x, y = cuda.grid(2)
    if y < t1.shape[0] and x < t1.shape[1]:
        out[y, x] = dog_value(conv_y_at(t1, y, x, k1), conv_y_at(t2, y, x, k2))


@cuda.jit(cache=CACHE)
def bilateral_x_kernel(src, r, inv_ss, inv_sc, out):
    x, y = cuda.grid(2)
    if y < src.shape[0] and x < src.shape[1]:
        out[y, x] = bilateral_x_at(src, y, x, r, inv_ss, inv_sc)


@cuda.jit(cache=CACHE)
def bilateral_y_kernel(src, r, inv_ss, inv_sc, out):
    x, y = cuda.grid(2)
    if y < src.shape[0] and x < src.shape[1]:
        out[y, x] = bilateral_y_at(src, y, x, r, inv_ss, inv_sc)


@cuda.jit(cache=CACHE)
def subtract_mean_kernel(img, mean, out):
    x, y = cuda.grid(2)
    if y < img.shape[0] and x < img.shape[1]:
        out[y, x] = img[y, x] - mean[y, x] + float32(128.0)


# ------------------------------------------------------------- costs
_CENSUS_KERNELS = {}


def census_kernel_for(wx, wy):
    """The census kernel of one window size: with constant loop bounds the window's
    reads unroll and overlap (with the bounds as arguments, one read at a time)."""
    if (wx, wy) not in _CENSUS_KERNELS:
        @cuda.jit(cache=CACHE)
        def census_kernel(img, out):
            x, y = cuda.grid(2)
            if y < img.shape[0] and x < img.shape[1]:
                out[y, x] = census_at(img, y, x, wx, wy)
        _CENSUS_KERNELS[(wx, wy)] = census_kernel
    return _CENSUS_KERNELS[(wx, wy)]


@cuda.jit(device=True, inline=True)
def _census_word(a, crow, xr0, w, tab, count):
    """`count` census costs packed in bytes: of the left string a against the right row's
    strings at xr0, xr0 - 1, ... (OUTSIDE beyond the image); the Hamming distance with the
    popc instruction (the CPU's census_cost_value counts the bits in software: the same
    number), scaled by the table tab."""
    word = uint32(0)
    for b in range(count):
        xr = xr0 - b
        v = uint32(OUTSIDE)
        if xr >= 0 and xr < w:
            v = tab[cuda.popc(a ^ crow[uint32(xr)])]
        word |= v << uint32(8 * b)
    return word


@cuda.jit(device=True, inline=True)
def _shared_scale(scale):
    tab = cuda.shared.array(65, uint32)
    for i in range(cuda.threadIdx.x, 65, cuda.blockDim.x):
        tab[i] = scale[i]
    cuda.syncthreads()
    return tab


@cuda.jit(cache=CACHE)
def census_volume8_kernel(cl, cr, min_d, scale, vol8):
    """The census volume eight disparities per thread, written as one uint64 (D % 8 == 0)."""
    tab = _shared_scale(scale)
    h, w, n8 = vol8.shape
    y, x, wi, inside = _volume_index(w, n8)
    if inside:
        a = cl[y, x]
        crow = cr[y]
        xr0 = int32(right_x(x, min_d, 8 * wi))
        lo = _census_word(a, crow, xr0, w, tab, 4)
        hi = _census_word(a, crow, xr0 - 4, w, tab, 4)
        vol8[y, x, wi] = uint64(lo) | (uint64(hi) << uint64(32))


@cuda.jit(cache=CACHE)
def census_volume4_kernel(cl, cr, min_d, scale, vol4):
    """The census volume four disparities per thread, written as one uint32 (D % 4 == 0)."""
    tab = _shared_scale(scale)
    h, w, n4 = vol4.shape
    y, x, wi, inside = _volume_index(w, n4)
    if inside:
        vol4[y, x, wi] = _census_word(cl[y, x], cr[y], int32(right_x(x, min_d, 4 * wi)), w, tab, 4)


@cuda.jit(cache=CACHE)
def census_volume_kernel(cl, cr, min_d, scale, vol):
    h, w, n = vol.shape
    y, x, d, inside = _volume_index(w, n)
    if inside:
        xr = right_x(x, min_d, d)
        if xr >= 0 and xr < w:
            vol[y, x, d] = census_cost_value(cl[y, x], cr[y, xr], scale)
        else:
            vol[y, x, d] = OUTSIDE


@cuda.jit(cache=CACHE)
def diff_volume_kernel(L, R, min_d, kind, vol):
    h, w, n = vol.shape
    y, x, d, inside = _volume_index(w, n)
    if inside:
        xr = min(max(right_x(x, min_d, d), 0), w - 1)
        vol[y, x, d] = pixel_diff(L, R, y, x, xr, kind)


@cuda.jit(cache=CACHE)
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


@cuda.jit(cache=CACHE)
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


@cuda.jit(cache=CACHE)
def finalize_kernel(M, min_d, kind, ml, ml2, mr, mr2, vol):
    h, w, n = M.shape
    y, x, d, inside = _volume_index(w, n)
    if inside:
        vol[y, x, d] = finalize_at(M, y, x, d, min_d, kind, ml, ml2, mr, mr2)


@cuda.jit(cache=CACHE)
def table_volume_kernel(ql, qr, table, min_d, vol):
    h, w, n = vol.shape
    y, x, d, inside = _volume_index(w, n)
    if inside:
        xr = right_x(x, min_d, d)
        if xr >= 0 and xr < w:
            vol[y, x, d] = table[ql[y, x], qr[y, xr]]
        else:
            vol[y, x, d] = OUTSIDE


@cuda.jit(cache=CACHE)
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
@cuda.jit(cache=CACHE)
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


@cuda.jit(cache=CACHE)
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
    which needs D % 4 == 0 and K % 4 == 0.

    The volumes and the guide are flat: a walk keeps the flat index of its pixel and of
    its lane's first word there, and steps them by constant strides (unsigned indices,
    so no per-access multiply or negative-index fix-up)."""
    GROUPS = 1 if SIM else 32 // G  # path lines per warp
    group_min, from_below, from_above = _group_exchange(G)

    @cuda.jit(device=True, inline=True)
    def load(C1, off, nk, c):
        """The costs of one pixel into c: off is the flat index of this lane's first
        cost (vec: its first uint32 word) there; nk of its K disparities exist."""
        if vec:
            for i in range(K // 4):
                word = C1[uint64(off + i)] if 4 * i < nk else uint32(0)
                for b in range(4):
                    c[4 * i + b] = int32((word >> uint32(8 * b)) & uint32(0xFF))
        else:
            for j in range(K):
                c[j] = int32(C1[uint64(off + j)]) if j < nk else int32(0)

    @cuda.jit(device=True, inline=True)
    def store(S1, off, nk, v):
        if vec:
            for i in range(K // 4):
                if 4 * i < nk:
                    S1[uint64(off + i)] = (uint64(v[4 * i] & 0xFFFF) | (uint64(v[4 * i + 1] & 0xFFFF) << uint64(16))
                                           | (uint64(v[4 * i + 2] & 0xFFFF) << uint64(32))
                                           | (uint64(v[4 * i + 3] & 0xFFFF) << uint64(48)))
        else:
            for j in range(K):
                if j < nk:
                    S1[uint64(off + j)] = v[j]

    @cuda.jit(device=True, inline=True)
    def begin(C1, G1, S1, p, pstep, off, stride, length, nk, cur, c, cn, scratch, w, gl):
        """First pixel of a path (flat index p, lane offset off; the next pixel is at
        p + pstep, off + stride): L = C there; starts the loads of the next pixel's costs
        (into cn) and guide value. Returns (min L of the group, guide here, guide at the
        next pixel)."""
        g = int32(0)
        gn = int32(0)
        if length > 0:
            g = int32(G1[uint64(p)])
            load(C1, off, nk, c)
        if length > 1:
            gn = int32(G1[uint64(p + pstep)])
            load(C1, off + stride, nk, cn)
        m = int32(BIG)
        for j in range(K):
            v = c[j] if j < nk else int32(BIG)
            cur[j] = v
            m = min(m, v)
        if length > 0:
            store(S1, off, nk, cur)
        return group_min(m, scratch, w, gl), g, gn

    @cuda.jit(device=True, inline=True)
    def advance(C1, G1, p1, p2tab, S1, p, pstep, off, stride, s, length, nk, m, gp, g, prev, cur,
                c, cn, scratch, w, gl):
        """Step s of a path, at the pixel (p, off): cur = SGM update of prev with the
        costs loaded a step ago; starts the load of the next pixel's (deeper prefetch
        measured no faster on an H100). A group past the end of its line computes but
        loads and stores nothing (the shuffles need every lane of the warp).
        gp, g: the guide values of the previous and this pixel (loaded a step ahead, like
        the costs). Returns (min cur of the group, g, the next pixel's guide value)."""
        for j in range(K):
            prev[j] = cur[j]
            c[j] = cn[j]
        gn = int32(0)
        if s + 1 < length:
            load(C1, off + stride, nk, cn)
            gn = int32(G1[uint64(p + pstep)])
        p2e = p2tab[abs(g - gp)]  # penalty2 of every grey step, tabulated by the host
        lo0 = from_below(prev[K - 1], scratch, w, gl)
        hiK = from_above(prev[0], scratch, w, gl)
        mloc = int32(BIG)
        for j in range(K):
            lo = prev[j - 1] if j > 0 else lo0
            hi = prev[j + 1] if j + 1 < K else hiK
            v = sgm_value(c[j], prev[j], lo, hi, m, p1, p2e)
            v = v if j < nk else int32(BIG)
            cur[j] = v
            mloc = min(mloc, v)
        if s < length:
            store(S1, off, nk, cur)
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

    @cuda.jit(cache=CACHE, **_REGS("STEREOCLI_SGM_REGS", SGM_REGISTER_CAP.get(K, 0)))
    def sgm_lines_kernel(C1, G1, h, wd, n, p1, p2table, Sd1, dirs, starts):
        """All path lines of all direction pairs in one launch, GROUPS lines per warp
        (starts[i] = (y, x, pair q), longest first). Pair q = dirs[q] = (dx, dy) walks the
        line along r into Sd1[2q] and, at the same time, back along -r into Sd1[2q + 1]:
        only stores, and no two groups write the same element. C1, G1, Sd1[k]: the cost
        volume (vec: as uint32 words), the guide and the path volumes (vec: as uint64
        words), flat. The direction volumes are added by the selection kernel."""
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
        p1i = int32(p1)  # a new name: rebinding p1 would unify back to int64
        y0 = starts[li, 0]
        x0 = starts[li, 1]
        q = starts[li, 2]
        dx = dirs[q, 0]
        dy = dirs[q, 1]
        length = line_length(y0, x0, dx, dy, h, wd) if valid else 0
        maxlen = warp_max(length)
        d0 = gl * K
        nk = int32(n - d0)  # how many of this lane's K disparities exist
        per = n >> 2 if vec else n  # words (vec) or costs per pixel
        first_word = d0 >> 2 if vec else d0
        pstep = dy * wd + dx  # flat step of the forward walk
        stride = pstep * per
        p = y0 * wd + x0
        pb = (y0 + (length - 1) * dy) * wd + x0 + (length - 1) * dx  # the last pixel: start of the walk back
        off = p * per + first_word
        offb = pb * per + first_word
        Sf, Sb = Sd1[2 * q], Sd1[2 * q + 1]
        # the two walks are independent chains: stepping them together hides each one's latency
        m, gp, g = begin(C1, G1, Sf, p, pstep, off, stride, length, nk, cur, c, cn, scratch, w, gl)
        m2, gp2, g2 = begin(C1, G1, Sb, pb, -pstep, offb, -stride, length, nk, cur2, c2, cn2, scratch, w, gl)
        for s in range(1, maxlen):
            p += pstep
            off += stride
            pb -= pstep
            offb -= stride
            m, gp, g = advance(C1, G1, p1i, p2tab, Sf, p, pstep, off, stride, s, length, nk, m, gp, g,
                               prev, cur, c, cn, scratch, w, gl)
            m2, gp2, g2 = advance(C1, G1, p1i, p2tab, Sb, pb, -pstep, offb, -stride, s, length, nk, m2, gp2, g2,
                                  prev2, cur2, c2, cn2, scratch, w, gl)

    return sgm_lines_kernel


def _REGS(var, default=0):
    """A register cap (cuda.jit's max_registers; 0 = the compiler's choice), with a
    tuning knob in the environment variable `var`."""
    r = int(os.environ.get(var, default))
    return {"max_registers": r} if r and not SIM else {}


_SGM_KERNELS = {}
# Disparities per lane K: 4 up to 128 disparities (one to 32 lanes per line), 16 above.
# Measured on an H100 (benchmarks/gpu.py; STEREOCLI_SGM_K=4/8/16 forces K and
# STEREOCLI_SGM_REGS the register cap): at 128 disparities K = 4 capped at 64 registers
# (28 warps per SM instead of 16 for K = 8) is 13 % (KITTI) and 10 % (1080p, 8 paths)
# faster than K = 8; K = 16 wins at 256 disparities.
SGM_REGISTER_CAP = {4: 64}


def sgm_kernel_for(ndisp):
    """(kernel, G, vec) for D disparities: G lanes per path line, K disparities per lane."""
    if SIM:
        G, K = SGM_LANES, SGM_K
    else:
        K = int(os.environ.get("STEREOCLI_SGM_K", "0")) or (4 if ndisp <= 128 else 16)
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


@cuda.jit(cache=CACHE)
def sgm_sum4_kernel(Sp4, S4):
    """The direction volumes added four disparities at a time as packed uint64 words:
    exact, because a sum never exceeds 65535 (config bounds paths * (255 + P2)), so no
    carry crosses from one 16-bit value into the next."""
    npairs, h, w, n4 = Sp4.shape
    y, x, wi, inside = _volume_index(w, n4)
    if inside:
        acc = uint64(0)
        for q in range(npairs):
            acc += Sp4[q, y, x, wi]
        S4[y, x, wi] = acc


@cuda.jit(cache=CACHE)
def sgm_sum_kernel(Sp, S):
    npairs, h, w, n = Sp.shape
    y, x, d, inside = _volume_index(w, n)
    if inside:
        acc = int32(0)
        for q in range(npairs):
            acc += Sp[q, y, x, d]
        S[y, x, d] = acc


# ------------------------------------------------------------- selection
SELECT_WARPS = 1 if SIM else 8  # pixel groups (warps) per block of the selection kernel
SELECT_SEGMENT = 4096  # right pixels per block (their running minima live in shared memory)
NO_KEY = 0x7FFFFFFF


def _make_select_kernel(vec, HOLD):
    """Winner-takes-all for the left image and, in the same pass, for the right image,
    reading the nv direction volumes of SGM (or one aggregated volume) and adding them
    as it goes: the sum is never stored. `vec`: uint16 volumes read as uint64 words of
    four disparities (D % 4 == 0, D <= MAX_SGM_DISPARITIES), HOLD words per lane held in
    registers between the two passes; otherwise one value per read, read again by the
    second pass.

    Block (segment, y) owns the right pixels xr of one segment of row y and the left
    pixels x of the same columns. A group of SGM_LANES lanes (a warp) takes one left
    pixel at a time, its lanes striding over d: the key cost << shift | d reduced with
    shuffles gives the smallest cost and its first index at once (the CPU's tie rule),
    a second pass the uniqueness runner-up, the subpixel neighbours come from the lanes
    holding them; lane 0 ends with the CPU's wta_finish. For the right image every
    (x, d) whose right pixel lies in the segment does an atomic min of the same key on
    that pixel's shared slot: the first d of the smallest cost, as the CPU's
    wta_right_at. Left pixels outside the segment (up to D - 1 + |min_d| columns beside
    it) are visited for that alone."""
    LANES = SGM_LANES
    PER = 4 if vec else 1  # disparities per read

    @cuda.jit(device=True, inline=True)
    def read(V, nv, base, i):
        """The summed costs of read i of a pixel (base: the pixel's first read in V's rows)."""
        acc = uint64(0)
        for v in range(nv):
            acc += uint64(V[v, uint64(base + i)])
        return acc

    @cuda.jit(device=True, inline=True)
    def value(acc, j):
        """Cost j of a read (vec: 16-bit field j, in 32-bit arithmetic)."""
        if vec:
            half = uint32(acc >> uint64(32)) if j >= 2 else uint32(acc)
            return int32((half >> uint32(16 * (j % 2))) & uint32(0xFFFF))
        return int32(acc)

    @cuda.jit(device=True, inline=True)
    def held_value(held, d):
        """This lane's candidate for cost d: field d % 4 of its held read (d // 4) // LANES
        (the lane (d // 4) % LANES holds the right one)."""
        k = (d >> 2) // LANES
        acc = uint64(0)
        for kk in range(HOLD):
            if kk == k:
                acc = held[kk]
        return int32((acc >> uint64(16 * (d & 3))) & uint64(0xFFFF))

    @cuda.jit(cache=CACHE, **_REGS("STEREOCLI_SELECT_REGS", 64))  # 4 blocks per SM, not 3: 15 % faster
    def select_kernel(V, nv, wd, n, shift, min_d, uniqueness, subpixel, right, out, out_r):
        rkey = cuda.shared.array(SELECT_SEGMENT, int32)
        scratch = cuda.shared.array((SELECT_WARPS, SGM_LANES), int32)  # the simulator's exchange
        held = cuda.local.array(HOLD, uint64)
        y = cuda.blockIdx.y
        a = cuda.blockIdx.x * SELECT_SEGMENT  # this block's columns a..b-1
        b = min(a + SELECT_SEGMENT, wd)
        tid = cuda.threadIdx.x
        w = tid // LANES
        lane = tid % LANES
        for i in range(tid, b - a, cuda.blockDim.x):
            rkey[i] = NO_KEY
        cuda.syncthreads()
        reads = (n + PER - 1) // PER
        rounds = HOLD if vec else (reads + LANES - 1) // LANES  # reads per lane
        mask = int32((1 << shift) - 1)
        xs = a
        xe = b - 1
        if right:  # also the left pixels whose right pixel x - min_d - d can fall in a..b-1
            xs = max(0, min(xs, a + min_d))
            xe = min(wd - 1, max(xe, b - 1 + min_d + n - 1))
        for x in range(xs + w, xe + 1, SELECT_WARPS):
            lo, hi = inside_range(wd, n, x, min_d)
            lo = int32(lo)
            hi = int32(hi)
            shiftx = int32(right_x(x, min_d, 0) - a)  # right pixel (in the segment) of d = 0
            base = (y * wd + x) * reads
            kmin = int32(NO_KEY)
            for k in range(rounds):
                i = int32(lane + LANES * k)
                acc = uint64(0)
                if i < reads:
                    acc = read(V, nv, base, i)
                    for j in range(PER):
                        d = int32(PER * i + j)
                        if d >= lo and d <= hi:
                            key = int32((value(acc, j) << shift) | d)
                            kmin = min(kmin, key)
                            xr = int32(shiftx - d)
                            if right and xr >= 0 and xr < b - a:
                                cuda.atomic.min(rkey, xr, key)
                if vec:
                    held[k] = acc
            if x >= a and x < b:  # a pixel of this block: its left disparity
                kmin = warp_min(kmin, scratch, w, lane)
                if hi < lo:
                    if lane == 0:
                        out[y, x] = float32(math.nan)
                else:
                    best = kmin & mask
                    bc = kmin >> shift
                    other = int32(NO_KEY)
                    if uniqueness > float32(0.0):
                        for k in range(rounds):
                            i = int32(lane + LANES * k)
                            if i < reads:
                                acc = held[k] if vec else read(V, nv, base, i)
                                for j in range(PER):
                                    d = int32(PER * i + j)
                                    if d >= lo and d <= hi and (d < best - 1 or d > best + 1):
                                        other = min(other, value(acc, j))
                        other = warp_min(other, scratch, w, lane)
                    c0 = int32(0)
                    c2 = int32(0)
                    if subpixel and best > lo and best < hi:
                        if vec:
                            c0 = from_lane(held_value(held, best - 1), int32(((best - 1) >> 2) % LANES), scratch, w,
                                           lane)
                            c2 = from_lane(held_value(held, best + 1), int32(((best + 1) >> 2) % LANES), scratch, w,
                                           lane)
                        elif lane == 0:
                            c0 = int32(read(V, nv, base, best - 1))
                            c2 = int32(read(V, nv, base, best + 1))
                    if lane == 0:
                        out[y, x] = wta_finish(best, bc, other, c0, c2, lo, hi, min_d, uniqueness, subpixel)
        if right:
            cuda.syncthreads()
            for i in range(tid, b - a, cuda.blockDim.x):
                k = rkey[i]
                out_r[y, a + i] = float32(math.nan) if k == NO_KEY else float32((k & mask) + min_d)

    return select_kernel


_SELECT_KERNELS = {}


def select_kernel_for(vec, n):
    """The selection kernel for D = n disparities; vec: packed words, each lane holding
    ceil(D / 4 / lanes) of them."""
    hold = (n // 4 + SGM_LANES - 1) // SGM_LANES if vec else 1
    if (vec, hold) not in _SELECT_KERNELS:
        _SELECT_KERNELS[(vec, hold)] = _make_select_kernel(vec, hold)
    return _SELECT_KERNELS[(vec, hold)]


# ------------------------------------------------------------- refinement
@cuda.jit(cache=CACHE)
def lr_check_kernel(disp, disp_r, max_diff, out):
    x, y = cuda.grid(2)
    if y < disp.shape[0] and x < disp.shape[1]:
        out[y, x] = lr_check_at(disp, disp_r, y, x, max_diff)


@cuda.jit(cache=CACHE)
def fill_kernel(disp, mode, out):
    x, y = cuda.grid(2)
    if y < disp.shape[0] and x < disp.shape[1]:
        out[y, x] = fill_row_at(disp, y, x, mode)


@cuda.jit(cache=CACHE)
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


@cuda.jit(cache=CACHE)
def ccl_init_kernel(disp, labels):
    x, y = cuda.grid(2)
    h, w = disp.shape
    if y < h and x < w:
        p = y * w + x
        labels[p] = p if disp[y, x] == disp[y, x] else -1


@cuda.jit(cache=CACHE)
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


@cuda.jit(cache=CACHE)
def ccl_count_kernel(labels, sizes):
    i = cuda.grid(1)
    if i < labels.shape[0] and labels[i] >= 0:
        r = _find(labels, i)
        labels[i] = r
        cuda.atomic.add(sizes, r, 1)


@cuda.jit(cache=CACHE)
def speckle_apply_kernel(disp, labels, sizes, max_size, out):
    x, y = cuda.grid(2)
    h, w = disp.shape
    if y < h and x < w:
        lab = labels[y * w + x]
        if lab < 0 or sizes[_find(labels, lab)] <= max_size:
            out[y, x] = float32(math.nan)
        else:
            out[y, x] = disp[y, x]
