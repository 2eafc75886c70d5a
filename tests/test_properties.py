"""Any input ends in a map or in one line of error: property-based tests (hypothesis).

CI runs a small number of examples (profile "ci"); for a long run:
    HYPOTHESIS_PROFILE=long pytest tests/test_properties.py
"""
import contextlib
import io as pyio
import os
import tempfile
from pathlib import Path

import cv2
import numpy as np
import pytest
from hypothesis import HealthCheck, assume, event, given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

import stereocli
from stereocli import cli, config, io

settings.register_profile("ci", max_examples=25, deadline=None, derandomize=True,
                          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
settings.register_profile("long", max_examples=2000, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


# ------------------------------------------------------------------ files: bytes -> image or one error

@given(st.binary(max_size=300))
def test_random_bytes_decode_or_say_why(data):
    try:
        img = io.decode_image(data, "x.png")
    except stereocli.StereoError as e:
        assert "\n" not in str(e)
    else:
        assert img.size > 0


@given(st.sampled_from([".pfm", ".png", ".npy", ".tif"]), st.binary(max_size=300),
       st.sampled_from([b"", b"Pf\n", b"Pf\n4 3\n-1\n", b"\x93NUMPY", b"\x89PNG\r\n\x1a\n"]))
def test_random_disparity_files_read_or_say_why(ext, tail, head):
    with tempfile.TemporaryDirectory() as tmp:
        p = Path(tmp) / f"d{ext}"
        p.write_bytes(head + tail)
        try:
            d = io.read_disparity(p)
        except stereocli.StereoError as e:
            assert "\n" not in str(e)
        else:
            assert d.dtype == np.float32 and d.ndim == 2


@given(arrays(np.float32, st.tuples(st.integers(1, 12), st.integers(1, 12)),
              elements=st.one_of(st.integers(0, 65535 * 2).map(lambda k: k / 512),  # on and between 1/256 steps
                                 st.floats(0, 255.99609375, width=32), st.sampled_from([np.nan, np.inf, -np.inf]))))
def test_png_map_holds_round_d_times_256_and_0_where_invalid(d):
    """KITTI's 16-bit PNG: each value is d * 256 rounded (half to even, as Python's
    round), at least 1, and 0 where the map has no disparity (NaN or infinite)."""
    stored = cv2.imdecode(np.frombuffer(io.encode_disparity(d, ".png"), np.uint8), cv2.IMREAD_UNCHANGED)
    assert stored.dtype == np.uint16
    want = [[0 if not np.isfinite(x) else max(1, round(float(x) * 256)) for x in row] for row in d]
    assert stored.reshape(d.shape).tolist() == want


@given(st.floats(-1000, -1e-3) | st.floats(256.0, 1e6))
def test_png_map_refuses_disparities_it_cannot_hold(bad):
    d = np.full((3, 4), 10.0, np.float32)
    d[1, 2] = bad
    d[0, 0] = np.nan
    with pytest.raises(stereocli.StereoError, match="16-bit PNG"):
        io.encode_disparity(d, ".png")


def test_truncated_png_is_reported_without_opencvs_own_lines(capfd):
    data = (Path(__file__).parent.parent / "sample_data" / "left.png").read_bytes()
    for cut in (9, 40, len(data) // 2, len(data) - 5):
        with pytest.raises(stereocli.StereoError, match="truncated PNG"):
            io.decode_image(data[:cut], "cut.png")
    assert capfd.readouterr().err == ""


# ------------------------------------------------------------------ images and options -> map or one error

@st.composite
def images(draw):
    """A pair of images of one random shape (1..64 px a side), dtype and channel count."""
    h, w = draw(st.integers(1, 64)), draw(st.integers(1, 64))
    ch = draw(st.sampled_from([None, 1, 3, 4]))
    dtype = draw(st.sampled_from([np.uint8, np.uint16, np.float32]))
    shape = (h, w) if ch is None else (h, w, ch)
    if dtype == np.float32:
        elements = st.one_of(st.floats(0, 1, width=32), st.sampled_from([np.nan, np.inf, -np.inf, 300.0]))
        left = draw(arrays(np.float32, shape, elements=elements))
    else:
        # texture with a random shift, so that there is something to match
        rng = np.random.default_rng(draw(st.integers(0, 2 ** 16)))
        left = rng.integers(0, np.iinfo(dtype).max, size=shape, endpoint=True).astype(dtype)
    shift = draw(st.integers(-4, 8))
    right = np.roll(left, -shift, axis=1)
    return left, right


@st.composite
def options(draw):
    cost = draw(st.sampled_from(config.COSTS))
    if cost == "census":
        window = draw(st.sampled_from([(3, 3), (5, 5), (7, 5), (9, 7)]))
    elif cost == "mi":
        window = None
    else:
        window = draw(st.sampled_from([(1, 1), (3, 3), (5, 3), (7, 7)]))
    n = draw(st.integers(1, 24))
    return dict(
        cost=cost, window=window, num_disparities=n, min_disparity=draw(st.integers(-10, 10)),
        preprocess=draw(st.sampled_from(config.PREPROCESS)),
        aggregation=draw(st.sampled_from(config.AGGREGATIONS)), block=draw(st.sampled_from([1, 3])),
        paths=draw(st.sampled_from(config.PATHS)), uniqueness=draw(st.sampled_from([0.0, 5.0, 30.0])),
        subpixel=draw(st.booleans()), lr_check=draw(st.booleans()), fill=draw(st.sampled_from(config.FILLS)),
        median=draw(st.sampled_from([0, 3, 5])), speckle_size=draw(st.sampled_from([0, 4, 100])),
        max_memory=draw(st.sampled_from([0, 0, 1, 2])),
    )


def check_map(disp, shape, opts):
    assert disp.shape == shape[:2] and disp.dtype == np.float32
    valid = disp[np.isfinite(disp)]
    assert not np.isinf(disp).any()  # invalid is NaN in memory
    lo, hi = opts["min_disparity"], opts["min_disparity"] + opts["num_disparities"] - 1
    if valid.size:
        assert valid.min() >= lo - 1 and valid.max() <= hi + 1


@given(images(), options())
def test_any_image_and_options_give_a_map_or_one_error(pair, opts):
    left, right = pair
    try:
        disp, _ = stereocli.match(left, right, device="cpu", **opts)
    except stereocli.StereoError as e:
        assert "\n" not in str(e) and str(e)
        event("one-line error: " + " ".join(w for w in str(e).split()[:5] if not w[-1:].isdigit()))
        return
    event("map")
    check_map(disp, left.shape, opts)
    bad = ~np.isfinite(left)
    if bad.any():  # non-finite input pixels get no disparity
        assert np.isnan(disp[bad if bad.ndim == 2 else bad.any(axis=2)]).all()


FLAGS = {"subpixel": ("--subpixel", "--no-subpixel"), "lr_check": ("--lr-check", "--no-lr-check")}


def argv_of(opts):
    out = []
    for k, v in opts.items():
        if k in FLAGS:
            out.append(FLAGS[k][0 if v else 1])
        elif k == "window":
            if v is not None:
                out += ["--window", f"{v[0]}x{v[1]}"]
        else:
            out += ["--" + k.replace("_", "-"), str(v)]
    return out


@given(images(), options(), st.sampled_from([".pfm", ".png", ".npy", ".tif"]))
@settings(max_examples=15)
def test_cli_on_any_file_gives_a_map_or_one_line_and_exit_2(pair, opts, ext):
    left, right = pair
    assume(left.dtype != np.float32 or left.ndim == 2 or left.shape[2] != 4)  # TIFF float RGBA: not written
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        kind = ".tif" if left.dtype == np.float32 else ".png"
        lp, rp, out = tmp / f"l{kind}", tmp / f"r{kind}", tmp / f"d{ext}"
        assert cv2.imwrite(str(lp), left) and cv2.imwrite(str(rp), right)
        err = pyio.StringIO()
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(pyio.StringIO()):
            code = cli.main(["match", str(lp), str(rp), "-o", str(out), "--device", "cpu", *argv_of(opts)])
        left_over = sorted(p.name for p in tmp.iterdir())
        if code == 0:
            check_map(io.read_disparity(out), left.shape, opts)
            assert left_over == sorted([lp.name, rp.name, out.name])
        else:
            lines = err.getvalue().strip().splitlines()
            assert code == 2 and len(lines) == 1 and lines[0].startswith("stereo: error: "), err.getvalue()
            assert left_over == sorted([lp.name, rp.name])  # nothing written, nothing half-written
