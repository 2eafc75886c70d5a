"""Times the stereocli CPU pipeline (default preset) and OpenCV StereoSGBM in its three
modes (HH: 8 paths, SGBM: 5 paths, 3WAY) on the same pairs in the same process, with
the same number of threads for both; prints one JSON line per pair with per-stage ms,
the ratios ours / OpenCV (best of N warm runs) and the process's peak memory.

Pairs: the shared scenes, and the cones pair resized ("cones@741x500/64" is the size
of Middlebury 2014's motorcycle at quarter resolution, "cones@1482x1000/128" at half).

    python benchmarks/cpu_vs_opencv.py [DATA_DIR] [--threads 1] [--pairs teddy,cones@741x500/64] [--repeat 5]
"""
import argparse
import resource

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
    ap.add_argument("--threads", type=int, default=0, help="threads for both (0: all cores)")
    ap.add_argument("--preset", default="default")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--quick", action="store_true", help="one small scene, one run (a check that the script runs)")
    a = ap.parse_args()
    if a.quick:
        a.pairs, a.repeat = ",".join(s for s, _ in QUICK_SCENES), 1
    threads = a.threads or numba.config.NUMBA_NUM_THREADS
    numba.set_num_threads(threads)
    cv2.setNumThreads(threads)
    bk = CpuBackend()
    for spec in (a.scenes or a.pairs).split(","):
        name, left, right, ndisp = load(a.data, spec)
        params = config.load(a.preset, None, {"num_disparities": ndisp})
        last = {}

        def ours():
            last["r"] = pipeline.run(left, right, params, bk)

        ours_ms = best_ms(ours, a.repeat)
        gl, gr = cv2.cvtColor(left, cv2.COLOR_BGR2GRAY), cv2.cvtColor(right, cv2.COLOR_BGR2GRAY)
        theirs = {}
        for mode in ("hh", "sgbm", "3way"):
            sgbm = opencv_sgbm(ndisp, mode)
            theirs[mode] = best_ms(lambda: sgbm.compute(gl, gr), a.repeat)
        h, w = gl.shape
        emit(pair=name, width=w, height=h, num_disparities=ndisp, preset=a.preset, threads=threads,
             stereocli_ms=round(ours_ms, 2), **{f"opencv_{m}_ms": round(t, 2) for m, t in theirs.items()},
             ratio_hh=round(ours_ms / theirs["hh"], 2), ratio_3way=round(ours_ms / theirs["3way"], 2),
             stages_ms={k: round(v, 2) for k, v in last["r"].timings.items()},
             peak_rss_mib=round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024),
             bytes_per_cell_peak=round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / (w * h * ndisp), 1))


if __name__ == "__main__":
    main()
