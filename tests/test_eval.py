"""Metrics against hand-computed values, and `stereo eval` from the command line."""
import json

import cv2
import numpy as np
import pytest

from stereocli import io, metrics
from test_cli import LEFT, RIGHT, stereo

NAN = np.nan


def test_metrics_by_hand():
    gt = np.array([[10.0, 20.0, NAN], [4.0, 8.0, 100.0]], np.float32)
    est = np.array([[10.4, 23.0, 5.0], [NAN, 8.0, 94.0]], np.float32)
    m = metrics.evaluate(est, gt)
    # 5 pixels with ground truth; one has no estimate; errors 0.4, 3, 0, 6
    assert m["pixels"] == 5
    assert m["density"] == pytest.approx(4 / 5)
    assert m["bad0.5"] == pytest.approx(3 / 5)   # 3, 6 and the missing one
    assert m["bad2"] == pytest.approx(3 / 5)
    assert m["bad4"] == pytest.approx(2 / 5)     # 6 and missing
    assert m["bad2_est"] == pytest.approx(2 / 4)
    assert m["avgerr"] == pytest.approx((0.4 + 3 + 0 + 6) / 4, abs=1e-5)
    assert m["rms"] == pytest.approx(np.sqrt((0.16 + 9 + 0 + 36) / 4), abs=1e-5)
    # D1: error > 3 and > 5 %: only 6 px at gt 100 (6 %) -> 1, plus the missing pixel
    assert m["d1"] == pytest.approx(2 / 5)
    assert metrics.evaluate(est, gt, max_disparity=50)["pixels"] == 4


def test_eval_cli_on_files_and_folders(tmp_path):
    (tmp_path / "est").mkdir()
    (tmp_path / "gt").mkdir()
    r = stereo("match", LEFT, RIGHT, "-o", tmp_path / "est" / "tsukuba.png", "-n", 16, "--device", "cpu")
    assert r.returncode == 0, r.stderr
    gt = io.read_disparity(LEFT.replace("left.png", "disp.pfm"))
    io.write_disparity(tmp_path / "gt" / "tsukuba.pfm", gt)
    r = stereo("eval", tmp_path / "est" / "tsukuba.png", tmp_path / "gt" / "tsukuba.pfm", "--json")
    assert r.returncode == 0, r.stderr
    m = json.loads(r.stdout)
    want = metrics.evaluate(io.read_disparity(tmp_path / "est" / "tsukuba.png"), gt)
    assert m["bad2"] == pytest.approx(want["bad2"], abs=1e-6) and m["bad2"] < 0.06
    r = stereo("eval", tmp_path / "est", tmp_path / "gt")
    assert r.returncode == 0 and "bad2" in r.stdout
    r = stereo("eval", tmp_path / "est", tmp_path / "nope")
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1


def test_folder_total_is_over_all_pixels_of_all_maps():
    rng = np.random.default_rng(5)
    maps = []
    for shape in ((6, 7), (4, 9)):
        gt = rng.uniform(0, 40, shape).astype(np.float32)
        gt[rng.random(shape) < 0.2] = NAN
        est = (gt + rng.normal(0, 2.5, shape)).astype(np.float32)
        est[rng.random(shape) < 0.1] = NAN
        maps.append((est, gt))
    total = None
    for est, gt in maps:
        total = metrics.add(total, metrics.counts(est, gt))
    flat = metrics.evaluate(np.concatenate([e.ravel() for e, _ in maps]), np.concatenate([g.ravel() for _, g in maps]))
    got = metrics.summarize(total)
    assert got.keys() == flat.keys()
    for k in flat:
        assert got[k] == pytest.approx(flat[k], rel=1e-9), k
    # and not the mean of the two maps' fractions (the maps have different numbers of pixels)
    per_map = [metrics.evaluate(e, g)["bad2"] for e, g in maps]
    assert got["bad2"] != pytest.approx(sum(per_map) / 2, rel=1e-6)


def test_error_map_colours_by_kitti_bins(tmp_path):
    gt = np.full((4, 5), 40.0, np.float32)
    gt[0, 0] = np.nan  # no ground truth: black
    est = gt.copy()
    est[1, 1] = np.nan  # missing estimate: magenta
    est[2, 2] = 40.0 + 100.0  # far off: the last (red) bin
    est[3, 3] = 40.0 + 2.0  # 2 px on 40: 2/3 of the 3 px threshold, below D1
    io.write_disparity(tmp_path / "gt.pfm", gt)
    io.write_disparity(tmp_path / "est.pfm", est)
    r = stereo("eval", tmp_path / "est.pfm", tmp_path / "gt.pfm", "--error-map", tmp_path / "err.png")
    assert r.returncode == 0, r.stderr
    img = cv2.imread(str(tmp_path / "err.png"))
    assert img.shape == (4, 5, 3)
    assert tuple(img[0, 0]) == (0, 0, 0)
    assert tuple(img[1, 1]) == metrics.MISSING_BGR
    assert tuple(img[2, 2]) == tuple(metrics.ERROR_COLOURS_BGR[-1])
    assert tuple(img[4 - 1, 0]) == tuple(metrics.ERROR_COLOURS_BGR[0])  # exact
    within = [tuple(c) for c in metrics.ERROR_COLOURS_BGR[:5]]
    assert tuple(img[3, 3]) in within and tuple(img[3, 3]) != tuple(metrics.ERROR_COLOURS_BGR[0])
