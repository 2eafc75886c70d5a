"""Whole-process times, as a user running one command per pair sees them: `stereo match`
of the Tsukuba pair (warm kernel cache) against a 4-line OpenCV script run in the same
loop (runs interleaved, median of N). With --scan, a disparity-count scan in a fresh
kernel cache: the time of each process and so what each new count costs to compile.

    python benchmarks/startup.py [--runs 5] [--devices cpu,cuda] [--scan 64,96,128,192,256] [--quick]
"""
import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

from common import ROOT, emit

SAMPLE = ROOT / "sample_data"
OPENCV_SCRIPT = ("import cv2; l = cv2.imread(r'{l}', 0); r = cv2.imread(r'{r}', 0); "
                 "d = cv2.StereoSGBM_create(0, 16, 5).compute(l, r); cv2.imwrite(r'{o}', d)")


def timed(cmd, env=None) -> float:
    t = time.perf_counter()
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT)
    if r.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed: {r.stderr.strip()}")
    return time.perf_counter() - t


def stereo(*args):
    return [sys.executable, "-m", "stereocli.cli", "match", str(SAMPLE / "left.png"), str(SAMPLE / "right.png"),
            *args]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--devices", default="cpu,cuda")
    ap.add_argument("--scan", default="", help="disparity counts to run one after another in a fresh cache")
    ap.add_argument("--quick", action="store_true", help="one run on the CPU (a check that it runs)")
    a = ap.parse_args()
    if a.quick:
        a.runs, a.devices, a.scan = 1, "cpu", ""
    from stereocli.backends import cuda_status
    devices = [d for d in a.devices.split(",") if d == "cpu" or cuda_status()[0]]
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "d.pfm")
        cv_cmd = [sys.executable, "-c", OPENCV_SCRIPT.format(l=SAMPLE / "left.png", r=SAMPLE / "right.png",
                                                             o=os.path.join(tmp, "cv.png"))]
        for device in devices:
            timed(stereo("-o", out, "-n", "16", "--device", device))  # fill the kernel cache
        times = {"opencv script": []}
        for _ in range(a.runs):
            times["opencv script"].append(timed(cv_cmd))
            for device in devices:
                times.setdefault(device, []).append(timed(stereo("-o", out, "-n", "16", "--device", device)))
        base = statistics.median(times["opencv script"])
        for what, ts in times.items():
            emit(bench="process start", what=what if what == "opencv script" else f"stereo match --device {what}",
                 runs=len(ts), median_s=round(statistics.median(ts), 3), min_s=round(min(ts), 3),
                 ratio_to_opencv_script=round(statistics.median(ts) / base, 2))
        for device in devices if a.scan else ():
            env = {**os.environ, "STEREOCLI_CACHE_DIR": os.path.join(tmp, f"cache-{device}")}
            for n in a.scan.split(","):
                emit(bench="disparity-count scan, fresh cache", device=device, num_disparities=int(n),
                     process_s=round(timed(stereo("-o", out, "-n", n, "--device", device), env), 2))


if __name__ == "__main__":
    main()
