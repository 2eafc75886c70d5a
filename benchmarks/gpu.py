"""GPU benchmark: per-stage kernel time with device-resident input (CUDA events, warm,
best of N, the stream held while Python launches a round so that the kernels run back
to back; `kernel_total_with_launch_gaps_ms` is the same without the hold, and
`host_queue_ms` the host's time to queue such a round) for census
9x7 + SGM + WTA + LR check, and the end-to-end time (best and median of --e2e-repeat) of
stereocli.match with host arrays (default preset otherwise). One JSON line per
configuration; the first line reports the cold (compile or cache load) time.

    python benchmarks/gpu.py [--repeat 10] [--quick] [--configs 1920x1080/256/8] [--preset quality] [--large-runs 5]

Then issue 13's 6000x4000 / 320 pair: its strips, 5 consecutive warm runs and their
spread, device memory a cell (benchmarks/large_pair.py compares it with the CPU's map),
and the same in one strip, as `stereo match --max-memory MIB` runs it
(--no-large-one-strip: not). The last line is a
summary: the rows whose kernels are above libSGM's figure and those whose end to end is
past its bound.

--libsgm-peer BINARY (benchmarks/libsgm_peer/build.sh makes it) also runs libSGM on the
same pair and GPU for every row, with its 63-bit census 9x7 (what stereocli computes)
and its 31-bit symmetric one, and prints both and the ratios to the faster, beside
those to issue 13's table, which was measured on an H100: on another GPU (the H200
machine) only the peer's figures compare like with like.

--preset changes the end-to-end pipeline only (the kernel times are always the
default's census + SGM + WTA + LR check, the figures libSGM is compared with).

Tuning knobs (see stereocli/backends/cuda/aggregate.py and select.py):
STEREOCLI_SGM_K=4|8|16 forces the disparities per lane of the SGM kernel,
STEREOCLI_SGM_PREFETCH=1|2|3|4 how many pixels ahead its walks load (STEREOCLI_SGM_PREFETCH_DEEP:
the most warps per SM that take depth 4, 20), STEREOCLI_SGM_PAIRS_APART=on|off 4 paths
in two launches (auto: from 2^27 cells), STEREOCLI_SGM_REDUX=0
the line minimum by shuffles instead of redux.sync, STEREOCLI_SGM_REGS
and STEREOCLI_SELECT_REGS the register caps of the SGM and selection kernels (0: the
compiler's choice), STEREOCLI_SGM_SUM=volumes one path volume per direction instead
of atomic adds into one sum, STEREOCLI_SGM_BANDS=off|on the line kernel for every path
or the vertical ones in bands of rows (aggregate_bands.py; auto: 256 disparities on
large images). Give each setting its own
NUMBA_CACHE_DIR: the kernel cache does not key on the register cap.
"""
import argparse
import functools
import gc
import json
import os
import subprocess
import tempfile
import time
from pathlib import Path

import cv2
import numba
import numpy as np

from common import DATA, emit

# (width, height, disparities, paths, libSGM H100 kernel ms, libSGM host->host ms): libSGM
# e4c669b for sm_90 on the H100 machine, best of 100 warm runs (issue 13's table)
CONFIGS = [
    (741, 500, 64, 8, 1.08, 1.24), (741, 500, 128, 4, 0.97, 1.13), (741, 500, 128, 8, 1.28, 1.49),
    (1242, 375, 128, 4, 1.37, 1.61), (1242, 375, 128, 8, 1.69, 1.93),
    (1920, 1080, 128, 4, 2.63, 3.38), (1920, 1080, 128, 8, 3.73, 4.62), (1920, 1080, 256, 8, 6.45, 7.56),
    (3840, 2160, 256, 8, 19.8, 24.0),
]


def device_bytes(run):
    """Device memory that `run()` allocates: the buffer pool is emptied first and keeps
    every buffer the run frees, so what is in use afterwards is its working set."""
    from numba import cuda

    from stereocli.backends import get_backend
    from stereocli.backends.cuda.backend import _POOL
    bk = get_backend("cuda")
    kept, bk.graphs = bk.graphs, False  # (a replayed graph allocates nothing: its buffers are its own)
    gc.collect()
    _POOL.release()
    ctx = cuda.current_context()
    ctx.deallocations.clear()
    free0 = ctx.get_memory_info()[0]
    try:
        run()
        cuda.synchronize()
    finally:
        bk.graphs = kept
    return free0 - ctx.get_memory_info()[0]


def pair(w, h):
    left = cv2.imread(str(DATA / "cones" / "left.png"), cv2.IMREAD_GRAYSCALE)
    right = cv2.imread(str(DATA / "cones" / "right.png"), cv2.IMREAD_GRAYSCALE)
    return (cv2.resize(left, (w, h), interpolation=cv2.INTER_CUBIC),
            cv2.resize(right, (w, h), interpolation=cv2.INTER_CUBIC))


HOLD_MS = 20  # how long the stream is held before each timed round (far longer than its launches take)


@functools.cache
def _hold_kernel():
    """(Made once: each call of cuda.jit is a new kernel, compiled again.)"""
    from numba import cuda

    @cuda.jit
    def hold(us):
        """Keeps the stream busy for about `us` microseconds."""
        if cuda.threadIdx.x == 0:
            for _ in range(us):
                cuda.nanosleep(1000)
    return hold


def free_last_round():
    """Free the last round's device buffers now, not inside the next timed span (Numba
    defers frees; the simulator keeps none)."""
    from numba import cuda
    gc.collect()
    if not numba.config.ENABLE_CUDASIM:
        cuda.current_context().deallocations.clear()


def queue_round(bk, L, R, ndisp, paths, mark=lambda: None):
    """Queue one kernel round on the 8-bit images L, R already on the device, as the
    pipeline asks for it (and libSGM takes it): census 9x7 (census_codes, or the volume),
    SGM, selection, LR check; mark() after each of the four stages."""
    vol = bk.census_codes(L, R, 0, ndisp, 9, 7, paths)  # (as the pipeline asks: see census_codes)
    if vol is None:
        vol = bk.census_volume(L, R, 0, ndisp, 9, 7)
    mark()
    s = bk.sgm(vol, L, 40, 480, True, paths)
    mark()
    d, d_r, _ = bk.select(s, 0, 5.0, True, True)
    mark()
    bk.lr_check(d, d_r, 1.0)
    mark()


def kernel_times(bk, left, right, ndisp, paths, repeat, hold=True, host=False):
    """{stage: ms, "total": ms}: the best of `repeat` rounds, each timed by CUDA events
    between the stages. `hold`: a kernel keeps the stream busy while Python launches the
    round, so the events time the kernels alone, back to back (as libSGM's C++ launches
    them); without it they also time the gaps in which the GPU waits for the next launch
    (0.1-0.3 ms a round at the smaller sizes). A round whose launches outlast the hold
    is not counted. Where the selection follows SGM's bands (select.select_with_bands),
    most of it runs inside the aggregation's span and "select" is what is left after
    the last band; the total is the figure to compare. `host` (with `hold`): also
    "host_queue", the host's time to queue a round (Python and the driver's calls):
    where it exceeds the kernels' total, a match without a hold waits for the host."""
    from numba import cuda
    hold = hold and not numba.config.ENABLE_CUDASIM
    hold_kernel = _hold_kernel() if hold else None
    # the 8-bit images, as the pipeline hands them to the census (and libSGM takes them)
    L, R = bk.upload(left), bk.upload(right)
    stages = {}

    def once(record):
        free_last_round()
        ev = [cuda.event() for _ in range(5)]
        if hold:
            hold_kernel[1, 32, bk.stream](HOLD_MS * 1000)
        t = time.perf_counter()
        ev[0].record(bk.stream)
        marks = iter(ev[1:])
        queue_round(bk, L, R, ndisp, paths, lambda: next(marks).record(bk.stream))
        queued_ms = (time.perf_counter() - t) * 1e3
        launched_in_hold = queued_ms < 0.8 * HOLD_MS
        bk.synchronize()  # (as a match ends: the backend's ordering events are reused from here)
        if record and (launched_in_hold or not hold):
            if host and hold:
                stages.setdefault("host_queue", []).append(queued_ms)
            for name, a, b in (("cost", 0, 1), ("aggregate", 1, 2), ("select", 2, 3), ("lr_check", 3, 4)):
                stages.setdefault(name, []).append(ev[a].elapsed_time(ev[b]))
            stages.setdefault("total", []).append(ev[0].elapsed_time(ev[4]))

    once(False)
    for _ in range(repeat):
        once(True)
    return {k: min(v) for k, v in stages.items()}


LARGE = (6000, 4000, 320, 250.0)  # issue 13's large pair: width, height, disparities, end-to-end bound (ms)


def large_pair_line(runs, one_strip=False):
    """Issue 13's large pair, default preset from host arrays: how many strips, each of
    `runs` consecutive warm runs (after two that allocate the device memory and the
    pinned result maps at this size), their spread (slowest / fastest - 1), how many
    result maps were pinned during them (0 when the warm-ups' maps came back to the
    pool; each one a pause of tens of ms), the stages of the last and of the slowest
    (where a slow run lost its time).

    one_strip: the same in one strip, as `stereo match --max-memory MIB` runs it with
    the MiB that one strip of the whole image needs (the line gives that option and the
    device memory a run takes, a cell). The default layout is the same on every device
    (pipeline.STRIP_CELLS: 4 strips here), so that the CPU's map is the same; one strip's
    map differs from it along the seams."""
    from stereocli import config, pipeline
    from stereocli.backends import get_backend
    w, h, ndisp, bound = LARGE
    left, right = pair(w, h)
    params = config.load("default", None, {"num_disparities": ndisp})
    bk = get_backend("cuda")
    extra = dict(layout="default")
    if one_strip:
        need = pipeline.strip_bytes(h, w, params, bk.sgm_bytes_per_element(params.paths))
        mib = -(-need // 2 ** 20)
        params = config.load("default", None, {"num_disparities": ndisp, "max_memory": mib})
        extra = dict(layout=f"--max-memory {mib}")
    used = device_bytes(lambda: pipeline.run(left, right, params, bk))
    extra.update(device_bytes_per_cell=round(used / (w * h * ndisp), 2))
    # Two warm-up runs, the first one's map kept during the second, as the loop below
    # keeps each map while the next is made: the result maps come in pinned host memory
    # (hostmem), and the second map alive at once is pinned then (91 MiB, about 40 ms on
    # the H100 machine); afterwards the two buffers take turns.
    kept = pipeline.run(left, right, params, bk)
    pipeline.run(left, right, params, bk)
    del kept
    from stereocli.backends.cuda.backend import _HOST_MAPS
    pinned0 = _HOST_MAPS.pinned
    ts, stages = [], []
    for _ in range(runs):
        t = time.perf_counter()
        r = pipeline.run(left, right, params, bk)
        ts.append((time.perf_counter() - t) * 1e3)
        stages.append({k: round(v, 1) for k, v in r.timings.items()})
    emit(preset="default", width=w, height=h, num_disparities=ndisp, strips=r.strips, **extra,
         run_ms=[round(t, 1) for t in ts], best_ms=round(min(ts), 1), spread=round(max(ts) / min(ts) - 1, 3),
         maps_pinned_during_runs=_HOST_MAPS.pinned - pinned0, bound_ms=bound, stages_ms=stages[-1],
         slowest_run_stages_ms=stages[int(np.argmax(ts))])


def libsgm_peer(binary, left, right, ndisp, paths, census):
    """libSGM's figures on this pair from the peer binary (census 0: CENSUS_9x7, 1:
    SYMMETRIC_CENSUS_9x7): its JSON line."""
    h, w = left.shape
    with tempfile.TemporaryDirectory() as tmp:
        names = [str(Path(tmp) / f"{side}.raw") for side in ("left", "right")]
        for name, image in zip(names, (left, right)):
            np.ascontiguousarray(image, dtype=np.uint8).tofile(name)
        out = subprocess.run([binary, *names, str(w), str(h), str(ndisp), str(paths), "100", str(census)],
                             capture_output=True, text=True, check=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=10)
    ap.add_argument("--e2e-repeat", type=int, default=30,
                    help="end-to-end matches per configuration: the best and the median are printed "
                         "(libSGM's host-to-host figures are the best of 100) [30]")
    ap.add_argument("--quick", action="store_true", help="only 1242x375/128 and 1920x1080/128")
    ap.add_argument("--configs", default="",
                    help="only these rows of the table, as WxH/D/PATHS[,...] (e.g. 1920x1080/256/8)")
    ap.add_argument("--large-runs", type=int, default=5,
                    help="consecutive runs of the 6000x4000 / 320 pair at the end (0: none; not with --quick) [5]")
    ap.add_argument("--large-one-strip", action=argparse.BooleanOptionalAction, default=True,
                    help="after the large pair's line, the same pair in one strip (--max-memory) [on]")
    ap.add_argument("--libsgm-peer", metavar="BINARY",
                    help="libSGM's peer binary (benchmarks/libsgm_peer/build.sh), run on every row's pair")
    ap.add_argument("--preset", default="default", help="the end-to-end pipeline's preset [default]")
    ap.add_argument("--graph-max-cells", type=int, metavar="N",
                    help="end to end: replay CUDA graphs of matches up to N cells (W x H x D) "
                         "[pipeline.GRAPH_MAX_CELLS]; for A/B runs in alternated processes")
    ap.add_argument("--sim-check", action="store_true",
                    help="one tiny size, for NUMBA_ENABLE_CUDASIM=1 in CI (a check that the script runs)")
    a = ap.parse_args()
    if a.libsgm_peer and not (Path(a.libsgm_peer).is_file() and os.access(a.libsgm_peer, os.X_OK)):
        ap.error(f"--libsgm-peer {a.libsgm_peer}: no such program; build it with benchmarks/libsgm_peer/build.sh")
    import stereocli
    from stereocli import pipeline
    from stereocli.backends.cuda import CudaBackend, gpu_summary
    if a.graph_max_cells is not None:
        pipeline.GRAPH_MAX_CELLS = a.graph_max_cells
    bk = CudaBackend()
    configs = [(40, 16, 8, 4, None, None)] if a.sim_check else CONFIGS
    if a.sim_check:
        a.repeat = 1
    left, right = pair(*configs[0][:2]) if a.sim_check else pair(741, 500)
    t = time.perf_counter()
    stereocli.match(left, right, device="cuda", num_disparities=configs[0][2] if a.sim_check else 64)
    emit(cold_first_match_s=round(time.perf_counter() - t, 2), gpu=dict(gpu_summary())["gpu"],
         graph_max_cells=pipeline.GRAPH_MAX_CELLS)
    rows = []
    for w, h, ndisp, paths, libsgm, libsgm_h2h in configs:
        if a.quick and (w, h, ndisp) not in ((1242, 375, 128), (1920, 1080, 128)):
            continue
        if a.configs and f"{w}x{h}/{ndisp}/{paths}" not in a.configs.split(","):
            continue
        left, right = pair(w, h)
        k = kernel_times(bk, left, right, ndisp, paths, a.repeat, host=True)
        host_queue = k.pop("host_queue", None)
        # (the simulator has no hold: the same rounds again would time nothing new)
        k_launched = k["total"] if a.sim_check else kernel_times(bk, left, right, ndisp, paths, a.repeat,
                                                                 hold=False)["total"]
        ends = []
        timings = {}
        for _ in range(1 if a.sim_check else a.e2e_repeat):  # (a size seen before replays a graph: steady state)
            t = time.perf_counter()
            _, timings = stereocli.match(left, right, preset=a.preset, device="cuda", num_disparities=ndisp,
                                         paths=paths)
            ends.append((time.perf_counter() - t) * 1e3)
        volume_mb = w * h * ndisp / 1e6
        used = None if a.sim_check else device_bytes(
            lambda: stereocli.match(left, right, preset=a.preset, device="cuda", num_disparities=ndisp, paths=paths))
        peer, fast, fast_h2h = {}, None, None
        if a.libsgm_peer:  # (the ratios and the bound against the faster of libSGM's two census types)
            full, sym = (libsgm_peer(a.libsgm_peer, left, right, ndisp, paths, c) for c in (0, 1))
            fast, fast_h2h = min(full["kernel_ms"], sym["kernel_ms"]), min(full["host_to_host_ms"],
                                                                         sym["host_to_host_ms"])
            peer = dict(libsgm_peer_gpu=full["gpu"], libsgm_peer_ms=round(full["kernel_ms"], 3),
                        libsgm_peer_symmetric_census_ms=round(sym["kernel_ms"], 3),
                        ratio_vs_libsgm_peer=round(k["total"] / fast, 2),
                        libsgm_peer_host_ms=round(full["host_to_host_ms"], 3),
                        libsgm_peer_symmetric_census_host_ms=round(sym["host_to_host_ms"], 3),
                        end_to_end_bound_peer_ms=round(1.5 * fast_h2h, 2))
        rows.append(dict(config=f"{w}x{h}/{ndisp}/{paths}", ratio=k["total"] / libsgm if libsgm else None,
                         within=min(ends) <= 1.5 * libsgm_h2h if libsgm_h2h else None,
                         peer_ratio=k["total"] / fast if fast else None,
                         peer_within=min(ends) <= 1.5 * fast_h2h if fast_h2h else None))
        emit(preset=a.preset, width=w, height=h, num_disparities=ndisp, paths=paths,
             kernel_ms={k2: round(v, 3) for k2, v in k.items()},
             kernel_total_with_launch_gaps_ms=round(k_launched, 3),
             host_queue_ms=round(host_queue, 3) if host_queue is not None else None,
             libsgm_ms=libsgm, ratio_vs_libsgm=round(k["total"] / libsgm, 2) if libsgm else None,
             end_to_end_ms=round(min(ends), 2), end_to_end_median_ms=round(float(np.median(ends)), 2),
             libsgm_host_ms=libsgm_h2h,
             end_to_end_bound_ms=round(1.5 * libsgm_h2h, 2) if libsgm_h2h else None,
             end_to_end_stages_ms={s: round(v, 2) for s, v in timings.items()},
             volume_mb=round(volume_mb, 1), device_mib=round(used / 2**20, 1) if used is not None else None,
             device_bytes_per_cell=round(used / (volume_mb * 1e6), 2) if used is not None else None,
             **peer)
    if a.large_runs > 0 and not (a.quick or a.sim_check):
        large_pair_line(a.large_runs)
        if a.large_one_strip:
            large_pair_line(a.large_runs, one_strip=True)
    summary(rows)


def summary(rows):
    """The last line: the rows whose kernels are above libSGM's figure (issue 13's table,
    and the peer's where it ran) and those whose end to end is past its bound."""
    out = dict(rows=len(rows),
               above_libsgm_table=[r["config"] for r in rows if r["ratio"] is not None and r["ratio"] > 1.0],
               past_end_to_end_bound=[r["config"] for r in rows if r["within"] is False])
    if any(r["peer_ratio"] is not None for r in rows):
        out.update(above_libsgm_peer=[r["config"] for r in rows if r["peer_ratio"] > 1.0],
                   past_peer_end_to_end_bound=[r["config"] for r in rows if r["peer_within"] is False])
    emit(summary=out)


if __name__ == "__main__":
    main()
