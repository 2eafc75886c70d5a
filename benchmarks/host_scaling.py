"""How far this host's cores can scale, whatever the program: the ceiling against which
the CPU backend's own scaling (cpu_vs_opencv.py --threads 1,16) is judged. Three Numba
loops, each split into many chunks over the threads like the stages' loops:

  simd   SGM's path update (min of four candidates, add, subtract the minimum) over a
         64-value uint16 vector kept in L1: compute only, no memory traffic
  l3     read, add to and write back a 24 MiB uint16 array (teddy's sum and cost volumes
         are 32 MB): bound by the shared last-level cache
  dram   the same over a 1 GiB array: bound by memory bandwidth

It also prints the host's topology: logical CPUs, physical cores (threads that share a
core count once), last-level cache. One JSON line per loop and thread count, then the
speed-up of each loop from the first to the last count (processes alternated, two rounds,
as in cpu_vs_opencv.py: the host's speed drifts).

    python benchmarks/host_scaling.py [--threads 1,16] [--repeat 5] [--quick]

--quick: small arrays and one run each (a check that the script runs, for CI).
"""
import argparse
import glob
import json
import os
import subprocess
import sys
import time

import numba
import numpy as np
from numba import njit, prange, set_num_threads

from common import emit


@njit(parallel=True, cache=True)
def simd(chunks, steps):
    out = np.zeros(chunks, np.int64)
    for c in prange(chunks):
        L = np.empty(66, np.int32)
        cost = np.empty(64, np.int32)
        for d in range(64):
            cost[d] = (d * 37 + c) % 61
            L[d + 1] = cost[d]
        L[0] = 1 << 20
        L[65] = 1 << 20
        m = 0
        for s in range(steps):
            m2 = 1 << 20
            prev = L[0]
            for d in range(64):
                cur = L[d + 1]
                v = cost[d] + min(min(cur, min(prev, L[d + 2]) + 8), m + 96) - m
                prev = cur
                L[d + 1] = v
                m2 = min(m2, v)
            m = m2
        out[c] = m
    return out


@njit(parallel=True, cache=True)
def stream(a, chunks, passes):
    n = a.size // chunks
    for p in range(passes):
        for c in prange(chunks):
            for i in range(c * n, (c + 1) * n):
                a[i] = np.uint16(a[i] + np.uint16(1))
    return a[0]


def topology():
    cpus = sorted(os.sched_getaffinity(0))
    cores = set()
    for c in cpus:
        try:
            with open(f"/sys/devices/system/cpu/cpu{c}/topology/thread_siblings_list") as f:
                cores.add(f.read().strip())
        except OSError:
            cores.add(str(c))
    llc = None
    for path in sorted(glob.glob("/sys/devices/system/cpu/cpu0/cache/index*/size")):
        with open(path) as f:
            llc = f.read().strip()  # the last index is the last level
    model = ""
    try:
        with open("/proc/cpuinfo") as f:
            model = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), "")
    except OSError:
        pass
    return dict(logical_cpus=len(cpus), physical_cores=len(cores), last_level_cache=llc, model=model)


def measure(threads, repeat, quick=False):
    set_num_threads(threads)
    small = np.zeros(2 ** 16 if quick else 12 * 2 ** 20, np.uint16)  # 24 MiB
    big = np.zeros(2 ** 20 if quick else 2 ** 29, np.uint16)  # 1 GiB
    loops = {
        "simd": lambda: simd(256, 40 if quick else 4000),
        "l3": lambda: stream(small, 256, 8),
        "dram": lambda: stream(big, 256, 1),
    }
    rows = []
    for name, fn in loops.items():
        fn()
        times = []
        for _ in range(repeat):
            t = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t) * 1e3)
        rows.append(dict(loop=name, threads=threads, best_ms=round(min(times), 3)))
    return rows


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", default=f"1,{numba.config.NUMBA_NUM_THREADS}")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--quick", action="store_true", help="small arrays, one run each (CI)")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    counts = [int(t) for t in a.threads.split(",")]
    counts = [t for t in counts if t <= numba.config.NUMBA_NUM_THREADS] or [1]  # (this machine's at most)
    if a.quick:
        a.repeat = 1
    if a.child:
        for row in measure(counts[0], a.repeat, a.quick):
            print(json.dumps(row), flush=True)
        return
    emit(**topology())
    best = {}
    for _ in range(2):
        for t in counts:
            out = subprocess.run([sys.executable, __file__, "--child", "--threads", str(t), "--repeat", str(a.repeat)]
                                 + (["--quick"] if a.quick else []), capture_output=True, text=True, check=True).stdout
            for line in out.splitlines():
                row = json.loads(line)
                key = (row["loop"], t)
                best[key] = min(best.get(key, float("inf")), row["best_ms"])
    for (loop, t), ms in sorted(best.items()):
        emit(loop=loop, threads=t, best_ms=ms)
    lo, hi = counts[0], counts[-1]
    for loop in ("simd", "l3", "dram"):
        emit(loop=loop, speedup=round(best[(loop, lo)] / best[(loop, hi)], 2), threads=f"{lo}->{hi}")


if __name__ == "__main__":
    main()
