"""Times the stereocli CPU pipeline and OpenCV StereoSGBM (MODE_HH, 8 directions) on
the same pairs in the same process; prints one JSON line per scene with per-stage ms
and the ratio ours / OpenCV (best of N warm runs).

    python benchmarks/cpu_vs_opencv.py [DATA_DIR] [--scenes teddy,cones] [--repeat 5] [--quick]
"""
import argparse

import cv2
import numba

from common import DATA, QUICK_SCENES, SCENES, best_ms, emit, opencv_sgbm

from stereocli import config, io, pipeline
from stereocli.backends.cpu import CpuBackend


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("data", nargs="?", default=str(DATA))
    ap.add_argument("--scenes", default=",".join(s for s, _ in SCENES))
    ap.add_argument("--preset", default="default")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--quick", action="store_true", help="one small scene, one run (a check that the script runs)")
    a = ap.parse_args()
    if a.quick:
        a.scenes, a.repeat = ",".join(s for s, _ in QUICK_SCENES), 1
    want = a.scenes.split(",")
    bk = CpuBackend()
    for scene, ndisp in SCENES:
        if scene not in want:
            continue
        left, right = io.read_image(f"{a.data}/{scene}/left.png"), io.read_image(f"{a.data}/{scene}/right.png")
        params = config.load(a.preset, None, {"num_disparities": ndisp})
        last = {}

        def ours():
            last["r"] = pipeline.run(left, right, params, bk)

        ours_ms = best_ms(ours, a.repeat)
        gl, gr = cv2.cvtColor(left, cv2.COLOR_BGR2GRAY), cv2.cvtColor(right, cv2.COLOR_BGR2GRAY)
        sgbm = opencv_sgbm(ndisp)
        cv_ms = best_ms(lambda: sgbm.compute(gl, gr), a.repeat)
        h, w = gl.shape
        emit(scene=scene, width=w, height=h, num_disparities=ndisp, preset=a.preset, threads=numba.get_num_threads(),
             opencv_threads=cv2.getNumThreads(), stereocli_ms=round(ours_ms, 2), opencv_sgbm_hh_ms=round(cv_ms, 2),
             ratio=round(ours_ms / cv_ms, 2), stages_ms={k: round(v, 2) for k, v in last["r"].timings.items()})


if __name__ == "__main__":
    main()
