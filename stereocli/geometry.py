"""Disparity -> metric depth and coloured point clouds.

    depth = f * B / (d + doffs)

f: focal length in pixels, B: baseline (depth comes out in the baseline's unit),
doffs: the difference of the principal points' x, cx_right - cx_left (0 for
images rectified to a common principal point). The camera frame is OpenCV's:
x right, y down, z forward, origin at the left camera.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .errors import StereoError


@dataclass
class Camera:
    focal: float
    baseline: float
    doffs: float = 0.0
    cx: float | None = None  # None: image centre
    cy: float | None = None


def read_calib(path) -> dict:
    """Middlebury calib.txt (cam0=[f 0 cx; 0 f cy; 0 0 1], cam1=..., doffs=, baseline=) ->
    {focal, cx, cy, doffs, baseline} for the keys present."""
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as e:
        raise StereoError(f"cannot read --calib {p}: {e.strerror}") from None
    values = {}
    for line in text.splitlines():
        if "=" in line:
            k, v = line.split("=", 1)
            values[k.strip().lower()] = v.strip()
    out = {}
    try:
        if "cam0" in values:
            m = [float(x) for x in re.findall(r"[-+0-9.eE]+", values["cam0"])]
            if len(m) != 9:
                raise ValueError("cam0 must be a 3x3 matrix")
            out.update(focal=m[0], cx=m[2], cy=m[5])
            if "cam1" in values and "doffs" not in values:
                m1 = [float(x) for x in re.findall(r"[-+0-9.eE]+", values["cam1"])]
                out["doffs"] = m1[2] - m[2]
        if "doffs" in values:
            out["doffs"] = float(values["doffs"])
        if "baseline" in values:
            out["baseline"] = float(values["baseline"])
    except (ValueError, IndexError) as e:
        raise StereoError(f"--calib {p}: cannot parse it ({e}); expected Middlebury calib.txt lines "
                          f"'cam0=[f 0 cx; 0 f cy; 0 0 1]', 'doffs=...', 'baseline=...'") from None
    if "focal" not in out and "baseline" not in out:
        raise StereoError(f"--calib {p} has neither cam0= nor baseline=; expected Middlebury calib.txt")
    return out


def camera(focal=None, baseline=None, doffs=None, calib=None) -> Camera | None:
    """Camera from options (which override --calib); None when nothing was given."""
    vals = read_calib(calib) if calib else {}
    for k, v in (("focal", focal), ("baseline", baseline), ("doffs", doffs)):
        if v is not None:
            vals[k] = v
    if not vals:
        return None
    missing = [f"--{k}" for k in ("focal", "baseline") if k not in vals]
    if missing:
        raise StereoError(f"depth needs {' and '.join(missing)} (or --calib with cam0= and baseline=)")
    if vals["focal"] <= 0 or vals["baseline"] <= 0:
        raise StereoError("--focal and --baseline must be positive")
    return Camera(vals["focal"], vals["baseline"], vals.get("doffs", 0.0), vals.get("cx"), vals.get("cy"))


def depth(disp: np.ndarray, cam: Camera) -> np.ndarray:
    """float32 depth in the baseline's unit; NaN where the disparity is invalid or d + doffs <= 0."""
    d = disp.astype(np.float64) + cam.doffs
    with np.errstate(divide="ignore", invalid="ignore"):
        z = np.where(np.isfinite(d) & (d > 0), cam.focal * cam.baseline / d, np.nan)
    return z.astype(np.float32)


def point_cloud(disp: np.ndarray, colour: np.ndarray, cam: Camera) -> np.ndarray:
    """Structured array (x, y, z float32; red, green, blue uint8) of the valid pixels."""
    h, w = disp.shape
    z = depth(disp, cam)
    cx = cam.cx if cam.cx is not None else (w - 1) / 2.0
    cy = cam.cy if cam.cy is not None else (h - 1) / 2.0
    ys, xs = np.nonzero(np.isfinite(z))
    zz = z[ys, xs].astype(np.float64)
    rgb = _rgb8(colour)[ys, xs]
    pts = np.empty(len(zz), dtype=[("x", "<f4"), ("y", "<f4"), ("z", "<f4"),
                                   ("red", "u1"), ("green", "u1"), ("blue", "u1")])
    pts["x"] = (xs - cx) * zz / cam.focal
    pts["y"] = (ys - cy) * zz / cam.focal
    pts["z"] = zz
    pts["red"], pts["green"], pts["blue"] = rgb[:, 0], rgb[:, 1], rgb[:, 2]
    return pts


def encode_ply(points: np.ndarray) -> bytes:
    """Binary little-endian PLY of `point_cloud` output (MeshLab, Open3D, CloudCompare read it)."""
    header = ("ply\nformat binary_little_endian 1.0\ncomment written by stereocli\n"
              f"element vertex {len(points)}\n"
              "property float x\nproperty float y\nproperty float z\n"
              "property uchar red\nproperty uchar green\nproperty uchar blue\nend_header\n")
    return header.encode("ascii") + points.tobytes()


def read_ply(data: bytes) -> np.ndarray:
    """Read back what encode_ply writes (for tests and scripts)."""
    end = data.index(b"end_header\n") + len(b"end_header\n")
    n = int(re.search(rb"element vertex (\d+)", data[:end]).group(1))
    dt = np.dtype([("x", "<f4"), ("y", "<f4"), ("z", "<f4"), ("red", "u1"), ("green", "u1"), ("blue", "u1")])
    return np.frombuffer(data, dtype=dt, count=n, offset=end)


def _rgb8(img: np.ndarray) -> np.ndarray:
    a = img
    if a.dtype == np.uint16:
        a = (a >> 8).astype(np.uint8)
    elif a.dtype != np.uint8:
        a = np.clip(a, 0, 255).astype(np.uint8)
    if a.ndim == 2:
        return np.repeat(a[:, :, None], 3, axis=2)
    if a.shape[2] == 1:
        return np.repeat(a, 3, axis=2)
    return a[:, :, 2::-1]  # BGR(A) -> RGB
