"""A prototype, not the pipeline's: SGM's six paths from the rows above and below
(dx = 0, +1, -1) in two row-synchronous sweeps on the GPU. Each block keeps a tile of T
columns, a warp per column (a lane per D / 32 disparities); each row it computes the
three paths of its pixels from the previous row's path costs (the vertical path's in
registers, the diagonals' in shared memory), writes each pixel's sum once for the three,
and hands its edge columns' path costs to the neighbouring blocks through global memory
(benchmarks/gpu_handoff.py times that handoff). Every block must be resident at once.
Checked against the CPU's sgm_vertical_cpu (the same six paths) bit for bit; prints one
JSON line per size: the two sweeps' best ms of 5.

    python benchmarks/sgm_sweep.py [--sizes 1920x1080/128,1920x1080/256] [--tile 16] [--regs 0] [--check]
    python benchmarks/sgm_sweep.py --sim-check   (NUMBA_ENABLE_CUDASIM=1: one block, a lane per column)
"""
import argparse
import time

import numpy as np
from numba import cuda, int32, uint16, uint64

from common import emit

from stereocli.backends.cuda.common import SIM, BIG, warp_min, from_lane_below, from_lane_above
from stereocli.backends.cuda.aggregate import agg
from stereocli.stages import aggregate

LANES = 1 if SIM else 32
_K = {}


def make_sweep(T, K, regs=0):
    D = LANES * K
    SLOTS = T + 2  # (shared array sizes must be plain constants)

    @cuda.jit(device=True, inline=True)
    def start(c, out):
        """A path's first pixel: L = C."""
        for k in range(K):
            out[k] = c[k]

    @cuda.jit(device=True, inline=True)
    def update(c, prev, m, p1, p2, out, scratch, j, lane):
        """out = SGM's update of the path's L at the previous pixel (prev, its minimum m)
        with this pixel's costs c; the neighbouring lanes' edge disparities by shuffles."""
        lo0 = from_lane_below(prev[K - 1], scratch, j, lane)
        hiK = from_lane_above(prev[0], scratch, j, lane)
        for k in range(K):
            lo = prev[k - 1] if k > 0 else lo0
            hi = prev[k + 1] if k + 1 < K else hiK
            out[k] = agg.sgm_value(c[k], prev[k], lo, hi, m, p1, p2)

    @cuda.jit(**({"max_registers": regs} if regs else {}))
    def sweep(C, G, h, w, p1, p2tab_g, S, down, first, edge, edgem, flags):
        p2tab = cuda.shared.array(256, int32)
        Ld = cuda.shared.array((2, SLOTS, D), uint16)  # [0: path dx=+1, 1: dx=-1][slot = column - x0 + 1][d]
        Md = cuda.shared.array((2, SLOTS), int32)
        scratch = cuda.shared.array((T, LANES), int32)
        tid = cuda.threadIdx.x
        for i in range(tid, 256, cuda.blockDim.x):
            p2tab[i] = p2tab_g[i]
        b = cuda.blockIdx.x
        nb = cuda.gridDim.x
        j = tid // LANES
        lane = tid % LANES
        x0 = b * T
        x = x0 + j
        inside = x < w
        d0 = lane * K
        p1i = int32(p1)
        Lv = cuda.local.array(K, int32)
        c = cuda.local.array(K, int32)
        L0 = cuda.local.array(K, int32)
        L1 = cuda.local.array(K, int32)
        L2 = cuda.local.array(K, int32)
        pv = cuda.local.array(K, int32)
        mv = int32(0)
        m1 = int32(0)
        m2 = int32(0)
        cuda.syncthreads()
        for r in range(h):
            y = r if down else h - 1 - r
            yp = y - 1 if down else y + 1
            if r > 0:
                if tid == 0:
                    if b > 0:
                        while cuda.atomic.add(flags, b - 1, 0) < r:
                            pass
                    if b < nb - 1:
                        while cuda.atomic.add(flags, b + 1, 0) < r:
                            pass
                cuda.syncthreads()
                par = (r - 1) & 1
                if j == 0 and b > 0:  # block b-1's last column, path dx=+1, row r-1
                    o = (((b - 1) * 2 + par) * 2 + 0) * D
                    for k in range(K):
                        Ld[0, 0, d0 + k] = cuda.ldcg(edge, o + d0 + k)
                    if lane == 0:
                        Md[0, 0] = cuda.ldcg(edgem, ((b - 1) * 2 + par) * 2 + 0)
                if j == T - 1 and b < nb - 1:  # block b+1's first column, path dx=-1
                    o = (((b + 1) * 2 + par) * 2 + 1) * D
                    for k in range(K):
                        Ld[1, T + 1, d0 + k] = cuda.ldcg(edge, o + d0 + k)
                    if lane == 0:
                        Md[1, T + 1] = cuda.ldcg(edgem, ((b + 1) * 2 + par) * 2 + 1)
                cuda.syncthreads()
            if inside:
                base = uint64((y * w + x) * D + d0)
                for k in range(K):
                    c[k] = int32(C[base + k])
                g = int32(G[y * w + x])
                # vertical path (dx 0): previous pixel (x, yp), in registers
                if r == 0:
                    start(c, L0)
                else:
                    update(c, Lv, mv, p1i, p2tab[abs(g - int32(G[yp * w + x]))], L0, scratch, j, lane)
                # dx = +1: previous pixel (x - 1, yp): slot j
                if r == 0 or x == 0:
                    start(c, L1)
                else:
                    for k in range(K):
                        pv[k] = int32(Ld[0, j, d0 + k])
                    update(c, pv, Md[0, j], p1i, p2tab[abs(g - int32(G[yp * w + x - 1]))], L1, scratch, j, lane)
                # dx = -1: previous pixel (x + 1, yp): slot j + 2
                if r == 0 or x == w - 1:
                    start(c, L2)
                else:
                    for k in range(K):
                        pv[k] = int32(Ld[1, j + 2, d0 + k])
                    update(c, pv, Md[1, j + 2], p1i, p2tab[abs(g - int32(G[yp * w + x + 1]))], L2, scratch, j, lane)
                a0 = int32(BIG)
                a1 = int32(BIG)
                a2 = int32(BIG)
                for k in range(K):
                    v = L0[k] + L1[k] + L2[k]
                    if first:
                        S[base + k] = uint16(v)
                    else:
                        S[base + k] = uint16(int32(S[base + k]) + v)
                    a0 = min(a0, L0[k])
                    a1 = min(a1, L1[k])
                    a2 = min(a2, L2[k])
                mv = warp_min(a0, scratch, j, lane)
                m1 = warp_min(a1, scratch, j, lane)
                m2 = warp_min(a2, scratch, j, lane)
            cuda.syncthreads()  # every read of the previous row is done
            if inside:
                for k in range(K):
                    Lv[k] = L0[k]
                    Ld[0, j + 1, d0 + k] = uint16(L1[k])
                    Ld[1, j + 1, d0 + k] = uint16(L2[k])
                if lane == 0:
                    Md[0, j + 1] = m1
                    Md[1, j + 1] = m2
                par = r & 1
                if j == T - 1:
                    o = ((b * 2 + par) * 2 + 0) * D
                    for k in range(K):
                        edge[o + d0 + k] = uint16(L1[k])
                    if lane == 0:
                        edgem[(b * 2 + par) * 2 + 0] = m1
                if j == 0:
                    o = ((b * 2 + par) * 2 + 1) * D
                    for k in range(K):
                        edge[o + d0 + k] = uint16(L2[k])
                    if lane == 0:
                        edgem[(b * 2 + par) * 2 + 1] = m2
            cuda.threadfence()
            cuda.syncthreads()
            if tid == 0:
                cuda.atomic.exch(flags, b, int32(r + 1))

    return sweep


def run_sweeps(C, guide, p1, p2tab, T, regs=0):
    h, w, D = C.shape
    K = D // LANES
    key = (T, K, regs)
    if key not in _K:
        _K[key] = make_sweep(T, K, regs)
    k = _K[key]
    nb = (w + T - 1) // T
    dC = cuda.to_device(C.reshape(-1))
    dG = cuda.to_device(guide.reshape(-1))
    dS = cuda.device_array(h * w * D, np.uint16)
    dp2 = cuda.to_device(p2tab)
    edge = cuda.device_array(nb * 2 * 2 * D, np.uint16)
    edgem = cuda.device_array(nb * 2 * 2, np.int32)
    flags = cuda.to_device(np.zeros(nb, np.int32))

    def go():
        flags.copy_to_device(np.zeros(nb, np.int32))
        k[nb, T * LANES](dC, dG, h, w, p1, dp2, dS, True, True, edge, edgem, flags)
        flags.copy_to_device(np.zeros(nb, np.int32))
        k[nb, T * LANES](dC, dG, h, w, p1, dp2, dS, False, False, edge, edgem, flags)
    return go, dS


def one(w, h, d, T, regs, check):
    rng = np.random.default_rng(0)
    C = rng.integers(0, 60, (h, w, d)).astype(np.uint8)
    guide = rng.integers(0, 256, (h, w)).astype(np.uint8)
    p1, p2 = 8, 96
    p2tab = aggregate.p2_table(p1, p2, True)
    nb = (w + T - 1) // T
    row = dict(width=w, height=h, num_disparities=d, tile=T, blocks=nb)
    if not SIM:  # compiled on a one-block image first, to check that every block fits at once
        g1, _ = run_sweeps(C[:2, :min(w, T)].copy(), guide[:2, :min(w, T)].copy(), p1, p2tab, T, regs)
        g1()
        cuda.synchronize()
        disp = _K[(T, d // LANES, regs)]
        try:
            r = list(disp.overloads.values())[0].regs_per_thread
        except AttributeError:
            r = disp.get_regs_per_thread()
            r = list(r.values())[0] if isinstance(r, dict) else r
        fit = min(65536 // (r * T * LANES), 2048 // (T * LANES)) * cuda.get_current_device().MULTIPROCESSOR_COUNT
        row.update(registers=r, resident=fit)
        if nb > fit:
            emit(**row, skipped="not every block would be resident")
            return
    go, dS = run_sweeps(C, guide, p1, p2tab, T, regs)
    go()
    cuda.synchronize()
    if check:
        S = np.zeros((h, w, d), np.uint16)
        aggregate.sgm_vertical_cpu(C, guide, np.int32(p1), p2tab, S, np.array([0, 1, -1], np.int64), None)
        row["identical_to_cpu"] = bool(np.array_equal(dS.copy_to_host().reshape(h, w, d), S))
    ts = []
    for _ in range(1 if SIM else 5):
        cuda.synchronize()
        t = time.perf_counter()
        go()
        cuda.synchronize()
        ts.append((time.perf_counter() - t) * 1e3)
    emit(**row, sweeps_ms=round(min(ts), 3))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="100x50/128,70x40/256,1920x1080/128,1920x1080/256,3840x2160/256")
    ap.add_argument("--tile", type=int, default=16, help="columns a block (3840 wide and more: 30)")
    ap.add_argument("--regs", type=int, default=0, help="register cap (3840 wide: 64, so that a block fits an SM)")
    ap.add_argument("--check", action="store_true", help="compare with the CPU (the small sizes always are)")
    ap.add_argument("--sim-check", action="store_true", help="under the simulator: 4x5, 8 disparities, one block")
    a = ap.parse_args()
    if a.sim_check:
        return one(4, 5, 8, 4, 0, True)
    for spec in a.sizes.split(","):
        wh, d = spec.split("/")
        w, h = (int(v) for v in wh.split("x"))
        wide = w >= 3000
        one(w, h, int(d), 30 if wide and a.tile == 16 else a.tile, 64 if wide and not a.regs else a.regs,
            a.check or w * h <= 10000)


if __name__ == "__main__":
    main()
