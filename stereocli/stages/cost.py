"""Matching costs -> cost volume C[y, x, d] (uint8, d contiguous).

Every cost is scaled to 0..255 "cost units" so that P1/P2 mean the same for all
of them. Index d in 0..D-1 is the disparity min_disparity + d; pixel (x, y) of
the left image is compared with (x - min_disparity - d, y) of the right image.
Where that falls outside the right image the cost is OUTSIDE (255).

Window costs (SAD, SSD, their zero-mean forms, ZNCC, BT) are computed as a
per-pixel volume, then box-summed with running sums, so their time does not grow
with the window.
"""
import functools
import math
from typing import NamedTuple

import cv2
import numpy as np
from numba import njit, prange

from . import CACHE, shared

OUTSIDE = 255
COST_SCALE = np.float32(4.0)  # grey-level differences -> cost units

# per-pixel difference kinds for diff_volume
ABS, SQ, PROD, BT = 0, 1, 2, 3
# what finalize_volume makes of window means: mean difference (SAD, BT), root mean
# square (SSD), zero-mean SSD, ZNCC
MEAN, RMS, ZSSD, ZNCC = 0, 1, 2, 3

M1 = np.uint64(0x5555555555555555)
M2 = np.uint64(0x3333333333333333)
M4 = np.uint64(0x0F0F0F0F0F0F0F0F)
H01 = np.uint64(0x0101010101010101)


# ----------------------------------------------------------------- shared arithmetic
@shared
def right_x(x, min_d, d):
    """The column of the right image that left pixel x is compared with at disparity
    index d (disparity min_d + d). The one place the convention is written."""
    return x - min_d - d


@shared
def inside_range(w, n, x, min_d):
    """The disparity indices lo..hi (inclusive; none when hi < lo) whose right pixel
    right_x(x, min_d, d) lies inside an image w pixels wide."""
    return max(0, right_x(x, min_d, w - 1)), min(n - 1, right_x(x, min_d, 0))


@shared
def census_at(img, y, x, wx, wy):
    """Census string of (x, y): one bit per window pixel (centre excluded), 1 where darker than the centre."""
    h, w = img.shape
    c = img[y, x]
    bits = np.uint64(0)
    for j in range(-(wy // 2), wy // 2 + 1):
        yy = min(max(y + j, 0), h - 1)
        for i in range(-(wx // 2), wx // 2 + 1):
            if i != 0 or j != 0:
                xx = min(max(x + i, 0), w - 1)
                bits = (bits << np.uint64(1)) | np.uint64(1 if img[yy, xx] < c else 0)
    return bits


def census_scale(nbits: int) -> np.ndarray:
    """Hamming distance (0..nbits) -> cost units 0..255, rounded, as a lookup table."""
    h = np.arange(65)
    return np.minimum((h * 255 + nbits // 2) // nbits, 255).astype(np.uint8)


@functools.lru_cache(maxsize=None)  # (one search per census size, not one per match)
def census_scale_magic(nbits: int) -> tuple[np.uint32, np.uint32, np.uint32]:
    """(mul, add, shift) such that min((h * mul + add) >> shift, 255), in uint32, is
    census_scale(nbits)[h] for every h in 0..64: the CPU's census volume computes its
    costs so instead of looking each one up (at one thread a lookup per cell cost more
    than the Hamming distance itself: teddy's volume 3.9 ms, 2.6 without)."""
    table = census_scale(nbits)
    h = np.arange(65, dtype=np.uint64)
    for shift in range(8, 32):
        m = -(-(1 << shift) // nbits)  # ceil(2**shift / nbits)
        mul, add = 255 * m, (nbits // 2) * m
        if 64 * mul + add >= 1 << 32:
            break
        if np.array_equal(np.minimum((h * np.uint64(mul) + np.uint64(add)) >> np.uint64(shift), 255), table):
            return np.uint32(mul), np.uint32(add), np.uint32(shift)
    raise ValueError(f"no uint32 form of the census scale for {nbits} bits")


@shared
def census_scaled(ham, mul, add, shift):
    """census_scale(nbits)[ham] for a Hamming distance ham (uint32), computed from
    census_scale_magic(nbits) = (mul, add, shift) instead of looked up. The shift is
    masked to 0..31 (it is 8..31): Numba types a uint32 shift as 64-bit, and the mask
    lets LLVM keep the whole scale in 32-bit lanes, twice as many a vector (the census
    volume's kernel, one thread, 2-core machine (AVX2), processes alternated: teddy
    9.5-13.7 -> 6.9-7.7 ms; no change beyond the noise on the H100 machine's AVX-512 host)."""
    v = np.uint32(ham * mul + add)  # (32-bit arithmetic: the magic keeps 64 * mul + add below 2**32)
    return np.uint32(min(v >> (shift & np.uint32(31)), np.uint32(255)))


@shared
def census_cost_value(a, b, scale):
    """Hamming distance of two census strings, scaled to cost units by the table `scale`."""
    v = a ^ b
    v = v - ((v >> np.uint64(1)) & M1)
    v = (v & M2) + ((v >> np.uint64(2)) & M2)
    v = (v + (v >> np.uint64(4))) & M4
    return scale[(v * H01) >> np.uint64(56)]


@shared
def pixel_diff(L, R, y, x, xr, kind):
    """Per-pixel term of a window cost between L[y, x] and R[y, xr] (xr inside the image)."""
    a = L[y, x]
    b = R[y, xr]
    if kind == ABS:
        return abs(a - b)
    if kind == SQ:
        return (a - b) * (a - b)
    if kind == PROD:
        return a * b
    # Birchfield-Tomasi: distance of each pixel to the other's half-pixel interpolated range
    w = L.shape[1]
    a_lo = np.float32(0.5) * (a + L[y, max(x - 1, 0)])
    a_hi = np.float32(0.5) * (a + L[y, min(x + 1, w - 1)])
    b_lo = np.float32(0.5) * (b + R[y, max(xr - 1, 0)])
    b_hi = np.float32(0.5) * (b + R[y, min(xr + 1, w - 1)])
    amin = min(a, min(a_lo, a_hi))
    amax = max(a, max(a_lo, a_hi))
    bmin = min(b, min(b_lo, b_hi))
    bmax = max(b, max(b_lo, b_hi))
    d1 = max(np.float32(0.0), max(b - amax, amin - b))
    d2 = max(np.float32(0.0), max(a - bmax, bmin - a))
    return min(d1, d2)


@shared
def scaled_cost(v):
    """A mean grey-level difference (0..255) -> cost units, saturating at 255."""
    c = v * COST_SCALE + np.float32(0.5)
    if not c < np.float32(OUTSIDE):
        return np.uint8(OUTSIDE)
    if c < np.float32(0.0):
        return np.uint8(0)
    return np.uint8(c)


# A window is flat for ZNCC where its variance (mean square minus squared mean) is at
# most ZNCC_FLAT_ABS + ZNCC_FLAT_REL x its mean square: a standard deviation below about
# 0.03 grey levels near black and 0.8 near white (8-bit values), where the variance
# is float rounding, not texture.
ZNCC_FLAT_ABS = np.float32(1e-3)
ZNCC_FLAT_REL = np.float32(1e-5)


@shared
def zncc_cost_value(m_lr, m_l, m_l2, m_r, m_r2):
    """(1 - ZNCC) * 127.5 from window means of L*R, L, L^2, R, R^2; 128 (ZNCC 0: no
    preference) where either window is flat (ZNCC_FLAT_ABS, ZNCC_FLAT_REL). There ZNCC
    is 0 / 0, and the rounding of the means, not the images, decided the cost: 0 or 255
    by chance (the variances were held at 1e-3, and a covariance of rounding error, about
    0.004 near white, over them gave a correlation of +-4), and a different one on the
    GPU, whose multiply-adds round once, wherever the preprocessing gave float images."""
    v_l = m_l2 - m_l * m_l
    v_r = m_r2 - m_r * m_r
    if v_l <= ZNCC_FLAT_ABS + ZNCC_FLAT_REL * m_l2 or v_r <= ZNCC_FLAT_ABS + ZNCC_FLAT_REL * m_r2:
        return np.uint8(128)
    ncc = (m_lr - m_l * m_r) / math.sqrt(v_l * v_r)
    c = (np.float32(1.0) - ncc) * np.float32(127.5) + np.float32(0.5)
    return np.uint8(min(max(c, np.float32(0.0)), np.float32(255.0)))


@shared
def zssd_value(m_sq, m_l, m_r):
    """RMS of the zero-mean difference over a window, from window means."""
    d = m_l - m_r
    return math.sqrt(max(m_sq - d * d, np.float32(0.0)))


# ----------------------------------------------------------------- CPU drivers
def census_transform_cpu(img, wx, wy):
    """census_at for every pixel: the image with its edges replicated (wx // 2 columns
    and wy // 2 rows out, as census_at clamps), then census_rows_cpu over it."""
    return census_rows_cpu(_pad(img, wx, wy), img.shape[0], img.shape[1], wx, wy)


@njit(parallel=True, cache=CACHE)
def census_rows_cpu(padded, h, w, wx, wy):
    """The census strings of the h x w image inside `padded` (edges replicated), a row
    at a time (census_row)."""
    out = np.empty((h, w), np.uint64)
    for y in prange(h):
        census_row(padded, y, w, wx, wy, np.empty(w, np.uint8), out[y])
    return out


@njit(cache=CACHE, inline="always")
def census_row(padded, y, w, wx, wy, acc, bits):
    """bits[x] = the census string of pixel (x, y) of the image inside `padded`: for each
    window offset, one comparison of a whole row with the centre row, shifted into a
    byte per pixel (acc); every 8 offsets the bytes are shifted into the strings. The
    same bits in the same order as census_at, but the loops over x vectorise, and on
    bytes (a 9x7 window: 1.23 -> 0.74 ms at 450x375, one thread, against shifting each
    bit into the uint64 strings). The rows come padded once instead of each row's window
    rows being built with clamped indices: 1.08 -> 0.47 ms (teddy, uint8, one thread,
    2-core machine)."""
    rx, ry = wx // 2, wy // 2
    bits[:] = 0
    acc[:] = 0  # (the last (up to 8) offsets' bits, the latest lowest)
    centre = padded[y + ry, rx:rx + w]
    n = 0  # bits in acc not yet in bits
    for j in range(wy):
        row = padded[y + j]
        for i in range(wx):
            if i != rx or j != ry:
                seg = row[i:i + w]  # (views indexed from 0: no negative-index checks)
                for x in range(w):
                    acc[x] = (acc[x] << np.uint8(1)) | np.uint8(seg[x] < centre[x])
                n += 1
                if n == 8:
                    for x in range(w):
                        bits[x] = (bits[x] << np.uint64(8)) | np.uint64(acc[x])
                    n = 0
    # the last n offsets; acc's bits above them are the offsets just before, which the
    # shift by n puts under the same bits of `bits`: OR-ing them changes nothing
    if n:
        for x in range(w):
            bits[x] = (bits[x] << np.uint64(n)) | np.uint64(acc[x])


class CensusCodes(NamedTuple):
    """A pair's census strings over a disparity range: what the CPU's SGM computes the
    census costs from, pixel by pixel, as it sweeps (aggregate.sgm_cpu with `codes`),
    instead of reading them from a stored volume (1 byte per cell less memory)."""
    cl: np.ndarray  # (h, w) uint64: the left image's strings
    crev: np.ndarray  # (h, w) uint64: the right image's, each row reversed (crev[y, k] = right[y, w - 1 - k])
    min_d: int
    ndisp: int
    mul: np.uint32  # census_scale_magic(nbits)
    add: np.uint32
    shift: np.uint32


def census_codes(cl, cr, min_d, ndisp, nbits) -> CensusCodes:
    return CensusCodes(cl, np.ascontiguousarray(cr[:, ::-1]), int(min_d), int(ndisp), *census_scale_magic(nbits))


@njit(cache=CACHE, inline="always")
def census_pixel_costs(codes, y, x, C, cy):
    """C[cy, x, :] = the census costs of pixel (x, y) (the census volume's C[y, x]). The
    right row is read reversed, so that the d loop reads ascending memory, and the
    Hamming distance is scaled to cost units (census_scale_magic) in the same loop: it
    vectorises (1482x1000x128, one thread: 38.7 -> 27.8 ms against a second loop over
    the distances kept in a scratch vector, which also ran 4.5x slower wherever LLVM
    could not tell that vector's length)."""
    w = codes.cl.shape[1]
    ndisp = C.shape[2]
    lo, hi = inside_range(w, ndisp, x, codes.min_d)  # then as a half-open range within 0..ndisp
    lo = min(lo, ndisp)
    hi = max(hi + 1, lo)
    out = C[cy, x]  # (views indexed from 0: no negative-index checks)
    for d in range(lo):
        out[d] = OUTSIDE
    a = codes.cl[y, x]
    k0 = w - 1 - x + codes.min_d + lo  # crev index of the right pixel of disparity lo
    seg = codes.crev[y, k0:k0 + hi - lo]
    inside = out[lo:hi]
    mul, add, shift = codes.mul, codes.add, codes.shift
    for d in range(hi - lo):
        v = a ^ seg[d]
        v = v - ((v >> np.uint64(1)) & M1)
        v = (v & M2) + ((v >> np.uint64(2)) & M2)
        v = (v + (v >> np.uint64(4))) & M4
        inside[d] = np.uint8(census_scaled(np.uint32((v * H01) >> np.uint64(56)), mul, add, shift))
    for d in range(hi, ndisp):
        out[d] = OUTSIDE


def census_volume_pair_cpu(left, right, min_d, ndisp, wx, wy, out=None):
    """The census cost volume C[y, x, d] = census_cost_value(census_at(left, y, x),
    census_at(right, y, x - min_d - d), scaled), OUTSIDE where that right pixel is
    outside the image; into `out` (h, w, ndisp) uint8 when given. One parallel loop over
    rows: each row's strings of both images are computed where its costs are (the costs
    of row y need only row y's strings), so there is one fork instead of the three of
    two census_transform_cpu calls and a volume loop, no serial copy of the right
    strings reversed, and no full-size string arrays. H100 machine's host, 16 threads,
    profile_cpu.py: census stage teddy 1.10-1.18 -> 0.79-0.80 ms, cones@741x500 2.5-2.8
    -> 2.0."""
    h, w = left.shape
    vol = np.empty((h, w, ndisp), np.uint8) if out is None else out
    mul, add, shift = census_scale_magic(wx * wy - 1)
    census_volume_rows_cpu(_pad(left, wx, wy), _pad(right, wx, wy), wx, wy, int(min_d), mul, add, shift, vol)
    return vol


def _pad(img, wx, wy):
    """The image with wx // 2 columns and wy // 2 rows replicated out at its edges."""
    rx, ry = wx // 2, wy // 2
    try:
        return cv2.copyMakeBorder(img, ry, ry, rx, rx, cv2.BORDER_REPLICATE)
    except cv2.error:  # (a pixel type OpenCV does not take)
        return np.pad(img, ((ry, ry), (rx, rx)), mode="edge")


@njit(parallel=True, cache=CACHE)
def census_volume_rows_cpu(pl, pr, wx, wy, min_d, mul, add, shift, vol):
    """census_volume_pair_cpu's loop: for each row (in parallel) both images' census
    strings (census_row), then its costs (census_pixel_costs, from one-row codes)."""
    h, w, ndisp = vol.shape
    for y in prange(h):
        acc = np.empty(w, np.uint8)
        cl = np.empty((1, w), np.uint64)
        cr = np.empty(w, np.uint64)
        crev = np.empty((1, w), np.uint64)
        census_row(pl, y, w, wx, wy, acc, cl[0])
        census_row(pr, y, w, wx, wy, acc, cr)
        for k in range(w):
            crev[0, k] = cr[w - 1 - k]
        codes = CensusCodes(cl, crev, min_d, ndisp, mul, add, shift)
        for x in range(w):
            census_pixel_costs(codes, 0, x, vol, y)


@njit(parallel=True, cache=CACHE)
def diff_volume_cpu(L, R, min_d, ndisp, kind):
    """E[y, x, d] = pixel_diff(L, R, y, x, clamp(x - min_d - d)) as float32."""
    h, w = L.shape
    vol = np.empty((h, w, ndisp), np.float32)
    for y in prange(h):
        for x in range(w):
            for d in range(ndisp):
                xr = min(max(right_x(x, min_d, d), 0), w - 1)
                vol[y, x, d] = pixel_diff(L, R, y, x, xr, kind)
    return vol


@njit(parallel=True, cache=CACHE)
def box_mean_cpu(V, rx, ry):
    """Mean over a (2rx+1) x (2ry+1) window of each d-slice of V[y, x, d], edges replicated.

    Running sums: the time does not depend on the window. The order of the float
    additions is the same as in the CUDA kernels, so both give the same bits.
    """
    h, w, n = V.shape
    tmp = np.empty_like(V)
    for y in prange(h):
        for d in range(n):
            acc = np.float32(0.0)
            for i in range(-rx, rx + 1):
                acc += V[y, min(max(i, 0), w - 1), d]
            for x in range(w):
                tmp[y, x, d] = acc
                acc = acc + (V[y, min(x + rx + 1, w - 1), d] - V[y, max(x - rx, 0), d])
    out = np.empty_like(V)
    inv = np.float32(1.0 / ((2 * rx + 1) * (2 * ry + 1)))
    for x in prange(w):
        for d in range(n):
            acc = np.float32(0.0)
            for j in range(-ry, ry + 1):
                acc += tmp[min(max(j, 0), h - 1), x, d]
            for y in range(h):
                out[y, x, d] = acc * inv
                acc = acc + (tmp[min(y + ry + 1, h - 1), x, d] - tmp[max(y - ry, 0), x, d])
    return out


@shared
def finalize_at(M, y, x, d, min_d, kind, ml, ml2, mr, mr2):
    """Window means -> cost units of one element. kind: MEAN (of differences: SAD, BT),
    RMS (of squares: SSD), ZSSD (zero-mean SSD), ZNCC (M holds the mean of L*R)."""
    w = M.shape[1]
    xr = right_x(x, min_d, d)
    if xr < 0 or xr >= w:
        return np.uint8(OUTSIDE)
    if kind == MEAN:
        return scaled_cost(M[y, x, d])
    if kind == RMS:
        return scaled_cost(math.sqrt(max(M[y, x, d], np.float32(0.0))))  # running sums can dip below 0
    if kind == ZSSD:
        return scaled_cost(zssd_value(M[y, x, d], ml[y, x], mr[y, xr]))
    return zncc_cost_value(M[y, x, d], ml[y, x], ml2[y, x], mr[y, xr], mr2[y, xr])


@njit(parallel=True, cache=CACHE)
def finalize_volume_cpu(M, min_d, kind, ml, ml2, mr, mr2):
    """Window means -> uint8 cost volume (see finalize_at)."""
    h, w, n = M.shape
    vol = np.empty((h, w, n), np.uint8)
    for y in prange(h):
        for x in range(w):
            for d in range(n):
                vol[y, x, d] = finalize_at(M, y, x, d, min_d, kind, ml, ml2, mr, mr2)
    return vol


@njit(parallel=True, cache=CACHE)
def table_volume_cpu(ql, qr, table, min_d, ndisp):
    """C[y, x, d] = table[ql[y, x], qr[y, x - d]] (mutual information lookup)."""
    h, w = ql.shape
    vol = np.empty((h, w, ndisp), np.uint8)
    for y in prange(h):
        for x in range(w):
            for d in range(ndisp):
                xr = right_x(x, min_d, d)
                if xr >= 0 and xr < w:
                    vol[y, x, d] = table[ql[y, x], qr[y, xr]]
                else:
                    vol[y, x, d] = OUTSIDE
    return vol


@njit(cache=CACHE)
def joint_histogram_cpu(ql, qr, disp):
    """Joint histogram of (ql[y, x], qr[y, round(x - disp)]) over pixels with a valid disparity."""
    h, w = ql.shape
    hist = np.zeros((256, 256), np.float64)
    for y in range(h):
        for x in range(w):
            d = disp[y, x]
            if d == d:
                xr = int(math.floor(x - d + 0.5))
                if xr >= 0 and xr < w:
                    hist[ql[y, x], qr[y, xr]] += 1.0
    return hist


def mi_table(hist: np.ndarray, sigma: float = 1.0) -> np.ndarray:
    """Hirschmueller's MI cost table from a joint histogram: Parzen (Gaussian) smoothing of
    the probabilities and of their -log, then c(i, k) = -(h_L(i) + h_R(k) - h_LR(i, k)),
    shifted and scaled to 0..255 cost units (uint8 256x256)."""
    n = hist.sum()
    if n <= 0:
        return np.full((256, 256), 128, np.uint8)
    p = (hist / n).astype(np.float64)
    eps = 1e-7
    p_s = cv2.GaussianBlur(p, (7, 7), sigma)
    h_lr = cv2.GaussianBlur(-np.log(p_s + eps), (7, 7), sigma) / n
    pl, pr = p.sum(axis=1), p.sum(axis=0)
    gk = cv2.getGaussianKernel(7, sigma).ravel()
    h_l = np.convolve(-np.log(np.convolve(pl, gk, mode="same") + eps), gk, mode="same") / n
    h_r = np.convolve(-np.log(np.convolve(pr, gk, mode="same") + eps), gk, mode="same") / n
    mi = h_l[:, None] + h_r[None, :] - h_lr
    cost = -mi
    lo, hi = np.percentile(cost, 1), np.percentile(cost, 99)
    scaled = (cost - lo) * (255.0 / max(hi - lo, 1e-12))
    return np.clip(np.round(scaled), 0, 255).astype(np.uint8)
