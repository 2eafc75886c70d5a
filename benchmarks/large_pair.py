"""A large pair on both devices: the cones pair resized to 6000x4000, 320 disparities,
default preset. Prints one JSON line per device (strips, per-stage ms of each run,
peak memory) and whether the two maps are identical. `--cpu-costs both` runs the CPU
twice in turn, with its census volume stored and with its costs computed as the SGM
sweeps (from 2^30 cells on it does the latter; peak memory is then the process's, of
both).

    python benchmarks/large_pair.py [--size 6000x4000] [--ndisp 320] [--runs 5] [--cpu-runs 1]
                                    [--cpu-costs auto|stored|on-the-fly|both] [--max-memory MIB] [--quick]
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
    ap.add_argument("--max-memory", type=int, metavar="MIB",
                    help="as stereo match --max-memory: strips of that budget instead of the standard layout "
                         "(e.g. 40000: one strip on an 80 GB GPU)")
    ap.add_argument("--cpu-costs", default="auto", choices=("auto", "stored", "on-the-fly", "both"),
                    help="the CPU's census costs: as the backend decides, stored, computed as SGM sweeps, or both")
    ap.add_argument("--quick", action="store_true", help="600x400, 32 disparities, CPU (a check that it runs)")
    args = ap.parse_args()
    if args.quick:
        args.size, args.ndisp, args.devices = "600x400", 32, "cpu"
    w, h = (int(v) for v in args.size.split("x"))
    left, right = pair(w, h)

    import numba

    from stereocli import config, pipeline
    from stereocli.backends import get_backend
    overrides = {"num_disparities": args.ndisp}
    if args.max_memory:
        overrides["max_memory"] = args.max_memory
    params = config.load("default", None, overrides)
    maps = {}
    for device in args.devices.split(","):
        runs = args.runs if device == "cuda" else args.cpu_runs
        variants = {None: get_backend(device)}
        if device == "cpu" and args.cpu_costs != "auto":
            costs = ("stored", "on-the-fly") if args.cpu_costs == "both" else (args.cpu_costs,)
            variants = {c: type(variants[None])() for c in costs}
            for c, bk in variants.items():
                bk.CENSUS_ON_THE_FLY_CELLS = 0 if c == "on-the-fly" else 1 << 62
        for bk in variants.values():
            pipeline.run(left[:64], right[:64], params, bk)  # compile / load the kernels
        if device == "cpu" and None in variants:  # (and those of the costs computed as SGM sweeps)
            bk = type(variants[None])()
            bk.CENSUS_ON_THE_FLY_CELLS = 0
            pipeline.run(left[:64], right[:64], params, bk)
        times = {c: [] for c in variants}
        res = {}
        for _ in range(runs):
            for c, bk in variants.items():  # (variants in turn: one machine's speed drifts)
                t = time.perf_counter()
                res[c] = pipeline.run(left, right, params, bk)
                times[c].append((time.perf_counter() - t) * 1e3)
        for c, r in res.items():
            ts = times[c]
            maps[device if c is None else f"{device} ({c})"] = r.disparity
            extra = {} if c is None else {"cpu_costs": c}
            emit(device=device, **extra, width=w, height=h, ndisp=args.ndisp, threads=numba.get_num_threads(),
                 strips=r.strips, notes=r.notes, run_ms=[round(t, 1) for t in ts],
                 spread=round(max(ts) / min(ts) - 1, 3), stages_ms={k: round(v, 1) for k, v in r.timings.items()},
                 peak_rss_mib=round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024))
    if len(maps) >= 2:
        (_, a), *others = maps.items()
        for name, b in others:
            same = np.isclose(a, b, atol=1e-5, rtol=0) | (np.isnan(a) & np.isnan(b))
            emit(identical=bool(same.all()), differing_pixels=int((~same).sum()), maps=[next(iter(maps)), name])


if __name__ == "__main__":
    main()
