"""Cost-volume kernels (stages/cost.py on the GPU): census transform and census volume (packed, popc), per-pixel differences, box means, finalisation to cost units, mutual-information table and histogram."""
import math

from numba import cuda, float32, int32, uint32, uint64

from ...stages import cost as _cost
from .common import CACHE, OUTSIDE, _volume_index, device_twins

cst = device_twins(_cost)  # the stage's shared arithmetic, as device functions

_CENSUS_KERNELS = {}


def census_kernel_for(wx, wy):
    """The census kernel of one window size: with constant loop bounds the window's
    reads unroll and overlap (with the bounds as arguments, one read at a time)."""
    if (wx, wy) not in _CENSUS_KERNELS:
        @cuda.jit(cache=CACHE)
        def census_kernel(img, out):
            x, y = cuda.grid(2)
            if y < img.shape[0] and x < img.shape[1]:
                out[y, x] = cst.census_at(img, y, x, wx, wy)
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
        xr0 = int32(cst.right_x(x, min_d, 8 * wi))
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
