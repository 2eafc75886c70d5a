"""`stereo batch --scheduler`: the same batch on a Dask cluster (dask.distributed).

The client (the `stereo batch` process) pairs the files, then sends each pair (paths
and parameters, a few hundred bytes) to the workers; a worker reads the images,
matches them, writes the output itself and sends back only the event (status,
per-stage ms, metric sums). Each worker process keeps one backend, so it compiles
(or loads) the kernels once and keeps its GPU. `--scheduler local` starts a cluster
on this machine: with CUDA, one worker per GPU (CUDA_VISIBLE_DEVICES set per worker,
as dask-cuda does); on the CPU, N workers sharing the cores.

A pair that fails on a worker is tried once more on another worker before it is
reported; the pairs of a worker that dies are rescheduled by Dask (once, on a local
cluster; a remote scheduler follows its own `distributed.scheduler.allowed-failures`).
At most a few pairs per worker are in flight, so the scheduler stays small for
any number of pairs, and Ctrl-C only waits for those to finish.
"""
from __future__ import annotations

import os
import threading
import time

from . import batch, io
from .errors import StereoError

_COMPUTE_LOCK = threading.Lock()  # per worker process: one match at a time on its device


def _require_dask():
    try:
        import distributed  # noqa: F401
    except ImportError:
        raise StereoError("--scheduler needs Dask: pip install 'stereocli[dask]' "
                          "(or pip install 'dask[distributed]')") from None


# ------------------------------------------------------------------ on the worker

def _worker_task(pair, params, device, ext, skip_existing, max_disparity):
    """Runs on a worker: one pair start to finish. The backend is per process; a worker
    with several threads decodes/encodes pairs while one of them matches."""
    from .backends import get_backend
    try:
        from distributed import get_worker
        where = get_worker().address
    except Exception:  # pragma: no cover - not inside a worker
        where = None
    with _COMPUTE_LOCK:  # the first call initialises CUDA, which must not race between threads
        backend = get_backend(device)
    ev, counts = batch.match_one(pair, params, backend, ext, skip_existing, max_disparity,
                                 compute_lock=_COMPUTE_LOCK)
    ev["worker"] = where
    return ev, counts


# ------------------------------------------------------------------ on the client

def start_local_cluster(workers: int | None, device: str, threads: int = 4):
    """A LocalCluster-like SpecCluster: one worker per GPU with CUDA, else N CPU workers."""
    _require_dask()
    import dask
    from distributed import Nanny, Scheduler, SpecCluster

    from .backends import _simulator, cuda_status
    use_gpu = device in ("cuda", "auto") and cuda_status()[0] and not _simulator()
    if device == "cuda" and not use_gpu:
        raise StereoError(f"--device cuda: {cuda_status()[1]}; use --device cpu or auto")
    if use_gpu:
        from numba import cuda
        ngpu = len(cuda.gpus)
        n = workers or ngpu  # more workers than GPUs: they take the GPUs in turn (several per GPU)
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        ids = visible.split(",") if visible else [str(i) for i in range(ngpu)]
        envs = [{"CUDA_VISIBLE_DEVICES": ids[i % len(ids)]} for i in range(n)]
    else:
        n = workers or 2
        threads = max(1, (os.cpu_count() or 2) // n)
        envs = [{"NUMBA_NUM_THREADS": str(threads), "OMP_NUM_THREADS": "1"} for _ in range(n)]
    specs = {f"{'gpu' if use_gpu else 'cpu'}-{i}": {"cls": Nanny, "options": {
        "nthreads": threads, "env": envs[i], "silence_logs": 50, "memory_limit": 0}} for i in range(n)}
    # a pair whose worker dies is rerun once on another worker, then reported (KilledWorker)
    with dask.config.set({"distributed.worker.daemon": False, "distributed.scheduler.allowed-failures": 1}):
        cluster = SpecCluster(scheduler={"cls": Scheduler, "options": {"dashboard_address": None}},
                              workers=specs, silence_logs=40, asynchronous=False)
    return cluster


def run(pairs, params, device: str, ext: str, scheduler: str, *, workers: int | None = None, threads: int = 4,
        skip_existing: bool = False, on_event=None, max_disparity=None, summary=None, warn=None):
    """Run the batch on a Dask scheduler ("local" or an address); same events and summary as
    batch.run. KeyboardInterrupt stops sending pairs, lets the ones in flight finish, re-raises."""
    _require_dask()
    from distributed import Client

    summary = summary if summary is not None else batch.Summary()
    start = time.perf_counter()
    cluster = None
    try:
        if scheduler == "local":
            cluster = start_local_cluster(workers, device, threads)
            client = Client(cluster)
        else:
            try:
                client = Client(scheduler, timeout="20s")
            except (OSError, TimeoutError) as e:
                raise StereoError(f"cannot reach the Dask scheduler at {scheduler} ({e}); start one with "
                                  f"'dask scheduler' and workers with 'dask worker {scheduler}', "
                                  f"or use --scheduler local") from None
        with client:
            if scheduler != "local":
                client.wait_for_workers(1, timeout=60)
            _run_with_client(client, pairs, params, device, ext, skip_existing, max_disparity, summary,
                             on_event, warn)
    finally:
        if cluster is not None:
            cluster.close()
        io.remove_partial_writes(p.output for p in pairs)  # a worker killed while writing
        summary.seconds = time.perf_counter() - start
    return summary


def _run_with_client(client, pairs, params, device, ext, skip_existing, max_disparity, summary, on_event, warn):
    from distributed import as_completed
    from distributed.client import FutureCancelledError

    info = client.scheduler_info(n_workers=-1)["workers"]
    nworkers = max(1, len(info))
    window = sum(w.get("nthreads", 1) + 1 for w in info.values()) or 2  # every thread busy, one queued each
    if warn:
        warn(f"sending {len(pairs)} pairs to {nworkers} Dask worker(s) at {client.scheduler.address}")
    params_f = client.scatter(params, broadcast=True)  # sent once, not once per pair
    todo = iter(pairs)
    attempts = {}  # future key -> (pair, attempt, future): everything sent and not yet reported

    def submit(p, attempt=1, avoid=None):
        kw = {}
        if avoid:
            others = [w for w in client.scheduler_info(n_workers=-1)["workers"] if w != avoid]
            if others:
                kw = {"workers": others, "allow_other_workers": False}
        f = client.submit(_worker_task, p, params_f, device, ext, skip_existing, max_disparity, pure=False, **kw)
        attempts[f.key] = (p, attempt, f)
        return f

    report = summary.reporter(on_event)

    ac = as_completed()
    for p in (next(todo, None) for _ in range(window)):
        if p is not None:
            ac.add(submit(p))
    try:
        for fut in ac:
            p, attempt, _ = attempts.pop(fut.key)
            try:
                ev, counts = fut.result()
            except FutureCancelledError:
                continue
            except Exception as e:  # the worker died too often (KilledWorker) or the task could not run
                ev, counts = batch.failed_event(p, f"{type(e).__name__}: {e}"), None
            if ev["status"] == "failed" and attempt == 1 and not p.error:
                ac.add(submit(p, 2, avoid=ev.get("worker")))  # once more, elsewhere when there is an elsewhere
                continue
            ev["attempts"] = attempt
            report(ev, counts)
            nxt = next(todo, None)
            if nxt is not None:
                ac.add(submit(nxt))
    except KeyboardInterrupt:
        summary.interrupted = True
        # the pairs in flight finish (each output is whole or absent), nothing new is sent
        for p, _, fut in list(attempts.values()):
            try:
                ev, counts = fut.result(timeout=120)
            except Exception as e:
                ev, counts = batch.failed_event(p, f"{type(e).__name__}: {e}"), None
            report(ev, counts)
        raise
