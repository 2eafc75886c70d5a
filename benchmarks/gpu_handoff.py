"""What it costs GPU blocks to hand a row's results to their neighbours through global
memory: the floor of a row-synchronous SGM sweep (each block a tile of columns, each
row waiting until both neighbouring tiles have finished the row before) and of a
one-directional wavefront (waiting on the left neighbour only). Each row a block waits
for its neighbours' counters (atomic reads), passes two block barriers, then a fence
and an atomic store of its own counter. Prints one JSON line per configuration: blocks,
neighbours waited on, rows, best ms of 5 launches, us a row.

    python benchmarks/gpu_handoff.py [--rows 1080] [--blocks 1,2,16,66,120,132] [--threads 256]
    python benchmarks/gpu_handoff.py --sim-check   (one block, 4 rows: under NUMBA_ENABLE_CUDASIM=1,
                                                    whose blocks run one after another, no block may wait)
"""
import argparse
import time

import numpy as np
from numba import cuda, int32

from common import emit


@cuda.jit
def handoff_kernel(flags, rows, both):
    b = cuda.blockIdx.x
    nb = cuda.gridDim.x
    for r in range(rows):
        if cuda.threadIdx.x == 0:
            if b > 0:
                while cuda.atomic.add(flags, b - 1, 0) < r:
                    pass
            if both and b < nb - 1:
                while cuda.atomic.add(flags, b + 1, 0) < r:
                    pass
        cuda.syncthreads()  # (a row's work would go between the barriers)
        cuda.syncthreads()
        if cuda.threadIdx.x == 0:
            cuda.threadfence()
            cuda.atomic.exch(flags, b, int32(r + 1))


def best_ms(blocks, threads, rows, both, runs=5):
    flags = cuda.to_device(np.zeros(blocks, np.int32))
    times = []
    for i in range(runs + 1):  # (the first compiles)
        flags.copy_to_device(np.zeros(blocks, np.int32))
        cuda.synchronize()
        t = time.perf_counter()
        handoff_kernel[blocks, threads](flags, rows, both)
        cuda.synchronize()
        if i:
            times.append((time.perf_counter() - t) * 1e3)
    return min(times)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=1080)
    ap.add_argument("--blocks", default="1,2,16,66,120,132")
    ap.add_argument("--threads", type=int, default=256)
    ap.add_argument("--sim-check", action="store_true", help="one block, 4 rows, 4 threads (the simulator)")
    a = ap.parse_args()
    if a.sim_check:
        a.rows, a.blocks, a.threads = 4, "1", 4
    for both in (1, 0):
        for blocks in (int(v) for v in a.blocks.split(",")):
            ms = best_ms(blocks, a.threads, a.rows, both, 1 if a.sim_check else 5)
            emit(blocks=blocks, threads=a.threads, neighbours="both" if both else "left", rows=a.rows,
                 ms=round(ms, 3), us_per_row=round(ms * 1e3 / a.rows, 3))


if __name__ == "__main__":
    main()
