"""Rectification: a shared pair turned into raw camera images with a known small
rotation and lens distortion, then rectified back and matched."""
import cv2
import numpy as np
import pytest

import stereocli
from conftest import SHARED_DATA
from stereocli import io, metrics
from stereocli import rectify as rx
from test_cli import stereo

SCENES = [("tsukuba", 16), ("venus", 32), ("teddy", 64), ("cones", 64)]


def calibration(w, h, k1=(-0.02, -0.015), rvec=(0.002, -0.002, 0.0015), t=(-0.16, 0.001, 0.001)):
    K = np.array([[450.0, 0, w / 2], [0, 450.0, h / 2], [0, 0, 1]])
    return rx.StereoCalibration(K, np.array([k1[0], 0, 0, 0, 0.0]), K.copy(), np.array([k1[1], 0, 0, 0, 0.0]),
                                cv2.Rodrigues(np.array(rvec))[0], np.array([t]).T)


def raw_views(left, right, calib):
    """What the two cameras of `calib` would have seen, if `left` and `right` are the
    views rectified by it: each raw pixel looks up its rectified position."""
    h, w = left.shape[:2]
    R1, R2, P1, P2, *_ = cv2.stereoRectify(calib.K1, calib.D1, calib.K2, calib.D2, (w, h), calib.R, calib.T,
                                           flags=cv2.CALIB_ZERO_DISPARITY, alpha=0)
    grid = np.stack(np.meshgrid(np.arange(w), np.arange(h)), -1).reshape(-1, 1, 2).astype(np.float32)
    out = []
    for img, K, D, Rr, P in ((left, calib.K1, calib.D1, R1, P1), (right, calib.K2, calib.D2, R2, P2)):
        q = cv2.undistortPoints(grid, K, D, R=Rr, P=P).reshape(h, w, 2)
        out.append(cv2.remap(img, q[..., 0], q[..., 1], cv2.INTER_LANCZOS4))
    return out


def write_opencv(path, calib):
    fs = cv2.FileStorage(str(path), cv2.FILE_STORAGE_WRITE)
    for name in ("K1", "D1", "K2", "D2", "R", "T"):
        fs.write(name, getattr(calib, name))
    fs.release()


def test_a_raw_pair_rectified_back_matches_nearly_as_well_as_the_original(tmp_path):
    if not SHARED_DATA.exists():
        pytest.skip("shared data not present")
    rows = []
    for scene, ndisp in SCENES:
        d = SHARED_DATA / scene
        left, right = io.read_image(d / "left.png"), io.read_image(d / "right.png")
        gt = io.read_disparity(d / "disp.pfm")
        calib = calibration(left.shape[1], left.shape[0])
        raw_l, raw_r = raw_views(left, right, calib)
        write_opencv(tmp_path / f"{scene}.yml", calib)
        rect_l, rect_r, cam = rx.rectify(raw_l, raw_r, rx.read_stereo_calibration(tmp_path / f"{scene}.yml"))
        bad2 = [metrics.evaluate(stereocli.match(a, b, num_disparities=ndisp)[0], gt)["bad2"]
                for a, b in ((left, right), (rect_l, rect_r), (raw_l, raw_r))]
        rows.append(bad2)
        assert bad2[1] < bad2[2], (scene, bad2)  # rectifying helps
        assert cam.baseline == pytest.approx(0.16, rel=1e-3) and cam.focal > 400
    original, rectified, _ = np.array(rows).T
    assert np.mean(rectified - original) <= 0.02, rows  # within 2 points of bad-2, over the four scenes


def test_match_rectify_from_the_command_line(tmp_path):
    if not SHARED_DATA.exists():
        pytest.skip("shared data not present")
    d = SHARED_DATA / "cones"
    left, right = io.read_image(d / "left.png"), io.read_image(d / "right.png")
    calib = calibration(left.shape[1], left.shape[0])
    raw_l, raw_r = raw_views(left, right, calib)
    cv2.imwrite(str(tmp_path / "l.png"), raw_l)
    cv2.imwrite(str(tmp_path / "r.png"), raw_r)
    write_opencv(tmp_path / "stereo.yml", calib)
    r = stereo("match", tmp_path / "l.png", tmp_path / "r.png", "--rectify", "--calib", tmp_path / "stereo.yml",
               "-o", tmp_path / "d.pfm", "-n", 64, "--depth", tmp_path / "z.pfm", "--device", "cpu")
    assert r.returncode == 0, r.stderr
    disp, depth = io.read_disparity(tmp_path / "d.pfm"), io.read_disparity(tmp_path / "z.pfm")
    gt = io.read_disparity(d / "disp.pfm")
    assert metrics.evaluate(disp, gt)["bad2"] < 0.12
    ok = np.isfinite(disp) & (disp > 0)
    cam = rx.rectify(raw_l, raw_r, calib)[2]
    np.testing.assert_allclose(depth[ok], cam.focal * cam.baseline / disp[ok], rtol=1e-4)
    r = stereo("rectify", tmp_path / "l.png", tmp_path / "r.png", "--calib", tmp_path / "stereo.yml",
               "-o", tmp_path / "rl.png", tmp_path / "rr.png")
    assert r.returncode == 0 and "focal" in r.stderr
    assert cv2.imread(str(tmp_path / "rl.png")).shape == left.shape


def test_kitti_calibration_gives_camera_3_relative_to_camera_2(tmp_path):
    K = "7.215377e+02 0 6.095593e+02 0 7.215377e+02 1.728540e+02 0 0 1"
    text = "\n".join([
        "calib_time: 09-Jan-2012 13:57:47", "corner_dist: 9.950000e-02",
        f"K_02: {K}", "D_02: -3.7e-01 2.0e-01 2.2e-03 1.3e-03 -7.2e-02",
        "R_02: 1 0 0 0 1 0 0 0 1", "T_02: 5.956621e-02 2.900141e-04 2.577209e-03",
        f"K_03: {K}", "D_03: -3.6e-01 1.9e-01 1.1e-03 -6.3e-04 -6.3e-02",
        "R_03: 1 0 0 0 1 0 0 0 1", "T_03: -4.731050e-01 5.551470e-03 -5.250882e-03"])
    (tmp_path / "calib_cam_to_cam.txt").write_text(text + "\n")
    c = rx.read_stereo_calibration(tmp_path / "calib_cam_to_cam.txt")
    np.testing.assert_allclose(c.T.ravel(), [-0.4731050 - 0.05956621, 0.00555147 - 0.00029001, -0.00525088 - 0.00257721],
                               atol=1e-7)
    assert c.K1[0, 0] == pytest.approx(721.5377) and c.D1.size == 5


def test_a_calibration_that_does_not_parse_is_one_line_and_exit_2(tmp_path):
    from conftest import SAMPLE
    (tmp_path / "bad.yml").write_text("%YAML:1.0\nK1: 3\n")
    (tmp_path / "junk.txt").write_text("hello\n")
    for calib in ("bad.yml", "junk.txt", "missing.yml"):
        r = stereo("rectify", SAMPLE / "left.png", SAMPLE / "right.png", "--calib", tmp_path / calib,
                   "-o", tmp_path / "a.png", tmp_path / "b.png")
        assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
        assert not (tmp_path / "a.png").exists()
