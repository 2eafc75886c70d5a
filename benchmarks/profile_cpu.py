"""Where the CPU pipeline's time goes, kernel by kernel, at one thread count: every
backend call of a default match (and SGM's sweeps one by one) timed on its own, the
best of N matches for each. Prints one JSON line per pair and thread count, with each
kernel's ms and its speed-up over one thread when --threads lists 1 first.

    python benchmarks/profile_cpu.py [DATA_DIR] [--pairs teddy,cones@741x500/64] [--threads 1,16] [--repeat 7]
"""
import argparse
import time

import numba

from common import DATA, emit
from cpu_vs_opencv import load

from stereocli import config, pipeline
from stereocli.backends.cpu import CpuBackend
from stereocli.stages import aggregate, refine


MS = {}  # ms of each timed call over one match (main clears it before each)


def _timed(key, fn, *args, **kw):
    t = time.perf_counter()
    r = fn(*args, **kw)
    MS[key] = MS.get(key, 0.0) + (time.perf_counter() - t) * 1e3
    return r


class TimedCpu(CpuBackend):
    """The CPU backend, each stage call timed into MS, and (through the module attributes
    below) each kernel its drivers call: SGM's sweeps, speckle's and the fill's kernels.
    The drivers' own choices (which sweeps, block sizes) are the ones timed: nothing of
    them is written out again here."""


def _wrap(name):
    base = getattr(CpuBackend, name)
    setattr(TimedCpu, name, lambda self, *a, **k: _timed(name, base, self, *a, **k))


for _name in ("census_volume", "select", "lr_check", "weighted_median", "median", "mgm",
              "download", "upload"):
    _wrap(_name)


def _time_kernel(module, name, key):
    """module.name, as the drivers look it up at each call, timed under `key` (a name, or
    a function of the call's arguments)."""
    fn = getattr(module, name)
    setattr(module, name, lambda *a: _timed(key(a) if callable(key) else key, fn, *a))


for _module, _name, _key in [
        (aggregate, "sgm_horizontal_cpu", "sgm_horizontal"),
        (aggregate, "sgm_vertical_cpu", "sgm_vertical"),
        (aggregate, "sgm_vertical3_cpu", "sgm_vertical"),
        (aggregate, "sgm_vertical_lines_cpu", lambda a: f"sgm_lines_dx{a[5]}"),
        (aggregate, "sgm_line_pair_cpu", "sgm_lines"),
        (refine, "speckle_sizes_cpu", "speckle_sizes"),
        (refine, "speckle_apply_cpu", "speckle_apply"),
        (refine, "border_slope_cpu", "border_slope"),
        (refine, "fill_cpu", "fill"),
        (refine, "fill2d_cpu", "fill")]:
    _time_kernel(_module, _name, _key)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("data", nargs="?", default=str(DATA))
    ap.add_argument("--pairs", default="teddy,cones@741x500/64")
    ap.add_argument("--threads", default="1," + str(numba.config.NUMBA_NUM_THREADS))
    ap.add_argument("--preset", default="default")
    ap.add_argument("--repeat", type=int, default=7)
    a = ap.parse_args()
    bk = TimedCpu()
    for spec in a.pairs.split(","):
        name, left, right, ndisp = load(a.data, spec)
        params = config.load(a.preset, None, {"num_disparities": ndisp})
        one = None
        for threads in (int(t) for t in a.threads.split(",")):
            numba.set_num_threads(threads)
            best, total = {}, []
            for _ in range(a.repeat + 1):  # (the first run compiles or loads, and is not counted)
                MS.clear()
                t = time.perf_counter()
                pipeline.run(left, right, params, bk)
                total.append((time.perf_counter() - t) * 1e3)
                for k, v in MS.items():
                    best[k] = min(best.get(k, v), v)
            kernels = {k: round(v, 3) for k, v in best.items()}
            row = dict(pair=name, width=left.shape[1], height=left.shape[0], num_disparities=ndisp,
                       threads=threads, match_ms=round(min(total[1:]), 2), kernels_ms=kernels,
                       other_ms=round(min(total[1:]) - sum(best.values()), 2))
            if one is None:
                one = (row["match_ms"], best)
            else:
                row["speedup"] = round(one[0] / row["match_ms"], 2)
                row["kernel_speedup"] = {k: round(one[1][k] / v, 1) for k, v in best.items() if k in one[1] and v}
            emit(**row)


if __name__ == "__main__":
    main()
