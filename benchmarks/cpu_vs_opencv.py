"""Times the stereocli CPU pipeline (default preset) and OpenCV StereoSGBM in its three
modes (HH: 8 paths, SGBM: 5 paths, 3WAY) on the same pairs in the same process, with
the same number of threads for both; prints one JSON line per pair with per-stage ms,
the ratios ours / OpenCV (best of N warm runs) and the process's peak memory.

With several thread counts (`--threads 1,16`) each pair's runs alternate between them
(one run of ours and of each OpenCV mode at 1 thread, then at 16, and so on), so that
the host's speed, which can drift by tens of percent within minutes on a shared
machine, weighs on every count alike; the lines after the first count's then give the
speed-up over it, ours and OpenCV 3WAY's, from those alternated runs.

Pairs: the shared scenes, and the cones pair resized ("cones@741x500/64" is the size
of Middlebury 2014's motorcycle at quarter resolution, "cones@1482x1000/128" at half).

    python benchmarks/cpu_vs_opencv.py [DATA_DIR] [--threads 1[,16]] [--pairs teddy,cones@741x500/64] [--repeat 5]
"""
import argparse
import resource
import time

import cv2
import numba

from common import DATA, QUICK_SCENES, SCENES, emit, opencv_sgbm

from stereocli import config, io, pipeline
from stereocli.backends.cpu import CpuBackend

DEFAULT_PAIRS = ",".join([s for s, _ in SCENES] + ["cones@741x500/64", "cones@1482x1000/128"])


def load(data, spec):
    """'scene' or 'scene@WxH/D' -> (name, left, right, D)."""
    ndisp = dict(SCENES)
    scene, _, size = spec.partition("@")
    left, right = io.read_image(f"{data}/{scene}/left.png"), io.read_image(f"{data}/{scene}/right.png")
    if not size:
        return spec, left, right, ndisp[scene]
    wh, _, d = size.partition("/")
    w, h = (int(v) for v in wh.split("x"))
    resize = (lambda img: cv2.resize(img, (w, h), interpolation=cv2.INTER_CUBIC))
    return spec, resize(left), resize(right), int(d)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("data", nargs="?", default=str(DATA))
    ap.add_argument("--pairs", default=DEFAULT_PAIRS, help="scene or scene@WxH/D, comma-separated")
    ap.add_argument("--scenes", help="(old name of --pairs)")
    ap.add_argument("--threads", default="0",
                    help="threads for both (0: all cores); several, comma-separated, alternate run by run")
    ap.add_argument("--preset", default="default")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--quick", action="store_true", help="one small scene, one run (a check that the script runs)")
    a = ap.parse_args()
    if a.quick:
        a.pairs, a.repeat = ",".join(s for s, _ in QUICK_SCENES), 1
    counts = [int(t) or numba.config.NUMBA_NUM_THREADS for t in str(a.threads).split(",")]
    bk = CpuBackend()
    modes = ("hh", "sgbm", "3way")
    for spec in (a.scenes or a.pairs).split(","):
        name, left, right, ndisp = load(a.data, spec)
        params = config.load(a.preset, None, {"num_disparities": ndisp})
        gl, gr = cv2.cvtColor(left, cv2.COLOR_BGR2GRAY), cv2.cvtColor(right, cv2.COLOR_BGR2GRAY)
        sgbm = {m: opencv_sgbm(ndisp, m) for m in modes}
        last = {}

        def ours():
            last["r"] = pipeline.run(left, right, params, bk)

        runs = {(t, k): [] for t in counts for k in ("ours",) + modes}
        stages = {}
        for rep in range(a.repeat + 1):  # (the first round warms up and is not counted)
            for t in counts:
                numba.set_num_threads(t)
                cv2.setNumThreads(t)
                for k, fn in [("ours", ours)] + [(m, lambda m=m: sgbm[m].compute(gl, gr)) for m in modes]:
                    t0 = time.perf_counter()
                    fn()
                    if rep:
                        runs[t, k].append((time.perf_counter() - t0) * 1e3)
        best = {key: min(v) for key, v in runs.items()}
        h, w = gl.shape
        for t in counts:
            numba.set_num_threads(t)
            ours()  # (the stages of a run at this count)
            stages[t] = last["r"].timings
        for t in counts:
            extra = {}
            if t != counts[0]:
                extra = dict(speedup_from=counts[0], speedup=round(best[counts[0], "ours"] / best[t, "ours"], 2),
                             opencv_3way_speedup=round(best[counts[0], "3way"] / best[t, "3way"], 2))
            emit(pair=name, width=w, height=h, num_disparities=ndisp, preset=a.preset, threads=t,
                 stereocli_ms=round(best[t, "ours"], 2), **{f"opencv_{m}_ms": round(best[t, m], 2) for m in modes},
                 ratio_hh=round(best[t, "ours"] / best[t, "hh"], 2), ratio_3way=round(best[t, "ours"] / best[t, "3way"], 2),
                 stages_ms={k: round(v, 2) for k, v in stages[t].items()}, **extra,
                 peak_rss_mib=round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024),
                 bytes_per_cell_peak=round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / (w * h * ndisp), 1))


if __name__ == "__main__":
    main()
