"""The selection kernel (stages/select.py on the GPU): adds SGM's direction volumes as it reads them, and finds the left and right winner-takes-all disparities in one pass."""
import math

from numba import cuda, float32, int32, uint32, uint64

from ...stages import cost as _cost
from ...stages import select as _sel
from .common import _REGS, CACHE, SGM_LANES, SIM, from_lane, warp_min, device_twins

cst = device_twins(_cost)  # the stage's shared arithmetic, as device functions
sel = device_twins(_sel)  # the stage's shared arithmetic, as device functions

SELECT_WARPS = 1 if SIM else 8  # pixel groups (warps) per block of the selection kernel
SELECT_SEGMENT = 4096  # right pixels per block (their running minima live in shared memory)
NO_KEY = 0x7FFFFFFF
NO_RUNNER = _sel.NO_RUNNER  # the uniqueness runner-up when there is none (margin_confidence: 1)


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
    def select_kernel(V, nv, wd, n, shift, min_d, uniqueness, subpixel, right, confidence, out, out_r, out_c):
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
        reads = int32((n + PER - 1) // PER)
        rounds = HOLD if vec else (reads + LANES - 1) // LANES  # reads per lane
        mask = int32((1 << shift) - 1)
        shift32 = int32(shift)
        seg = int32(b - a)
        xs = a
        xe = b - 1
        if right:  # also the left pixels whose right pixel x - min_d - d can fall in a..b-1
            xs = max(0, min(xs, a + min_d))
            xe = min(wd - 1, max(xe, b - 1 + min_d + n - 1))
        # Per pixel in 32-bit arithmetic (each result cast back: Numba widens int32
        # arithmetic to int64, which the GPU runs as two instructions): the kernel is bound
        # by the instructions it issues (ncu at 1920x1080/128: 71 % of the SMs' issue
        # rate, 420 instructions a pixel). H100, selection ms before / after: 741x500
        # 0.252 / 0.219, 1242x375 0.322 / 0.283, 1920x1080/128 1.33 / 1.18, 3840x2160
        # 7.82 / 7.47. The pixel's first read in V: row (the block's row, once) + x * reads.
        lo0 = int32(wd - 1 + min_d)  # lo = max(0, x - lo0), hi = min(n - 1, x - min_d): inside_range
        n1 = int32(n - 1)
        min_d32 = int32(min_d)
        shift0 = int32(cst.right_x(0, min_d, 0) - a)  # right pixel (in the segment) of d = 0 at x = 0
        row = uint64(y) * uint64(wd) * uint64(reads)
        for x in range(xs + w, xe + 1, SELECT_WARPS):
            x32 = int32(x)
            lo = int32(max(int32(0), int32(x32 - lo0)))
            hi = int32(min(n1, int32(x32 - min_d32)))
            shiftx = int32(x32 + shift0)
            base = row + uint64(x32) * uint64(reads)
            kmin = int32(NO_KEY)
            for k in range(rounds):
                i = int32(lane + LANES * k)
                acc = uint64(0)
                if i < reads:
                    acc = read(V, nv, base, i)
                    for j in range(PER):
                        d = int32(PER * i + j)
                        if d >= lo and d <= hi:
                            key = int32(int32(value(acc, j) << shift32) | d)
                            kmin = min(kmin, key)
                            xr = int32(shiftx - d)
                            if right and xr >= 0 and xr < seg:
                                cuda.atomic.min(rkey, xr, key)
                if vec:
                    held[k] = acc
            if x >= a and x < b:  # a pixel of this block: its left disparity
                kmin = warp_min(kmin, scratch, w, lane)
                if hi < lo:
                    if lane == 0:
                        out[y, x] = float32(math.nan)
                        if confidence:
                            out_c[y, x] = float32(0.0)
                else:
                    best = int32(kmin & mask)
                    bc = int32(kmin >> shift32)
                    other = int32(NO_RUNNER)
                    if uniqueness > float32(0.0) or confidence:
                        below, above = int32(best - 1), int32(best + 1)
                        for k in range(rounds):
                            i = int32(lane + LANES * k)
                            if i < reads:
                                acc = held[k] if vec else read(V, nv, base, i)
                                for j in range(PER):
                                    d = int32(PER * i + j)
                                    if d >= lo and d <= hi and (d < below or d > above):
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
                        out[y, x] = sel.wta_finish(best, bc, other, c0, c2, lo, hi, min_d, uniqueness, subpixel)
                        if confidence:
                            out_c[y, x] = sel.margin_confidence(bc, other)
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
