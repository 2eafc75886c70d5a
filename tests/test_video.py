"""`stereo video` as a user runs it: a side-by-side video (or two) in, a colour
disparity video and per-frame maps out."""
import json

import cv2
import numpy as np
import pytest

from conftest import SAMPLE
from stereocli import config, io, pipeline
from stereocli.backends.cpu import CpuBackend
from test_cli import stereo

FRAMES = 5


@pytest.fixture(scope="module")
def videos(tmp_path_factory):
    """A lossless (FFV1) side-by-side video of the sample pair panning, and the same as
    two videos; the frames as decoded."""
    d = tmp_path_factory.mktemp("video")
    left, right = cv2.imread(str(SAMPLE / "left.png")), cv2.imread(str(SAMPLE / "right.png"))
    left, right = left[:96, :160], right[:96, :160]
    h, w = left.shape[:2]
    four = cv2.VideoWriter_fourcc(*"FFV1")
    sbs = cv2.VideoWriter(str(d / "sbs.avi"), four, 12, (2 * w, h))
    lv, rv = (cv2.VideoWriter(str(d / f"{s}.avi"), four, 12, (w, h)) for s in ("l", "r"))
    for i in range(FRAMES):
        fl, fr = np.roll(left, 3 * i, 1), np.roll(right, 3 * i, 1)
        sbs.write(np.hstack([fl, fr]))
        lv.write(fl)
        rv.write(fr)
    for v in (sbs, lv, rv):
        v.release()
    cap = cv2.VideoCapture(str(d / "sbs.avi"))
    frames = [cap.read()[1] for _ in range(FRAMES)]
    return d, frames


def test_side_by_side_video_to_colour_video_and_maps(tmp_path, videos):
    d, frames = videos
    r = stereo("video", d / "sbs.avi", "-o", tmp_path / "disp.mp4", "--maps-dir", tmp_path / "maps",
               "--format", "pfm", "-n", 16, "--device", "cpu", "--json")
    assert r.returncode == 0, r.stderr
    summary = json.loads(r.stdout)
    assert summary["frames"] == FRAMES and summary["fps"] > 0 and summary["width"] == 160
    assert "fps end to end" in r.stderr
    cap = cv2.VideoCapture(str(tmp_path / "disp.mp4"))
    assert int(cap.get(cv2.CAP_PROP_FRAME_COUNT)) == FRAMES and cap.get(cv2.CAP_PROP_FPS) == 12
    assert (cap.get(cv2.CAP_PROP_FRAME_WIDTH), cap.get(cv2.CAP_PROP_FRAME_HEIGHT)) == (160, 96)
    params = config.load("default", None, {"num_disparities": 16})
    for i, frame in enumerate(frames):  # each map is the frame's match
        want = pipeline.run(frame[:, :160], frame[:, 160:], params, CpuBackend()).disparity
        got = io.read_disparity(tmp_path / "maps" / f"{i:06d}.pfm")
        np.testing.assert_array_equal(got, want)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["disp.mp4", "maps"]  # no partial file left


def test_two_videos_give_the_maps_of_one_side_by_side(tmp_path, videos):
    d, _ = videos
    r = stereo("video", "--left", d / "l.avi", "--right", d / "r.avi", "--maps-dir", tmp_path / "two",
               "-n", 16, "--device", "cpu", "--max-frames", 3, "--every", 2)
    assert r.returncode == 0, r.stderr
    assert sorted(p.name for p in (tmp_path / "two").iterdir()) == ["000000.png", "000002.png"]
    r = stereo("video", d / "sbs.avi", "--maps-dir", tmp_path / "one", "-n", 16, "--device", "cpu",
               "--max-frames", 3)
    assert r.returncode == 0, r.stderr
    for name in ("000000.png", "000002.png"):
        np.testing.assert_array_equal(io.read_disparity(tmp_path / "two" / name),
                                      io.read_disparity(tmp_path / "one" / name))


@pytest.mark.parametrize("case", ["missing", "not a video", "sizes differ", "no output", "bad container"])
def test_bad_video_input_is_one_line_exit_2_and_no_output(tmp_path, videos, case):
    d, _ = videos
    small = tmp_path / "small.avi"
    if case == "sizes differ":
        v = cv2.VideoWriter(str(small), cv2.VideoWriter_fourcc(*"FFV1"), 10, (32, 20))
        v.write(np.zeros((20, 32, 3), np.uint8))
        v.release()
    (tmp_path / "junk.mp4").write_bytes(b"not a video")
    out = tmp_path / "out" / "disp.mp4"
    out.parent.mkdir()
    inputs = {"missing": (tmp_path / "nope.mp4", "-o", out), "not a video": (tmp_path / "junk.mp4", "-o", out),
              "sizes differ": ("--left", d / "l.avi", "--right", small, "-o", out), "no output": (d / "sbs.avi",),
              "bad container": (d / "sbs.avi", "-o", tmp_path / "out" / "disp.gif")}[case]
    r = stereo("video", *inputs, "-n", 4, "--device", "cpu")
    assert r.returncode == 2, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr, r.stderr
    assert list(out.parent.iterdir()) == []


def test_ctrl_c_on_a_video_file_leaves_no_video(tmp_path, videos):
    """A video file interrupted half-way: exit 130, and no video (whole or partial) under
    any name; the maps written so far are whole."""
    import signal
    import subprocess
    import sys
    import time
    d, frames = videos
    long = tmp_path / "long.avi"
    v = cv2.VideoWriter(str(long), cv2.VideoWriter_fourcc(*"FFV1"), 12, (frames[0].shape[1], frames[0].shape[0]))
    for _ in range(200):
        for f in frames:
            v.write(f)
    v.release()
    out = tmp_path / "out"
    out.mkdir()
    args = ["stereo", "video", str(long), "-o", str(out / "d.mp4"), "--maps-dir", str(out / "maps"), "-n", "16",
            "--device", "cpu"]
    # `stereo` as `python -m stereocli.cli` runs it, with SIGUSR1 dumping every thread's
    # stack: a run that does not stop says where it hangs (it did once in CI, under load)
    boot = ("import faulthandler, runpy, signal, sys; faulthandler.register(signal.SIGUSR1, all_threads=True); "
            f"sys.argv = {args!r}; runpy.run_module('stereocli.cli', run_name='__main__', alter_sys=True)")
    p = subprocess.Popen([sys.executable, "-c", boot], stderr=subprocess.PIPE, text=True)
    maps_dir = out / "maps"
    deadline = time.time() + 120
    while time.time() < deadline and not (maps_dir.exists() and any(maps_dir.glob("*.png"))):
        time.sleep(0.05)
    p.send_signal(signal.SIGINT)
    try:
        _, err = p.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        p.send_signal(signal.SIGUSR1)
        time.sleep(2)
        p.kill()
        _, err = p.communicate()
        pytest.fail(f"stereo video still ran 120 s after Ctrl-C; its threads then:\n{err[-6000:]}")
    assert p.returncode == 130, err
    assert [x.name for x in out.iterdir()] == ["maps"]
    maps = sorted(maps_dir.iterdir())
    assert 0 < len(maps) < 1000 and all(m.name == f"{i:06d}.png" for i, m in enumerate(maps))  # no temporary file
    assert all(io.read_disparity(m).shape == (96, 160) for m in maps)


def test_a_map_that_cannot_be_written_stops_the_video_with_one_line_and_no_video(tmp_path, videos):
    """A failure in the thread that colours and writes the maps (here: a folder where the
    third map must go) ends the run like bad input: one line, exit 2, no video under
    any name, and the maps before it whole."""
    d, _ = videos
    out = tmp_path / "out"
    (out / "maps" / "000002.png").mkdir(parents=True)
    r = stereo("video", d / "sbs.avi", "-o", out / "disp.mp4", "--maps-dir", out / "maps", "-n", 4, "--device", "cpu")
    assert r.returncode == 2, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and "000002.png" in r.stderr, r.stderr
    assert sorted(p.name for p in out.iterdir()) == ["maps"]
    for name in ("000000.png", "000001.png"):
        assert io.read_disparity(out / "maps" / name).shape == (96, 160)
