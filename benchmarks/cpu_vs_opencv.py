"""Times the stereocli CPU pipeline (default preset) and OpenCV StereoSGBM in its three
modes (HH: 8 paths, SGBM: 5 paths, 3WAY) on the same pairs in the same process, with
the same number of threads for both; prints one JSON line per pair with per-stage ms,
the ratios ours / OpenCV (best of N warm runs) and the process's peak memory.

With several thread counts (`--threads 1,16`) each pair runs in processes that
alternate between them (a process at 1 thread, one at 16, one at 1, one at 16, each
the best of its half of the runs), so that the host's speed, which can drift by tens
of percent within minutes on a shared machine, weighs on every count alike; the lines
after the first count's then give the speed-up over it, ours and OpenCV 3WAY's, from
those runs. (Not in one process: there, alternating the thread count run by run made
a 16-thread run right after a switch take up to 6x its time on the 16-core host, and a
one-thread run after 2 threads 1.3x on the 2-core machine.)

Pairs: the shared scenes, and the cones pair resized ("cones@741x500/64" is the size
of Middlebury 2014's motorcycle at quarter resolution, "cones@1482x1000/128" at half).

    python benchmarks/cpu_vs_opencv.py [DATA_DIR] [--threads 1[,16]] [--pairs teddy,cones@741x500/64] [--repeat 5]
"""
import argparse
import json
import resource
import subprocess
import sys

import cv2
import numba

from common import DATA, QUICK_SCENES, SCENES, best_ms, emit, opencv_sgbm

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
                    help="threads for both (0: all cores); several, comma-separated: processes alternating between them")
    ap.add_argument("--preset", default="default")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--quick", action="store_true", help="one small scene, one run (a check that the script runs)")
    a = ap.parse_args()
    if a.quick:
        a.pairs, a.repeat = ",".join(s for s, _ in QUICK_SCENES), 1
    counts = [int(t) or numba.config.NUMBA_NUM_THREADS for t in str(a.threads).split(",")]
    if len(counts) > 1:
        return alternate(a, counts)
    threads = counts[0]
    numba.set_num_threads(threads)
    cv2.setNumThreads(threads)
    bk = CpuBackend()
    modes = ("hh", "sgbm", "3way")
    for spec in (a.scenes or a.pairs).split(","):
        name, left, right, ndisp = load(a.data, spec)
        params = config.load(a.preset, None, {"num_disparities": ndisp})
        gl, gr = cv2.cvtColor(left, cv2.COLOR_BGR2GRAY), cv2.cvtColor(right, cv2.COLOR_BGR2GRAY)
        last = {}

        def ours():
            last["r"] = pipeline.run(left, right, params, bk)

        best = {"ours": best_ms(ours, a.repeat)}
        for m in modes:
            sgbm = opencv_sgbm(ndisp, m)
            best[m] = best_ms(lambda: sgbm.compute(gl, gr), a.repeat)
        h, w = gl.shape
        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        emit(pair=name, width=w, height=h, num_disparities=ndisp, preset=a.preset, threads=threads,
             stereocli_ms=round(best["ours"], 2), **{f"opencv_{m}_ms": round(best[m], 2) for m in modes},
             ratio_hh=round(best["ours"] / best["hh"], 2), ratio_3way=round(best["ours"] / best["3way"], 2),
             stages_ms={k: round(v, 2) for k, v in last["r"].timings.items()},
             peak_rss_mib=round(rss / 1024), bytes_per_cell_peak=round(rss * 1024 / (w * h * ndisp), 1))


def alternate(a, counts, rounds=2):
    """Each pair in processes of one thread count each, the counts alternated `rounds`
    times (each process the best of its share of the runs); one line per count: the
    best time of each method over its processes (the stages of ours from its best
    process), the peak memory of the largest, and the speed-up over the first count."""
    per = -(-a.repeat // rounds)
    for spec in (a.scenes or a.pairs).split(","):
        rows = {t: [] for t in counts}
        for _ in range(rounds):
            for t in counts:
                out = subprocess.run([sys.executable, __file__, a.data, "--pairs", spec, "--threads", str(t),
                                      "--repeat", str(per), "--preset", a.preset],
                                     check=True, capture_output=True, text=True).stdout
                rows[t].append(json.loads([line for line in out.splitlines() if line.startswith("{")][-1]))
        got = {}
        for t in counts:
            r = dict(min(rows[t], key=lambda row: row["stereocli_ms"]))
            for k in r:
                if k.startswith("opencv_"):
                    r[k] = min(row[k] for row in rows[t])
            r["peak_rss_mib"] = max(row["peak_rss_mib"] for row in rows[t])
            r["bytes_per_cell_peak"] = round(r["peak_rss_mib"] * 2 ** 20 / (r["width"] * r["height"] * r["num_disparities"]), 1)
            r["ratio_hh"] = round(r["stereocli_ms"] / r["opencv_hh_ms"], 2)
            r["ratio_3way"] = round(r["stereocli_ms"] / r["opencv_3way_ms"], 2)
            if t != counts[0]:
                r.update(speedup_from=counts[0], speedup=round(got[counts[0]]["stereocli_ms"] / r["stereocli_ms"], 2),
                         opencv_3way_speedup=round(got[counts[0]]["opencv_3way_ms"] / r["opencv_3way_ms"], 2))
            got[t] = r
            emit(**r)


if __name__ == "__main__":
    main()
