"""`-n auto`: the disparity range of a rectified pair from sparse feature matches.

ORB features of both images are matched (Hamming distance, Lowe's ratio test, both
ways), and only matches on the same row (|dy| <= MAX_ROW_OFFSET px) are kept, as a
rectified pair has them. Their disparities x_left - x_right, trimmed of the outer
TRIM percent on each side, give the range, widened by a margin (MARGIN of its span,
at least MIN_MARGIN px) and rounded out to a multiple of 4 disparities.
"""
from __future__ import annotations

import math

import cv2
import numpy as np

from .errors import StereoError
from .io import to_grey

FEATURES = 8000
LEVELS = 3  # pyramid levels: coarser ones place keypoints too roughly for a disparity
MIN_MATCHES = 12
MAX_ROW_OFFSET = 1.5
RATIO = 0.8
TRIM = 1.0  # percent of the matches dropped at each end (mismatches, imprecise corners)
MARGIN = 0.1
MIN_MARGIN = 1.0


def _grey8(img: np.ndarray) -> np.ndarray:
    g = to_grey(img)
    return np.clip(np.round(g), 0, 255).astype(np.uint8)


def match_disparities(left: np.ndarray, right: np.ndarray) -> np.ndarray:
    """Disparities (x_left - x_right) of the reliable feature matches between the images."""
    gl, gr = _grey8(left), _grey8(right)
    detector = cv2.ORB_create(nfeatures=FEATURES, fastThreshold=5, nlevels=LEVELS)
    kl, dl = detector.detectAndCompute(gl, None)
    kr, dr = detector.detectAndCompute(gr, None)
    if dl is None or dr is None or len(kl) < 2 or len(kr) < 2:
        return np.empty(0, np.float32)
    matcher = cv2.BFMatcher(cv2.NORM_HAMMING)

    def good(a, b):
        out = {}
        for m in matcher.knnMatch(a, b, k=2):
            if len(m) == 2 and m[0].distance < RATIO * m[1].distance:
                out[m[0].queryIdx] = m[0].trainIdx
        return out

    lr, rl = good(dl, dr), good(dr, dl)
    disp = []
    for i, j in lr.items():
        if rl.get(j) != i:
            continue  # not each other's best: dropped
        (xl, yl), (xr, yr) = kl[i].pt, kr[j].pt
        if abs(yl - yr) <= MAX_ROW_OFFSET:
            disp.append(xl - xr)
    return np.array(disp, np.float32)


def estimate(left: np.ndarray, right: np.ndarray) -> tuple[int, int, str]:
    """(min_disparity, num_disparities, why) for a rectified pair; StereoError when the
    images have too few matching features to say."""
    d = match_disparities(left, right)
    if d.size < MIN_MATCHES:
        raise StereoError(f"-n auto found only {d.size} matching features between the images (needs "
                          f"{MIN_MATCHES}); give the range with -n and --min-disparity")
    lo, hi = np.percentile(d, [TRIM, 100 - TRIM])
    margin = max(MIN_MARGIN, MARGIN * (hi - lo))
    lo_i = int(math.floor(lo - margin))
    num = int(math.ceil(hi + margin)) - lo_i + 1
    extra = -num % 4  # round out to a multiple of 4, half below, half above
    lo_i -= extra // 2
    num = max(1, min(num + extra, left.shape[1] - 1))
    why = (f"{d.size} feature matches with disparities {lo:.1f}..{hi:.1f} (outer {TRIM:g} % dropped), "
           f"plus a margin of {margin:.1f} px")
    return lo_i, num, why
