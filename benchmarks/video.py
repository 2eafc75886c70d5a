"""Frames per second of `stereo video`, as a user runs it: a side-by-side video of the
cones scene panning, resized to SIZE (default 1280x720), N frames, matched with the
default preset; whole command (process start and kernel loading included) and the
command's own end-to-end rate (first decode to last encode), with ms per frame of
decoding, matching, colouring and encoding. One JSON line per device and input.

    python benchmarks/video.py [--size 1280x720] [-n 128] [--frames 120] [--device cpu cuda]
                               [--input mp4v ffv1] [--quick]

Also a line per device with the pipeline's per-stage ms on one frame (the best of 10
runs in this process), to see what bounds the rate.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import cv2
import numpy as np

from common import DATA, ROOT, emit


CODECS = {"mp4v": ("mp4v", ".mp4"), "ffv1": ("FFV1", ".avi")}  # --input: (fourcc, container)


def make_video(path: Path, w: int, h: int, frames: int, codec: str = "mp4v") -> None:
    """A side-by-side video: the cones pair resized to w x h, panning by 2 px a frame;
    MPEG-4 (mp4v: compressed, as cameras and phones record, decoded with FFmpeg's
    threads) or lossless FFV1 (decoded in one thread: a harder input)."""
    left = cv2.resize(cv2.imread(str(DATA / "cones" / "left.png")), (w, h), interpolation=cv2.INTER_CUBIC)
    right = cv2.resize(cv2.imread(str(DATA / "cones" / "right.png")), (w, h), interpolation=cv2.INTER_CUBIC)
    v = cv2.VideoWriter(str(path), cv2.VideoWriter_fourcc(*CODECS[codec][0]), 30, (2 * w, h))
    for i in range(frames):
        v.write(np.hstack([np.roll(left, 2 * i, 1), np.roll(right, 2 * i, 1)]))
    v.release()


def stage_times(w, h, ndisp, device, repeat=10):
    """Per-stage ms of pipeline.run on one frame of the video, the run with the best total."""
    from stereocli import config, pipeline
    from stereocli.backends import get_backend
    left = cv2.resize(cv2.imread(str(DATA / "cones" / "left.png")), (w, h), interpolation=cv2.INTER_CUBIC)
    right = cv2.resize(cv2.imread(str(DATA / "cones" / "right.png")), (w, h), interpolation=cv2.INTER_CUBIC)
    params = config.load("default", None, {"num_disparities": ndisp})
    backend = get_backend(device)
    runs = [pipeline.run(left, right, params, backend) for _ in range(repeat + 1)][1:]
    best = min(runs, key=lambda r: r.total_ms)
    return {k: round(v, 2) for k, v in best.timings.items()}, round(best.total_ms, 2)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--size", default="1280x720")
    ap.add_argument("-n", "--num-disparities", type=int, default=128)
    ap.add_argument("--frames", type=int, default=120)
    ap.add_argument("--device", nargs="+", default=["cpu"])
    ap.add_argument("--input", choices=list(CODECS), nargs="+", default=["mp4v"],
                    help="codec of the side-by-side input video (default mp4v)")
    ap.add_argument("--quick", action="store_true", help="a tiny video (a check that the script runs)")
    a = ap.parse_args()
    if a.quick:
        a.size, a.num_disparities, a.frames = "160x96", 16, 4
    w, h = (int(v) for v in a.size.lower().split("x"))
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
           "STEREOCLI_NO_WORKER": "1"}
    with tempfile.TemporaryDirectory() as tmp:
        for codec, device in [(c, d) for c in a.input for d in a.device]:
            src = Path(tmp) / f"sbs_{codec}{CODECS[codec][1]}"
            if not src.exists():
                make_video(src, w, h, a.frames, codec)
            cmd = [sys.executable, "-m", "stereocli.cli", "video", str(src), "-o", str(Path(tmp) / "disp.mp4"),
                   "-n", str(a.num_disparities), "--device", device, "--json", "--no-progress"]
            subprocess.run(cmd[:4] + ["--max-frames", "2"] + cmd[4:], env=env, capture_output=True)  # compile
            t = time.perf_counter()
            r = subprocess.run(cmd, env=env, capture_output=True, text=True)
            wall = time.perf_counter() - t
            if r.returncode != 0:
                sys.exit(r.stderr)
            s = json.loads(r.stdout)
            emit(size=f"{w}x{h}", num_disparities=a.num_disparities, device=device, input=codec, frames=s["frames"],
                 threads=int(os.environ.get("NUMBA_NUM_THREADS", os.cpu_count())),
                 fps_end_to_end=s["fps"], fps_after_first_frame=s["steady_fps"], fps_whole_command=round(s["frames"] / wall, 2),
                 command_s=round(wall, 2), decode_ms=s["decode_ms_per_frame"], match_ms=s["match_ms_per_frame"],
                 colour_ms=s["colour_ms_per_frame"], encode_ms=s["encode_ms_per_frame"])
            if codec != a.input[0]:
                continue
            stages, total = stage_times(w, h, a.num_disparities, device, 2 if a.quick else 10)
            emit(size=f"{w}x{h}", num_disparities=a.num_disparities, device=device, one_frame_ms=total,
                 stages_ms=stages)


if __name__ == "__main__":
    main()
