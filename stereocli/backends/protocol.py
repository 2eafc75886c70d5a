"""What a backend provides: the operations `pipeline.run` calls, declared once.

`CpuBackend` (NumPy arrays, `stages/*_cpu` drivers) and `CudaBackend` (device arrays,
`backends/cuda/*` kernels) implement it; a new backend implements every method below
and passes tests/test_cuda.py's comparisons against the CPU. "Array" is the backend's
own array type (numpy.ndarray on the CPU, a device array on the GPU); shapes are
(H, W) for images and maps, (H, W, D) for volumes with the disparity index d fastest.
Disparity index d means disparity min_d + d (stages/cost.py: right_x, inside_range).
"""
from __future__ import annotations

import math
from typing import Any, Protocol

Array = Any  # numpy.ndarray or a numba device array


class Backend(Protocol):
    name: str  # "cpu" or "cuda": reported in timings and JSON

    # ---------------------------------------------------------------- memory
    def describe(self) -> str:
        """One line for --timings: the device and its threads or memory."""

    def upload(self, a) -> Array:
        """A host numpy array onto the device (no copy on the CPU)."""

    def upload_inputs(self, *arrays) -> list:
        """The arrays a strip starts from, on the device: upload's, called before anything
        else of the strip is queued."""

    def to_float(self, a: Array) -> Array:
        """uint8 (H, W) -> float32 (H, W), the same values."""

    def download(self, a: Array, out=None, wait: bool = True):
        """A device array back as a host numpy array; into `out` (a host array of its
        shape and dtype, e.g. rows of the final map) when given, which is returned.
        wait=False: the copy into `out` may be only queued (the caller calls synchronize
        before it reads `out`)."""

    def host_empty(self, shape, dtype):
        """An uninitialised host numpy array for a result map (the CUDA backend hands out
        large ones in pinned memory, which its downloads fill faster)."""

    def pin_host(self, buffer):
        """Page-lock a host buffer in place -> a function that unlocks it, or None (the
        CPU backend; a GPU driver that refuses). A batch's read slots, from which the CUDA
        backend's graphs then upload without a host copy."""

    def recycle(self, *arrays) -> None:
        """The caller is done with these arrays (the pipeline's volumes, after the
        selection) and holds no other reference to them: the backend may use their memory
        again."""

    def synchronize(self) -> None:
        """Wait for the work launched so far."""

    def mark(self):
        """A time marker placed after the work launched so far, without waiting for it
        (the pipeline's timer leaves one after each stage)."""

    def recycle_marks(self, marks) -> None:
        """The markers of a finished timing, whose times have been read: the device may
        use them again for later marks."""

    def elapsed_ms(self, start, end) -> float:
        """Milliseconds between two markers (waits for `end` to be reached)."""

    def free_memory(self) -> float | None:
        """Bytes this device can still give, or None if unknown (strip planning)."""

    def sgm_bytes_per_element(self, paths: int) -> int:
        """Bytes per volume cell that `sgm` keeps for `paths` directions (strip planning)."""

    # ---------------------------------------------------------------- preprocessing
    def dog(self, img: Array, k1: Array, k2: Array) -> Array:
        """Difference of Gaussians of a float32 (H, W) image with 1-D kernels k1, k2."""

    def bilateral(self, img: Array, r: int, inv_ss: float, inv_sc: float) -> Array:
        """Separable bilateral filter of a float32 (H, W) image."""

    def subtract_mean(self, img: Array, mean: Array) -> Array:
        """img - mean, float32 (H, W) each (zero-mean costs)."""

    # ---------------------------------------------------------------- costs
    def census_volume(self, left: Array, right: Array, min_d: int, ndisp: int, wx: int, wy: int) -> Array:
        """uint8 (H, W, ndisp) census cost in cost units, OUTSIDE beyond the right image."""

    def census_codes(self, left: Array, right: Array, min_d: int, ndisp: int, wx: int, wy: int, paths: int):
        """What `sgm` over `paths` (4 or 8) directions can compute census_volume's costs
        from as it sweeps, instead of reading a stored volume, or None: then the pipeline
        asks for the volume. The CPU gives its census strings (stages/cost.CensusCodes)
        for large volumes; the GPU wants the volume, and makes it here in parts of rows
        where its SGM can start on each part as it is made (large sizes)."""

    def diff_volume(self, left: Array, right: Array, min_d: int, ndisp: int, kind: int) -> Array:
        """float32 (H, W, ndisp) per-pixel difference of `kind` (cost.ABS, SQ, PROD, BT)."""

    def box_mean(self, vol: Array, rx: int, ry: int) -> Array:
        """float32 (H, W, D) means over (2rx+1) x (2ry+1) windows, edges replicated."""

    def finalize_volume(self, m: Array, min_d: int, kind: int, ml: Array, ml2: Array, mr: Array,
                        mr2: Array) -> Array:
        """Window means -> uint8 (H, W, D) cost units; kind cost.MEAN, RMS, ZSSD or ZNCC."""

    def table_volume(self, ql: Array, qr: Array, table: Array, min_d: int, ndisp: int) -> Array:
        """uint8 (H, W, ndisp) = table[ql[y, x], qr[y, right_x]] (mutual information)."""

    def joint_histogram(self, ql: Array, qr: Array, disp: Array):
        """(256, 256) histogram of grey pairs matched by `disp` (host numpy array)."""

    # ---------------------------------------------------------------- aggregation
    def box_u8(self, vol: Array, r: int) -> Array:
        """Box aggregation of a uint8 (H, W, D) volume over (2r+1)^2, rounded mean."""

    def sgm(self, vol: Array, guide: Array, p1: int, p2: int, adaptive: bool, paths: int):
        """SGM over `paths` directions of a uint8 (H, W, D) volume (or what census_codes
        gave) with the uint8 (H, W) grey guide: the uint16 (H, W, D) sum."""

    def mgm(self, vol: Array, guide: Array, p1: int, p2: int, adaptive: bool, paths: int) -> Array:
        """More Global Matching (stages/aggregate.py) over 4 or 8 passes: the uint16 sum
        of the passes' costs, (H, W, D), as sgm's parameters."""

    # ---------------------------------------------------------------- selection
    def select(self, agg, min_d: int, uniqueness: float, subpixel: bool, right: bool, confidence: bool = False):
        """(left float32 (H, W), right float32 (H, W) or None, confidence float32 (H, W) or
        None): winner-takes-all, NaN invalid; the confidence is select.margin_confidence."""

    # ---------------------------------------------------------------- refinement
    def lr_check(self, disp: Array, disp_r: Array, max_diff: float) -> Array:
        """Left disparities that the right map confirms within max_diff, others NaN."""

    def speckle(self, disp: Array, max_size: int, max_diff: float) -> Array:
        """NaN over 4-connected regions (steps <= max_diff) of at most max_size pixels."""

    def keep_confidence(self, conf: Array, disp: Array) -> Array:
        """conf where disp is valid, 0 where it is NaN."""

    def fill(self, disp: Array, mode: int, lo: float = -math.inf, hi: float = math.inf) -> Array:
        """Invalid pixels from their row neighbours (refine.BACKGROUND or NEAREST), or
        (SLOPE, DIRECTIONS) the left border strip continued along its slope first, held
        within the search range [lo, hi]."""

    def median(self, disp: Array, r: int) -> Array:
        """(2r+1)^2 median of the valid values; invalid stays invalid."""

    def weighted_median(self, disp: Array, guide: Array, r: int) -> Array:
        """At disparity edges, the median of the window of radius r weighted by colour
        likeness in guide (the left image as H x (W * C) uint8, C = 3 or 1, on this
        device); see refine.weighted_median_at."""
