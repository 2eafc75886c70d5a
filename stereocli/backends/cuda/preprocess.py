"""Preprocessing kernels (stages/preprocess.py on the GPU): grey to float, separable Gaussian (DoG) and bilateral filters, mean subtraction."""
from numba import cuda, float32

from ...stages import preprocess as _pre
from .common import CACHE, device_twins

pre = device_twins(_pre)  # the stage's shared arithmetic, as device functions

@cuda.jit(cache=CACHE)
def to_float_kernel(src, out):
    x, y = cuda.grid(2)
    if y < src.shape[0] and x < src.shape[1]:
        out[y, x] = float32(src[y, x])



@cuda.jit(cache=CACHE)
def conv_x_kernel(src, k, out):
    x, y = cuda.grid(2)
    if y < src.shape[0] and x < src.shape[1]:
        out[y, x] = pre.conv_x_at(src, y, x, k)


@cuda.jit(cache=CACHE)
def dog_y_kernel(t1, t2, k1, k2, out):
    x, y = cuda.grid(2)
    if y < t1.shape[0] and x < t1.shape[1]:
        out[y, x] = pre.dog_value(pre.conv_y_at(t1, y, x, k1), pre.conv_y_at(t2, y, x, k2))


@cuda.jit(cache=CACHE)
def bilateral_x_kernel(src, r, inv_ss, inv_sc, out):
    x, y = cuda.grid(2)
    if y < src.shape[0] and x < src.shape[1]:
        out[y, x] = pre.bilateral_x_at(src, y, x, r, inv_ss, inv_sc)


@cuda.jit(cache=CACHE)
def bilateral_y_kernel(src, r, inv_ss, inv_sc, out):
    x, y = cuda.grid(2)
    if y < src.shape[0] and x < src.shape[1]:
        out[y, x] = pre.bilateral_y_at(src, y, x, r, inv_ss, inv_sc)


@cuda.jit(cache=CACHE)
def subtract_mean_kernel(img, mean, out):
    x, y = cuda.grid(2)
    if y < img.shape[0] and x < img.shape[1]:
        out[y, x] = img[y, x] - mean[y, x] + float32(128.0)
