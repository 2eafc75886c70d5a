"""`-n auto`: the disparity range from feature matches."""
import numpy as np
import pytest

from conftest import SAMPLE, SHARED_DATA
from stereocli import StereoError, autorange, io
from test_cli import LEFT, RIGHT, stereo

SCENES = ["tsukuba", "venus", "teddy", "cones"]


@pytest.mark.parametrize("scene", SCENES)
def test_auto_range_holds_the_ground_truth_and_is_not_much_wider(scene):
    d = SHARED_DATA / scene if (SHARED_DATA / scene).exists() else None
    if d is None:
        pytest.skip("shared data not present")
    lo, num, why = autorange.estimate(io.read_image(d / "left.png"), io.read_image(d / "right.png"))
    gt = io.read_disparity(d / "disp.pfm")
    v = gt[np.isfinite(gt) & (gt > 0)]
    assert ((v >= lo) & (v <= lo + num - 1)).mean() >= 0.99, (lo, num, why)
    assert num <= 1.5 * (v.max() - v.min()), (lo, num)
    assert num % 4 == 0


def test_match_n_auto_says_which_range_and_why(tmp_path):
    r = stereo("match", LEFT, RIGHT, "-o", tmp_path / "d.pfm", "-n", "auto", "--min-disparity", "auto",
               "--device", "cpu")
    assert r.returncode == 0, r.stderr
    line = r.stderr.strip().splitlines()[-1]
    assert line.startswith("stereo: auto range ") and "feature matches" in line
    disp = io.read_disparity(tmp_path / "d.pfm")
    gt = io.read_disparity(SAMPLE / "disp.pfm")
    ok = np.isfinite(gt) & np.isfinite(disp)
    assert np.mean(np.abs(disp[ok] - gt[ok]) <= 2) > 0.9


def test_too_few_features_is_a_one_line_error(tmp_path):
    import cv2
    flat = tmp_path / "flat.png"
    cv2.imwrite(str(flat), np.full((40, 60), 128, np.uint8))
    r = stereo("match", flat, flat, "-o", tmp_path / "d.pfm", "-n", "auto")
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and "-n auto" in r.stderr
    assert not (tmp_path / "d.pfm").exists()
    with pytest.raises(StereoError):
        autorange.estimate(np.zeros((40, 60), np.uint8), np.zeros((40, 60), np.uint8))
