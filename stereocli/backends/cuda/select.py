"""The selection kernel (stages/select.py on the GPU): adds SGM's direction volumes as it reads them, and finds the left and right winner-takes-all disparities in one pass."""
import math
import os

from numba import cuda, float32, int32, uint32, uint64

from ...stages import cost as _cost
from ...stages import select as _sel
from .common import (stable_cache_key, _REGS, CACHE, SGM_LANES, SIM, auto_on_off, group_min_for, min_u16x2_for, warp_min,
                     device_twins)

cst = device_twins(_cost)  # the stage's shared arithmetic, as device functions
sel = device_twins(_sel)  # the stage's shared arithmetic, as device functions

# Warps per block of the selection kernel. A block takes a row (up to SELECT_SEGMENT
# columns), so 1080 rows made 2.05 waves of 8-warp blocks (4 a SM, 64 registers): the
# third wave ran 24 blocks on an idle GPU. With 16 warps a row takes half the time in
# the same number of warps per SM. H100, kernel_times selection ms, 8 / 16 / 32 warps
# (one process each): 741x500/64 0.068 / 0.067 / 0.071, 1242x375/128 0.181 / 0.176 /
# 0.161, 1920x1080/128 0.723 / 0.668 / 0.672, 1920x1080/256 1.424 / 1.310 / 1.304,
# 3840x2160/256 4.91 / 4.73 / 4.77. STEREOCLI_SELECT_WARPS sets it (tuning).
SELECT_WARPS = 1 if SIM else int(os.environ.get("STEREOCLI_SELECT_WARPS", "16"))
SELECT_REGS = 64  # the kernel's register cap: 4 blocks of 8 warps an SM, not 3 (15 % faster)
# With SGM in bands (aggregate_bands), the rows the bands have finished are selected
# while the bands go on with the others (CudaBackend.select; the middle rows finish
# first, once both sweeps have passed them), each range's launch on one of
# SELECT_STREAMS side streams by turns. H100, benchmarks/gpu.py kernel ms, after the
# bands / overlapped (thirtieth session, three rounds): 1920x1080/256/8 6.80-6.83 /
# 6.62-6.65, 3840x2160/256/8 26.63-26.81 / 25.90-25.97; the bands lose part of what the
# selection gains (aggregation 5.67 -> 6.04-6.09 ms, 22.5 -> 23.7-24.2), and below 2^28
# cells they lose all of it (1920x1080/128/8 3.59-3.60 / 3.61-3.65). The ranges' launches
# on one stream ran one after another, each a block's time (6.80 -> 7.67 ms); on 8
# streams 6.71; with the bands on streams of the greatest priority the selection waited
# for them (6.91-6.93). STEREOCLI_SELECT_OVERLAP=auto|on|off.
SELECT_WITH_BANDS = os.environ.get("STEREOCLI_SELECT_OVERLAP", "auto")
SELECT_WITH_BANDS_MIN_CELLS = 1 << 28
SELECT_STREAMS = int(os.environ.get("STEREOCLI_SELECT_STREAMS", "4"))


def select_with_bands(cells):
    """Whether the selection follows SGM's bands over `cells` cells (W x H x D) as they
    finish rows (SELECT_WITH_BANDS)."""
    return auto_on_off(SELECT_WITH_BANDS, cells >= SELECT_WITH_BANDS_MIN_CELLS)


SELECT_SEGMENT = 4096  # right pixels per block (their running minima live in shared memory)
NO_KEY = 0x7FFFFFFF
KEY_SHIFT = 15  # key = cost << KEY_SHIFT | d: costs below 2**16 and d below 2**15 fill a positive int32
KEY_MASK = (1 << KEY_SHIFT) - 1
KEY_FIELD = 0x7FFF8000  # a 16-bit field's place in a key
NO_RUNNER = _sel.NO_RUNNER  # the uniqueness runner-up when there is none (margin_confidence: 1)


def _group_min(P):
    """The min over a pixel's group of P lanes: warp shuffles within aligned groups, every
    lane of the warp taking part; under the simulator (P = SGM_LANES, one group a warp)
    the shared-memory twin."""
    return warp_min if SIM else group_min_for(P)


def _make_select_kernel(vec, HOLD, P, WARPS, ONE, cc):
    """Winner-takes-all for the left image and, in the same pass, for the right image,
    reading the nv direction volumes of SGM (or one aggregated volume) and adding them
    as it goes: the sum is never stored. `vec`: uint16 volumes read as uint64 words of
    four disparities (D % 4 == 0, D <= MAX_SGM_DISPARITIES), HOLD words per lane held in
    registers between the two passes; otherwise one value per read, read again by the
    second pass.

    Block (segment, y) owns the right pixels xr of one segment of row y and the left
    pixels x of the same columns. A group of P lanes takes one left pixel (a warp
    32 / P of them side by side), its lanes striding over d: the key cost << KEY_SHIFT | d
    reduced with shuffles gives the smallest cost and its first index at once (the
    CPU's tie rule), a second pass the uniqueness runner-up and (vec) the subpixel
    neighbours, each a group minimum; the group's first lane ends with the CPU's
    wta_finish. For the right image every (x, d) whose right pixel lies in the segment
    does an atomic min of the same key on that pixel's shared slot: the first d of the
    smallest cost, as the CPU's wta_right_at. Left pixels outside the segment (up to
    D - 1 + |min_d| columns beside it) are visited for that alone."""
    LANES = SGM_LANES
    PIX = LANES // P  # pixels a warp takes at once
    PER = 4 if vec else 1  # disparities per read
    gmin = _group_min(P)
    min2 = min_u16x2_for(cc)

    @cuda.jit(device=True, inline=True)
    def read(V, nv, base, i):
        """The summed costs of read i of a pixel (base: the pixel's first read in V's rows);
        ONE: V is one volume (SGM's sum), read without a loop over volumes."""
        if ONE:
            return uint64(V[0, uint64(base + i)])
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
    def field_key(acc, j, d):
        """The key of cost j of a read and disparity d: vec, its 16-bit field moved to
        KEY_FIELD in 32 bits (a shift and a mask, no extraction); d has bits 0..KEY_SHIFT-1."""
        if vec:
            half = uint32(acc >> uint64(32)) if j >= 2 else uint32(acc)
            if j % 2 == 0:
                return int32(((half << uint32(KEY_SHIFT)) & uint32(KEY_FIELD)) | uint32(d))
            return int32(((half >> uint32(16 - KEY_SHIFT)) & uint32(KEY_FIELD)) | uint32(d))
        return int32(int32(acc) << KEY_SHIFT) | d

    @cuda.jit(cache=CACHE, **_REGS("STEREOCLI_SELECT_REGS", SELECT_REGS))
    def select_kernel(V, nv, wd, n, min_d, uniqueness, subpixel, right, confidence, out, out_r, out_c, y0):
        """Rows y0, y0 + 1, ... (a block per row and segment of SELECT_SEGMENT
        columns): every row, or the rows of the bands of SGM that have finished
        (CudaBackend.select)."""
        # the right pixels' keys, the segment's last column first: a read's four cells
        # then go to ascending slots, at constant offsets from the first one's address
        rkey = cuda.shared.array(SELECT_SEGMENT, int32)
        scratch = cuda.shared.array((WARPS, SGM_LANES), int32)  # the simulator's exchange
        held = cuda.local.array(HOLD, uint64)
        y = int32(cuda.blockIdx.y + y0)
        a = cuda.blockIdx.x * SELECT_SEGMENT  # this block's columns a..b-1
        b = min(a + SELECT_SEGMENT, wd)
        tid = cuda.threadIdx.x
        w = tid // LANES
        lane = tid % LANES
        sub = int32(lane // P)  # this lane's pixel among the warp's PIX
        gl = int32(lane % P)  # its place in that pixel's group
        for i in range(tid, b - a, cuda.blockDim.x):
            rkey[i] = NO_KEY
        cuda.syncthreads()
        reads = int32((n + PER - 1) // PER)
        rounds = HOLD if vec else (reads + P - 1) // P  # reads per lane
        seg = int32(b - a)
        seg1 = int32(seg - 1)
        xs = a
        xe = b - 1
        if right:  # also the left pixels whose right pixel x - min_d - d can fall in a..b-1
            xs = max(0, min(xs, a + min_d))
            xe = min(wd - 1, max(xe, b - 1 + min_d + n - 1))
        # Per pixel in 32-bit arithmetic (each result cast back: Numba widens int32
        # arithmetic to int64, which the GPU runs as two instructions): the kernel is bound
        # by the instructions it issues (ncu at 1920x1080/128: 71 % of the SMs' issue
        # rate, 420 instructions a pixel with a warp a pixel). H100, selection ms before /
        # after: 741x500 0.252 / 0.219, 1242x375 0.322 / 0.283, 1920x1080/128 1.33 / 1.18,
        # 3840x2160 7.82 / 7.47. In the loops over d, the key is cost * scale | d (a shift
        # by a variable amount stayed 64-bit) and the right pixel's slot an unsigned index
        # (a signed one costs a negative-index fix-up a cell): PTX of the hot loop 14 -> 9
        # operations a cell, spills 56 -> 28 bytes; H100, selection ms (sixteenth
        # session, before on earlier machine starts, after two runs): 741x500/64 0.075 /
        # 0.068-0.069, 1242x375/128 0.193 / 0.181, 1920x1080/128 0.775 / 0.728-0.729,
        # 1920x1080/256 1.536 / 1.438, 3840x2160/256 5.38 / 4.97. Then (seventeenth
        # session) the key is a shift and a mask of its 16-bit field in the packed word
        # (field_key: a fixed KEY_SHIFT, no multiply, no extraction), the right slots are
        # reversed so a read's four atomics take constant offsets from one address, the
        # one sum volume is read without the loop over volumes (ONE), and blocks have 16
        # warps (SELECT_WARPS): ncu at 1920x1080/128 before, 413 M warp instructions
        # (199 a pixel), issue 55 %. H100, gpu.py selection ms before / after all four:
        # 741x500/64 0.068 / 0.052, 1242x375/128 0.181 / 0.142, 1920x1080/128 0.723 /
        # 0.522, 1920x1080/256 1.424 / 0.987, 3840x2160/256 4.91 / 3.54.
        # The pixel's first read in V: row (the block's row, once) + x * reads. Every lane
        # of a warp runs the shuffles, whether its pixel exists (`there`) and is its
        # block's or not: only the reads and writes are conditional.
        lo0 = int32(wd - 1 + min_d)  # lo = max(0, x - lo0), hi = min(n - 1, x - min_d): inside_range
        n1 = int32(n - 1)
        min_d32 = int32(min_d)
        shift0 = int32(cst.right_x(0, min_d, 0) - a)  # right pixel (in the segment) of d = 0 at x = 0
        row = uint64(y) * uint64(wd) * uint64(reads)
        for xb in range(xs + w * PIX, xe + 1, WARPS * PIX):
            x32 = int32(xb + sub)
            there = x32 <= xe
            lo = int32(max(int32(0), int32(x32 - lo0)))
            hi = int32(min(n1, int32(x32 - min_d32)))
            shiftx = int32(x32 + shift0)
            base = row + uint64(min(x32, int32(wd - 1))) * uint64(reads)
            kmin = int32(NO_KEY)
            # every disparity's right pixel inside the image and in the segment (all but the
            # pixels near the borders): the loops without the checks. H100, selection ms
            # with the checks everywhere / not here: 741x500/64 0.086 / 0.075, 1242x375/128
            # 0.218 / 0.193, 1920x1080/128 0.883 / 0.774, 1920x1080/256 1.729 / 1.534,
            # 3840x2160/256 6.20 / 5.37.
            full = lo == 0 and hi == n1 and (not right or (shiftx - n1 >= 0 and shiftx < seg))
            # With packed words every read of the lane is issued before the first is used.
            # Loaded inside the loop below, the SASS issued each load after the previous
            # word's shared atomics, so a lane waited on four loads one after another.
            # H100, kernel_times selection ms, two rounds alternated (twenty-third
            # session): 741x500/64 0.052 -> 0.048, 1242x375/128 0.142 -> 0.106,
            # 1920x1080/128 0.520 -> 0.423, 1920x1080/256 0.989 -> 0.847, 3840x2160/256
            # 3.55 -> 3.05. Loading the next pixel's words an iteration ahead as well (8 more
            # registers, a few spilled) gave nothing more: 1920x1080/128 0.422 -> 0.432,
            # 3840x2160/256 3.05 -> 3.13.
            if vec:
                for k in range(HOLD):
                    i = int32(gl + P * k)
                    held[k] = read(V, nv, base, i) if there and i < reads else uint64(0)
            for k in range(rounds):
                i = int32(gl + P * k)
                acc = uint64(0)
                if there and i < reads:
                    acc = held[k] if vec else read(V, nv, base, i)
                    if full:
                        d0 = int32(PER * i)
                        s0 = uint64(uint32(seg1 - shiftx + d0))  # the slot of d0's right pixel (see rkey)
                        for j in range(PER):
                            key = field_key(acc, j, int32(d0 | j))
                            kmin = min(kmin, key)
                            if right:
                                cuda.atomic.min(rkey, s0 + uint64(j), key)
                    else:
                        for j in range(PER):
                            d = int32(PER * i + j)
                            if d >= lo and d <= hi:
                                key = field_key(acc, j, d)
                                kmin = min(kmin, key)
                                xr = int32(shiftx - d)
                                if right and xr >= 0 and xr < seg:
                                    cuda.atomic.min(rkey, uint32(seg1 - xr), key)
            kmin = gmin(kmin, scratch, w, lane)
            best = int32(kmin & KEY_MASK)
            bc = int32(kmin >> KEY_SHIFT)
            other = int32(NO_RUNNER)
            c0 = int32(0)
            c2 = int32(0)
            inner = subpixel and best > lo and best < hi
            need_other = uniqueness > float32(0.0) or confidence
            below, above = int32(best - 1), int32(best + 1)
            if vec and (need_other or subpixel):
                # One pass over the held words for the uniqueness runner-up and the subpixel
                # neighbours: a word clear of best - 1 .. best + 1 gives the runner-up alone, a
                # word across it (one or two of the pixel's) is taken cost by cost. The
                # neighbours then come from the group's minima. (They were fetched from the
                # lane holding them by an index that put every held word in local memory,
                # stored each pixel; ncu at 1920x1080/128: 864 warp instructions a warp's
                # round of pixels, 39 % of the L1 requests local ones. Without them the
                # kernel runs no faster: it waits on its loads, docs/speed.md.)
                n0 = int32(NO_RUNNER)
                n2 = int32(NO_RUNNER)
                wmin = uint32(0xFFFFFFFF)  # the pairwise minima of the words clear of best
                seen = False
                for k in range(HOLD):
                    i = int32(gl + P * k)
                    if there and i < reads:
                        acc = held[k]
                        d0 = int32(PER * i)
                        if d0 > above or int32(d0 + 3) < below:
                            if need_other:
                                if full:
                                    # (two 16-bit-pair minima, one instruction each on Hopper. H100,
                                    # kernel_times selection ms before / after (twenty-third
                                    # session): 1920x1080/128 0.422 / 0.405, 1920x1080/256 0.847 /
                                    # 0.805, 3840x2160/256 3.05 / 2.87)
                                    wmin = min2(wmin, min2(uint32(acc), uint32(acc >> uint64(32))))
                                    seen = True
                                else:
                                    for j in range(PER):
                                        d = int32(d0 + j)
                                        if d >= lo and d <= hi:
                                            other = min(other, value(acc, j))
                        else:
                            for j in range(PER):
                                d = int32(d0 + j)
                                v = value(acc, j)
                                if d == below:
                                    n0 = v
                                elif d == above:
                                    n2 = v
                                elif need_other and d != best and d >= lo and d <= hi:
                                    other = min(other, v)
                if seen:
                    other = min(other, int32(min(uint32(wmin & uint32(0xFFFF)), uint32(wmin >> uint32(16)))))
                if need_other:
                    other = gmin(other, scratch, w, lane)
                if subpixel:
                    n0 = gmin(n0, scratch, w, lane)
                    n2 = gmin(n2, scratch, w, lane)
                    if inner:
                        c0 = n0
                        c2 = n2
            elif need_other:
                for k in range(rounds):
                    i = int32(gl + P * k)
                    if there and i < reads:
                        acc = read(V, nv, base, i)
                        for j in range(PER):
                            d = int32(PER * i + j)
                            if d >= lo and d <= hi and (d < below or d > above):
                                other = min(other, value(acc, j))
                other = gmin(other, scratch, w, lane)
            if not vec and inner and gl == 0 and there:
                c0 = int32(read(V, nv, base, best - 1))
                c2 = int32(read(V, nv, base, best + 1))
            if gl == 0 and there and x32 >= a and x32 < b:  # a pixel of this block: its left disparity
                if hi < lo:
                    out[y, x32] = float32(math.nan)
                    if confidence:
                        out_c[y, x32] = float32(0.0)
                else:
                    out[y, x32] = sel.wta_finish(best, bc, other, c0, c2, lo, hi, min_d, uniqueness, subpixel)
                    if confidence:
                        out_c[y, x32] = sel.margin_confidence(bc, other)
        if right:
            cuda.syncthreads()
            for i in range(tid, b - a, cuda.blockDim.x):
                k = rkey[seg1 - i]
                out_r[y, a + i] = float32(math.nan) if k == NO_KEY else float32((k & KEY_MASK) + min_d)

    return stable_cache_key(select_kernel)


_SELECT_KERNELS = {}


# Packed words a lane holds (vec): a pixel takes P lanes, the fewest (a power of two, up
# to a warp) that hold its D / 4 words SELECT_WORDS to a lane, so a warp takes 32 / P
# pixels at once and the shuffles and the finish of a pixel are shared among them.
# H100, benchmarks/gpu.py selection ms, a warp a pixel (SELECT_WORDS=1) / 4 words a lane,
# two runs each alternated, the same both times: 741x500/64 0.124 / 0.085, 741x500/128
# 0.24 / 0.165, 1242x375/128 0.305 / 0.216, 1920x1080/128 1.27 / 0.877, 1920x1080/256
# 2.11 / 1.72, 3840x2160/256 7.54 / 6.15. From 128 disparities 8 words a lane (after
# the loads issued together, twenty-third session; 4 / 8 words, kernel_times selection
# ms: 1920x1080/128 0.405 / 0.385, 1920x1080/256 0.806 / 0.743, 3840x2160/256 2.876 /
# 2.639, 1242x375/128 the same). STEREOCLI_SELECT_WORDS forces a count (tuning).
SELECT_WORDS = int(os.environ.get("STEREOCLI_SELECT_WORDS", "0"))
SELECT_WORDS_FROM_128 = 8


def select_words(n):
    """Packed words a lane holds for n disparities (SELECT_WORDS)."""
    return SELECT_WORDS or (SELECT_WORDS_FROM_128 if n >= 128 else 4)


def select_kernel_for(vec, n, nv=0):
    """The selection kernel for D = n disparities and nv volumes to add; vec: packed
    words, each lane holding ceil(D / 4 / P) of them."""
    P = SGM_LANES
    if vec and not SIM:
        P = 1
        words = select_words(n)
        while P < SGM_LANES and P * words < n // 4:
            P *= 2
    hold = (n // 4 + P - 1) // P if vec else 1
    cc = (0, 0) if SIM else tuple(cuda.get_current_device().compute_capability)
    key = (vec, hold, P, SELECT_WARPS, nv == 1, cc)
    if key not in _SELECT_KERNELS:
        _SELECT_KERNELS[key] = _make_select_kernel(*key)
    return _SELECT_KERNELS[key]
