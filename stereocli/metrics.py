"""Middlebury/KITTI error metrics of a disparity estimate against ground truth.

Both maps are float32 with NaN (or inf) where invalid. Statistics run over the
pixels with valid ground truth (optionally also inside `mask`). "bad-t" counts
pixels whose estimate is off by more than t px *or missing*; "bad-t (est)" the
same over the pixels that have an estimate.
"""
from __future__ import annotations

import numpy as np

BAD_THRESHOLDS = (0.5, 1.0, 2.0, 4.0)


def evaluate(est: np.ndarray, gt: np.ndarray, mask: np.ndarray | None = None,
             max_disparity: float | None = None) -> dict:
    est = np.asarray(est, np.float64)
    gt = np.asarray(gt, np.float64)
    if est.shape != gt.shape:
        from .errors import StereoError
        raise StereoError(f"estimate is {est.shape[1]}x{est.shape[0]} but ground truth is "
                          f"{gt.shape[1]}x{gt.shape[0]}")
    known = np.isfinite(gt)
    if max_disparity is not None:
        known &= gt <= max_disparity
    if mask is not None:
        known &= mask.astype(bool)
    n = int(known.sum())
    have = known & np.isfinite(est)
    err = np.abs(est - gt)[have]
    gt_have = gt[have]
    out = {"pixels": n, "density": (have.sum() / n) if n else 0.0}
    for t in BAD_THRESHOLDS:
        bad = int((err > t).sum())
        out[f"bad{t:g}"] = ((bad + (n - have.sum())) / n) if n else 0.0
        out[f"bad{t:g}_est"] = (bad / err.size) if err.size else 0.0
    out["avgerr"] = float(err.mean()) if err.size else float("nan")
    out["rms"] = float(np.sqrt((err ** 2).mean())) if err.size else float("nan")
    d1 = (err > 3.0) & (err > 0.05 * np.abs(gt_have))
    out["d1"] = ((int(d1.sum()) + (n - have.sum())) / n) if n else 0.0
    out["d1_est"] = (d1.sum() / err.size) if err.size else 0.0
    return {k: (float(v) if not isinstance(v, int) else v) for k, v in out.items()}
