"""Middlebury/KITTI error metrics of a disparity estimate against ground truth.

Both maps are float32 with NaN (or inf) where invalid. Statistics run over the
pixels with valid ground truth (optionally also inside `mask`). "bad-t" counts
pixels whose estimate is off by more than t px *or missing*; "bad-t (est)" the
same over the pixels that have an estimate.

`counts` gives the raw sums of one map; sums of several maps add up key by key,
and `summarize` turns them into the metrics, so a folder total is over all pixels.
"""
from __future__ import annotations

import numpy as np

BAD_THRESHOLDS = (0.5, 1.0, 2.0, 4.0)


def counts(est: np.ndarray, gt: np.ndarray, mask: np.ndarray | None = None,
           max_disparity: float | None = None) -> dict:
    """Integer and float sums behind the metrics of one map (add them to combine maps)."""
    est, gt = _same_size(est, gt)
    known = _known(gt, mask, max_disparity)
    have = known & np.isfinite(est)
    err = np.abs(est - gt)[have]
    out = {"pixels": int(known.sum()), "estimated": int(have.sum()),
           "err_sum": float(err.sum()), "sq_sum": float((err ** 2).sum()),
           "d1": int(((err > 3.0) & (err > 0.05 * np.abs(gt[have]))).sum())}
    for t in BAD_THRESHOLDS:
        out[f"bad{t:g}"] = int((err > t).sum())
    return out


def _same_size(est, gt):
    """Both maps as float64, or a StereoError when their sizes differ."""
    est = np.asarray(est, np.float64)
    gt = np.asarray(gt, np.float64)
    if est.shape != gt.shape:
        from .errors import StereoError
        raise StereoError(f"estimate is {est.shape[1]}x{est.shape[0]} but ground truth is "
                          f"{gt.shape[1]}x{gt.shape[0]}")
    return est, gt


def _known(gt, mask, max_disparity):
    """The pixels the metrics count: ground truth known, inside `mask`, not above max_disparity."""
    known = np.isfinite(gt)
    if max_disparity is not None:
        known &= gt <= max_disparity
    if mask is not None:
        known &= mask.astype(bool)
    return known


def add(a: dict | None, b: dict) -> dict:
    return dict(b) if a is None else {k: a[k] + b[k] for k in a}


def summarize(c: dict) -> dict:
    n, e = c["pixels"], c["estimated"]
    missing = n - e
    out = {"pixels": n, "density": e / n if n else 0.0}
    for t in BAD_THRESHOLDS:
        k = f"bad{t:g}"
        out[k] = (c[k] + missing) / n if n else 0.0
        out[f"{k}_est"] = c[k] / e if e else 0.0
    out["avgerr"] = c["err_sum"] / e if e else float("nan")
    out["rms"] = float(np.sqrt(c["sq_sum"] / e)) if e else float("nan")
    out["d1"] = (c["d1"] + missing) / n if n else 0.0
    out["d1_est"] = c["d1"] / e if e else 0.0
    return {k: (float(v) if not isinstance(v, int) else v) for k, v in out.items()}


def rounded(m: dict) -> dict:
    """Metrics for JSON output: floats to 6 decimals."""
    return {k: round(v, 6) if isinstance(v, float) else v for k, v in m.items()}


def evaluate(est: np.ndarray, gt: np.ndarray, mask: np.ndarray | None = None,
             max_disparity: float | None = None) -> dict:
    return summarize(counts(est, gt, mask, max_disparity))


SPARSIFICATION_STEPS = 20  # the curve is sampled at 5 %, 10 %, ..., 100 % of the pixels
CONFIDENCE_THRESHOLD = 2.0  # px: the sparsification curve is of bad-2


def confidence_ranking(conf: np.ndarray, est: np.ndarray, gt: np.ndarray, mask: np.ndarray | None = None,
                       max_disparity: float | None = None, t: float = CONFIDENCE_THRESHOLD):
    """(confidence, bad) of the ground-truth pixels of one map (as `counts` selects them):
    bad = off by more than t px or missing. Concatenate several maps' to rank them together."""
    est, gt = _same_size(est, gt)
    conf = np.asarray(conf, np.float64)
    if conf.shape != gt.shape:
        from .errors import StereoError
        raise StereoError(f"the confidence map is {conf.shape[1]}x{conf.shape[0]} but ground truth is "
                          f"{gt.shape[1]}x{gt.shape[0]}")
    known = _known(gt, mask, max_disparity)
    bad = ~(np.abs(est[known] - gt[known]) <= t)  # NaN (missing) counts as bad
    return np.nan_to_num(conf[known], nan=0.0), bad


def sparsification(conf: np.ndarray, bad: np.ndarray) -> dict:
    """How well a confidence ranks the pixels: keep the most confident fraction f of the
    ground-truth pixels (f = 5 %, 10 %, ..., 100 %) and measure bad-t among them.
    bad_top50: bad-t of the most confident half; bad_all: of all; auc: the mean of the
    curve (lower is better); auc_optimal: the same for a ranking that puts every bad
    pixel last (the best any confidence could do); auc_random: bad_all (a ranking that
    knows nothing)."""
    n = len(bad)
    if n == 0:
        return {"pixels": 0, "bad_top50": 0.0, "bad_all": 0.0, "auc": 0.0, "auc_optimal": 0.0}
    order = np.argsort(-conf, kind="stable")
    bad_sorted = np.cumsum(bad[order])
    k = np.maximum(1, (np.arange(1, SPARSIFICATION_STEPS + 1) * n) // SPARSIFICATION_STEPS)
    curve = bad_sorted[k - 1] / k
    nbad = int(bad.sum())
    optimal = np.maximum(0, k - (n - nbad)) / k
    half = max(1, n // 2)
    return {"pixels": n, "bad_top50": float(bad_sorted[half - 1] / half), "bad_all": nbad / n,
            "auc": float(curve.mean()), "auc_optimal": float(optimal.mean())}


# KITTI's error colours (devkit's disp_error_image): bins of the error relative to the
# D1 thresholds (3 px and 5 %), log-spaced, blue (far below) to red (far above); BGR.
ERROR_BINS = (0.0625, 0.125, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 16.0)
ERROR_COLOURS_BGR = np.array([(149, 54, 49), (180, 117, 69), (209, 173, 116), (233, 217, 171), (248, 243, 224),
                              (144, 224, 254), (97, 174, 253), (67, 109, 244), (39, 48, 215), (38, 0, 165)],
                             np.uint8)
MISSING_BGR = (255, 0, 255)  # ground truth known, no estimate: counted as bad, shown in magenta


def error_image(est: np.ndarray, gt: np.ndarray) -> np.ndarray:
    """KITTI-style error picture (HxWx3 uint8 BGR): where the ground truth is known, the
    colour of min(|err| / 3, |err| / |gt| / 0.05) (below 1: within D1, blue; above:
    orange to red), magenta where the estimate is missing; black where no ground truth."""
    est, gt = _same_size(est, gt)
    known = np.isfinite(gt)
    have = known & np.isfinite(est)
    err = np.abs(np.where(have, est, 0.0) - np.where(known, gt, 0.0))
    with np.errstate(divide="ignore", invalid="ignore"):
        rel = np.minimum(err / 3.0, np.where(gt != 0, err / np.abs(np.where(known, gt, 1.0)) / 0.05, np.inf))
    out = np.zeros(est.shape + (3,), np.uint8)
    out[have] = ERROR_COLOURS_BGR[np.searchsorted(ERROR_BINS, rel[have], side="right")]
    out[known & ~have] = MISSING_BGR
    return out
