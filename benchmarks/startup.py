"""Whole-process times, as a user running one command per pair sees them: `stereo match`
of the Tsukuba pair (warm kernel cache), in-process (--no-worker) and through the
background worker, against a 4-line OpenCV script run in the same loop (runs
interleaved, median of N). A "kernel cache" line says how many kernels the timed runs
compiled: with a warm cache none, unless some kernel misses the cache in every process
(as three GPU kernels did until the forty-third session, 20 s a run on the H200). With
--scan, a disparity-count scan in a fresh kernel cache (in-process): the time of each
process and so what each new count costs to compile.

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


def wait_for_worker(env, timeout=120):
    from pathlib import Path
    t = time.time()
    while time.time() - t < timeout and not list(Path(env["STEREOCLI_RUNTIME_DIR"]).glob("*.sock")):
        time.sleep(0.1)


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
    ap.add_argument("--scan", default="", help="disparity counts to run one after another in a fresh cache, "
                                               "then again after `stereo info --warm-up` in another")
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
        env = {k: v for k, v in os.environ.items() if k != "STEREOCLI_NO_WORKER"}
        env["STEREOCLI_RUNTIME_DIR"] = os.path.join(tmp, "run")
        for device in devices:
            timed(stereo("-o", out, "-n", "16", "--device", device), env)  # fill the cache, start the worker
        wait_for_worker(env)
        for device in devices:
            timed(stereo("-o", out, "-n", "16", "--device", device), env)  # the worker's first use of it
        runs = {"opencv script": cv_cmd}
        for device in devices:
            runs[f"stereo match --device {device} --no-worker"] = stereo("-o", out, "-n", "16", "--device", device,
                                                                         "--no-worker")
            runs[f"stereo match --device {device} (worker)"] = stereo("-o", out, "-n", "16", "--device", device)
        times = {what: [] for what in runs}
        from stereocli import cache
        kernels = cache.kernel_count()
        for _ in range(a.runs):
            for what, cmd in runs.items():
                times[what].append(timed(cmd, env))
        emit(bench="kernel cache", folder=cache.DIR, kernels=cache.kernel_count(),
             compiled_during_timed_runs=cache.kernel_count() - kernels)
        subprocess.run([sys.executable, "-m", "stereocli.cli", "info", "--stop-worker"], env=env,
                       capture_output=True)
        base = statistics.median(times["opencv script"])
        for what, ts in times.items():
            emit(bench="process start", what=what, runs=len(ts), median_s=round(statistics.median(ts), 3),
                 min_s=round(min(ts), 3), ratio_to_opencv_script=round(statistics.median(ts) / base, 2))
        for device in devices if a.scan else ():
            for warm in (False, True):
                env = {**os.environ, "STEREOCLI_CACHE_DIR": os.path.join(tmp, f"cache-{device}-{warm}"),
                       "STEREOCLI_NO_WORKER": "1"}
                what = "fresh cache"
                if warm:
                    s = timed([sys.executable, "-m", "stereocli.cli", "info", "--warm-up"], env)
                    emit(bench="stereo info --warm-up", device=device, process_s=round(s, 1))
                    what = "after stereo info --warm-up"
                for n in a.scan.split(","):
                    emit(bench=f"disparity-count scan, {what}", device=device, num_disparities=int(n),
                         process_s=round(timed(stereo("-o", out, "-n", n, "--device", device), env), 2))


if __name__ == "__main__":
    main()
