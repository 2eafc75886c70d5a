"""Accuracy on the Middlebury scenes of ../shared/data against their ground truth,
next to OpenCV StereoSGBM run in the same script with the settings of
shared/data/README.md. One JSON line per scene, then a summary line.

    python benchmarks/accuracy.py [DATA_DIR] [--preset NAME] [--device cpu|cuda]
"""
import argparse

import cv2
import numpy as np

from common import DATA, SCENES, emit

import stereocli
from stereocli import io, metrics


def opencv_sgbm(left, right, ndisp):
    gl, gr = cv2.cvtColor(left, cv2.COLOR_BGR2GRAY), cv2.cvtColor(right, cv2.COLOR_BGR2GRAY)
    sgbm = cv2.StereoSGBM_create(minDisparity=0, numDisparities=ndisp, blockSize=5, P1=8 * 25, P2=32 * 25,
                                 disp12MaxDiff=1, uniquenessRatio=10, speckleWindowSize=100, speckleRange=2,
                                 mode=cv2.STEREO_SGBM_MODE_HH)
    d = sgbm.compute(gl, gr).astype(np.float32) / 16.0
    d[d < 0] = np.nan
    return d


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("data", nargs="?", default=str(DATA))
    ap.add_argument("--preset", default="default")
    ap.add_argument("--device", default="cpu")
    a = ap.parse_args()
    ours, theirs = [], []
    for scene, ndisp in SCENES:
        d = f"{a.data}/{scene}"
        left, right = io.read_image(f"{d}/left.png"), io.read_image(f"{d}/right.png")
        gt = io.read_disparity(f"{d}/disp.pfm")
        disp, _ = stereocli.match(left, right, preset=a.preset, device=a.device, num_disparities=ndisp)
        m = metrics.evaluate(disp, gt)
        o = metrics.evaluate(opencv_sgbm(left, right, ndisp), gt)
        ours.append(m["bad2"])
        theirs.append(o["bad2"])
        emit(scene=scene, num_disparities=ndisp, preset=a.preset, device=a.device,
             bad2=round(100 * m["bad2"], 2), bad1=round(100 * m["bad1"], 2), density=round(100 * m["density"], 2),
             avgerr=round(m["avgerr"], 3), d1=round(100 * m["d1"], 2),
             opencv_bad2=round(100 * o["bad2"], 2), opencv_density=round(100 * o["density"], 2))
    emit(summary=True, mean_bad2=round(100 * np.mean(ours), 2), opencv_mean_bad2=round(100 * np.mean(theirs), 2))


if __name__ == "__main__":
    main()
