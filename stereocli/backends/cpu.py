"""CPU backend: NumPy arrays and the @njit(parallel=True) drivers of the stages."""
import functools
import math
import threading
import time

import numba
import numpy as np

from ..stages import aggregate, cost, preprocess, refine, select

_WMF_LUT = refine.wmf_weights()


def _meminfo(key):
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith(key):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


@functools.cache
def _malloc_trim():
    """glibc's malloc_trim, or None elsewhere."""
    try:
        import ctypes
        return ctypes.CDLL("libc.so.6").malloc_trim
    except (OSError, AttributeError):
        return None


def _trim_heap():
    """malloc_trim(0): free pages of every malloc heap back to the system (a no-op
    without glibc)."""
    trim = _malloc_trim()
    if trim is not None:
        trim(0)


@functools.cache
def tune_malloc():
    """Fix glibc's allocator thresholds at the values its dynamic scheme reaches at most:
    arrays up to 32 MiB from the heap, and up to 64 MiB of freed heap kept for the next
    arrays (larger ones are mmapped and freed to the system, as before; _trim_heap still
    trims before large volumes). Left dynamic, the thresholds follow the sizes freed last,
    and for some image sizes a match's arrays were given back to the system at its end
    and faulted in again page by page in the next: tsukuba (384x288 / 16), 1696 minor
    faults a match, 0 after this; one thread 19.5-19.8 -> 16.3-16.6 ms, two 13.8-17.9 ->
    11.6-11.7 (2-core machine, processes alternated; venus, teddy and cones had no faults
    and kept their times). A Dask nanny starts its worker with MALLOC_TRIM_THRESHOLD_=
    65536 (distributed.nanny.pre-spawn-environ), which also fixes the mmap threshold at
    128 KiB: every cost volume was a fresh mmap, and a batch of 384x288 pairs ran at 0.65x
    the rate of the same process without that variable; this undoes it. Once per
    process; a no-op off glibc."""
    try:
        import ctypes
        libc = ctypes.CDLL("libc.so.6")
        m_trim_threshold, m_mmap_threshold = -1, -3  # glibc's mallopt parameters
        libc.mallopt(m_mmap_threshold, 32 * 2 ** 20)  # the most glibc's dynamic threshold reaches
        libc.mallopt(m_trim_threshold, 64 * 2 ** 20)
    except (OSError, AttributeError):
        pass


def _resident_bytes():
    """This process's resident memory (Linux), or None."""
    try:
        import os
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


class CpuBackend:
    name = "cpu"
    memory_limit = None  # bytes this process may use in all (a Dask worker's limit); None = the system's

    # The cost and aggregation volumes the pipeline is done with are kept for the next
    # match of the same size (a batch, the strips of a large pair): glibc gives arrays over
    # 32 MiB fresh pages from the kernel every time, and touching them first cost more
    # than the stage's work (cones@1482x1000/128, one thread: the census volume 121 ms,
    # 55 ms into a kept one).
    KEEP_MIN_BYTES = 32 << 20
    KEEP_MAX_BYTES = 2 << 30  # (larger ones are freed, not held between matches)

    # From this many volume cells (W x H x D) on, SGM computes the census costs from the
    # census strings as its sweeps reach each pixel (three times in all) instead of
    # reading a stored volume: 1 byte per cell less memory, for the same sums, but mostly
    # slower (benchmarks/large_pair.py --cpu-costs both, H100 machine's host, 16 threads,
    # best whole match, stored -> computed: 6000x4000/320 4.23 -> 4.74 s, 3000x2000/256
    # 0.76 -> 0.92 s, 1920x1080/256 0.23 -> 0.28 s), so only where the volume would take
    # 1 GiB or more.
    CENSUS_ON_THE_FLY_CELLS = 1 << 30

    # Before a new volume this large, the C heap's free pages go back to the system: the
    # stages' arrays freed by then (many threads' heaps of them) stayed resident beside
    # the volume, which the large pairs' peak memory is mostly made of.
    TRIM_BEFORE_BYTES = 256 << 20

    # How long a reading of the system's available memory is trusted: reading
    # /proc/meminfo cost about 0.15 ms, every match (0.5 % of a one-thread teddy).
    AVAILABLE_TTL_S = 1.0

    def __init__(self):
        tune_malloc()
        self._spare = {}  # (shape, dtype) -> a volume given back by recycle
        self._spare_lock = threading.Lock()  # (one backend per process: matches may run in several threads)
        self._avail = (-math.inf, None)  # (time.monotonic(), MemAvailable bytes) of the last reading

    def _volume(self, shape, dtype):
        """An uninitialised array: a recycled one of this shape if there is one."""
        with self._spare_lock:
            spare = self._spare.pop((shape, dtype.str), None)
            if spare is not None:
                return spare
            # a new size (the next strip of a large pair, another pair's size): the kept volumes
            # go first, so that two sizes' volumes are never held at once (when they were, a
            # 3000x1400/256 pair in 3 strips peaked at 3114 MiB resident, 1746 after this;
            # 6000x4000/320 in 4 strips at 10.4 GB). Only for a new size: a volume of this
            # size that was too small to keep (a cost volume under KEEP_MIN_BYTES beside a
            # kept aggregate twice its size, as at 741x500/64) must not drop the kept one,
            # which every match then mapped and faulted in afresh.
            if any(k[0] != shape for k in self._spare):
                self._spare.clear()
        if math.prod(shape) * dtype.itemsize >= self.TRIM_BEFORE_BYTES:
            _trim_heap()
        return np.empty(shape, dtype)

    def recycle(self, *arrays):
        """The caller is done with these arrays and holds no other reference to them or
        their views: the large ones are kept for the next volume of their shape (two at
        most: the cost and the aggregation volume)."""
        for a in arrays:
            if (isinstance(a, np.ndarray) and a.base is None and a.flags.c_contiguous
                    and self.KEEP_MIN_BYTES <= a.nbytes <= self.KEEP_MAX_BYTES):
                key = (a.shape, a.dtype.str)
                with self._spare_lock:
                    if key not in self._spare and len(self._spare) >= 2:
                        self._spare.clear()  # a new size: the old ones go
                    self._spare[key] = a

    def describe(self) -> str:
        return f"CPU ({numba.get_num_threads()} threads)"

    # arrays and transfers
    def upload(self, a):
        return np.ascontiguousarray(a)

    def upload_inputs(self, *arrays):
        return [self.upload(a) for a in arrays]

    def to_float(self, a):
        return a.astype(np.float32)

    def host_empty(self, shape, dtype):
        return np.empty(shape, dtype)

    def pin_host(self, buffer):
        return None  # (nothing to gain on the CPU)

    def download(self, a, out=None, wait=True):
        if out is None:
            return np.asarray(a)
        np.copyto(out, a)
        return out

    def synchronize(self):
        pass

    def mark(self):
        return time.perf_counter()

    def recycle_marks(self, marks):
        pass

    def elapsed_ms(self, start, end):
        return (end - start) * 1e3

    def free_memory(self):
        """Bytes of memory the system can still give (Linux MemAvailable), and no more than
        memory_limit less what this process holds; None if unknown."""
        now = time.monotonic()
        if now - self._avail[0] > self.AVAILABLE_TTL_S:
            self._avail = (now, _meminfo("MemAvailable:"))
        avail = self._avail[1]
        if self.memory_limit:
            room = max(0, self.memory_limit - (_resident_bytes() or 0))
            avail = room if avail is None else min(avail, room)
        return avail

    # preprocessing
    def dog(self, img, k1, k2):
        return preprocess.dog_cpu(img, k1, k2)

    def bilateral(self, img, r, inv_ss, inv_sc):
        return preprocess.bilateral_cpu(img, r, inv_ss, inv_sc)

    # costs
    def census_volume(self, left, right, min_d, ndisp, wx, wy):
        vol = self._volume(left.shape + (ndisp,), np.dtype(np.uint8))
        return cost.census_volume_pair_cpu(left, right, min_d, ndisp, wx, wy, vol)

    def census_codes(self, left, right, min_d, ndisp, wx, wy, paths):
        if left.size * ndisp < self.CENSUS_ON_THE_FLY_CELLS:
            return None
        cl = cost.census_transform_cpu(left, wx, wy)
        cr = cost.census_transform_cpu(right, wx, wy)
        return cost.census_codes(cl, cr, min_d, ndisp, wx * wy - 1)

    def diff_volume(self, left, right, min_d, ndisp, kind):
        return cost.diff_volume_cpu(left, right, min_d, ndisp, kind)

    def box_mean(self, vol, rx, ry):
        return cost.box_mean_cpu(vol, rx, ry)

    def finalize_volume(self, m, min_d, kind, ml, ml2, mr, mr2):
        return cost.finalize_volume_cpu(m, min_d, kind, ml, ml2, mr, mr2)

    def subtract_mean(self, img, mean):
        return (img - mean.reshape(img.shape) + np.float32(128.0)).astype(np.float32)

    def table_volume(self, ql, qr, table, min_d, ndisp):
        return cost.table_volume_cpu(ql, qr, table, min_d, ndisp)

    def joint_histogram(self, ql, qr, disp):
        return cost.joint_histogram_cpu(ql, qr, disp)

    # aggregation
    def box_u8(self, vol, r):
        return aggregate.box_sum_u8_cpu(vol, r)

    def sgm(self, vol, guide, p1, p2, adaptive, paths):
        if isinstance(vol, cost.CensusCodes):
            shape = vol.cl.shape + (vol.ndisp,)
            return aggregate.sgm_cpu(None, guide, p1, p2, adaptive, paths, codes=vol,
                                     out=self._volume(shape, np.dtype(np.uint16)))
        return aggregate.sgm_cpu(vol, guide, p1, p2, adaptive, paths,
                                 out=self._volume(vol.shape, np.dtype(np.uint16)))

    def mgm(self, vol, guide, p1, p2, adaptive, paths):
        return aggregate.mgm_cpu(vol, guide, p1, p2, adaptive, paths)

    def sgm_bytes_per_element(self, paths):
        return 2

    # selection
    def select(self, agg, min_d, uniqueness, subpixel, right, confidence=False):
        """(left disparity, right disparity or None, confidence or None) by winner-takes-all."""
        left, right_disp, conf = select.select_cpu(agg, min_d, np.float32(uniqueness), subpixel, right, confidence)
        return left, (right_disp if right else None), (conf if confidence else None)

    # refinement
    def lr_check(self, disp, disp_r, max_diff):
        return refine.lr_check_cpu(disp, disp_r, np.float32(max_diff))

    def speckle(self, disp, max_size, max_diff):
        sizes = refine.speckle_sizes_cpu(disp, np.float32(max_diff), numba.get_num_threads())
        return refine.speckle_apply_cpu(disp, sizes, max_size)

    def keep_confidence(self, conf, disp):
        return refine.keep_confidence_cpu(conf, disp)

    def fill(self, disp, mode, lo=-np.inf, hi=np.inf):
        if mode == refine.DIRECTIONS:
            return refine.fill2d_cpu(refine.border_slope_cpu(disp, lo, hi), refine.FILL2D_DIRECTIONS)
        if mode == refine.SLOPE:
            disp, mode = refine.border_slope_cpu(disp, lo, hi), refine.BACKGROUND
        return refine.fill_cpu(disp, mode)

    def median(self, disp, r):
        return refine.median_cpu(disp, r)

    def weighted_median(self, disp, guide, r):
        return refine.weighted_median_cpu(disp, guide, guide.shape[1] // disp.shape[1], _WMF_LUT, r,
                                           numba.get_num_threads())
