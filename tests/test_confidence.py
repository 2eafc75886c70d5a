"""The confidence map: what it is on small cases, that it ranks pixels well on real
scenes (through `stereo batch` and `stereo eval` as a user runs them), and
--min-confidence."""
import json
import shutil

import numpy as np
import pytest

from conftest import SAMPLE, SHARED_DATA
from stereocli import config, io, metrics, pipeline
from stereocli.backends.cpu import CpuBackend
from test_cli import LEFT, RIGHT, stereo

SCENES = [d for d in (SHARED_DATA / s for s in ("tsukuba", "venus", "teddy", "cones")) if d.exists()] or [SAMPLE]


def test_sparsification_by_hand():
    conf = np.array([0.9, 0.8, 0.7, 0.1])
    bad = np.array([False, False, True, True])
    s = metrics.sparsification(conf, bad)
    assert s["bad_all"] == 0.5 and s["bad_top50"] == 0.0
    assert s["auc_optimal"] == pytest.approx(s["auc"])  # this ranking puts the bad pixels last
    worst = metrics.sparsification(-conf, bad)
    assert worst["bad_top50"] == 1.0 and worst["auc"] > s["auc"]


def test_confident_pixels_are_far_more_often_right_on_real_scenes(tmp_path):
    """Bad-2 of the most confident half of the pixels is under half of bad-2 of all, and
    the sparsification curve lies below what a blind ranking gives (its area < bad-2)."""
    for d in ("L", "R", "G"):
        (tmp_path / d).mkdir()
    for scene in SCENES:
        shutil.copy(scene / "left.png", tmp_path / "L" / f"{scene.name}.png")
        shutil.copy(scene / "right.png", tmp_path / "R" / f"{scene.name}.png")
        shutil.copy(scene / "disp.pfm", tmp_path / "G" / f"{scene.name}.pfm")
    r = stereo("batch", tmp_path / "L", tmp_path / "R", "-o", tmp_path / "out", "--format", "pfm", "-n", 64,
               "--device", "cpu", "--confidence-dir", tmp_path / "conf", "--gt-dir", tmp_path / "G",
               "--error-map-dir", tmp_path / "err")
    assert r.returncode == 0, r.stderr
    assert sorted(p.name for p in (tmp_path / "err").iterdir()) == sorted(f"{s.name}.png" for s in SCENES)
    r = stereo("eval", tmp_path / "out", tmp_path / "G", "--confidence", tmp_path / "conf", "--json")
    assert r.returncode == 0, r.stderr
    rows = [json.loads(line) for line in r.stdout.splitlines()]
    for row in rows:
        s = row["sparsification"]
        assert s["bad_all"] == pytest.approx(row["bad2"], abs=1e-6)
        assert s["bad_top50"] < 0.5 * s["bad_all"], row["estimate"]
        assert s["auc_optimal"] < s["auc"] < 0.7 * s["bad_all"], row["estimate"]
    conf = io.read_disparity(tmp_path / "conf" / f"{SCENES[0].name}.pfm")
    assert conf.dtype == np.float32 and conf.min() >= 0 and conf.max() <= 1 and 0.3 < np.median(conf) < 0.95


def test_confidence_is_zero_where_the_map_was_rejected_or_filled():
    left, right = io.read_image(LEFT), io.read_image(RIGHT)
    unfilled = pipeline.run(left, right, config.load("default", None, {"num_disparities": 16, "fill": "none"}),
                            CpuBackend(), confidence=True)
    filled = pipeline.run(left, right, config.load("default", None, {"num_disparities": 16}), CpuBackend(),
                          confidence=True)
    rejected = np.isnan(unfilled.disparity)
    assert rejected.any() and (unfilled.confidence[rejected] == 0).all()
    np.testing.assert_array_equal(filled.confidence, unfilled.confidence)  # the fill adds no confidence
    assert (unfilled.confidence[~rejected] > 0).mean() > 0.99


def test_min_confidence_cuts_the_map_where_the_confidence_is_low(tmp_path):
    r = stereo("match", LEFT, RIGHT, "-o", tmp_path / "all.pfm", "--confidence", tmp_path / "c.pfm", "-n", 16,
               "--device", "cpu")
    assert r.returncode == 0, r.stderr
    r = stereo("match", LEFT, RIGHT, "-o", tmp_path / "cut.pfm", "--min-confidence", 0.6, "-n", 16, "--device", "cpu")
    assert r.returncode == 0, r.stderr
    full, cut, conf = (io.read_disparity(tmp_path / f) for f in ("all.pfm", "cut.pfm", "c.pfm"))
    low = conf < np.float32(0.6)
    assert 0.05 < low.mean() < 0.95
    assert np.isnan(cut[low]).all()
    np.testing.assert_array_equal(cut[~low], full[~low])
