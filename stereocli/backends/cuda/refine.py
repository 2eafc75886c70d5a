"""Refinement kernels (stages/refine.py on the GPU): left-right check, fill (with the
border slopes), median, weighted median, and the connected components of the speckle filter."""
import math

from numba import cuda, float32, float64, int32

from ...stages import refine as _ref
from .common import CACHE, SIM, device_twins

ref = device_twins(_ref)  # the stage's shared arithmetic, as device functions
# local array sizes must be plain globals (a module attribute is not a compile-time constant)
SLOPE_WINDOW = _ref.SLOPE_WINDOW
WMF_MAX_SAMPLES = _ref.WMF_MAX_SAMPLES
WMF_SMALL_R = 4  # the default radius: its samples take a smaller scratch array
WMF_SMALL_SAMPLES = (2 * WMF_SMALL_R // _ref.WMF_STEP + 1) ** 2

# Scratch arrays (cuda.local.array) live in the device functions below, not in the
# kernels: Numba zero-fills a local array where its function starts, so an array
# declared in a kernel costs every thread a store of its whole size, whether or not the
# thread uses it. In slope_fill_kernel (340 floats a thread) and wmf_kernel (169 ints)
# that was 175 and 267 MB of local-memory stores at 741x500, which made the two kernels
# take 108 and 119 us (ncu: DRAM writes 155 and 235 MB). Declared in a function that
# only the threads with work call, the fill costs only those threads.


@cuda.jit(device=True)
def _slope_apply(disp, first, slopes, y, e, out, lo, hi):
    window = cuda.local.array(SLOPE_WINDOW, float32)
    ref.slope_apply_at(disp, first, slopes, y, e, window, out, lo, hi)


@cuda.jit(device=True)
def _wmf_small(disp, guide, nc, lut, y, x, r):
    samples = cuda.local.array(WMF_SMALL_SAMPLES, int32)
    return ref.weighted_median_at(disp, guide, nc, lut, y, x, r, samples)


@cuda.jit(device=True)
def _wmf_large(disp, guide, nc, lut, y, x, r):
    samples = cuda.local.array(WMF_MAX_SAMPLES, int32)
    return ref.weighted_median_at(disp, guide, nc, lut, y, x, r, samples)

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


FILL_THREADS = 4 if SIM else 256  # threads of fill_kernel's block (one row; the simulator: a thread per thread)


@cuda.jit(device=True, inline=True)
def _max_scan(buf, t, v):
    """Leaves in buf[t] the max of v over the threads in slots 0..t (an inclusive scan;
    thread t's slot is t, or any permutation of the threads)."""
    buf[t] = v
    cuda.syncthreads()
    off = 1
    while off < FILL_THREADS:
        u = buf[t - off] if t >= off else v
        cuda.syncthreads()
        v = max(v, u)
        buf[t] = v
        cuda.syncthreads()
        off *= 2


@cuda.jit(cache=CACHE)
def fill_kernel(disp, mode, out):
    """The row fill (fill_choice between the nearest valid pixels on the left and on the
    right) for every pixel of a row (block y), in time linear in the row: each
    thread takes a segment of the row; the nearest valid pixel left of a segment comes
    from a scan over the threads of the last valid index in each segment, the nearest on
    its right from one of the first (a search per pixel took time quadratic in the
    length of an invalid run, 1.2 ms at 1920x1080)."""
    buf = cuda.shared.array(FILL_THREADS, int32)
    _fill_row(disp, mode, out, cuda.blockIdx.x, buf)


SLOPE_ENDS = 64  # run ends a row's block takes together (more: the rest one thread each)


@cuda.jit(cache=CACHE)
def slope_fill_kernel(disp, first, slopes, sloped, mode, out, lo, hi):
    """Fill mode SLOPE, step 2, and the background fill, a row per block: the runs of
    the row that slope_fit_kernel found continued along the median slope nearby (into
    sloped: slope_apply_at's values, computed by the whole block), then (mode not 0)
    fill_kernel's row fill of sloped into out. One launch instead of a list kernel and
    the fill: at small sizes each launch costs more host time than the GPU spends on
    these steps. The block gathers a run's window of slopes (up to SLOPE_WINDOW) into
    shared memory, each thread ranks some of them (the median: the value whose rank
    range holds n // 2, or the mean of those at n // 2 - 1 and n // 2, in float32 as
    sorted_median takes them), and the threads continue the run together. One thread a
    run, with the window read and sorted serially, took 56 us at 741x500 and 178 at
    1920x1080 (H100)."""
    buf = cuda.shared.array(FILL_THREADS, int32)
    ends = cuda.shared.array(SLOPE_ENDS, int32)
    vals = cuda.shared.array(SLOPE_WINDOW, float32)
    cnt = cuda.shared.array(2, int32)  # [run ends found, slopes gathered]
    med = cuda.shared.array(2, float32)
    y = cuda.blockIdx.x
    h, w = disp.shape
    t = cuda.threadIdx.x
    if t == 0:
        cnt[0] = 0
        cnt[1] = 0
    cuda.syncthreads()
    for e in range(t, w, FILL_THREADS):
        if first[y, e] >= 0:
            k = cuda.atomic.add(cnt, 0, 1)
            if k < SLOPE_ENDS:
                ends[k] = e
            else:
                _slope_apply(disp, first, slopes, y, e, sloped, lo, hi)
    cuda.syncthreads()
    for q in range(min(cnt[0], SLOPE_ENDS)):
        e = ends[q]
        for i in range(t, SLOPE_WINDOW, FILL_THREADS):  # the window's slopes, in any order
            yy, xx = ref.slope_window_cell(y, e, i)
            if yy >= 0 and yy < h and xx >= 0 and xx < w:
                v = slopes[yy, xx]
                if v == v:
                    vals[cuda.atomic.add(cnt, 1, 1)] = v
        cuda.syncthreads()
        n = cnt[1]
        m = n // 2
        for i in range(t, n, FILL_THREADS):
            v = vals[i]
            less = 0
            same = 0
            for j in range(n):
                u = vals[j]
                if u < v:
                    less += 1
                elif u == v:
                    same += 1
            if less <= m and m < less + same:
                med[1] = v
            if less <= m - 1 and m - 1 < less + same:
                med[0] = v
        cuda.syncthreads()
        s = 0.0
        if n > 0:
            s = float64(ref.middle(med[0], med[1], n))
        ref.slope_continue(disp, first, y, e, s, sloped, t, FILL_THREADS, lo, hi)
        cuda.syncthreads()
        if t == 0:
            cnt[1] = 0
        cuda.syncthreads()
    if mode != 0:
        _fill_row(sloped, mode, out, y, buf)


@cuda.jit(device=True, inline=True)
def _fill_row(disp, mode, out, y, buf):
    """fill_kernel's work on row y (the block's FILL_THREADS threads; buf: shared scratch)."""
    h, w = disp.shape
    t = cuda.threadIdx.x
    seg = (w + FILL_THREADS - 1) // FILL_THREADS
    s0 = min(t * seg, w)
    s1 = min(s0 + seg, w)
    last = int32(-1)
    first = int32(w)
    for x in range(s0, s1):
        if disp[y, x] == disp[y, x]:
            last = x
            first = min(first, x)
    _max_scan(buf, t, last)  # the last valid index at or before each segment's end
    before = buf[t - 1] if t > 0 else int32(-1)  # ... before this one's start
    cuda.syncthreads()
    # the first valid index after a segment: a max-scan of (w - first) from the right
    _max_scan(buf, FILL_THREADS - 1 - t, int32(w - first))
    after = w - buf[FILL_THREADS - 1 - t - 1] if t < FILL_THREADS - 1 else w
    nl = before  # nearest valid at or left of x
    for x in range(s0, s1):
        c = disp[y, x]
        if c == c:
            out[y, x] = c
            nl = x
        else:
            nr = after
            for i in range(x + 1, s1):
                if disp[y, i] == disp[y, i]:
                    nr = i
                    break
            left = disp[y, nl] if nl >= 0 else float32(math.nan)
            right = disp[y, nr] if nr < w else float32(math.nan)
            out[y, x] = ref.fill_choice(left, x - nl, right, nr - x, mode, x, w)


@cuda.jit(cache=CACHE)
def slope_fit_kernel(disp, first, slopes, out):
    """Fill mode SLOPE, step 1 (border_slope_cpu's first loop): at the end e of each run
    that the border rule fills, its start and the slope fitted there; out = disp."""
    x, y = cuda.grid(2)
    h, w = disp.shape
    if y < h and x < w:
        out[y, x] = disp[y, x]
        x0 = ref.slope_run_start(disp, y, x)
        first[y, x] = x0
        slopes[y, x] = ref.slope_fit_at(disp, y, x) if x0 >= 0 else float32(math.nan)


WMF_BLOCK = (32, 8)  # wmf_kernel's block
WMF_THREADS = WMF_BLOCK[0] * WMF_BLOCK[1]


@cuda.jit(cache=CACHE)
def wmf_kernel(disp, guide, nc, lut, r, out):
    """The weighted median in one launch: each thread copies its pixel to out and, if it
    is a disparity edge, puts it on its block's list (shared memory); then the block's
    threads share out that list, so every lane of a warp has an edge pixel to work on
    (two launches, with a list in global memory, cost more host time than the GPU's
    work at small sizes). Launched with WMF_BLOCK blocks."""
    todo = cuda.shared.array(WMF_THREADS, int32)
    n = cuda.shared.array(1, int32)
    t = cuda.threadIdx.y * cuda.blockDim.x + cuda.threadIdx.x
    if t == 0:
        n[0] = 0
    cuda.syncthreads()
    x, y = cuda.grid(2)
    h, w = disp.shape
    if y < h and x < w:
        v = disp[y, x]
        out[y, x] = v
        if v == v and ref.disparity_edge_at(disp, y, x):
            todo[cuda.atomic.add(n, 0, 1)] = y * w + x
    cuda.syncthreads()
    for i in range(t, n[0], WMF_THREADS):
        yy = todo[i] // w
        xx = todo[i] - yy * w
        if r <= WMF_SMALL_R:
            out[yy, xx] = _wmf_small(disp, guide, nc, lut, yy, xx, r)
        else:
            out[yy, xx] = _wmf_large(disp, guide, nc, lut, yy, xx, r)


@cuda.jit(cache=CACHE)
def median_kernel(disp, r, out):
    window = cuda.local.array(25, float32)
    x, y = cuda.grid(2)
    if y < disp.shape[0] and x < disp.shape[1]:
        out[y, x] = ref.median_at(disp, y, x, r, window)


@cuda.jit(cache=CACHE)
def fill2d_kernel(disp, dirs, out):
    """The 2-D fill (fill2d_at) of every invalid pixel, a thread each."""
    x, y = cuda.grid(2)
    if y < disp.shape[0] and x < disp.shape[1]:
        v = disp[y, x]
        out[y, x] = v if v == v else ref.fill2d_at(disp, dirs, y, x)


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


CCL_TILE = (8, 4) if SIM else (32, 8)  # pixels (x, y) of ccl_tile_kernel's block, a thread each
_TX, _TY = CCL_TILE
_TN = _TX * _TY  # (a shared array's size must be a plain global)


@cuda.jit(device=True, inline=True)
def _joins(v, u, max_diff):
    """Two 4-neighbours are one speckle component: both valid, at most max_diff apart."""
    return v == v and u == u and abs(u - v) <= max_diff


@cuda.jit(cache=CACHE)
def ccl_tile_kernel(disp, max_diff, labels, counts):
    """The components inside each tile of CCL_TILE pixels, found in shared memory; each
    pixel's label becomes the image index of its tile component's root (the smallest
    index in it, so labels[p] <= p), -1 where invalid, and the root's `counts` entry
    the component's size (0 elsewhere). Tiles are joined afterwards by
    ccl_border_kernel. One pass over all pixels in global memory (unions chasing chains
    across the image, then an atomic add per pixel on the few roots of the large
    components) took 0.22-0.31 ms at 741x500 and 1242x375 on an H100, 0.61 at
    1920x1080, 1.53 at 3840x2160; tile by tile 0.04-0.05, 0.12 and 0.40."""
    val = cuda.shared.array(_TN, float32)
    lab = cuda.shared.array(_TN, int32)
    cnt = cuda.shared.array(_TN, int32)
    tx, ty = cuda.threadIdx.x, cuda.threadIdx.y
    x0, y0 = cuda.blockIdx.x * _TX, cuda.blockIdx.y * _TY
    h, w = disp.shape
    x, y = x0 + tx, y0 + ty
    i = ty * _TX + tx
    v = disp[y, x] if y < h and x < w else float32(math.nan)
    val[i] = v
    lab[i] = i if v == v else -1
    cnt[i] = 0
    cuda.syncthreads()
    if tx + 1 < _TX and _joins(v, val[i + 1], max_diff):
        _union(lab, i, i + 1)
    if ty + 1 < _TY and _joins(v, val[i + _TX], max_diff):
        _union(lab, i, i + _TX)
    cuda.syncthreads()
    r = _find(lab, i) if v == v else -1
    if r >= 0:
        cuda.atomic.add(cnt, r, 1)
    cuda.syncthreads()
    if y < h and x < w:
        labels[y * w + x] = (y0 + r // _TX) * w + x0 + r % _TX if r >= 0 else -1
        counts[y * w + x] = cnt[i]


@cuda.jit(cache=CACHE)
def ccl_border_kernel(disp, max_diff, labels):
    """Joins the components of neighbouring tiles: each pixel on a tile's right or
    bottom edge with its neighbour across it."""
    x, y = cuda.grid(2)
    h, w = disp.shape
    if y < h and x < w:
        v = disp[y, x]
        p = y * w + x
        if x % _TX == _TX - 1 and x + 1 < w and _joins(v, disp[y, x + 1], max_diff):
            _union(labels, p, p + 1)
        if y % _TY == _TY - 1 and y + 1 < h and _joins(v, disp[y + 1, x], max_diff):
            _union(labels, p, p + w)


@cuda.jit(cache=CACHE)
def ccl_count_kernel(labels, counts, sizes):
    """Each tile component's size (at its tile root) added to its image component's
    root; the tile root then points straight at that root, so every pixel is two steps
    from it."""
    i = cuda.grid(1)
    if i < labels.shape[0] and counts[i] > 0:
        r = _find(labels, i)
        labels[i] = r
        cuda.atomic.add(sizes, r, counts[i])


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
