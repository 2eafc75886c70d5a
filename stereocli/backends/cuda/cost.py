"""Cost-volume kernels (stages/cost.py on the GPU): census transform and census volume (packed, popc), per-pixel differences, box means, finalisation to cost units, mutual-information table and histogram."""
import functools
import math
import os

import numpy as np

from numba import cuda, float32, int32, uint32, uint64

from ...stages import cost as _cost
from .common import stable_cache_key, _REGS, CACHE, OUTSIDE, SIM, _volume_index, byte_perm, device_twins

cst = device_twins(_cost)  # the stage's shared arithmetic, as device functions

_CENSUS_KERNELS = {}
CENSUS_BLOCK = (8, 4) if SIM else (32, 8)  # threads (x, y) of a census kernel's block: one pixel each
# (the simulator runs a thread per CUDA thread: small blocks keep the tests quick)


def census_kernel_for(wx, wy, tiled=True):
    """The census kernel of one window size for both images of a pair (grid of
    CENSUS_BLOCK blocks, z = 0 the left image, 1 the right: one launch). `tiled`: the
    block's pixels and their window margins are read once into shared memory as float32
    (exact for float32, uint8 and uint16 images), and every comparison reads from there;
    otherwise census_at reads the image itself (any dtype), 62 reads per pixel."""
    key = (wx, wy, tiled)
    if key in _CENSUS_KERNELS:
        return _CENSUS_KERNELS[key]
    rx, ry = wx // 2, wy // 2
    bx, by = CENSUS_BLOCK
    tw, th = bx + 2 * rx, by + 2 * ry
    nb = wx * wy - 1  # bits of a string: the first comparison is the highest
    tsize = th * tw  # (a shared array's size must be a plain constant)

    if tiled:
        @cuda.jit(cache=CACHE)
        def census_kernel(img0, img1, out0, out1):
            """Each bit set in one of two 32-bit halves at its own position (the
            window's loops unroll to constant positions and tile offsets), instead of
            shifting a 64-bit string once per comparison: H100, 3840x2160, 9x7 window,
            about 1050 instructions a pixel before (ncu: 0.87 ms for both images)."""
            img = img0 if cuda.blockIdx.z == 0 else img1
            out = out0 if cuda.blockIdx.z == 0 else out1
            tile = cuda.shared.array(tsize, float32)  # (flat: unsigned offsets, no negative-index fix-ups)
            h, w = img.shape
            tx, ty = cuda.threadIdx.x, cuda.threadIdx.y
            x0 = cuda.blockIdx.x * bx - rx  # image column of tile column 0 (clamped at the borders)
            y0 = cuda.blockIdx.y * by - ry
            for j in range(ty, th, by):
                yy = min(max(y0 + j, 0), h - 1)
                for i in range(tx, tw, bx):
                    tile[uint32(j * tw + i)] = img[yy, min(max(x0 + i, 0), w - 1)]
            cuda.syncthreads()
            x = cuda.blockIdx.x * bx + tx
            y = cuda.blockIdx.y * by + ty
            if y < h and x < w:
                base = uint32(ty * tw + tx)
                c = tile[base + uint32(ry * tw + rx)]
                lo = uint32(0)
                hi = uint32(0)
                k = 0
                for j in range(wy):  # census_at's order: rows, then columns, centre left out
                    for i in range(wx):
                        if i != rx or j != ry:
                            pos = nb - 1 - k
                            bit = uint32(1) if tile[base + uint32(j * tw + i)] < c else uint32(0)
                            if pos >= 32:
                                hi |= bit << uint32(pos - 32)
                            else:
                                lo |= bit << uint32(pos)
                            k += 1
                out[y, x] = (uint64(hi) << uint64(32)) | uint64(lo)
    else:
        @cuda.jit(cache=CACHE)
        def census_kernel(img0, img1, out0, out1):
            img = img0 if cuda.blockIdx.z == 0 else img1
            out = out0 if cuda.blockIdx.z == 0 else out1
            x, y = cuda.grid(2)
            if y < img.shape[0] and x < img.shape[1]:
                out[y, x] = cst.census_at(img, y, x, wx, wy)
    _CENSUS_KERNELS[key] = census_kernel
    return stable_cache_key(census_kernel)


CENSUS8_MAX_ROWS = 9  # window rows census8_kernel_for unrolls (taller windows: the float kernel)
_H = uint32(0x80808080)  # each byte's top bit
_L7 = uint32(0x7F7F7F7F)  # each byte's low seven bits


def _transpose4():
    """transpose4(a0, a1, a2, a3): the 4x4 matrix of bytes (byte m of word B) transposed,
    as four words: word m = (byte m of a0, of a1, of a2, of a3), a0's lowest. Eight prmt."""
    prmt = byte_perm()

    @cuda.jit(device=True, inline=True)
    def transpose4(a0, a1, a2, a3):
        t0 = prmt(a0, a1, uint32(0x5140))  # (a0.0, a1.0, a0.1, a1.1)
        t1 = prmt(a0, a1, uint32(0x7362))  # (a0.2, a1.2, a0.3, a1.3)
        t2 = prmt(a2, a3, uint32(0x5140))
        t3 = prmt(a2, a3, uint32(0x7362))
        return (prmt(t0, t2, uint32(0x5410)), prmt(t0, t2, uint32(0x7632)),
                prmt(t1, t3, uint32(0x5410)), prmt(t1, t3, uint32(0x7632)))
    return transpose4


def census8_kernel_for(wx, wy):
    """The census kernel of one window size for a pair of 8-bit images (grid: blocks of
    CENSUS_BLOCK threads, each thread four neighbouring pixels of a row, so a block
    covers 4 bx x by pixels; z = 0 the left image, 1 the right). The block's pixels and
    their window margins are read once into shared memory as bytes, four to a word, and
    a thread compares the four pixels with one neighbour offset at once: the
    neighbours' four bytes are one funnel shift of two words, and "darker than the
    centre" for four bytes at once is the borrow out of each byte of neighbour -
    centre (SWAR: the low seven bits' difference without borrows across bytes, then the
    top bits), about six instructions for four comparisons where the float kernel
    spends about five on each. Each comparison's four bits go to the byte of the string
    they belong to (one accumulator word a string byte, a byte a pixel), and a byte
    transpose at the end makes the four strings. Bit for bit census_at's strings (the
    comparison of 8-bit values is exact either way). H100, ncu at 1920x1080, both
    images: 56 us, the ALU pipe 86 % of its peak (the float kernel on the same images,
    with their conversion to float: about twice that, an event-timed probe)."""
    key = ("u8", wx, wy)
    if key in _CENSUS_KERNELS:
        return _CENSUS_KERNELS[key]
    rx, ry = wx // 2, wy // 2
    bx, by = CENSUS_BLOCK
    nb = wx * wy - 1  # bits of a string: the first comparison is the highest
    if nb > 64 or wy > CENSUS8_MAX_ROWS:
        raise ValueError(f"census8_kernel_for: {wx}x{wy} is not a window it takes (at most 64 bits and "
                         f"{CENSUS8_MAX_ROWS} rows)")
    NB = (nb + 7) // 8  # bytes of a string
    NW = (2 * rx + 3) // 4 + 1  # words of a window row a thread reads (its bytes 4 tx .. 4 tx + 2 rx + 3)
    TWW = bx + NW - 1  # words of a tile row
    th = by + 2 * ry
    tsize = th * TWW
    centre = ry * wx + rx  # the centre's place in the window, row by row
    top_shift = uint32(8 * NB - nb)  # the highest string byte's bits end that much too high
    transpose4 = _transpose4()

    @cuda.jit(device=True, inline=True)
    def window(wd, j, i):
        """The four bytes of window row j at column offset i (of 0..2 rx) for the thread's
        four pixels: bytes i..i+3 of the row's words."""
        q = i // 4
        r = i % 4
        if r == 0:
            return wd[j, q]
        return uint32(((uint64(wd[j, q + 1]) << uint64(32)) | uint64(wd[j, q])) >> uint64(8 * r))

    @cuda.jit(device=True, inline=True)
    def compare_row(wd, j, c, k7, acc):
        """Window row j's comparisons for the four pixels, its columns backwards (c: the
        centres' bytes, k7: 0x80 - their low seven bits): comparison k sets string bit
        nb - 1 - k, which comes in at the top of its byte's accumulator as the bits before
        it move down one."""
        for ii in range(wx):
            i = wx - 1 - ii
            idx = j * wx + i
            if idx != centre:
                k = idx if idx < centre else idx - 1
                v = window(wd, j, i)
                t = (v & _L7) + k7  # each byte's top bit: v's low seven bits >= the centre's
                lt = (~v & c) | (~(v ^ c) & ~t)  # each byte's top bit: v < c
                B = (nb - 1 - k) // 8
                acc[B] = (acc[B] >> uint32(1)) | (lt & _H)

    @cuda.jit(cache=CACHE)
    def census8_kernel(img0, img1, out0, out1):
        img = img0 if cuda.blockIdx.z == 0 else img1
        out = out0 if cuda.blockIdx.z == 0 else out1
        tile = cuda.shared.array(tsize, uint32)  # (flat: unsigned offsets)
        wd = cuda.local.array((wy, NW), uint32)  # the thread's window rows (registers: constant indices)
        acc = cuda.local.array(8, uint32)  # byte B of the strings, a byte a pixel
        h, w = img.shape
        tx, ty = cuda.threadIdx.x, cuda.threadIdx.y
        x0 = cuda.blockIdx.x * (4 * bx) - rx  # image column of the tile's byte 0 (clamped at the borders)
        y0 = cuda.blockIdx.y * by - ry
        for e in range(ty * bx + tx, tsize, bx * by):
            j = e // TWW
            yy = min(max(y0 + j, 0), h - 1)
            xb = x0 + 4 * (e - j * TWW)
            word = uint32(0)
            for b in range(4):
                word |= uint32(img[yy, min(max(xb + b, 0), w - 1)]) << uint32(8 * b)
            tile[uint32(e)] = word
        cuda.syncthreads()
        x = cuda.blockIdx.x * (4 * bx) + 4 * tx
        y = cuda.blockIdx.y * by + ty
        if y < h and x < w:
            for j in range(wy):
                for q in range(NW):
                    wd[j, q] = tile[uint32((ty + j) * TWW + tx + q)]
            c = window(wd, ry, rx)
            k7 = _H - (c & _L7)  # 0x80 - the centre's low seven bits, each byte
            for B in range(8):
                acc[B] = uint32(0)
            # the window's rows backwards, so that the string's bits come in ascending (one
            # call a row: LLVM unrolls each row's loop, not a loop over rows, and acc must
            # see constant indices to stay in registers)
            compare_row(wd, wy - 1, c, k7, acc)
            if wy > 1:
                compare_row(wd, wy - 2, c, k7, acc)
            if wy > 2:
                compare_row(wd, wy - 3, c, k7, acc)
            if wy > 3:
                compare_row(wd, wy - 4, c, k7, acc)
            if wy > 4:
                compare_row(wd, wy - 5, c, k7, acc)
            if wy > 5:
                compare_row(wd, wy - 6, c, k7, acc)
            if wy > 6:
                compare_row(wd, wy - 7, c, k7, acc)
            if wy > 7:
                compare_row(wd, wy - 8, c, k7, acc)
            if wy > 8:
                compare_row(wd, wy - 9, c, k7, acc)
            acc[NB - 1] = acc[NB - 1] >> top_shift
            lo = transpose4(acc[0], acc[1], acc[2], acc[3])
            hi = transpose4(acc[4], acc[5], acc[6], acc[7])
            for m in range(4):
                if x + m < w:
                    out[y, x + m] = (uint64(hi[m]) << uint64(32)) | uint64(lo[m])
    _CENSUS_KERNELS[key] = census8_kernel
    return stable_cache_key(census8_kernel)


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


TILE_MAX_D = 1024  # most disparities census_volume_px_kernel takes (its right strings live in shared memory)
PX_THREADS = 8 if SIM else 128  # threads per block of census_volume_px_kernel
PX_EACH = 8 if SIM else 1  # left pixels a thread takes (the simulator pays per thread and per barrier:
# few threads with many pixels each keep the tests quick; on the GPU the loop over them runs once)
PX_TILE = PX_THREADS * PX_EACH  # left pixels per block
PX_CHUNK = 8  # words (64 disparities) a pixel's thread computes between two of its block's writes
_PX_CODES = PX_TILE + TILE_MAX_D - 1
_PX_STAGE = PX_TILE * (PX_CHUNK + 1)
_PX_STEP = PX_THREADS // PX_CHUNK  # pixels apart of a thread's writes out of the stage
assert PX_THREADS % PX_CHUNK == 0  # (so a thread writes the same word of each of its pixels)


@cuda.jit(device=True, inline=True)
def _popc2(a, b):
    """Hamming distance of two uint64 strings: a popc of each 32-bit half."""
    v = a ^ b
    return uint32(cuda.popc(uint32(v & uint64(0xFFFFFFFF)))) + uint32(cuda.popc(uint32(v >> uint64(32))))


_PX_KERNELS = {}


@functools.lru_cache(maxsize=None)
def census_scale_top(nbits):
    """(mul, add) such that the top byte of h * mul + add (uint32, no overflow) is
    census_scale(nbits)[h] for every Hamming distance h in 0..nbits: the cost is then a
    multiply-add and a byte that prmt gathers with three others, where the CPU's magic
    (census_scale_magic, shift 19 at 62 bits) needs a shift and a merge for each cost.
    Found by search: the first mul (from 255 * 2**24 / nbits down and up) for which an
    add fits every h's interval."""
    t = _cost.census_scale(nbits)[:nbits + 1].astype(np.int64)
    h = np.arange(nbits + 1, dtype=np.int64)
    S = 1 << 24
    m0 = 255 * S // nbits
    for dm in range(0, 1 << 16):
        for mul in (m0 - dm, m0 + dm):
            lo = int(np.max(t * S - h * mul))
            hi = int(np.min((t + 1) * S - h * mul))
            if 0 <= lo < hi and nbits * mul + lo < 1 << 32:
                return np.uint32(mul), np.uint32(lo)
    raise ValueError(f"no top-byte form of the census scale for {nbits} bits")


def _pack4():
    """pack4(v0, v1, v2, v3): the top bytes of four words as one word, v0's lowest: three prmt."""
    prmt = byte_perm()

    @cuda.jit(device=True, inline=True)
    def pack4(v0, v1, v2, v3):
        return prmt(prmt(v0, v1, uint32(0x7373)), prmt(v2, v3, uint32(0x7373)), uint32(0x5410))
    return pack4


# The census volume in parts of rows, each with an event, so that SGM's horizontal pair
# (run alone before the bands, aggregate_bands.horizontal_first) starts on a part's lines
# as soon as it is made, and each band of the other paths on the pair's parts over its
# rows (CudaBackend._horizontal_first, aggregate_bands.FOLLOW_HORIZONTAL). H100, kernel
# ms (census + SGM + selection + LR check, best of 10), two rounds alternated in one
# process, one launch / 8 parts, the bands after the whole pair / 4, 8, 16 parts, the
# bands following the parts: 3840x2160/256/8 25.29 25.27 / 24.87 24.82 / 24.49 24.47,
# 24.22 25.06, 24.77 24.58; 1920x1080/256/8 6.54 6.53 / 6.66 6.59 / 6.35 6.34, 6.34
# 6.32, 6.45 6.48. STEREOCLI_COST_PARTS: how many parts (1 turns it off).
COST_PARTS = int(os.environ.get("STEREOCLI_COST_PARTS", "4"))
# 8 parts for the 8-path bands at 256 disparities and more from COST_PARTS_LARGE_MIN_CELLS
# cells (W x H x D; 3840x2160 / 256), where the pair's parts run side by side for 7.8 ms
# before the bands. H100, kernel ms as above, 4 / 8 parts, rounds alternated in one
# process: thirty-eighth session 24.18 24.07 / 23.88 23.87; thirty-ninth 24.18 24.06
# 24.05 / 23.86 23.82 23.92 (1920x1080/256/8 6.35 6.32 6.35 / 6.35 6.31 6.29,
# 1920x1080/128/4 2.64 2.63 2.65 / 2.73 2.66 2.69: those keep 4).
COST_PARTS_LARGE = int(os.environ.get("STEREOCLI_COST_PARTS", "8"))  # (the variable sets both)
COST_PARTS_LARGE_MIN_CELLS = 1 << 30


def cost_parts(n, paths, cells):
    """How many parts of rows the census volume is made in for SGM over n disparities,
    `paths` directions and `cells` cells, where the horizontal pair runs first."""
    return COST_PARTS_LARGE if paths == 8 and n >= 256 and cells >= COST_PARTS_LARGE_MIN_CELLS else COST_PARTS


def row_chunks(h, parts):
    """[(first row, end row)]: the census volume's launches in `parts` parts of h rows,
    from both ends inwards (the order in which SGM's bands from above and from below
    reach them)."""
    k = max(1, min(parts, h))
    parts = [(h * i // k, h * (i + 1) // k) for i in range(k)]
    return [parts[i // 2] if i % 2 == 0 else parts[k - 1 - i // 2] for i in range(k)]


def census_volume_px_kernel_for(nbits):
    """census_volume_px_kernel for census strings of nbits bits: the scale to cost units
    (census_scale_top) is compiled in as constants, so it stays 32-bit arithmetic (as
    arguments, the variable shift made it 64-bit) and costs a multiply-add instead of a
    lookup in shared memory (whose banks the lanes' Hamming distances hit at random)."""
    if nbits in _PX_KERNELS:
        return _PX_KERNELS[nbits]
    mul, add = census_scale_top(nbits)
    pack4 = _pack4()

    @cuda.jit(device=True, inline=True)
    def scaled(a, b):
        """The cost of strings a and b in the top byte (the bytes below: garbage)."""
        return uint32(_popc2(a, b) * mul + add)

    @cuda.jit(cache=CACHE, **_REGS("STEREOCLI_COST_REGS", 0))
    def census_volume_px_kernel(cl, cr, min_d, vol8, y0):
        """The census volume with a thread per left pixel (D % 8 == 0, D <= TILE_MAX_D), a
        block per PX_TILE pixels of one row (grid: tiles, rows from y0). The right strings the
        block meets are read once into shared memory; a thread's disparities read them at
        descending positions, its neighbours' at the next ones (no bank conflicts, no
        padding). A chunk of PX_CHUNK words (eight costs each) whose right pixels all lie
        inside takes an unrolled loop without bound checks, each word four costs' top
        bytes gathered by prmt twice; the others check each cost. The words go through
        shared memory PX_CHUNK per pixel at a time, and the block writes them out a
        pixel's run of words after another (coalesced). It replaced a kernel with a thread
        per word (a division per word, a padded index and a bound check per cost: about
        47 instructions a cost, bound by the integer pipeline, ncu 83 %). H100,
        benchmarks/gpu.py's cost stage (this and the census transform), ms before / after
        both changed: 741x500/64 0.086 / 0.062, 1242x375/128 0.151 / 0.100, 1920x1080/128
        0.624 / 0.379, 1920x1080/256 1.012 / 0.592, 3840x2160/256 4.00 / 2.28. The scale
        to cost units as constants instead of a table in shared memory: 1920x1080/128
        0.379 -> 0.356, /256 0.592 -> 0.556, 3840x2160/256 2.28 -> 2.14. The unrolled
        chunk and the top-byte scale (twenty-eighth session, with the 8-bit census
        kernel): 0.350 -> 0.267, 0.549 -> 0.446, 2.098 -> 1.650. ncu at 1920x1080/128
        then: this kernel 267 us (census8 56 us), issue slots 71 % busy, the ALU pipe 65 %
        and the XU pipe (POPC) 62 % of their peaks, 30 % of the warps resident (94
        registers). Capping the registers (STEREOCLI_COST_REGS) to fit more warps spills:
        cost ms at 1920x1080/128, /256, 3840x2160/256 with no cap 0.267 / 0.443 / 1.647, 80
        registers 0.268 / 0.446 / 1.655, 64 0.290 / 0.501 / 1.88, 56 0.280 / 0.479 / 1.79.
        What held the registers was the write-out: its eight 64-bit indices (a signed
        division and remainder each), invariant across the chunks, were kept for the
        whole loop. A thread writes the same word of every pixel it writes (PX_THREADS %
        PX_CHUNK == 0), so the indices are now two 32-bit values and a constant step:
        94 -> 64 registers (20 -> 32 warps a SM), no spills; cost ms at 1920x1080/128 and
        /256 0.267 -> 0.231 and 0.442 -> 0.387 (one call, before and after alternated;
        3840x2160 not measured). A loop over the chunk's words instead of the unrolled
        chunk (72 registers): 0.235 against 0.231."""
        crs = cuda.shared.array(_PX_CODES, uint64)
        stage = cuda.shared.array(_PX_STAGE, uint64)
        left = cuda.local.array(PX_EACH, uint64)  # the thread's left strings (a register on the GPU)
        h, w, n8 = vol8.shape
        nd = 8 * n8
        y = y0 + cuda.blockIdx.y
        x0 = cuda.blockIdx.x * PX_TILE
        tid = cuda.threadIdx.x
        xlo = int32(cst.right_x(x0, min_d, nd - 1))  # the right column of crs[0]
        for j in range(tid, PX_TILE + nd - 1, PX_THREADS):
            xr = xlo + j
            crs[j] = cr[y, xr] if xr >= 0 and xr < w else uint64(0)
        for i in range(PX_EACH):
            x = x0 + i * PX_THREADS + tid
            left[i] = cl[y, x] if x < w else uint64(0)
        cuda.syncthreads()
        n8i = int32(n8)
        wk = int32(tid % PX_CHUNK)  # the word this thread writes out of each pixel's chunk
        p0 = int32(tid // PX_CHUNK)  # the first pixel it writes (then every _PX_STEP-th)
        for c0 in range(0, n8i, PX_CHUNK):
            for i in range(PX_EACH):
                px = i * PX_THREADS + tid  # the pixel's place in the tile
                a = left[i]
                dhi = int32(cst.right_x(x0 + px, min_d, 0))  # disparities with the right pixel inside: dlo..dhi
                dlo = dhi - (w - 1)
                top = uint32(px + nd - 1)  # the crs index of disparity index 0
                st = uint32(px * (PX_CHUNK + 1))
                # a whole chunk whose right pixels all lie inside (so written, the kernel
                # takes 64 registers; with c0 + PX_CHUNK <= n8i tested first, 66)
                kn = min(int32(PX_CHUNK), n8i - c0)  # words of this chunk
                fast = 8 * c0 >= dlo and 8 * (c0 + kn) - 1 <= dhi
                if fast and kn == PX_CHUNK:
                    jc = top - uint32(8 * c0)
                    for k in range(PX_CHUNK):
                        jb = jc - uint32(8 * k)
                        lo = pack4(scaled(a, crs[jb]), scaled(a, crs[jb - uint32(1)]),
                                   scaled(a, crs[jb - uint32(2)]), scaled(a, crs[jb - uint32(3)]))
                        hi = pack4(scaled(a, crs[jb - uint32(4)]), scaled(a, crs[jb - uint32(5)]),
                                   scaled(a, crs[jb - uint32(6)]), scaled(a, crs[jb - uint32(7)]))
                        stage[st + uint32(k)] = uint64(lo) | (uint64(hi) << uint64(32))
                else:
                    for k in range(PX_CHUNK):
                        wi = c0 + k
                        if wi < n8i:  # (the same for the whole block)
                            word = uint64(0)
                            for b in range(8):
                                d = int32(8 * wi + b)
                                v = uint64(OUTSIDE)
                                if d >= dlo and d <= dhi:
                                    v = uint64(scaled(a, crs[top - uint32(d)]) >> uint32(24))
                                word |= v << uint64(8 * b)
                            stage[st + uint32(k)] = word
            cuda.syncthreads()
            # element r * PX_THREADS + tid of the chunk: word k of pixel p0 + r * _PX_STEP
            for r in range(PX_CHUNK * PX_EACH):
                p = p0 + int32(r * _PX_STEP)
                if x0 + p < w and c0 + wk < n8i:
                    vol8[y, x0 + p, c0 + wk] = stage[uint32(p * (PX_CHUNK + 1) + wk)]
            cuda.syncthreads()
    _PX_KERNELS[nbits] = census_volume_px_kernel
    return stable_cache_key(census_volume_px_kernel)


@cuda.jit(cache=CACHE)
def census_volume4_kernel(cl, cr, min_d, scale, vol4):
    """The census volume four disparities per thread, written as one uint32 (D % 4 == 0)."""
    tab = _shared_scale(scale)
    h, w, n4 = vol4.shape
    y, x, wi, inside = _volume_index(w, n4)
    if inside:
        vol4[y, x, wi] = _census_word(cl[y, x], cr[y], int32(cst.right_x(x, min_d, 4 * wi)), w, tab, 4)


@cuda.jit(cache=CACHE)
def census_volume_kernel(cl, cr, min_d, scale, vol):
    h, w, n = vol.shape
    y, x, d, inside = _volume_index(w, n)
    if inside:
        xr = cst.right_x(x, min_d, d)
        if xr >= 0 and xr < w:
            vol[y, x, d] = cst.census_cost_value(cl[y, x], cr[y, xr], scale)
        else:
            vol[y, x, d] = OUTSIDE


@cuda.jit(cache=CACHE)
def diff_volume_kernel(L, R, min_d, kind, vol):
    h, w, n = vol.shape
    y, x, d, inside = _volume_index(w, n)
    if inside:
        xr = min(max(cst.right_x(x, min_d, d), 0), w - 1)
        vol[y, x, d] = cst.pixel_diff(L, R, y, x, xr, kind)


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
        vol[y, x, d] = cst.finalize_at(M, y, x, d, min_d, kind, ml, ml2, mr, mr2)


@cuda.jit(cache=CACHE)
def table_volume_kernel(ql, qr, table, min_d, vol):
    h, w, n = vol.shape
    y, x, d, inside = _volume_index(w, n)
    if inside:
        xr = cst.right_x(x, min_d, d)
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
