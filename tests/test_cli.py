"""`stereo` run as a user runs it: a subprocess on real files in a temporary folder."""
import json
import os
import subprocess
import sys
from pathlib import Path

import cv2
import numpy as np
import pytest

from conftest import SAMPLE
from stereocli import io

LEFT, RIGHT = str(SAMPLE / "left.png"), str(SAMPLE / "right.png")


def stereo(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "stereocli.cli", *map(str, args)], capture_output=True,
                          text=True, cwd=cwd, env={**os.environ, "PYTHONUNBUFFERED": "1"})


@pytest.fixture(scope="module")
def reference_map():
    import stereocli
    disp, _ = stereocli.match(LEFT, RIGHT, num_disparities=16)
    return disp


@pytest.mark.parametrize("ext", [".pfm", ".png", ".npy", ".tif", ".tiff"])
def test_every_output_format_reads_back(tmp_path, reference_map, ext):
    out = tmp_path / f"d{ext}"
    r = stereo("match", LEFT, RIGHT, "-o", out, "-n", 16, "--device", "cpu")
    assert r.returncode == 0, r.stderr
    back = io.read_disparity(out)
    assert back.shape == reference_map.shape
    tol = 1 / 256 + 1e-6 if ext == ".png" else 0  # d*256 rounded; d = 0 is stored as 1 (0 means invalid)
    same = np.isclose(back, reference_map, atol=tol, rtol=0) | (np.isnan(back) & np.isnan(reference_map))
    assert same.all()
    assert [p.name for p in tmp_path.iterdir()] == [out.name]  # no temporary file left


def test_pfm_and_png_invalid_conventions(tmp_path):
    args = ("match", LEFT, RIGHT, "-n", 16, "--fill", "none", "--device", "cpu")
    assert stereo(*args, "-o", tmp_path / "d.pfm").returncode == 0
    assert stereo(*args, "-o", tmp_path / "d.png").returncode == 0
    raw_pfm = cv2.imread(str(tmp_path / "d.pfm"), cv2.IMREAD_UNCHANGED)  # OpenCV's own PFM reader
    raw_png = cv2.imread(str(tmp_path / "d.png"), cv2.IMREAD_UNCHANGED)
    assert raw_png.dtype == np.uint16
    invalid = np.isinf(raw_pfm)
    assert invalid.any() and not np.isnan(raw_pfm).any()
    np.testing.assert_array_equal(raw_png == 0, invalid)
    np.testing.assert_allclose(raw_png[~invalid] / 256.0, raw_pfm[~invalid], atol=1 / 256 + 1e-6)


def test_png_compression_fast_stores_the_same_values_uncompressed(tmp_path):
    """`stereo match` deflates a PNG map by default; --png-compression fast stores it (as
    `stereo batch` does by default): the same values, the file at least its raw rows."""
    args = ("match", LEFT, RIGHT, "-n", 16, "--device", "cpu")
    assert stereo(*args, "-o", tmp_path / "small.png").returncode == 0
    r = stereo(*args, "-o", tmp_path / "fast.png", "--png-compression", "fast")
    assert r.returncode == 0, r.stderr
    small, fast = (cv2.imread(str(tmp_path / n), cv2.IMREAD_UNCHANGED) for n in ("small.png", "fast.png"))
    assert fast.dtype == np.uint16 and np.array_equal(fast, small)
    h, w = fast.shape
    assert (tmp_path / "fast.png").stat().st_size >= h * (1 + 2 * w) > (tmp_path / "small.png").stat().st_size


def test_json_timings_and_preview(tmp_path):
    r = stereo("match", LEFT, RIGHT, "-o", tmp_path / "d.pfm", "-n", 16, "--json", "--timings",
               "--preview", tmp_path / "p.png", "--device", "cpu")
    assert r.returncode == 0, r.stderr
    info = json.loads(r.stdout)
    assert (info["width"], info["height"], info["num_disparities"], info["device"]) == (384, 288, 16, "cpu")
    assert set(info["timings_ms"]) >= {"cost", "aggregate", "select"}
    assert info["total_ms"] > 0
    assert "aggregate" in r.stderr and "total" in r.stderr
    preview = cv2.imread(str(tmp_path / "p.png"))
    assert preview.shape == (288, 384, 3)


def test_explicit_options_override_preset_and_config(tmp_path):
    cfg = tmp_path / "my.toml"
    cfg.write_text('paths = 4\nmedian = 5\ncost = "sad"\n')
    r = stereo("match", LEFT, RIGHT, "-o", tmp_path / "d.npy", "-n", 16, "--preset", "quality",
               "--config", cfg, "--median", 0, "--json", "--device", "cpu")
    assert r.returncode == 0, r.stderr
    p = json.loads(r.stdout)["params"]
    assert (p["paths"], p["median"], p["cost"], p["speckle_size"]) == (4, 0, "sad", 100)


def test_presets_command():
    r = stereo("presets")
    assert r.returncode == 0
    for name in ("default", "fast", "quality"):
        assert name in r.stdout
    r = stereo("presets", "fast")
    assert "paths = 4" in r.stdout
    r = stereo("presets", "nope")
    assert r.returncode == 2 and "unknown preset" in r.stderr


@pytest.mark.parametrize("command", ["match", "batch", "eval", "presets", "info"])
def test_every_help_example_parses(command):
    """Each command's --help has examples, and the stereo part of every one of them is a
    valid command line (no renamed or misspelt option)."""
    import re
    import shlex

    from stereocli.cli import cli
    r = stereo(command, "--help")
    assert r.returncode == 0 and "Examples:" in r.stdout
    examples = r.stdout.split("Examples:")[1].split("\nOptions:")[0]
    text = re.sub(r"\\\n\s*", " ", examples)  # join continued lines
    calls = [seg.strip() for line in text.splitlines() for seg in line.split(" | ")
             if re.search(r"(^|\s)stereo \w", seg)]
    assert calls
    for call in calls:
        call = re.split(r"\s+#\s|\s+>\s", call)[0]
        words = shlex.split(call)
        words = words[words.index("stereo") + 1:]
        assert words[0] in cli.commands, call
        cli.commands[words[0]].make_context(words[0], words[1:])  # raises on an unknown option or value


def bad_cases(tmp):
    other = tmp / "small.png"
    cv2.imwrite(str(other), np.zeros((20, 30), np.uint8))
    junk = tmp / "junk.png"
    junk.write_bytes(b"not an image")
    empty = tmp / "empty.png"
    empty.write_bytes(b"")
    truncated = tmp / "truncated.png"
    truncated.write_bytes(Path(LEFT).read_bytes()[:5000])
    bomb = tmp / "bomb.png"
    bomb.write_bytes(png_claiming(100000, 100000))
    bad_pfm = tmp / "bad.pfm"
    bad_pfm.write_bytes(b"Pf\n384 288\n-1.0\n" + b"\0" * 100)
    ok = ("-n", 16)
    return {
        "missing file": (("match", tmp / "nope.png", RIGHT, "-o", tmp / "o.pfm", *ok), "no such file"),
        "unreadable": (("match", junk, RIGHT, "-o", tmp / "o.pfm", *ok), "cannot decode"),
        "size mismatch": (("match", LEFT, other, "-o", tmp / "o.pfm", *ok), "differ in size"),
        "range too wide": (("match", LEFT, RIGHT, "-o", tmp / "o.pfm", "-n", 500), "larger than the image width"),
        "range outside": (("match", LEFT, RIGHT, "-o", tmp / "o.pfm", "--min-disparity", 400), "does not fit"),
        "negative window": (("match", LEFT, RIGHT, "-o", tmp / "o.pfm", "--window", "-3", *ok), "--window"),
        "census too big": (("match", LEFT, RIGHT, "-o", tmp / "o.pfm", "--window", "9x9", *ok), "census"),
        "zero-mean 1x1": (("match", LEFT, RIGHT, "-o", tmp / "o.pfm", "--cost", "zncc", "--window", "1", *ok),
                          "1x1 window"),
        "unknown preset": (("match", LEFT, RIGHT, "-o", tmp / "o.pfm", "--preset", "x", *ok), "unknown preset"),
        "unknown cost": (("match", LEFT, RIGHT, "-o", tmp / "o.pfm", "--cost", "x", *ok), "--cost"),
        "unknown option": (("match", LEFT, RIGHT, "-o", tmp / "o.pfm", "--bogus", *ok), "--bogus"),
        "missing folder": (("match", LEFT, RIGHT, "-o", tmp / "no" / "o.pfm", *ok), "does not exist"),
        "no writer": (("match", LEFT, RIGHT, "-o", tmp / "o.jpg", *ok), "cannot write disparity"),
        "png range": (("match", LEFT, RIGHT, "-o", tmp / "o.png", "--min-disparity", "-4", *ok), "16-bit PNG"),
        "bad config": (("match", LEFT, RIGHT, "-o", tmp / "o.pfm", "--config", tmp / "none.toml", *ok),
                       "cannot read config"),
        "p2 too big": (("match", LEFT, RIGHT, "-o", tmp / "o.pfm", "--p2", 99999, *ok), "--p2"),
        "two stdins": (("match", "-", "-", "-o", tmp / "o.pfm", *ok), "only one of LEFT and RIGHT"),
        "stdout no format": (("match", LEFT, RIGHT, "-o", "-", *ok), "--format"),
        "format clash": (("match", LEFT, RIGHT, "-o", tmp / "o.pfm", "--format", "png", *ok), "--format"),
        "sbs odd width": (("match", other_odd(tmp), "--sbs", "-o", tmp / "o.pfm", "-n", 4), "odd width"),
        "depth no focal": (("match", LEFT, RIGHT, "-o", tmp / "o.pfm", "--depth", tmp / "z.pfm", *ok),
                           "--focal"),
        "depth png": (("match", LEFT, RIGHT, "-o", tmp / "o.pfm", "--depth", tmp / "z.png", "--focal", 100,
                       "--baseline", 1, *ok), "float"),
        "confidence png": (("match", LEFT, RIGHT, "-o", tmp / "o.pfm", "--confidence", tmp / "c.png", *ok), "float"),
        "min confidence": (("match", LEFT, RIGHT, "-o", tmp / "o.pfm", "--min-confidence", 2, *ok),
                           "--min-confidence"),
        "mgm 16 paths": (("match", LEFT, RIGHT, "-o", tmp / "o.pfm", "--aggregation", "mgm", "--paths", 16, *ok),
                         "--aggregation mgm takes --paths 4 or 8"),
        "weighted median radius": (("match", LEFT, RIGHT, "-o", tmp / "o.pfm", "--weighted-median", 40, *ok),
                                   "--weighted-median"),
        "batch no folder": (("batch", tmp / "nope", tmp, "-o", tmp / "out", *ok), "no such folder"),
        "error maps no gt": (("batch", tmp, tmp, "-o", tmp / "out", "--error-map-dir", tmp / "e", *ok),
                             "--gt-dir"),
        "empty file": (("match", empty, RIGHT, "-o", tmp / "o.pfm", *ok), "is empty"),
        "truncated png": (("match", LEFT, truncated, "-o", tmp / "o.pfm", *ok), "truncated PNG"),
        "pixel bomb": (("match", bomb, RIGHT, "-o", tmp / "o.pfm", *ok), "OPENCV_IO_MAX_IMAGE_PIXELS"),
        "eval damaged pfm": (("eval", bad_pfm, SAMPLE / "disp.pfm"), "truncated"),
        "eval empty": (("eval", empty, SAMPLE / "disp.pfm"), "is empty"),
    }


def png_claiming(width, height):
    """A well-formed PNG whose header claims width x height pixels (a decompression bomb)."""
    import struct
    import zlib

    def chunk(kind, data):
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(b"\0" * 64)) + chunk(b"IEND", b""))


def other_odd(tmp):
    p = tmp / "odd.png"
    cv2.imwrite(str(p), np.zeros((20, 31), np.uint8))
    return p


@pytest.mark.parametrize("case", [
    "missing file", "unreadable", "size mismatch", "range too wide", "range outside", "negative window",
    "census too big", "zero-mean 1x1", "unknown preset", "unknown cost", "unknown option", "missing folder", "no writer",
    "png range", "bad config", "p2 too big", "two stdins", "stdout no format", "format clash", "sbs odd width",
    "depth no focal", "depth png", "confidence png", "min confidence", "mgm 16 paths", "weighted median radius", "batch no folder", "error maps no gt", "empty file", "truncated png", "pixel bomb",
    "eval damaged pfm", "eval empty"])
def test_bad_input_is_one_line_exit_2_and_no_output(tmp_path, case):
    args, needle = bad_cases(tmp_path)[case]
    before = set(p.name for p in tmp_path.rglob("*"))
    r = stereo(*args)
    assert r.returncode == 2, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    assert needle in lines[0]
    assert "Traceback" not in r.stderr
    assert set(p.name for p in tmp_path.rglob("*")) == before  # nothing written, nothing half-written
