"""Host-side cost of one match: with small images the GPU waits on Python (kernel
launches, buffer handling, timing events), so the wall time per match, not the kernel
time, bounds a batch. Prints one JSON line (size, disparities, wall ms per match: mean,
median and best, the per-stage device times of the last run) and, with --profile,
cProfile's top functions by internal time over the same number of matches.

    python benchmarks/profile_host.py [--scene teddy] [-n 64] [--runs 100] [--device cuda] [--profile]
"""
import argparse
import cProfile
import io as sio
import pstats
import time

import cv2
import numpy as np

from common import DATA, emit

from stereocli import config, io, pipeline
from stereocli.backends import get_backend


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--scene", default="teddy")
    ap.add_argument("-n", "--num-disparities", type=int, default=64)
    ap.add_argument("--runs", type=int, default=100)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--profile", action="store_true")
    a = ap.parse_args()
    bk = get_backend(a.device)
    left, right = (cv2.cvtColor(io.read_image(f"{DATA}/{a.scene}/{s}.png"), cv2.COLOR_BGR2GRAY)
                   for s in ("left", "right"))
    params = config.load("default", None, {"num_disparities": a.num_disparities})
    for _ in range(5):
        pipeline.run(left, right, params, bk)  # compile / load, fill the buffer pool
    times = []
    for _ in range(a.runs):
        t = time.perf_counter()
        res = pipeline.run(left, right, params, bk)
        times.append((time.perf_counter() - t) * 1e3)
    emit(scene=a.scene, width=left.shape[1], height=left.shape[0], num_disparities=a.num_disparities,
         device=bk.name, runs=a.runs, wall_ms_per_match=round(sum(times) / a.runs, 3),
         median_ms=round(float(np.median(times)), 3), best_ms=round(min(times), 3),
         device_stages_ms={k: round(v, 3) for k, v in res.timings.items()},
         device_total_ms=round(sum(res.timings.values()), 3))
    if a.profile:
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(a.runs):
            pipeline.run(left, right, params, bk)
        prof.disable()
        out = sio.StringIO()
        pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(25)
        print(out.getvalue())


if __name__ == "__main__":
    main()
