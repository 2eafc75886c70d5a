"""When each kernel of a GPU match runs: the launches of one round of census + SGM +
selection + LR check (as gpu.py's kernel_times queues it), each bracketed by CUDA
events on its own stream, so that what runs beside what on the backend's side streams
shows (the H100 machine has `ncu` but not Nsight Systems). A held stream keeps the GPU
waiting while the round is queued, so the times are the kernels', back to back.

    python benchmarks/gpu_timeline.py --configs 1920x1080/128/4,3840x2160/256/8 [--rounds 3] [--print]

One JSON line per configuration: the round's total (the best of --rounds), and for
that round every launch (kernel, stream, grid, block, start and end in ms from the
round's start) and each kernel's summed time. A launch's "start" is when its stream
reached it (what it waits for done), not when its first block ran: on a full GPU
that can be later. The events add a few microseconds of their own between launches.
--print also writes the launches as a table to stderr.
"""
import argparse
import collections
import sys

from common import emit

from gpu import HOLD_MS, _hold_kernel, free_last_round, kernel_times, pair, queue_round


def _name(kernel):
    py = getattr(kernel, "py_func", None)
    return getattr(py, "__name__", None) or getattr(kernel, "__name__", type(kernel).__name__)


def timeline(bk, left, right, ndisp, paths, rounds):
    """(total ms, [(kernel, stream number, grid, block, start ms, end ms)]) of the best of
    `rounds` rounds, after one round to compile and warm."""
    import numba
    from numba import cuda
    if not numba.config.ENABLE_CUDASIM:
        kernel_times(bk, left, right, ndisp, paths, 1)  # (compiles and warms, as gpu.py's rounds do)
    launcher = bk._launcher
    plain = launcher.launch
    recs = []

    def bracketed(kernel, grid, block, stream, *args):
        e0, e1 = cuda.event(), cuda.event()
        e0.record(stream)
        plain(kernel, grid, block, stream, *args)
        e1.record(stream)
        recs.append((_name(kernel), stream, grid, block, e0, e1))

    hold = None if numba.config.ENABLE_CUDASIM else _hold_kernel()
    L, R = bk.upload(left), bk.upload(right)
    best = None
    launcher.launch = bracketed  # (this backend's launcher only; every kernel of a match goes through it)
    try:
        for _ in range(rounds):
            recs.clear()
            free_last_round()
            if hold is not None:
                hold[1, 32, bk.stream](HOLD_MS * 1000)
            start = cuda.event()
            start.record(bk.stream)
            queue_round(bk, L, R, ndisp, paths)
            end = cuda.event()
            end.record(bk.stream)
            bk.synchronize()
            end.synchronize()
            total = start.elapsed_time(end)
            if best is None or total < best[0]:
                numbers = {}
                rows = [(name, numbers.setdefault(id(st), len(numbers)), grid, block,
                         start.elapsed_time(e0), start.elapsed_time(e1)) for name, st, grid, block, e0, e1 in recs]
                best = (total, rows)
    finally:
        del launcher.launch  # (back to the class's method)
    return best


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--configs", default="1920x1080/128/4",
                    help="sizes as WxH/D/PATHS[,...] [1920x1080/128/4]")
    ap.add_argument("--rounds", type=int, default=3, help="rounds; the quickest is printed [3]")
    ap.add_argument("--print", action="store_true", help="also the launches as a table, on stderr")
    ap.add_argument("--sim-check", action="store_true",
                    help="one tiny size, for NUMBA_ENABLE_CUDASIM=1 in CI (a check that the script runs)")
    a = ap.parse_args()
    from stereocli.backends.cuda import CudaBackend
    bk = CudaBackend()
    configs = ["48x16/8/4"] if a.sim_check else a.configs.split(",")
    for spec in configs:
        size, ndisp, paths = spec.split("/")
        w, h = map(int, size.split("x"))
        ndisp, paths = int(ndisp), int(paths)
        left, right = pair(w, h)
        total, rows = timeline(bk, left, right, ndisp, paths, 1 if a.sim_check else a.rounds)
        per_kernel = collections.defaultdict(float)
        for name, _, _, _, t0, t1 in rows:
            per_kernel[name] += t1 - t0
        emit(width=w, height=h, num_disparities=ndisp, paths=paths, total_ms=round(total, 3), launches=[
            dict(kernel=name, stream=st, grid=grid, block=block, start_ms=round(t0, 3), end_ms=round(t1, 3))
            for name, st, grid, block, t0, t1 in rows],
            kernel_sum_ms={k: round(v, 3) for k, v in per_kernel.items()})
        if a.print:
            print(f"{spec}: {total:.3f} ms, {len(rows)} launches", file=sys.stderr)
            for name, st, grid, block, t0, t1 in sorted(rows, key=lambda r: r[4]):
                print(f"  stream {st:2d} {t0:8.3f} {t1:8.3f} {t1 - t0:7.3f} ms  {name} grid={grid} block={block}",
                      file=sys.stderr)


if __name__ == "__main__":
    main()
