"""Stereo calibration files and rectification (beside geometry.py).

    calib = read_stereo_calibration("stereo.yml")        # OpenCV, KITTI or Middlebury
    left_r, right_r, camera = rectify(left, right, calib)

Reads
  * OpenCV YAML/XML as cv2.FileStorage writes it after stereoCalibrate: K1 (or M1),
    D1, K2 (or M2), D2, R, T;
  * KITTI calib_cam_to_cam.txt: K_02, D_02, R_02, T_02 and K_03, D_03, R_03, T_03
    (the colour cameras; cam 2 is the left);
  * Middlebury calib.txt: cam0, cam1 and baseline (images that are already rectified).
Rectification is OpenCV's (stereoRectify with a common principal point, so disparity
d maps to depth f * B / d, then undistort-rectify maps and bilinear remapping); the
rectified camera (focal, baseline in the calibration's unit, principal point) comes
back for depth and point clouds.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import cv2
import numpy as np

from .errors import StereoError
from .geometry import Camera


@dataclass
class StereoCalibration:
    K1: np.ndarray
    D1: np.ndarray
    K2: np.ndarray
    D2: np.ndarray
    R: np.ndarray  # rotation of the right camera relative to the left
    T: np.ndarray  # translation of the right camera (in the calibration's unit)
    source: str = ""


def read_stereo_calibration(path) -> StereoCalibration:
    p = Path(path)
    if not p.is_file():
        raise StereoError(f"--calib {p}: no such file")
    if p.suffix.lower() in (".yml", ".yaml", ".xml", ".json"):
        return _read_opencv(p)
    try:
        text = p.read_text()
    except (OSError, UnicodeDecodeError) as e:
        raise StereoError(f"cannot read --calib {p}: {e}") from None
    if re.search(r"^\s*K_02\s*:", text, re.M):
        return _read_kitti(p, text)
    if re.search(r"^\s*cam0\s*=", text, re.M):
        return _read_middlebury(p, text)
    raise StereoError(f"--calib {p}: not a calibration this reads: OpenCV YAML/XML (K1, D1, K2, D2, R, T), "
                      f"KITTI calib_cam_to_cam.txt or Middlebury calib.txt")


def _matrix(values, shape, what, p):
    a = np.asarray(values, np.float64)
    if a.size != int(np.prod(shape)):
        raise StereoError(f"--calib {p}: {what} has {a.size} numbers, expected {int(np.prod(shape))}")
    return a.reshape(shape)


def _read_opencv(p: Path) -> StereoCalibration:
    try:
        fs = cv2.FileStorage(str(p), cv2.FILE_STORAGE_READ)
    except cv2.error:
        fs = None
    if fs is None or not fs.isOpened():
        raise StereoError(f"--calib {p}: OpenCV cannot read it as YAML/XML")
    try:
        def node(*names):
            for n in names:
                try:
                    m = fs.getNode(n).mat()
                except cv2.error:
                    m = None
                if m is not None:
                    return m
            raise StereoError(f"--calib {p}: no {' or '.join(names)} in it; expected K1, D1, K2, D2, R, T as "
                              f"written by cv2.FileStorage after stereoCalibrate")
        return StereoCalibration(_matrix(node("K1", "M1"), (3, 3), "K1", p), node("D1").astype(np.float64).ravel(),
                                 _matrix(node("K2", "M2"), (3, 3), "K2", p), node("D2").astype(np.float64).ravel(),
                                 _matrix(node("R"), (3, 3), "R", p), _matrix(node("T"), (3, 1), "T", p), str(p))
    finally:
        fs.release()


def _numbers(text: str, key: str, p: Path):
    m = re.search(rf"^\s*{re.escape(key)}\s*[:=]\s*(.*)$", text, re.M)
    if m is None:
        raise StereoError(f"--calib {p}: no '{key}' line in it")
    try:
        return [float(v) for v in re.findall(r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?", m.group(1))]
    except ValueError:
        raise StereoError(f"--calib {p}: cannot read the numbers of '{key}'") from None


def _read_kitti(p: Path, text: str) -> StereoCalibration:
    K2, K3 = (_matrix(_numbers(text, f"K_0{c}", p), (3, 3), f"K_0{c}", p) for c in (2, 3))
    D2, D3 = (np.asarray(_numbers(text, f"D_0{c}", p), np.float64) for c in (2, 3))
    R2, R3 = (_matrix(_numbers(text, f"R_0{c}", p), (3, 3), f"R_0{c}", p) for c in (2, 3))
    T2, T3 = (_matrix(_numbers(text, f"T_0{c}", p), (3, 1), f"T_0{c}", p) for c in (2, 3))
    R = R3 @ R2.T  # camera 3 relative to camera 2
    return StereoCalibration(K2, D2, K3, D3, R, T3 - R @ T2, str(p))


def _read_middlebury(p: Path, text: str) -> StereoCalibration:
    K0, K1 = (_matrix(_numbers(text, k, p), (3, 3), k, p) for k in ("cam0", "cam1"))
    baseline = _numbers(text, "baseline", p)
    if len(baseline) != 1 or baseline[0] <= 0:
        raise StereoError(f"--calib {p}: 'baseline' must be one positive number")
    T = np.array([[-baseline[0]], [0.0], [0.0]])
    return StereoCalibration(K0, np.zeros(5), K1, np.zeros(5), np.eye(3), T, str(p))


def rectify(left: np.ndarray, right: np.ndarray, calib: StereoCalibration):
    """(left, right, Camera) rectified: rows correspond, a common principal point."""
    if left.shape[:2] != right.shape[:2]:
        raise StereoError(f"the images differ in size: left is {left.shape[1]}x{left.shape[0]}, right is "
                          f"{right.shape[1]}x{right.shape[0]}")
    h, w = left.shape[:2]
    R1, R2, P1, P2, _, _, _ = cv2.stereoRectify(calib.K1, calib.D1, calib.K2, calib.D2, (w, h), calib.R, calib.T,
                                                flags=cv2.CALIB_ZERO_DISPARITY, alpha=0)
    out = []
    for img, K, D, Rr, P in ((left, calib.K1, calib.D1, R1, P1), (right, calib.K2, calib.D2, R2, P2)):
        mx, my = cv2.initUndistortRectifyMap(K, D, Rr, P, (w, h), cv2.CV_32FC1)
        out.append(cv2.remap(img, mx, my, cv2.INTER_CUBIC, borderMode=cv2.BORDER_CONSTANT))
    focal = float(P1[0, 0])
    baseline = abs(float(P2[0, 3]) / float(P2[0, 0])) if P2[0, 0] else float(np.linalg.norm(calib.T))
    return out[0], out[1], Camera(focal, baseline, 0.0, float(P1[0, 2]), float(P1[1, 2]))
