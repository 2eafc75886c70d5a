"""Refinement kernels (stages/refine.py on the GPU): left-right check, fill, median, and the connected components of the speckle filter."""
import math

from numba import cuda, float32

from ...stages import refine as _ref
from .common import CACHE, device_twins

ref = device_twins(_ref)  # the stage's shared arithmetic, as device functions

@cuda.jit(cache=CACHE)
def lr_check_kernel(disp, disp_r, max_diff, out):
    x, y = cuda.grid(2)
    if y < disp.shape[0] and x < disp.shape[1]:
        out[y, x] = ref.lr_check_at(disp, disp_r, y, x, max_diff)


@cuda.jit(cache=CACHE)
def keep_confidence_kernel(conf, disp, out):
    x, y = cuda.grid(2)
    if y < disp.shape[0] and x < disp.shape[1]:
        out[y, x] = ref.keep_confidence_at(conf, disp, y, x)


@cuda.jit(cache=CACHE)
def fill_kernel(disp, mode, out):
    x, y = cuda.grid(2)
    if y < disp.shape[0] and x < disp.shape[1]:
        out[y, x] = ref.fill_row_at(disp, y, x, mode)


@cuda.jit(cache=CACHE)
def median_kernel(disp, r, out):
    window = cuda.local.array(25, float32)
    x, y = cuda.grid(2)
    if y < disp.shape[0] and x < disp.shape[1]:
        out[y, x] = ref.median_at(disp, y, x, r, window)


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
