"""Helpers shared by the benchmark scripts."""
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DATA = Path(os.environ.get("STEREOCLI_DATA", ROOT.parent / "shared" / "data"))
SCENES = [("tsukuba", 16), ("venus", 32), ("teddy", 64), ("cones", 64)]
QUICK_SCENES = [("tsukuba", 16)]  # --quick: one small scene, for CI


def opencv_sgbm(ndisp, mode="hh"):
    """The OpenCV peer every benchmark runs: StereoSGBM with the settings of
    shared/data/README.md (block 5, P1 8*25, P2 32*25, uniqueness 10, speckle 100/2)."""
    import cv2
    modes = {"hh": cv2.STEREO_SGBM_MODE_HH, "sgbm": cv2.STEREO_SGBM_MODE_SGBM, "3way": cv2.STEREO_SGBM_MODE_SGBM_3WAY}
    return cv2.StereoSGBM_create(minDisparity=0, numDisparities=ndisp, blockSize=5, P1=8 * 25, P2=32 * 25,
                                 disp12MaxDiff=1, uniquenessRatio=10, speckleWindowSize=100, speckleRange=2,
                                 mode=modes[mode])


def opencv_disparity(sgbm, grey_left, grey_right):
    """float32 disparity with NaN where OpenCV found none."""
    import numpy as np
    d = sgbm.compute(grey_left, grey_right).astype(np.float32) / 16.0
    d[d < 0] = np.nan
    return d


def emit(**row):
    print(json.dumps(row), flush=True)


def best_ms(fn, repeat=5):
    fn()  # warm (compile / caches)
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t) * 1e3)
    return min(times)


if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
