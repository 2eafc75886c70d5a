"""Accuracy on the Middlebury scenes of ../shared/data against their ground truth,
next to OpenCV StereoSGBM run in the same script with the settings of
shared/data/README.md. One JSON line per scene, then a summary line.

    python benchmarks/accuracy.py [DATA_DIR] [--preset NAME] [--device cpu|cuda] [--quick]
"""
import argparse

import cv2
import numpy as np

from common import DATA, QUICK_SCENES, SCENES, emit, opencv_disparity, opencv_sgbm

import stereocli
from stereocli import io, metrics


def opencv_map(left, right, ndisp):
    gl, gr = cv2.cvtColor(left, cv2.COLOR_BGR2GRAY), cv2.cvtColor(right, cv2.COLOR_BGR2GRAY)
    return opencv_disparity(opencv_sgbm(ndisp), gl, gr)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("data", nargs="?", default=str(DATA))
    ap.add_argument("--preset", default="default")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--quick", action="store_true", help="one small scene (a check that the script runs)")
    a = ap.parse_args()
    ours, theirs = [], []
    for scene, ndisp in QUICK_SCENES if a.quick else SCENES:
        d = f"{a.data}/{scene}"
        left, right = io.read_image(f"{d}/left.png"), io.read_image(f"{d}/right.png")
        gt = io.read_disparity(f"{d}/disp.pfm")
        disp, _ = stereocli.match(left, right, preset=a.preset, device=a.device, num_disparities=ndisp)
        m = metrics.evaluate(disp, gt)
        o = metrics.evaluate(opencv_map(left, right, ndisp), gt)
        ours.append(m["bad2"])
        theirs.append(o["bad2"])
        emit(scene=scene, num_disparities=ndisp, preset=a.preset, device=a.device,
             bad2=round(100 * m["bad2"], 2), bad1=round(100 * m["bad1"], 2), density=round(100 * m["density"], 2),
             avgerr=round(m["avgerr"], 3), d1=round(100 * m["d1"], 2),
             opencv_bad2=round(100 * o["bad2"], 2), opencv_density=round(100 * o["density"], 2))
    emit(summary=True, mean_bad2=round(100 * np.mean(ours), 2), opencv_mean_bad2=round(100 * np.mean(theirs), 2))


if __name__ == "__main__":
    main()
