"""What a change of options costs in time: a preset against the same preset with some
options overridden (by default, the pipeline before issue 17: the background fill and
the 3x3 median instead of the slope fill and the weighted median), run in turn in one
process so that both see the same machine. Prints one JSON line per scene: the best
time of each, the median of the paired ratios (run i of one against run i of the other:
steadier than the best times on a shared machine), and each one's per-stage best ms.

    python benchmarks/pipeline_cost.py [--preset default] [--against '{"fill": "background", "median": 3, "weighted_median": 0}']
                                       [--device cpu] [--threads 1] [--runs 60] [--quick]
"""
import argparse
import json
import statistics
import time

import numba

from common import DATA, QUICK_SCENES, SCENES, emit

from stereocli import config, io, pipeline
from stereocli.backends import get_backend

BEFORE_ISSUE_17 = {"fill": "background", "median": 3, "weighted_median": 0}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--preset", default="default")
    ap.add_argument("--against", default=json.dumps(BEFORE_ISSUE_17),
                    help="JSON object of options that make the other pipeline")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--threads", type=int, default=1, help="CPU threads (0: all cores)")
    ap.add_argument("--runs", type=int, default=60)
    ap.add_argument("--quick", action="store_true", help="one small scene, 2 runs (a check that the script runs)")
    a = ap.parse_args()
    if a.threads:
        numba.set_num_threads(a.threads)
    bk = get_backend(a.device)
    against = json.loads(a.against)
    runs = 2 if a.quick else a.runs
    for scene, ndisp in (QUICK_SCENES if a.quick else SCENES):
        left, right = (io.read_image(f"{DATA}/{scene}/{s}.png") for s in ("left", "right"))
        params = {"this": config.load(a.preset, None, {"num_disparities": ndisp}),
                  "other": config.load(a.preset, None, {"num_disparities": ndisp, **against})}
        for p in params.values():
            pipeline.run(left, right, p, bk)  # compile / load
        times = {k: [] for k in params}
        stages = {k: [] for k in params}
        for _ in range(runs):
            for k, p in params.items():
                t = time.perf_counter()
                res = pipeline.run(left, right, p, bk)
                times[k].append((time.perf_counter() - t) * 1e3)
                stages[k].append(res.timings)
        ratio = statistics.median(x / y for x, y in zip(times["this"], times["other"]))
        emit(scene=scene, num_disparities=ndisp, preset=a.preset, against=against, device=bk.name,
             threads=numba.get_num_threads(), runs=runs,
             best_ms=round(min(times["this"]), 2), other_best_ms=round(min(times["other"]), 2),
             median_paired_ratio=round(ratio, 3), extra_percent=round(100 * (ratio - 1), 1),
             stages_ms={k: {s: round(min(t[s] for t in stages[k]), 2) for s in stages[k][0]} for k in params})


if __name__ == "__main__":
    main()
