"""Preprocessing: separable Difference of Gaussians and separable bilateral filter.

Images are float32 grey in 0..255. Borders replicate the edge pixel.
"""
import math

import numpy as np
from numba import njit, prange

from . import CACHE, shared


def gaussian_kernel(sigma: float) -> np.ndarray:
    r = max(1, int(math.ceil(3.0 * sigma)))
    x = np.arange(-r, r + 1, dtype=np.float64)
    k = np.exp(-0.5 * (x / sigma) ** 2)
    return (k / k.sum()).astype(np.float32)


@shared
def conv_x_at(src, y, x, k):
    """sum_i k[i] * src[y, clamp(x + i - r)]"""
    w = src.shape[1]
    r = k.shape[0] // 2
    acc = np.float32(0.0)
    for i in range(k.shape[0]):
        xx = min(max(x + i - r, 0), w - 1)
        acc += k[i] * src[y, xx]
    return acc


@shared
def conv_y_at(src, y, x, k):
    h = src.shape[0]
    r = k.shape[0] // 2
    acc = np.float32(0.0)
    for i in range(k.shape[0]):
        yy = min(max(y + i - r, 0), h - 1)
        acc += k[i] * src[yy, x]
    return acc


@shared
def bilateral_x_at(src, y, x, r, inv_ss, inv_sc):
    """1-D bilateral along x: weights exp(-i^2/2ss^2 - (v-c)^2/2sc^2)."""
    w = src.shape[1]
    c = src[y, x]
    num = np.float32(0.0)
    den = np.float32(0.0)
    for i in range(-r, r + 1):
        v = src[y, min(max(x + i, 0), w - 1)]
        wt = math.exp(-np.float32(i * i) * inv_ss - (v - c) * (v - c) * inv_sc)
        num += wt * v
        den += wt
    return num / den


@shared
def bilateral_y_at(src, y, x, r, inv_ss, inv_sc):
    h = src.shape[0]
    c = src[y, x]
    num = np.float32(0.0)
    den = np.float32(0.0)
    for i in range(-r, r + 1):
        v = src[min(max(y + i, 0), h - 1), x]
        wt = math.exp(-np.float32(i * i) * inv_ss - (v - c) * (v - c) * inv_sc)
        num += wt * v
        den += wt
    return num / den


@shared
def dog_value(a, b):
    """Band-pass value re-centred on mid-grey so that costs see a 0..255 image."""
    return np.float32(128.0) + (a - b)


@njit(parallel=True, cache=CACHE)
def dog_cpu(img, k1, k2):
    h, w = img.shape
    t1 = np.empty_like(img)
    t2 = np.empty_like(img)
    for y in prange(h):
        for x in range(w):
            t1[y, x] = conv_x_at(img, y, x, k1)
            t2[y, x] = conv_x_at(img, y, x, k2)
    out = np.empty_like(img)
    for y in prange(h):
        for x in range(w):
            out[y, x] = dog_value(conv_y_at(t1, y, x, k1), conv_y_at(t2, y, x, k2))
    return out


@njit(parallel=True, cache=CACHE)
def bilateral_cpu(img, r, inv_ss, inv_sc):
    h, w = img.shape
    t = np.empty_like(img)
    for y in prange(h):
        for x in range(w):
            t[y, x] = bilateral_x_at(img, y, x, r, inv_ss, inv_sc)
    out = np.empty_like(img)
    for y in prange(h):
        for x in range(w):
            out[y, x] = bilateral_y_at(t, y, x, r, inv_ss, inv_sc)
    return out


def bilateral_constants(sigma_space: float, sigma_color: float):
    return np.float32(0.5 / sigma_space ** 2), np.float32(0.5 / sigma_color ** 2)
