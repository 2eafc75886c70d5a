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

    if tiled:
        @cuda.jit(cache=CACHE)
        def census_kernel(img0, img1, out0, out1):
            img = img0 if cuda.blockIdx.z == 0 else img1
            out = out0 if cuda.blockIdx.z == 0 else out1
            tile = cuda.shared.array((th, tw), float32)
            h, w = img.shape
            tx, ty = cuda.threadIdx.x, cuda.threadIdx.y
            x0 = cuda.blockIdx.x * bx - rx  # image column of tile column 0 (clamped at the borders)
            y0 = cuda.blockIdx.y * by - ry
            for j in range(ty, th, by):
                yy = min(max(y0 + j, 0), h - 1)
                for i in range(tx, tw, bx):
                    tile[j, i] = img[yy, min(max(x0 + i, 0), w - 1)]
            cuda.syncthreads()
            x = cuda.blockIdx.x * bx + tx
            y = cuda.blockIdx.y * by + ty
            if y < h and x < w:
                c = tile[ty + ry, tx + rx]
                bits = uint64(0)
                for j in range(wy):  # census_at's order: rows, then columns, centre left out
                    for i in range(wx):
                        if i != rx or j != ry:
                            bits = (bits << uint64(1)) | uint64(1 if tile[ty + j, tx + i] < c else 0)
                out[y, x] = bits
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


TILE_X = 128  # left pixels per block of census_volume_tile_kernel
TILE_MAX_D = 1024  # most disparities it takes (its right words live in shared memory)
_TILE_WORDS = TILE_X + TILE_MAX_D - 1
_PAD = _TILE_WORDS + (_TILE_WORDS >> 3) + 1


@cuda.jit(cache=CACHE)
def census_volume_tile_kernel(cl, cr, min_d, scale, vol8):
    """The census volume eight disparities per thread, written as one uint64 (D % 8 == 0,
    D <= TILE_MAX_D), a block per TILE_X left pixels of one row (grid: tiles, rows). The
    right strings those pixels meet are read once into shared memory, at position
    j + j // 8 for the j-th: consecutive threads read words 8 apart, and the padding
    spreads them over the banks (a thread's eight reads from global memory fell on eight
    cache lines per warp instruction)."""
    tab = _shared_scale(scale)
    crs = cuda.shared.array(_PAD, uint64)
    cls = cuda.shared.array(TILE_X, uint64)
    h, w, n8 = vol8.shape
    y = cuda.blockIdx.y
    x0 = cuda.blockIdx.x * TILE_X
    tid = cuda.threadIdx.x
    nd = 8 * n8
    xlo = int32(cst.right_x(x0, min_d, nd - 1))  # the right column of word j = 0
    nwords = TILE_X + nd - 1
    for j in range(tid, nwords, cuda.blockDim.x):
        xr = xlo + j
        crs[j + (j >> 3)] = cr[y, xr] if xr >= 0 and xr < w else uint64(0)
    for i in range(tid, TILE_X, cuda.blockDim.x):
        cls[i] = cl[y, x0 + i] if x0 + i < w else uint64(0)
    cuda.syncthreads()
    total = uint32(TILE_X * n8)
    for i in range(uint32(tid), total, uint32(cuda.blockDim.x)):
        xl = i // uint32(n8)
        wi = int32(i - xl * uint32(n8))
        x = x0 + int32(xl)
        if x < w:
            a = cls[xl]
            xr0 = int32(cst.right_x(x, min_d, 8 * wi))
            word = uint64(0)
            for b in range(8):
                xr = xr0 - b
                v = uint64(OUTSIDE)
                if xr >= 0 and xr < w:
                    j = xr - xlo
                    v = uint64(tab[cuda.popc(a ^ crs[j + (j >> 3)])])
                word |= v << uint64(8 * b)
            vol8[y, x, wi] = word


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
