"""The one place that runs the stages in order and times them.

    run(left, right, params, backend) -> Result(disparity, timings, strips, ...)

Large images are processed in horizontal strips that overlap by `STRIP_OVERLAP`
rows on each side; the overlap gives the vertical and diagonal SGM paths context,
and only each strip's own rows are kept. The layout depends on the image and the
options only, never on the device or its free memory, so every device gives the
same map: strips hold at most `STRIP_CELLS` cells of W x rows x D, or, with
--max-memory, as many rows as that budget holds. Only a device that cannot hold one
such strip plans smaller ones, of half, a quarter, ... as many cells (the largest that
fits: so the layout does not follow every change in free memory), and the Result says
so (`notes`).

Input pixels that are NaN or infinite (float images) are matched as 0 and get no
disparity: the output is NaN wherever the left pixel, or the right pixel it was
matched to, is not finite.

Confidence (run(..., confidence=True), or params.min_confidence > 0): per pixel in
[0, 1], the margin of the winning aggregated cost over the runner-up
(select.margin_confidence) where the disparity survived the uniqueness test, the
left-right check and the speckle filter, and 0 where it did not (the fill's guesses
and invalid pixels). Pixels below params.min_confidence are invalid in the output.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import cv2
import numpy as np

from .backends.protocol import Backend
from .config import Params, load
from .errors import StereoError
from .io import PairInput, prepare_pair, to_guide
from .stages import cost, preprocess, refine

STRIP_OVERLAP = 48
MIN_CORE_ROWS = 16  # a strip's own rows (those it keeps) at the least
STRIP_CELLS = 2 ** 31  # volume cells (W x rows x D) of one strip: 3840x2160 with 256 disparities is one
MEMORY_SHARE = 0.7  # of the device's free memory that one strip may take
STAGES = ("upload", "preprocess", "cost", "aggregate", "select", "lr_check", "speckle", "fill", "median",
          "weighted_median", "download")


@dataclass
class Result:
    disparity: np.ndarray  # float32, NaN = invalid
    timings: dict = field(default_factory=dict)  # stage -> ms
    strips: int = 1
    device: str = "cpu"
    notes: list = field(default_factory=list)  # things the user should hear (e.g. a memory-forced layout)
    confidence: np.ndarray | None = None  # float32 in [0, 1], when asked for

    @property
    def total_ms(self) -> float:
        return sum(self.timings.values())


class _Timer:
    """Per-stage times without stopping the device between stages: each lap leaves a
    marker in the device's order of work (backend.mark: the clock on the CPU, a CUDA
    event on the GPU, so kernels queue while Python goes on), read once at the end."""

    def __init__(self, backend, start: bool = True):
        self.backend = backend
        self.marks = []
        if start:
            self.start()

    def start(self):
        """The start marker, unless there is one (a match that may replay a CUDA graph starts
        the timer only where it runs as usual: a replay brings the graph's own markers)."""
        if not self.marks:
            self.marks.append((None, self.backend.mark()))

    def lap(self, stage):
        self.marks.append((stage, self.backend.mark()))

    def read(self) -> dict:
        """{stage: ms}, summed over strips; once, at the end: the markers go back to the
        backend for reuse."""
        out = {}
        for (_, a), (stage, b) in zip(self.marks, self.marks[1:]):
            out[stage] = out.get(stage, 0.0) + self.backend.elapsed_ms(a, b)
        self.backend.recycle_marks([m for _, m in self.marks])
        self.marks = []
        return out


def bytes_per_row(width: int, params: Params, sgm_bytes: int = 2) -> int:
    """Bytes of working memory per image row (volumes only); `sgm_bytes` per element for
    the aggregation (the backend's sgm_bytes_per_element)."""
    d = params.num_disparities
    per = 1 + sgm_bytes  # cost volume uint8 + aggregation
    if params.aggregation == "mgm":
        per += 2  # a pass's path costs, which the GPU keeps whole (planned alike on every device)
    if params.cost not in ("census", "mi"):
        per += 12  # float32 difference volume and two box-filter passes
    if params.block > 1:
        per += 5
    return width * d * per


def plan_strips(height: int, width: int, params: Params, budget_bytes: int | None = None,
                sgm_bytes: int = 2, cells: int = STRIP_CELLS) -> list[tuple[int, int, int, int]]:
    """[(y0, y1, keep0, keep1)]: strip rows y0..y1 (exclusive), of which keep0..keep1 go to the output.
    With no budget, strips of at most `cells` volume cells (STRIP_CELLS: the same on every device)."""
    if budget_bytes is None:
        rows = cells // (width * params.num_disparities)
        fixed = row = 0
    else:
        fixed = 2 * width * params.num_disparities * 8  # per-line scratch
        row = bytes_per_row(width, params, sgm_bytes)
        rows = (budget_bytes - fixed) // row if budget_bytes > fixed else 0
    if rows >= height:
        return [(0, height, 0, height)]
    core = rows - 2 * STRIP_OVERLAP
    if core < MIN_CORE_ROWS:
        need_mib = (fixed + row * (MIN_CORE_ROWS + 2 * STRIP_OVERLAP)) / 2 ** 20
        raise StereoError(f"{width} px wide with {params.num_disparities} disparities needs at least "
                          f"{math.ceil(need_mib)} MiB for one strip; raise --max-memory or reduce --num-disparities")
    strips = []
    for k0 in range(0, height, core):
        k1 = min(height, k0 + core)
        strips.append((max(0, k0 - STRIP_OVERLAP), min(height, k1 + STRIP_OVERLAP), k0, k1))
    return strips


def strip_bytes(strip_rows: int, width: int, params: Params, sgm_bytes: int) -> int:
    """Working memory of one strip of `strip_rows` rows (what plan_strips budgets for)."""
    return 2 * width * params.num_disparities * 8 + strip_rows * bytes_per_row(width, params, sgm_bytes)


def layout(h: int, w: int, params: Params, backend):
    """(strips, note or None): the standard layout, or with --max-memory that budget's;
    a smaller one only when the device cannot hold a standard strip."""
    sgm_bytes = backend.sgm_bytes_per_element(params.paths)
    if params.max_memory:
        return plan_strips(h, w, params, params.max_memory * 2 ** 20, sgm_bytes), None
    strips = plan_strips(h, w, params)
    free = backend.free_memory()
    if not free or not math.isfinite(free):
        return strips, None
    room = int(free * MEMORY_SHARE)

    def fits(plan):
        return strip_bytes(max(y1 - y0 for y0, y1, _, _ in plan), w, params, sgm_bytes) <= room

    if fits(strips):
        return strips, None
    # Smaller strips from a fixed ladder, STRIP_CELLS / 2, / 4, ...: the largest that fits.
    # The layout then follows the free memory in steps of two only, so a machine gives the
    # same map from one run to the next while its free memory moves a little, and devices
    # on the same step give the same map. Below the ladder's last step (a strip's
    # overlaps and MIN_CORE_ROWS), the rows that the room holds, or plan_strips' error.
    small, cells = None, STRIP_CELLS // 2
    while cells // (w * params.num_disparities) >= 2 * STRIP_OVERLAP + MIN_CORE_ROWS:
        plan = plan_strips(h, w, params, cells=cells)
        if fits(plan):
            small = plan
            break
        cells //= 2
    if small is None:
        small = plan_strips(h, w, params, room, sgm_bytes)
    note = (f"{backend.name}: {room / 2 ** 20:.0f} MiB of free memory holds less than one standard strip, so "
            f"this ran in {len(small)} strips instead of {len(strips)}; maps can differ slightly along the "
            f"seams from other machines' (--max-memory MiB fixes the layout everywhere)")
    return small, note


def check_inputs(left: np.ndarray, right: np.ndarray, params: Params) -> None:
    if left.shape[:2] != right.shape[:2]:
        raise StereoError(f"the images differ in size: left is {left.shape[1]}x{left.shape[0]}, "
                          f"right is {right.shape[1]}x{right.shape[0]}; give a rectified pair of equal size")
    h, w = left.shape[:2]
    if h < 2 or w < 2:
        raise StereoError(f"the images are too small ({w}x{h})")
    lo, hi = params.min_disparity, params.max_disparity
    if lo >= w or hi <= -w:
        raise StereoError(f"the disparity range {lo}..{hi} does not fit an image {w} px wide; "
                          f"lower --num-disparities or --min-disparity")
    if params.num_disparities > w:
        raise StereoError(f"--num-disparities {params.num_disparities} is larger than the image width {w}; "
                          f"use at most {w}")


def run(left, right, params: Params, backend: Backend, confidence: bool = False) -> Result:
    """Match a rectified pair (any shape/dtype io.to_grey accepts) -> Result; with
    `confidence`, Result.confidence too. (run_prepared checks the parameters and sizes.)"""
    return run_prepared(prepare_pair(left, right), params, backend, confidence)


def run_prepared(pair: PairInput, params: Params, backend: Backend, confidence: bool = False,
                 out: np.ndarray | None = None) -> Result:
    """run() on a pair that io.prepare_pair has made ready (a batch prepares the next
    pairs in its reader threads or worker processes while this one is matched); `out`: a
    C-contiguous float32 array of the image's shape to hold the map (a batch's write
    slot, from which a worker process encodes it), else a new one."""
    params.validate()
    want_conf = confidence or params.min_confidence > 0
    gl, gr = pair.grey_left, pair.grey_right
    check_inputs(gl, gr, params)
    bytes_in = gl.dtype == np.uint8 and gr.dtype == np.uint8
    guide = to_guide(pair.left) if params.weighted_median else None
    h, w = gl.shape
    strips, note = layout(h, w, params, backend)
    graph = _graph_key(params, backend, strips, want_conf, bytes_in, gl, gr, guide)
    timer = _Timer(backend, start=graph is None)
    if out is None:
        out = backend.host_empty((h, w), np.float32)
    elif out.shape != (h, w) or out.dtype != np.float32 or not out.flags.c_contiguous:
        raise ValueError(f"out must be a C-contiguous float32 array of shape {(h, w)}")
    conf = np.empty((h, w), np.float32) if want_conf else None
    try:
        for y0, y1, k0, k1 in strips:
            if graph is not None:  # one strip, whole: the backend may replay a graph of the match
                inputs = [gl, gr] + ([] if guide is None or _is_grey_bytes(guide, gl) else [guide])
                backend.run_graph(graph, inputs, out, timer, lambda t: _run_whole(gl, gr, params, backend, t, guide, out))
                continue
            # The strip's kept rows come straight into their rows of out (no host copy of
            # the strip's whole map: at 6000x4000 a 26 MB array a strip, whose fresh pages
            # made one match in a few 15-40 ms slower than the others), and the host does
            # not wait for them: it queues the next strip while the device works, and waits
            # once, below. When it waited for each strip's map, the device stood idle while
            # the host set up the next strip, and a slow host showed in every strip
            # (6000x4000 / 320, 4 strips, H100 machine, two alternated processes of 8 runs
            # each way: runs 188.9-195.9 -> 184.4-186.0 ms, upload stage 7.1-7.4 -> 2.2 ms).
            _, c = _run_strip(gl[y0:y1], gr[y0:y1], params, backend, timer, want_conf,
                              None if guide is None else guide[y0:y1], out[k0:k1], (k0 - y0, k1 - y0))
            if want_conf:
                conf[k0:k1] = c
    except BaseException:
        _settle(backend)
        raise
    backend.synchronize()
    _invalidate_nonfinite(out, pair.bad_left, pair.bad_right)
    if want_conf:
        conf[np.isnan(out)] = 0.0
        if params.min_confidence > 0:
            out[conf < np.float32(params.min_confidence)] = np.nan
    ms = timer.read()
    return Result(out, {s: ms[s] for s in STAGES if s in ms}, len(strips), backend.name,
                  [note] if note else [], conf if confidence else None)


# Graphs only for volumes up to this many cells (W x H x D): a kept graph keeps its
# buffers (about 3.5 bytes per cell), and above this size the host's share of a match is
# small (1920x1080 / 128 / 8 end to end in two gpu.py runs: 12.2 ms with a graph, 12.4
# without).
GRAPH_MAX_CELLS = 1 << 26


def _graph_key(params, backend, strips, want_conf, bytes_in, gl, gr, guide):
    """The key under which the backend may keep a graph of this match (the CUDA
    backend's run_graph), or None: one whole strip, 8-bit images, no confidence, and the
    stages whose every input the backend uploads from the arrays it is given (census
    costs on the images as they are, SGM)."""
    if not (getattr(backend, "graphs", False) and len(strips) == 1 and not want_conf and bytes_in
            and gl.size * params.num_disparities <= GRAPH_MAX_CELLS
            and params.cost == "census" and params.preprocess == "none" and params.aggregation == "sgm"
            and (guide is None or guide.dtype == np.uint8)):
        return None
    return (gl.shape, gr.shape, None if guide is None else guide.shape, repr(params))


WARM_UP_PRESETS = ("default", "fast", "quality")
# The GPU's SGM and selection kernels are specialised by the number of disparities D, in
# classes (lanes per path line, disparities per lane, whether D % 4 == 0; the selection
# kernel also by ceil(D / 128)): these counts reach every class up to 512, so that after
# a warm-up no count compiles anything. The CPU kernels do not depend on the count.
WARM_UP_DISPARITIES = (64, 3, 4, 7, 8, 15, 16, 31, 32, 63, 127, 128, 255, 256, 384, 511, 512)


def warm_up(backend, report=None) -> None:
    """Compile (or load) the kernels of the presets (on the GPU, for every class of
    disparity count) on a small random pair, so that later runs start at once;
    `report(text)` hears each step."""
    rng = np.random.default_rng(0)
    left = rng.integers(0, 256, (40, 600), dtype=np.uint8)
    right = np.roll(left, -5, axis=1)
    steps = [(preset, 64) for preset in WARM_UP_PRESETS]
    if backend.name == "cuda":
        steps += [("default", n) for n in WARM_UP_DISPARITIES[1:]]
    for preset, n in steps:
        t = time.perf_counter()
        run(left, right, load(preset, None, {"num_disparities": n}), backend)
        if report:
            report(f"{backend.name}: preset {preset}, {n} disparities: {time.perf_counter() - t:.1f} s")


def _run_whole(gl, gr, params, backend, timer, guide, out):
    """A match of one whole strip as run_graph runs it where it does not replay a graph:
    the timer starts here."""
    timer.start()
    return _run_strip(gl, gr, params, backend, timer, False, guide, out)


def _settle(backend) -> None:
    """After a strip failed: wait for the copies already queued into the map (its pinned
    memory must not be reused while the device may still write it), keeping the first
    error as the one raised."""
    try:
        backend.synchronize()
    except Exception:
        pass


def _invalidate_nonfinite(disp: np.ndarray, bad_l: np.ndarray | None, bad_r: np.ndarray | None) -> None:
    """NaN where the left pixel, or the right pixel it matched, was NaN or infinite
    (bad_l, bad_r: io.nonfinite_mask of each image)."""
    if bad_l is not None:
        disp[bad_l] = np.nan
    if bad_r is not None:
        ys, xs = np.nonzero(np.isfinite(disp))
        xr = np.clip(np.rint(xs - disp[ys, xs]).astype(np.int64), 0, disp.shape[1] - 1)
        hit = bad_r[ys, xr]
        disp[ys[hit], xs[hit]] = np.nan


def _run_strip(gl: np.ndarray, gr: np.ndarray, params: Params, bk, timer: _Timer, want_conf: bool = False,
               guide: np.ndarray | None = None, out: np.ndarray | None = None, keep: tuple[int, int] | None = None):
    """gl, gr: grey strips, uint8 (the guide itself) or float32 0..255 -> (disparity,
    confidence or None) of the strip, or of its rows keep = (first, end) only; guide: the
    left strip as io.to_guide gives it, for the weighted median; out: where the
    disparity goes, if given."""
    if gl.dtype == np.uint8:
        G, Gr = bk.upload_inputs(gl, gr)
        if params.cost == "census" and params.preprocess == "none":
            L, R = G, Gr  # the census compares grey levels: the bytes give the float32 images' strings
        else:
            L, R = bk.to_float(G), bk.to_float(Gr)
    else:
        L, R, G = bk.upload_inputs(gl, gr, np.clip(np.round(gl), 0, 255).astype(np.uint8))
    timer.lap("upload")
    L, R = _preprocess(bk, L, R, params)
    timer.lap("preprocess")
    vol = None
    if params.cost == "mi":
        vol = _mi_volume(bk, gl.astype(np.float32), gr.astype(np.float32), params, timer)
    elif params.cost == "census" and params.block <= 1 and params.aggregation == "sgm" and params.paths in (4, 8):
        # the backend may rather compute the costs as the SGM sweeps (the CPU, for large volumes)
        vol = bk.census_codes(L, R, params.min_disparity, params.num_disparities, *params.window_size(),
                              params.paths)
    if vol is None:
        vol = cost_volume(bk, L, R, params)
    timer.lap("cost")
    agg = _aggregate(bk, vol, G, params)
    timer.lap("aggregate")
    if agg is not vol:  # the selection reads the aggregate only: the costs go first (the CPU keeps large
        bk.recycle(vol)  # volumes for the next match of this size; its census strings, 105 MB a strip at
    del vol  # 6000x4000, are freed before the selection's maps are made)
    disp, disp_r, conf = bk.select(agg, params.min_disparity, params.uniqueness, params.subpixel, params.lr_check,
                                   want_conf)
    timer.lap("select")
    if params.lr_check:
        disp = bk.lr_check(disp, disp_r, params.lr_max_diff)
        timer.lap("lr_check")
    bk.recycle(agg)
    del agg
    if params.speckle_size > 0:
        disp = bk.speckle(disp, params.speckle_size, params.speckle_diff)
        timer.lap("speckle")
    if want_conf:
        conf = bk.keep_confidence(conf, disp)  # 0 where rejected: the fill below only guesses
    if params.fill != "none":
        disp = bk.fill(disp, refine.FILL_MODES[params.fill], params.min_disparity, params.max_disparity)
        timer.lap("fill")
    if params.median > 1:
        disp = bk.median(disp, params.median // 2)
        timer.lap("median")
    if params.weighted_median > 0:
        # (its guide uploaded here, not with the images: at 1242x375 on the H100 that
        # put the copy on the critical path of an idle GPU, 0.9 ms more end to end; measured
        # when uploads still came from pageable memory, not since they are staged)
        # A grey 8-bit left image is its own guide: its uploaded bytes serve.
        g = G if _is_grey_bytes(guide, gl) else bk.upload(guide)
        disp = bk.weighted_median(disp, g, params.weighted_median)
        timer.lap("weighted_median")
    if keep is not None and keep != (0, disp.shape[0]):
        disp = disp[keep[0]:keep[1]]
        conf = conf[keep[0]:keep[1]] if want_conf else None
    result = bk.download(disp, out, wait=want_conf)  # (run waits for the maps of all strips)
    conf = bk.download(conf) if want_conf else None
    timer.lap("download")
    return result, conf


def _is_grey_bytes(guide, gl) -> bool:
    """Whether the guide is the grey strip gl itself (a grey 8-bit left image: the same
    bytes, so the device copy of gl serves as the guide)."""
    return (gl.dtype == np.uint8 and guide.dtype == np.uint8 and guide.shape == gl.shape
            and guide.strides == gl.strides
            and guide.__array_interface__["data"][0] == gl.__array_interface__["data"][0])


def _preprocess(bk, L, R, params: Params):
    if params.preprocess == "dog":
        k1, k2 = bk.upload(preprocess.gaussian_kernel(params.dog_sigma1)), \
            bk.upload(preprocess.gaussian_kernel(params.dog_sigma2))
        return bk.dog(L, k1, k2), bk.dog(R, k1, k2)
    if params.preprocess == "bilateral":
        ss, sc = preprocess.bilateral_constants(params.bilateral_sigma_space, params.bilateral_sigma_color)
        return (bk.bilateral(L, params.bilateral_radius, ss, sc),
                bk.bilateral(R, params.bilateral_radius, ss, sc))
    return L, R


def _aggregate(bk, vol, guide, params: Params):
    if params.block > 1:
        vol = bk.box_u8(vol, params.block // 2)
    if params.aggregation == "sgm":
        return bk.sgm(vol, guide, params.p1, params.p2, params.adaptive_p2, params.paths)
    if params.aggregation == "mgm":
        return bk.mgm(vol, guide, params.p1, params.p2, params.adaptive_p2, params.paths)
    return vol


def cost_volume(bk, L, R, params: Params):
    """The uint8 cost volume of the chosen (non-MI) cost on preprocessed images, over
    params' disparity range."""
    min_d, ndisp = params.min_disparity, params.num_disparities
    wx, wy = params.window_size()
    rx, ry = wx // 2, wy // 2
    c = params.cost
    if c == "census":
        return bk.census_volume(L, R, min_d, ndisp, wx, wy)
    if c == "zsad":
        L = bk.subtract_mean(L, bk.box_mean(_as_volume(L), rx, ry))
        R = bk.subtract_mean(R, bk.box_mean(_as_volume(R), rx, ry))
        c = "sad"
    if c in ("sad", "bt"):
        kind = cost.ABS if c == "sad" else cost.BT
        m = bk.box_mean(bk.diff_volume(L, R, min_d, ndisp, kind), rx, ry)
        none = bk.upload(np.zeros((1, 1), np.float32))
        return bk.finalize_volume(m, min_d, cost.MEAN, none, none, none, none)
    if c == "ssd":
        m = bk.box_mean(bk.diff_volume(L, R, min_d, ndisp, cost.SQ), rx, ry)
        none = bk.upload(np.zeros((1, 1), np.float32))
        return bk.finalize_volume(m, min_d, cost.RMS, none, none, none, none)
    ml = _plane(bk.box_mean(_as_volume(L), rx, ry))
    mr = _plane(bk.box_mean(_as_volume(R), rx, ry))
    if c == "zssd":
        m = bk.box_mean(bk.diff_volume(L, R, min_d, ndisp, cost.SQ), rx, ry)
        return bk.finalize_volume(m, min_d, cost.ZSSD, ml, ml, mr, mr)
    if c == "zncc":
        ml2 = _plane(bk.box_mean(bk.diff_volume(L, L, 0, 1, cost.PROD), rx, ry))
        mr2 = _plane(bk.box_mean(bk.diff_volume(R, R, 0, 1, cost.PROD), rx, ry))
        m = bk.box_mean(bk.diff_volume(L, R, min_d, ndisp, cost.PROD), rx, ry)
        return bk.finalize_volume(m, min_d, cost.ZNCC, ml, ml2, mr, mr2)
    raise StereoError(f"unknown cost {c!r}")


def _as_volume(img):
    return img.reshape(img.shape[0], img.shape[1], 1)


def _plane(vol):
    return vol.reshape(vol.shape[0], vol.shape[1])


def _mi_volume(bk, gl: np.ndarray, gr: np.ndarray, params: Params, timer: _Timer):
    """Mutual-information cost volume, computed coarse to fine (Hirschmueller 2008):
    at the coarsest level the table starts from random disparities and is re-estimated
    three times; each finer level starts from the disparity of the level below."""
    levels = max(1, min(params.mi_levels, int(math.log2(max(1, min(gl.shape) // 32))) + 1))
    disp = None
    rng = np.random.default_rng(0)
    for level in range(levels - 1, -1, -1):
        f = 2 ** level
        if f > 1:
            size = (max(2, gl.shape[1] // f), max(2, gl.shape[0] // f))
            l_img = cv2.resize(gl, size, interpolation=cv2.INTER_AREA)
            r_img = cv2.resize(gr, size, interpolation=cv2.INTER_AREA)
        else:
            l_img, r_img = gl, gr
        h, w = l_img.shape
        min_d = int(math.floor(params.min_disparity / f))
        ndisp = max(2, int(math.ceil((params.min_disparity + params.num_disparities) / f)) - min_d)
        ql, qr = bk.upload(_quantize(l_img)), bk.upload(_quantize(r_img))
        if disp is None:
            disp = rng.uniform(min_d, min_d + ndisp - 1, size=(h, w)).astype(np.float32)
            rounds = 3
        else:
            disp = cv2.resize(disp * 2.0, (w, h), interpolation=cv2.INTER_NEAREST)
            rounds = 1
        for _ in range(rounds):
            table = bk.upload(cost.mi_table(bk.joint_histogram(ql, qr, bk.upload(disp))))
            vol = bk.table_volume(ql, qr, table, min_d, ndisp)
            if level == 0:
                return vol
            agg = _aggregate(bk, vol, ql, params)  # the quantised left image is the P2 guide
            d, d_r, _ = bk.select(agg, min_d, 0.0, False, True)
            d = bk.lr_check(d, d_r, 1.0)
            disp = bk.download(d)
    raise AssertionError("unreachable")


def _quantize(img: np.ndarray) -> np.ndarray:
    return np.clip(np.floor(img + 0.5), 0, 255).astype(np.uint8)
