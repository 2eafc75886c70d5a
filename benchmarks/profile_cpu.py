"""Where the CPU pipeline's time goes, kernel by kernel, at one thread count: every
backend call of a default match (and SGM's sweeps one by one) timed on its own, the
best of N matches for each. Prints one JSON line per pair and thread count, with each
kernel's ms and its speed-up over one thread when --threads lists 1 first.

    python benchmarks/profile_cpu.py [DATA_DIR] [--pairs teddy,cones@741x500/64] [--threads 1,16] [--repeat 7]
"""
import argparse
import time

import numba
import numpy as np

from common import DATA, emit
from cpu_vs_opencv import load

from stereocli import config, pipeline
from stereocli.backends.cpu import CpuBackend
from stereocli.stages import aggregate, refine


class TimedCpu(CpuBackend):
    """The CPU backend, timing each call (and each SGM sweep) into self.ms."""

    def __init__(self):
        super().__init__()
        self.ms = {}

    def _timed(self, key, fn, *args):
        t = time.perf_counter()
        r = fn(*args)
        self.ms[key] = self.ms.get(key, 0.0) + (time.perf_counter() - t) * 1e3
        return r

    def sgm(self, vol, guide, p1, p2, adaptive, paths):
        if paths not in (4, 8):
            return self._timed("sgm", super().sgm, vol, guide, p1, p2, adaptive, paths)
        S = self._volume(vol.shape, np.dtype(np.uint16))
        p2tab = aggregate.p2_table(p1, p2, adaptive)
        self._timed("sgm_horizontal", aggregate.sgm_horizontal_cpu, vol, guide, np.int32(p1), p2tab, S)
        dxs = [0] if paths == 4 else [0, 1, -1]
        if aggregate.vertical_by_lines(vol):
            for dx in dxs:
                self._timed(f"sgm_lines_dx{dx}", aggregate.sgm_vertical_lines_cpu, vol, guide, np.int32(p1),
                            p2tab, S, dx,
                            aggregate.lines_per_task(*vol.shape[:2], dx, numba.get_num_threads()),
                            numba.get_num_threads())
        else:
            if paths == 8:
                self._timed("sgm_vertical", aggregate.sgm_vertical3_cpu, vol, guide, np.int32(p1), p2tab, S)
            else:
                self._timed("sgm_vertical", aggregate.sgm_vertical_cpu, vol, guide, np.int32(p1), p2tab, S,
                            np.array(dxs, np.int64))
        return S

    def speckle(self, disp, max_size, max_diff):
        sizes = self._timed("speckle_sizes", refine.speckle_sizes_cpu, disp, np.float32(max_diff))
        return self._timed("speckle_apply", refine.speckle_apply_cpu, disp, sizes, max_size)

    def fill(self, disp, mode):
        if mode == refine.SLOPE:
            disp = self._timed("border_slope", refine.border_slope_cpu, disp)
            return self._timed("fill", refine.fill_cpu, disp, refine.BACKGROUND)
        return self._timed("fill", super().fill, disp, mode)


def _wrap(name):
    base = getattr(CpuBackend, name)
    setattr(TimedCpu, name, lambda self, *a, **k: self._timed(name, base, self, *a, **k))


for _name in ("census_volume", "select", "lr_check", "weighted_median", "median",
              "download", "upload"):
    _wrap(_name)


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
                bk.ms = {}
                t = time.perf_counter()
                pipeline.run(left, right, params, bk)
                total.append((time.perf_counter() - t) * 1e3)
                for k, v in bk.ms.items():
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
