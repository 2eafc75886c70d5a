"""Accuracy on the Middlebury scenes of ../shared/data against their ground truth,
next to OpenCV StereoSGBM run in the same script with the settings of
shared/data/README.md. One JSON line per scene (bad-0.5/1/2/4, average error,
density, D1, and how well the confidence map ranks the pixels: bad-2 of the most
confident half, the area under the sparsification curve and its best possible
value), then a summary line with the means.

    python benchmarks/accuracy.py [DATA_DIR] [--preset NAME] [--device cpu|cuda] [--quick]
"""
import argparse

import cv2
import numpy as np

from common import DATA, QUICK_SCENES, SCENES, emit, opencv_disparity, opencv_sgbm

from stereocli import config, io, metrics, pipeline
from stereocli.backends import get_backend


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
    backend = get_backend(a.device)
    rows, theirs = [], []
    for scene, ndisp in QUICK_SCENES if a.quick else SCENES:
        d = f"{a.data}/{scene}"
        left, right = io.read_image(f"{d}/left.png"), io.read_image(f"{d}/right.png")
        gt = io.read_disparity(f"{d}/disp.pfm")
        result = pipeline.run(left, right, config.load(a.preset, None, {"num_disparities": ndisp}), backend,
                              confidence=True)
        m = metrics.evaluate(result.disparity, gt)
        s = metrics.sparsification(*metrics.confidence_ranking(result.confidence, result.disparity, gt))
        o = metrics.evaluate(opencv_map(left, right, ndisp), gt)
        row = {f"bad{t:g}": round(100 * m[f"bad{t:g}"], 2) for t in metrics.BAD_THRESHOLDS}
        row.update(avgerr=round(m["avgerr"], 3), density=round(100 * m["density"], 2), d1=round(100 * m["d1"], 2),
                   conf_bad2_top50=round(100 * s["bad_top50"], 2), conf_auc=round(100 * s["auc"], 2),
                   conf_auc_optimal=round(100 * s["auc_optimal"], 2))
        rows.append(row)
        theirs.append(o["bad2"])
        emit(scene=scene, num_disparities=ndisp, preset=a.preset, device=a.device, **row,
             opencv_bad2=round(100 * o["bad2"], 2), opencv_density=round(100 * o["density"], 2))
    emit(summary=True, preset=a.preset, device=a.device,
         **{f"mean_{k}": round(float(np.mean([r[k] for r in rows])), 3 if k == "avgerr" else 2) for k in rows[0]},
         opencv_mean_bad2=round(100 * np.mean(theirs), 2))


if __name__ == "__main__":
    main()
