"""The files one `stereo match` writes: checked before any work, written after it.

    plan = MatchOutputs.plan(output, fmt, params, preview=..., depth=..., ply=..., camera=...)
    ... match ...
    plan.write(disparity, left_image)

`plan` raises StereoError for anything that would fail later (an unknown extension, a
missing folder, a range a 16-bit PNG cannot hold, depth without a camera), so a bad
option never costs a match. Every file is written whole or not at all (io.write_file).
"""
from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from . import geometry, io
from .config import Params
from .errors import StereoError


@dataclass
class MatchOutputs:
    disparity: Path | None  # None: standard output
    ext: str  # the disparity map's format (".pfm", ".png", ...)
    params: Params
    preview: Path | None = None
    depth: Path | None = None
    ply: Path | None = None
    camera: geometry.Camera | None = None
    confidence: Path | None = None
    png: str = "small"  # how a PNG map is written (io.PNG_COMPRESSIONS)

    @classmethod
    def plan(cls, output: str, fmt: str | None, params: Params, *, png: str = "small", preview=None, depth=None,
             ply=None, camera=None, confidence=None, json_on_stdout: bool = False) -> "MatchOutputs":
        if output == "-":
            if fmt is None:
                raise StereoError("-o - writes to standard output: say the format with --format png|pfm|npy|tiff")
            if json_on_stdout:
                raise StereoError("--json and -o - would both write to standard output; use --timings (stderr)")
            path, ext = None, "." + fmt
        else:
            path, ext = io.check_output_path(output, fmt)
        if ext == ".png":
            io.check_png_range(params.min_disparity, params.max_disparity)
        if preview:
            preview = io.check_preview_path(preview)
        if (depth or ply) and camera is None:
            raise StereoError("--depth and --ply need --focal and --baseline, or --calib")
        if depth:
            depth = io.check_float_map_path(depth, "depth")
        if ply:
            ply = io.check_ply_path(ply)
        if confidence:
            confidence = io.check_float_map_path(confidence, "confidence")
        return cls(path, ext, params, preview, depth, ply, camera, confidence, png)

    def write(self, disparity: np.ndarray, left_image: np.ndarray, confidence: np.ndarray | None = None) -> None:
        """The map (to its file or standard output) and every extra file that was asked for
        (`confidence`: the map pipeline.run gave, when self.confidence names a file)."""
        if self.disparity is None:
            sys.stdout.buffer.write(io.encode_disparity(disparity, self.ext, self.png))
            sys.stdout.buffer.flush()
        else:
            io.write_disparity(self.disparity, disparity, self.ext, self.png)
        if self.preview:
            io.write_preview(self.preview, disparity, self.params.min_disparity, self.params.max_disparity)
        if self.depth:
            io.write_disparity(self.depth, geometry.depth(disparity, self.camera))
        if self.ply:
            io.write_file(self.ply, geometry.encode_ply(geometry.point_cloud(disparity, left_image, self.camera)))
        if self.confidence:
            io.write_disparity(self.confidence, confidence)
