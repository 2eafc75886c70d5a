"""Scaling of `stereo batch --scheduler local` with the number of workers (one per GPU
with --device cuda), against the same batch in one process without Dask. Builds a tree
of N pairs from the shared scenes, runs the CLI as a user would, and prints one JSON
line per run: workers (0 = one process, no Dask), whole-command wall time (process and
cluster start, kernel-cache load included), the cluster's start-up as the command
reports it, pairs/s over the whole command and the steady rate between the first and
the last finished pair (read from the --jsonl stream), and the ratio to the one-process
rate. A first small run fills the kernel cache so that no run pays the compile.

    python benchmarks/cluster.py [DATA_DIR] [--pairs 400] [--device cuda] [--workers 1,2,4] [-n 64] [--quick]
"""
import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from batch import build_tree
from common import DATA, ROOT, emit


def run_batch(root: Path, out: str, workers: int, a) -> dict:
    """workers 0: the batch in one process, without Dask."""
    cmd = [sys.executable, "-m", "stereocli.cli", "batch", str(root / "left"), str(root / "right"),
           "-o", str(root / out), "-n", str(a.num_disparities), "--device", a.device,
           "--threads", str(a.threads), "--jsonl", "--no-progress"]
    if workers:
        cmd += ["--scheduler", "local", "--workers", str(workers)]
    t0 = time.perf_counter()
    stamps, summary = [], None
    with subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, cwd=ROOT) as p:
        for line in p.stdout:
            ev = json.loads(line)
            if "summary" in ev:
                summary = ev["summary"]
            elif ev["status"] == "ok":
                stamps.append(time.perf_counter())
    wall = time.perf_counter() - t0
    steady = (len(stamps) - 1) / (stamps[-1] - stamps[0]) if len(stamps) > 1 else 0.0
    return {"workers": workers, "rc": p.returncode, "done": summary["done"] if summary else None,
            "wall_s": round(wall, 2), "pairs_per_s_total": round(len(stamps) / wall, 2),
            "pairs_per_s_steady": round(steady, 2), "first_pair_after_s": round(stamps[0] - t0, 2) if stamps else None,
            "startup_s": summary.get("startup_s") if summary else None,
            "compute_ms_sum": summary["compute_ms"] if summary else None,
            "read_ms_sum": summary["read_ms"] if summary else None, "write_ms_sum": summary["write_ms"] if summary else None}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("data", nargs="?", default=str(DATA))
    ap.add_argument("--pairs", type=int, default=400)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--workers", default="1,2,4")
    ap.add_argument("--threads", type=int, default=4)
    ap.add_argument("-n", "--num-disparities", type=int, default=64)
    ap.add_argument("--quick", action="store_true",
                    help="8 pairs, one CPU worker, 16 disparities (a check that the script runs)")
    a = ap.parse_args()
    if a.quick:
        a.pairs, a.device, a.workers, a.num_disparities, a.threads = 8, "cpu", "1", 16, 1
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        build_tree(Path(a.data), root, a.pairs)
        warm = Path(tmp) / "warm"
        build_tree(Path(a.data), warm, 4)
        run_batch(warm, "out", 1, a)
        base = None
        for k in [0] + [int(x) for x in a.workers.split(",")]:
            row = run_batch(root, f"out{k}", k, a)
            base = base or row["pairs_per_s_total"]
            emit(bench="stereo batch" + (" --scheduler local" if k else " (one process)"), device=a.device,
                 pairs=a.pairs, num_disparities=a.num_disparities, threads=a.threads, **row,
                 vs_one_process=round(row["pairs_per_s_total"] / base, 3) if base else None)


if __name__ == "__main__":
    main()
