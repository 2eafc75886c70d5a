"""A large pair on both devices: the cones pair resized to 6000x4000, 320 disparities,
default preset. Prints one JSON line per device (strips, per-stage ms of each run,
peak memory) and whether the two maps are identical.

    python benchmarks/large_pair.py [--size 6000x4000] [--ndisp 320] [--runs 5] [--cpu-runs 1] [--quick]
"""
import argparse
import resource
import time

import numpy as np

from common import emit
from gpu import pair


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--size", default="6000x4000")
    ap.add_argument("--ndisp", type=int, default=320)
    ap.add_argument("--runs", type=int, default=5, help="consecutive GPU runs after a warm-up")
    ap.add_argument("--cpu-runs", type=int, default=1)
    ap.add_argument("--devices", default="cuda,cpu")
    ap.add_argument("--quick", action="store_true", help="600x400, 32 disparities, CPU (a check that it runs)")
    args = ap.parse_args()
    if args.quick:
        args.size, args.ndisp, args.devices = "600x400", 32, "cpu"
    w, h = (int(v) for v in args.size.split("x"))
    left, right = pair(w, h)

    import numba

    from stereocli import config, pipeline
    from stereocli.backends import get_backend
    params = config.load("default", None, {"num_disparities": args.ndisp})
    maps = {}
    for device in args.devices.split(","):
        bk = get_backend(device)
        pipeline.run(left[:64], right[:64], params, bk)  # compile / load the kernels
        runs = args.runs if device == "cuda" else args.cpu_runs
        times, res = [], None
        for _ in range(runs):
            t = time.perf_counter()
            res = pipeline.run(left, right, params, bk)
            times.append((time.perf_counter() - t) * 1e3)
        maps[device] = res.disparity
        emit(device=device, width=w, height=h, ndisp=args.ndisp, threads=numba.get_num_threads(),
             strips=res.strips, notes=res.notes, run_ms=[round(t, 1) for t in times],
             spread=round(max(times) / min(times) - 1, 3), stages_ms={k: round(v, 1) for k, v in res.timings.items()},
             peak_rss_mib=round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024))
    if len(maps) == 2:
        a, b = maps.values()
        same = np.isclose(a, b, atol=1e-5, rtol=0) | (np.isnan(a) & np.isnan(b))
        emit(identical=bool(same.all()), differing_pixels=int((~same).sum()))


if __name__ == "__main__":
    main()
