"""Cost-volume kernels (stages/cost.py on the GPU): census transform and census volume (packed, popc), per-pixel differences, box means, finalisation to cost units, mutual-information table and histogram."""
import math

from numba import cuda, float32, int32, uint32, uint64

from ...stages import cost as _cost
from .common import CACHE, OUTSIDE, SIM, _volume_index, device_twins

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
    return census_kernel


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


@cuda.jit(device=True, inline=True)
def _popc2(a, b):
    """Hamming distance of two uint64 strings: a popc of each 32-bit half."""
    v = a ^ b
    return uint32(cuda.popc(uint32(v & uint64(0xFFFFFFFF)))) + uint32(cuda.popc(uint32(v >> uint64(32))))


@cuda.jit(device=True, inline=True)
def _census_byte(ham, mul, add, shift):
    """census_scaled without its clamp at 255, exact for Hamming distances up to the
    string's bits: census_scale_magic keeps (nbits * mul + add) >> shift within a byte
    (test_census_volume_at_the_largest_hamming_distance), so the clamp never bites. An
    instruction a cost fewer in a kernel bound by its instructions."""
    return uint32(uint32(ham * mul + add) >> shift)


_PX_KERNELS = {}


def census_volume_px_kernel_for(nbits):
    """census_volume_px_kernel for census strings of nbits bits: the scale to cost units
    (census_scale_magic) is compiled in as constants, so it stays 32-bit arithmetic (as
    arguments, the variable shift made it 64-bit) and costs a multiply-add and a shift
    instead of a lookup in shared memory (whose banks the lanes' Hamming distances hit at
    random)."""
    if nbits in _PX_KERNELS:
        return _PX_KERNELS[nbits]
    mul, add, shift = _cost.census_scale_magic(nbits)

    @cuda.jit(cache=CACHE)
    def census_volume_px_kernel(cl, cr, min_d, vol8):
        """The census volume with a thread per left pixel (D % 8 == 0, D <= TILE_MAX_D), a
        block per PX_TILE pixels of one row (grid: tiles, rows). The right strings the
        block meets are read once into shared memory; a thread's disparities read them at
        descending positions, its neighbours' at the next ones (no bank conflicts, no
        padding). Each word of eight costs is built from two 32-bit halves, without bound
        checks where all eight right pixels lie inside. The words go through shared memory
        PX_CHUNK per pixel at a time, and the block writes them out a pixel's run of words
        after another (coalesced). It replaced a kernel with a thread per word (a division
        per word, a padded index and a bound check per cost: about 47 instructions a cost,
        bound by the integer pipeline, ncu 83 %). H100, benchmarks/gpu.py's cost stage (this
        and the census transform), ms before / after both changed: 741x500/64 0.086 / 0.062,
        1242x375/128 0.151 / 0.100, 1920x1080/128 0.624 / 0.379, 1920x1080/256 1.012 /
        0.592, 3840x2160/256 4.00 / 2.28 (this kernel alone at 4K: 2.54 against 4.00).
        The scale to cost units as constants instead of a table in shared memory: H100,
        kernel_times cost ms 1920x1080/128 0.379 -> 0.356, /256 0.592 -> 0.556,
        3840x2160/256 2.28 -> 2.14 (ncu at 1920x1080/128: census 0.112, this 0.244)."""
        crs = cuda.shared.array(_PX_CODES, uint64)
        stage = cuda.shared.array(_PX_STAGE, uint64)
        left = cuda.local.array(PX_EACH, uint64)  # the thread's left strings (a register on the GPU)
        h, w, n8 = vol8.shape
        nd = 8 * n8
        y = cuda.blockIdx.y
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
        for c0 in range(0, n8, PX_CHUNK):
            for i in range(PX_EACH):
                px = i * PX_THREADS + tid  # the pixel's place in the tile
                a = left[i]
                dhi = int32(cst.right_x(x0 + px, min_d, 0))  # disparities with the right pixel inside: dlo..dhi
                dlo = dhi - (w - 1)
                top = uint32(px + nd - 1)  # the crs index of disparity index 0
                for k in range(PX_CHUNK):
                    wi = c0 + k
                    if wi < n8:  # (the same for the whole block)
                        d0 = int32(8 * wi)
                        word = uint64(0)
                        if d0 >= dlo and d0 + 7 <= dhi:
                            jb = top - uint32(d0)
                            lo = uint32(0)
                            hi = uint32(0)
                            for b in range(4):
                                v = _census_byte(_popc2(a, crs[jb - uint32(b)]), mul, add, shift)
                                lo |= v << uint32(8 * b)
                            for b in range(4):
                                v = _census_byte(_popc2(a, crs[jb - uint32(4 + b)]), mul, add, shift)
                                hi |= v << uint32(8 * b)
                            word = uint64(lo) | (uint64(hi) << uint64(32))
                        else:
                            for b in range(8):
                                d = d0 + b
                                v = uint64(OUTSIDE)
                                if d >= dlo and d <= dhi:
                                    v = uint64(_census_byte(_popc2(a, crs[top - uint32(d)]), mul, add, shift))
                                word |= v << uint64(8 * b)
                        stage[px * (PX_CHUNK + 1) + k] = word
            cuda.syncthreads()
            for r in range(PX_CHUNK * PX_EACH):
                e = r * PX_THREADS + tid
                p = e // PX_CHUNK
                k = e % PX_CHUNK
                if x0 + p < w and c0 + k < n8:
                    vol8[y, x0 + p, c0 + k] = stage[p * (PX_CHUNK + 1) + k]
            cuda.syncthreads()
    _PX_KERNELS[nbits] = census_volume_px_kernel
    return census_volume_px_kernel


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
