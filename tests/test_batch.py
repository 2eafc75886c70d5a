"""`stereo batch` as users run it on dataset layouts, and the shell-pipeline forms of `match`."""
import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import cv2
import numpy as np
import pytest

from conftest import SAMPLE
from stereocli import batch as B
from stereocli import geometry, io
from test_cli import stereo

N = ("-n", 16, "--device", "cpu")


@pytest.fixture(scope="module")
def crops():
    """Three different small pairs cut from the sample (so outputs differ pair to pair)."""
    left, right = cv2.imread(str(SAMPLE / "left.png")), cv2.imread(str(SAMPLE / "right.png"))
    return [(left[y:y + 64, x:x + 96].copy(), right[y:y + 64, x:x + 96].copy())
            for y, x in ((0, 0), (100, 120), (200, 250))]


def expected(l_img, r_img):
    import stereocli
    return stereocli.match(l_img, r_img, num_disparities=16)[0]


def same_map(a, b, tol=0.0):
    """Equal maps (NaN = NaN); tol = 1/256 for 16-bit PNG, which stores round(d*256)."""
    return a.shape == b.shape and bool(np.all((np.abs(a - b) <= tol) | (np.isnan(a) & np.isnan(b))))


PNG_TOL = 1 / 256 + 1e-6


def kitti_tree(root: Path, crops, corrupt=None):
    (root / "image_2").mkdir(parents=True)
    (root / "image_3").mkdir()
    for i, (l_img, r_img) in enumerate(crops):
        cv2.imwrite(str(root / "image_2" / f"00000{i}_10.png"), l_img)
        cv2.imwrite(str(root / "image_3" / f"00000{i}_10.png"), r_img)
        cv2.imwrite(str(root / "image_2" / f"00000{i}_11.png"), l_img)  # other frame: not matched by the glob
    if corrupt is not None:
        (root / "image_3" / f"00000{corrupt}_10.png").write_bytes(b"\x89PNG truncated")


def test_kitti_layout_pairs_by_glob_and_names_outputs_by_left_stem(tmp_path, crops):
    kitti_tree(tmp_path / "kitti", crops)
    r = stereo("batch", tmp_path / "kitti/image_2", tmp_path / "kitti/image_3", "-o", tmp_path / "out",
               "--left-glob", "*_10.png", "--format", "pfm", "--jsonl", *N)
    assert r.returncode == 0, r.stderr
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == [f"00000{i}_10.pfm" for i in range(3)]
    for i, (l_img, r_img) in enumerate(crops):
        assert same_map(io.read_disparity(tmp_path / f"out/00000{i}_10.pfm"), expected(l_img, r_img))
    lines = [json.loads(x) for x in r.stdout.splitlines()]
    assert [x["status"] for x in lines[:-1]] == ["ok"] * 3
    assert lines[-1]["summary"]["done"] == 3 and "3 done, 0 failed" in r.stderr


def test_middlebury_layout_names_outputs_after_the_scene_folder(tmp_path, crops):
    for name, (l_img, r_img) in zip(("cones", "teddy"), crops):
        (tmp_path / "mb" / name).mkdir(parents=True)
        cv2.imwrite(str(tmp_path / "mb" / name / "im0.png"), l_img)
        cv2.imwrite(str(tmp_path / "mb" / name / "im1.png"), r_img)
        io.write_disparity(tmp_path / "mb" / name / "disp0GT.pfm", expected(l_img, r_img))
    r = stereo("batch", tmp_path / "mb", tmp_path / "mb", "-o", tmp_path / "out", "--left-glob", "*/im0.png",
               "--right-glob", "*/im1.png", "--format", "npy", "--gt-dir", tmp_path / "mb",
               "--gt-glob", "*/disp0GT.pfm", "--jsonl", *N)
    assert r.returncode == 0, r.stderr
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["cones.npy", "teddy.npy"]
    events = [json.loads(x) for x in r.stdout.splitlines()]
    # the ground truth is our own result here, so every evaluated pixel is exact
    assert all(e["metrics"]["bad0.5_est"] == 0 for e in events[:-1])
    assert events[-1]["summary"]["evaluated"] == 2 and "ground truth, 2 maps" in r.stderr


def test_pattern_keys():
    p = B.Pattern("left_{name}.png")
    assert p.regex.fullmatch("left_0042.png").group("name") == "0042"
    assert p.regex.fullmatch("right_0042.png") is None
    assert B.Pattern("**/*_10.png").regex.fullmatch("a/b/7_10.png").groups() == ("a/b/", "7")
    with pytest.raises(B.StereoError, match="no wildcard"):
        B.Pattern("im0.png")


def test_name_pattern_in_one_folder(tmp_path, crops):
    for i, (l_img, r_img) in enumerate(crops[:2]):
        cv2.imwrite(str(tmp_path / f"left_{i}.png"), l_img)
        cv2.imwrite(str(tmp_path / f"right_{i}.png"), r_img)
    r = stereo("batch", tmp_path, tmp_path, "-o", tmp_path / "out", "--left-glob", "left_{name}.png",
               "--right-glob", "right_{name}.png", *N)
    assert r.returncode == 0, r.stderr
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["0.png", "1.png"]


def test_corrupt_pair_in_the_middle_is_skipped_and_reported(tmp_path, crops):
    kitti_tree(tmp_path / "k", crops, corrupt=1)
    (tmp_path / "k/image_2/000009_10.png").write_bytes(cv2.imencode(".png", crops[0][0])[1].tobytes())  # no right
    r = stereo("batch", tmp_path / "k/image_2", tmp_path / "k/image_3", "-o", tmp_path / "out",
               "--left-glob", "*_10.png", "--jsonl", *N)
    assert r.returncode == 1
    assert "Traceback" not in r.stderr
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["000000_10.png", "000002_10.png"]
    assert same_map(io.read_disparity(tmp_path / "out/000002_10.png"), expected(*crops[2]), PNG_TOL)
    events = [json.loads(x) for x in r.stdout.splitlines()]
    status = {Path(e["left"]).name: e["status"] for e in events[:-1]}
    assert status == {"000000_10.png": "ok", "000001_10.png": "failed", "000002_10.png": "ok",
                      "000009_10.png": "failed"}
    assert events[-1]["summary"]["failed"] == 2
    assert "2 done, 2 failed, 0 skipped" in r.stderr
    assert "cannot decode" in r.stderr and "no right image" in r.stderr


def test_io_processes_write_the_same_maps_report_a_bad_pair_and_leave_no_slot_files(tmp_path, crops):
    """--io-processes N decodes and encodes in worker processes (for long GPU batches):
    the same maps and the same events as threads, pairs larger than a worker's first
    slot included, a corrupt pair reported, and the shared slot files gone at the end."""
    kitti_tree(tmp_path / "k", crops, corrupt=1)
    big = [cv2.resize(pair, (1200, 800)) for pair in crops[2]]  # (2.9 MB a pair: more than a first slot)
    cv2.imwrite(str(tmp_path / "k/image_2/000003_10.png"), big[0])
    cv2.imwrite(str(tmp_path / "k/image_3/000003_10.png"), big[1])
    runs = {}
    for procs in (0, 2):
        r = stereo("batch", tmp_path / "k/image_2", tmp_path / "k/image_3", "-o", tmp_path / f"out{procs}",
                   "--left-glob", "*_10.png", "--jsonl", "--io-processes", procs, *N)
        assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr
        events = [json.loads(x) for x in r.stdout.splitlines()]
        runs[procs] = sorted((Path(e["left"]).name, e["status"]) for e in events[:-1])  # (a failure comes at once)
        assert "cannot decode" in r.stderr
        assert events[-1]["summary"]["io_processes"] == procs
        assert ("in 2 processes" in r.stderr) == (procs == 2)
    assert runs[2] == runs[0] == [("000000_10.png", "ok"), ("000001_10.png", "failed"), ("000002_10.png", "ok"),
                                  ("000003_10.png", "ok")]
    for name in ("000000_10.png", "000002_10.png", "000003_10.png"):
        assert (tmp_path / "out2" / name).read_bytes() == (tmp_path / "out0" / name).read_bytes()
    assert same_map(io.read_disparity(tmp_path / "out2/000002_10.png"), expected(*crops[2]), PNG_TOL)
    import os
    import tempfile
    left = [n for d in ("/dev/shm", tempfile.gettempdir()) if os.path.isdir(d) for n in os.listdir(d)
            if n.startswith("stereocli-slot-")]
    assert left == []


def test_png_maps_are_stored_by_default_and_small_deflates_them_to_the_same_values(tmp_path, crops):
    """A batch writes its 16-bit PNG maps uncompressed by default (a tenth of the encode
    time, which bounds a GPU batch); --png-compression small deflates them. Threads and
    worker processes alike: the same values either way, the stored file at least as
    large as the raw rows, the deflated one smaller."""
    kitti_tree(tmp_path / "k", crops)
    for procs in (0, 2):
        for png in ("fast", "small"):
            r = stereo("batch", tmp_path / "k/image_2", tmp_path / "k/image_3", "-o", tmp_path / f"{png}{procs}",
                       "--left-glob", "*_10.png", "--io-processes", procs,
                       *(("--png-compression", png) if png == "small" else ()), *N)
            assert r.returncode == 0, r.stderr
    for i, pair in enumerate(crops):
        name = f"00000{i}_10.png"
        maps = {d: tmp_path / d / name for d in ("fast0", "fast2", "small0", "small2")}
        values = {d: cv2.imread(str(f), cv2.IMREAD_UNCHANGED) for d, f in maps.items()}
        assert all(v.dtype == np.uint16 and np.array_equal(v, values["small0"]) for v in values.values())
        assert same_map(io.read_disparity(maps["fast2"]), expected(*pair), PNG_TOL)
        h, w = values["fast0"].shape
        raw = h * (1 + 2 * w)  # a PNG's rows: a filter byte and two bytes a pixel
        for procs in (0, 2):
            assert maps[f"fast{procs}"].stat().st_size >= raw > maps[f"small{procs}"].stat().st_size


def test_io_processes_auto_takes_worker_processes_for_long_gpu_batches_only(tmp_path, crops):
    """--io-processes auto (the default): worker processes, one per core but an eighth, where
    the codec bounds the batch (a GPU batch of many pairs on a machine of many cores, or
    a stream), threads elsewhere; a CPU batch says it ran in threads."""
    from stereocli.batch import auto_io_processes
    linux = sys.platform.startswith("linux")
    assert auto_io_processes(True, 1000, cores=16) == (14 if linux else 0)
    assert auto_io_processes(True, None, cores=32) == (28 if linux else 0)  # a stream
    assert auto_io_processes(True, 1000, cores=128) == (32 if linux else 0)
    assert auto_io_processes(False, 1000, cores=16) == 0  # the CPU's matching is the bound
    assert auto_io_processes(True, 10, cores=16) == 0
    assert auto_io_processes(True, 1000, cores=4) == 0
    kitti_tree(tmp_path / "k", crops)
    r = stereo("batch", tmp_path / "k/image_2", tmp_path / "k/image_3", "-o", tmp_path / "out",
               "--left-glob", "*_10.png", "--jsonl", *N)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout.splitlines()[-1])["summary"]["io_processes"] == 0
    r = stereo("batch", tmp_path / "k/image_2", tmp_path / "k/image_3", "-o", tmp_path / "out",
               "--io-processes", "-1", *N)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert "--io-processes" in r.stderr and "0..256" in r.stderr


def test_skip_existing_resumes(tmp_path, crops):
    kitti_tree(tmp_path / "k", crops)
    args = ("batch", tmp_path / "k/image_2", tmp_path / "k/image_3", "-o", tmp_path / "out",
            "--left-glob", "*_10.png", *N)
    (tmp_path / "out").mkdir()
    marker = b"left alone by --skip-existing"
    (tmp_path / "out/000001_10.png").write_bytes(marker)
    r = stereo(*args, "--skip-existing")
    assert r.returncode == 0, r.stderr
    assert "2 done, 0 failed, 1 skipped" in r.stderr
    assert (tmp_path / "out/000001_10.png").read_bytes() == marker
    r = stereo(*args)  # without the flag, everything is redone
    assert "3 done" in r.stderr and (tmp_path / "out/000001_10.png").read_bytes() != marker


def test_pairs_from_stdin_with_outputs(tmp_path, crops):
    lines = []
    for i, (l_img, r_img) in enumerate(crops[:2]):
        cv2.imwrite(str(tmp_path / f"a{i}.png"), l_img)
        cv2.imwrite(str(tmp_path / f"b{i}.png"), r_img)
        lines.append(f"{tmp_path / f'a{i}.png'}\t{tmp_path / f'b{i}.png'}\tsub/pair{i}")
    lines.append("# a comment, then a malformed line")
    lines.append(str(tmp_path / "a0.png"))
    r = subprocess.run([sys.executable, "-m", "stereocli.cli", "batch", "--pairs", "-", "-o", str(tmp_path / "out"),
                        "--format", "tiff", *map(str, N)], input="\n".join(lines) + "\n", capture_output=True,
                       text=True)
    assert r.returncode == 1, r.stderr  # the malformed line fails, the others are written
    assert "line 4" in r.stderr
    for i in range(2):
        assert same_map(io.read_disparity(tmp_path / f"out/sub/pair{i}.tiff"), expected(*crops[i]))


def test_a_slow_producer_streams_each_pairs_line_out_as_soon_as_its_map_is_written(tmp_path, crops):
    """`producer | stereo batch --pairs - --jsonl | consumer`: each pair is matched when
    its line arrives and reported when written, while standard input is still open."""
    import select
    lines = []
    for i, (l_img, r_img) in enumerate(crops[:2]):
        cv2.imwrite(str(tmp_path / f"a{i}.png"), l_img)
        cv2.imwrite(str(tmp_path / f"b{i}.png"), r_img)
        lines.append(f"{tmp_path / f'a{i}.png'}\t{tmp_path / f'b{i}.png'}\tpair{i}\n")
    p = subprocess.Popen([sys.executable, "-m", "stereocli.cli", "batch", "--pairs", "-", "-o", str(tmp_path / "out"),
                          "--format", "pfm", "--jsonl", *map(str, N)], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, bufsize=1)
    try:
        for i, line in enumerate(lines):
            p.stdin.write(line)
            p.stdin.flush()  # ... and the producer waits: stdin stays open
            ready, _, _ = select.select([p.stdout], [], [], 120)
            assert ready, "no JSON line while standard input was open"
            ev = json.loads(p.stdout.readline())
            assert ev["status"] == "ok" and ev["output"].endswith(f"pair{i}.pfm")
            assert same_map(io.read_disparity(ev["output"]), expected(*crops[i]))
        p.stdin.close()
        rest = p.stdout.read().splitlines()
        assert p.wait(timeout=60) == 0, p.stderr.read()
        assert json.loads(rest[-1])["summary"]["done"] == 2
    finally:
        p.kill()


@pytest.mark.parametrize("io_processes", [0, 2])
def test_ctrl_c_stops_cleanly_and_resume_finishes(tmp_path, io_processes):
    left, right = cv2.imread(str(SAMPLE / "left.png")), cv2.imread(str(SAMPLE / "right.png"))
    (tmp_path / "L").mkdir()
    (tmp_path / "R").mkdir()
    for i in range(150):
        cv2.imwrite(str(tmp_path / f"L/{i:03d}.png"), left)
        cv2.imwrite(str(tmp_path / f"R/{i:03d}.png"), right)
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "stereocli.cli", "batch", str(tmp_path / "L"), str(tmp_path / "R"), "-o", str(out),
           "-n", "16", "--device", "cpu", "--io-processes", str(io_processes)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 120
    while time.time() < deadline and not (out.is_dir() and len(list(out.glob("*.png"))) >= 3):
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    written = sorted(out.iterdir())
    if proc.returncode == 0:  # finished before the signal arrived: nothing to check about stopping
        pytest.skip("the batch finished before Ctrl-C")
    assert proc.returncode == 130, err
    assert "interrupted after" in err and "Traceback" not in err
    assert all(p.suffix == ".png" and not p.name.startswith(".") for p in written)  # no .part files
    assert 0 < len(written) < 150
    ref = io.read_disparity(written[0])
    assert all(same_map(io.read_disparity(p), ref) for p in written)  # every file whole
    r = subprocess.run(cmd + ["--skip-existing"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert f"{len(written)} skipped" in r.stderr and len(list(out.iterdir())) == 150


def test_sbs_batch_and_match(tmp_path, crops):
    (tmp_path / "frames").mkdir()
    for i, (l_img, r_img) in enumerate(crops[:2]):
        cv2.imwrite(str(tmp_path / f"frames/f{i}.png"), np.hstack([l_img, r_img]))
    r = stereo("batch", tmp_path / "frames", "--sbs", "-o", tmp_path / "out", "--format", "pfm", *N)
    assert r.returncode == 0, r.stderr
    for i in range(2):
        assert same_map(io.read_disparity(tmp_path / f"out/f{i}.pfm"), expected(*crops[i]))
    r = stereo("match", tmp_path / "frames/f1.png", "--sbs", "-o", tmp_path / "m.pfm", *N)
    assert r.returncode == 0, r.stderr
    assert same_map(io.read_disparity(tmp_path / "m.pfm"), expected(*crops[1]))


@pytest.mark.parametrize("fmt", ["png", "pfm", "npy", "tiff"])
def test_stdin_to_stdout_round_trip(tmp_path, crops, fmt):
    l_img, r_img = crops[0]
    cv2.imwrite(str(tmp_path / "r.png"), r_img)
    data = cv2.imencode(".png", l_img)[1].tobytes()
    r = subprocess.run([sys.executable, "-m", "stereocli.cli", "match", "-", str(tmp_path / "r.png"), "-o", "-",
                        "--format", fmt, *map(str, N)], input=data, capture_output=True)
    assert r.returncode == 0, r.stderr.decode()
    (tmp_path / f"d.{fmt}").write_bytes(r.stdout)
    back = io.read_disparity(tmp_path / f"d.{fmt}")
    want = expected(l_img, r_img)
    tol = 1 / 256 + 1e-6 if fmt == "png" else 0
    assert back.shape == want.shape
    assert np.all(np.isclose(back, want, atol=tol, rtol=0) | (np.isnan(back) & np.isnan(want)))


def test_depth_and_ply_from_calib(tmp_path):
    calib = tmp_path / "calib.txt"
    calib.write_text("cam0=[400.5 0 190; 0 400.5 140; 0 0 1]\ncam1=[400.5 0 200; 0 400.5 140; 0 0 1]\n"
                     "baseline=160\nwidth=384\nheight=288\n")
    r = stereo("match", SAMPLE / "left.png", SAMPLE / "right.png", "-o", tmp_path / "d.pfm", *N,
               "--calib", calib, "--depth", tmp_path / "z.pfm", "--ply", tmp_path / "c.ply")
    assert r.returncode == 0, r.stderr
    disp = io.read_disparity(tmp_path / "d.pfm")
    z = io.read_disparity(tmp_path / "z.pfm")
    valid = np.isfinite(disp)
    np.testing.assert_array_equal(np.isfinite(z), valid)
    # doffs = 200 - 190 = 10 from cam1/cam0; depth in the baseline's unit
    np.testing.assert_allclose(z[valid], 400.5 * 160 / (disp[valid] + 10), rtol=1e-5)
    pts = geometry.read_ply((tmp_path / "c.ply").read_bytes())
    assert len(pts) == valid.sum()
    ys, xs = np.nonzero(valid)
    np.testing.assert_allclose(pts["z"], z[valid], rtol=1e-6)
    np.testing.assert_allclose(pts["x"], (xs - 190) * z[valid] / 400.5, rtol=1e-4, atol=1e-3)
    np.testing.assert_allclose(pts["y"], (ys - 140) * z[valid] / 400.5, rtol=1e-4, atol=1e-3)
    bgr = cv2.imread(str(SAMPLE / "left.png"))
    np.testing.assert_array_equal(pts["red"], bgr[ys, xs, 2])
    # explicit options win over the file
    r = stereo("match", SAMPLE / "left.png", SAMPLE / "right.png", "-o", tmp_path / "d2.pfm", *N,
               "--calib", calib, "--doffs", 0, "--focal", 100, "--depth", tmp_path / "z2.npy")
    assert r.returncode == 0, r.stderr
    z2 = io.read_disparity(tmp_path / "z2.npy")
    d_pos = valid & (disp > 0)
    np.testing.assert_allclose(z2[d_pos], 100 * 160 / disp[d_pos], rtol=1e-5)


def test_ctrl_c_inside_compiled_code_stops_the_batch():
    """Ctrl-C during a Numba call surfaces as a SystemError chained to the
    KeyboardInterrupt: it must stop the batch, not count as one failed pair."""
    try:
        try:
            raise KeyboardInterrupt
        except KeyboardInterrupt:
            raise SystemError("returned a result with an exception set")
    except SystemError as e:
        with pytest.raises(KeyboardInterrupt):
            B.raise_interrupt(e)
    B.raise_interrupt(ValueError("a bad pair"))  # other errors stay per-pair failures


def test_submissions_write_the_layouts_the_devkits_read(tmp_path, crops):
    kitti_tree(tmp_path / "kitti", crops)
    r = stereo("batch", tmp_path / "kitti/image_2", tmp_path / "kitti/image_3", "-o", tmp_path / "sub",
               "--left-glob", "*_10.png", "--submission", "kitti", *N)
    assert r.returncode == 0, r.stderr
    assert sorted(p.name for p in (tmp_path / "sub/disp_0").iterdir()) == [f"00000{i}_10.png" for i in range(3)]
    raw = cv2.imread(str(tmp_path / "sub/disp_0/000000_10.png"), cv2.IMREAD_UNCHANGED)
    assert raw.dtype == np.uint16  # d * 256, 0 = invalid
    assert same_map(io.read_disparity(tmp_path / "sub/disp_0/000000_10.png"), expected(*crops[0]), PNG_TOL)

    for i, (l_img, r_img) in enumerate(crops[:2]):  # Middlebury: one folder per scene
        (tmp_path / f"mb/scene{i}").mkdir(parents=True)
        cv2.imwrite(str(tmp_path / f"mb/scene{i}/im0.png"), l_img)
        cv2.imwrite(str(tmp_path / f"mb/scene{i}/im1.png"), r_img)
    r = stereo("batch", tmp_path / "mb", tmp_path / "mb", "-o", tmp_path / "mbsub", "--left-glob", "*/im0.png",
               "--right-glob", "*/im1.png", "--submission", "middlebury", "--method-name", "Mine", *N)
    assert r.returncode == 0, r.stderr
    for i in range(2):
        scene = tmp_path / f"mbsub/scene{i}"
        assert sorted(p.name for p in scene.iterdir()) == ["disp0Mine.pfm", "timeMine.txt"]
        assert same_map(io.read_disparity(scene / "disp0Mine.pfm"), expected(*crops[i]))
        assert 0 < float((scene / "timeMine.txt").read_text()) < 60


def test_batch_writes_previews_depth_and_clouds_with_a_calibration_per_scene(tmp_path, crops):
    for i, (l_img, r_img) in enumerate(crops[:2]):
        scene = tmp_path / f"mb/scene{i}"
        scene.mkdir(parents=True)
        cv2.imwrite(str(scene / "im0.png"), l_img)
        cv2.imwrite(str(scene / "im1.png"), r_img)
        f = 100.0 + 10 * i  # each scene its own camera
        (scene / "calib.txt").write_text(f"cam0=[{f} 0 48; 0 {f} 32; 0 0 1]\ncam1=[{f} 0 48; 0 {f} 32; 0 0 1]\n"
                                         f"doffs=0\nbaseline=50\n")
    r = stereo("batch", tmp_path / "mb", tmp_path / "mb", "-o", tmp_path / "out", "--left-glob", "*/im0.png",
               "--right-glob", "*/im1.png", "--format", "pfm", "--calib", "calib.txt", "--depth-dir",
               tmp_path / "depth", "--ply-dir", tmp_path / "ply", "--preview-dir", tmp_path / "prev", *N)
    assert r.returncode == 0, r.stderr
    for i in range(2):
        disp = io.read_disparity(tmp_path / f"out/scene{i}.pfm")
        depth = io.read_disparity(tmp_path / f"depth/scene{i}.pfm")
        ok = np.isfinite(disp) & (disp > 0)
        np.testing.assert_allclose(depth[ok], (100.0 + 10 * i) * 50 / disp[ok], rtol=1e-5)
        assert (tmp_path / f"ply/scene{i}.ply").read_bytes().startswith(b"ply\n")
        assert cv2.imread(str(tmp_path / f"prev/scene{i}.png")).shape == crops[i][0].shape
    r = stereo("batch", tmp_path / "mb", tmp_path / "mb", "-o", tmp_path / "out2", "--left-glob", "*/im0.png",
               "--right-glob", "*/im1.png", "--depth-dir", tmp_path / "d2", *N)
    assert r.returncode == 2 and "--focal" in r.stderr  # no camera: refused before any work


def test_io_processes_write_every_extra_file_as_threads_do(tmp_path, crops):
    """With the file work in worker processes, every file a batch writes beside its maps
    (previews, depth, point clouds from each scene's calibration, confidence maps, error
    pictures against ground truth, Middlebury time files) and the metrics it prints are
    those of a batch in threads; side-by-side frames too."""
    for i, (l_img, r_img) in enumerate(crops):
        scene = tmp_path / f"mb/scene{i}"
        scene.mkdir(parents=True)
        cv2.imwrite(str(scene / "im0.png"), l_img)
        cv2.imwrite(str(scene / "im1.png"), r_img)
        (scene / "calib.txt").write_text(f"cam0=[{100 + i} 0 48; 0 {100 + i} 32; 0 0 1]\n"
                                         f"cam1=[{100 + i} 0 48; 0 {100 + i} 32; 0 0 1]\ndoffs=0\nbaseline=50\n")
        (tmp_path / "gt").mkdir(exist_ok=True)
        io.write_disparity(tmp_path / f"gt/scene{i}.pfm", expected(l_img, r_img) + 0.5)
        (tmp_path / "sbs").mkdir(exist_ok=True)
        cv2.imwrite(str(tmp_path / f"sbs/f{i}.png"), np.hstack([l_img, r_img]))
    outputs, summaries = {}, {}
    for procs in (0, 2):
        run = tmp_path / f"run{procs}"
        r = stereo("batch", tmp_path / "mb", tmp_path / "mb", "-o", run / "out", "--left-glob", "*/im0.png",
                   "--right-glob", "*/im1.png", "--calib", "calib.txt", "--depth-dir", run / "depth",
                   "--ply-dir", run / "ply", "--preview-dir", run / "prev", "--confidence-dir", run / "conf",
                   "--gt-dir", tmp_path / "gt", "--error-map-dir", run / "err", "--io-processes", procs, *N)
        assert r.returncode == 0, r.stderr
        summaries[procs] = [line for line in r.stderr.splitlines() if "bad" in line or "density" in line]
        r = stereo("batch", tmp_path / "mb", tmp_path / "mb", "-o", run / "sub", "--left-glob", "*/im0.png",
                   "--right-glob", "*/im1.png", "--submission", "middlebury", "--io-processes", procs, *N)
        assert r.returncode == 0, r.stderr
        r = stereo("batch", tmp_path / "sbs", "--sbs", "-o", run / "sbs", "--io-processes", procs, *N)
        assert r.returncode == 0, r.stderr
        outputs[procs] = {p.relative_to(run).as_posix(): p.read_bytes() for p in sorted(run.rglob("*"))
                          if p.is_file() and not p.name.startswith("time")}
    assert len(outputs[0]) == 3 * 6 + 3 + 3  # maps, depth, ply, previews, confidence, errors; submission; sbs
    assert outputs[2] == outputs[0]
    assert summaries[2] == summaries[0] and summaries[0]
    times = sorted((tmp_path / "run2/sub").rglob("time*.txt"))
    assert len(times) == 3 and all(float(t.read_text()) > 0 for t in times)


def test_batches_at_once_hold_opencv_at_one_thread_and_give_the_callers_setting_back(tmp_path, crops):
    """batch.run keeps OpenCV's own pool at one thread while its reader and writer threads
    run; a Dask worker runs several batches at once, and the caller's setting must come
    back when the last ends, not when the first does."""
    import threading

    from stereocli import config
    from stereocli.backends.cpu import CpuBackend
    for side, k in (("left", 0), ("right", 1)):
        (tmp_path / side).mkdir()
        for i, pair in enumerate(crops):
            cv2.imwrite(str(tmp_path / side / f"{i}.png"), pair[k])
    params, backend = config.load("default", None, {"num_disparities": 16}), CpuBackend()
    both_in = threading.Barrier(2, timeout=60)  # each batch's first match waits for the other's
    device = threading.Lock()  # then one match at a time, as a Dask worker's device thread runs them
    seen, summaries = [], []

    def one(name):
        first = [True]

        def compute(fn, *args, **kw):
            if first[0]:
                first[0] = False
                both_in.wait()
            with device:
                return fn(*args, **kw)

        pairs = B.find_pairs(tmp_path / "left", tmp_path / "right", tmp_path / name, ".pfm")
        summaries.append(B.run(pairs, params, backend, ".pfm", threads=2, compute=compute,
                               on_event=lambda ev: seen.append(cv2.getNumThreads())))

    before = cv2.getNumThreads()
    cv2.setNumThreads(3)
    try:
        runs = [threading.Thread(target=one, args=(name,)) for name in ("a", "b")]
        for t in runs:
            t.start()
        for t in runs:
            t.join()
        assert [s.done for s in summaries] == [3, 3]
        assert seen == [1] * 6
        assert cv2.getNumThreads() == 3
    finally:
        cv2.setNumThreads(before)


def test_a_batch_in_worker_processes_gives_back_the_interpreters_switch_interval(tmp_path, crops):
    """While batch.run hands pairs to worker processes it runs this process's interpreter
    at a short switch interval (its threads hand every pair on); a program that runs a
    batch gets its own interval back afterwards, and its maps are those of threads."""
    import sys

    from stereocli import config
    from stereocli.backends.cpu import CpuBackend
    for k, side in enumerate(("left", "right")):
        (tmp_path / side).mkdir()
        for i, pair in enumerate(crops):
            cv2.imwrite(str(tmp_path / side / f"{i}.png"), pair[k])
    params, backend = config.load("default", None, {"num_disparities": 16}), CpuBackend()
    before = sys.getswitchinterval()
    sys.setswitchinterval(0.003)
    try:
        seen = []
        for name, procs in (("threads", 0), ("procs", 2)):
            pairs = B.find_pairs(tmp_path / "left", tmp_path / "right", tmp_path / name, ".pfm")
            s = B.run(pairs, params, backend, ".pfm", threads=2, processes=procs,
                      on_event=lambda ev: seen.append((procs, sys.getswitchinterval())))
            assert s.done == 3 and s.io_processes == procs
            assert sys.getswitchinterval() == 0.003
        assert seen == [(0, 0.003)] * 3 + [(2, B.WORKERS_SWITCH_S)] * 3
        for i in range(3):
            assert np.array_equal(io.read_disparity(tmp_path / "procs" / f"{i}.pfm"),
                                  io.read_disparity(tmp_path / "threads" / f"{i}.pfm"), equal_nan=True)
    finally:
        sys.setswitchinterval(before)
