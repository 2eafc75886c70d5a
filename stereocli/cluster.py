"""`stereo batch --scheduler`: the same batch on a Dask cluster (dask.distributed).

The client (the `stereo batch` process) pairs the files, then sends them to the
workers in chunks (chunk_size: paths and parameters, a few hundred bytes a pair). A
worker runs each chunk through the same runner as an in-process batch (batch.run:
reader threads decode ahead, writer threads encode and write, the matching runs on
its device meanwhile), writes the outputs itself and sends back only the events
(status, per-stage ms, metric sums). One task per pair would cost a scheduler round
trip per pair and lose the overlap of decoding, matching and encoding. Each worker
process keeps one backend, so it compiles (or loads) the kernels once and keeps its
GPU; two chunks run side by side in a worker, so that one decodes while the other
matches. `--scheduler local` starts a cluster on this machine: with CUDA, one worker
per GPU (CUDA_VISIBLE_DEVICES set per worker, as dask-cuda does); on the CPU, N
workers sharing the cores.

A pair that fails on a worker is tried once more on another worker before it is
reported; the chunks of a worker that dies are rescheduled by Dask (once, on a local
cluster; a remote scheduler follows its own `distributed.scheduler.allowed-failures`)
and then once more by us. At most a few chunks per worker are in flight, so the
scheduler stays small for any number of pairs, and Ctrl-C only waits for those.
"""
from __future__ import annotations

import os
import time
from concurrent.futures import ThreadPoolExecutor

from . import batch, io
from .errors import StereoError

WORKER_TASKS = 2  # chunks side by side in one local worker: one decodes while the other matches
# Per worker process, every match runs on this one thread: one at a time on the device,
# and always from the same thread (a CUDA context, or an OpenMP thread team, belongs to
# the thread that made it; with a team per calling thread, idle teams spin and take
# cores from the busy one: matches ran 1.8x slower in a worker before this).
_DEVICE = ThreadPoolExecutor(1, thread_name_prefix="stereo-device")


def _on_device(fn, *args, **kw):
    return _DEVICE.submit(fn, *args, **kw).result()


def _require_dask():
    try:
        import distributed  # noqa: F401
    except ImportError:
        raise StereoError("--scheduler needs Dask: pip install 'stereocli[dask]' "
                          "(or pip install 'dask[distributed]')") from None


# ------------------------------------------------------------------ on the worker

def _worker_chunk(pairs, params, device, ext, skip_existing, max_disparity, threads, png=batch.PNG_DEFAULT):
    """Runs on a worker: a chunk of pairs through the in-process batch runner (reader and
    writer threads overlapped with the matching, outputs written here) ->
    (events, summed metric counts or None, pairs evaluated). The backend is per process;
    chunks that run side by side in one worker take turns on its device."""
    from .backends import get_backend
    from .backends.cpu import tune_malloc
    try:
        from distributed import get_worker
        worker = get_worker()
        where, limit = worker.name, getattr(getattr(worker, "memory_manager", None), "memory_limit", None)
    except Exception:  # pragma: no cover - not inside a worker
        where = limit = None
    tune_malloc()  # (a Dask nanny starts its worker with MALLOC_TRIM_THRESHOLD_=65536: see there)
    backend = _on_device(get_backend, device)
    if limit and backend.name == "cpu":  # strips planned within the worker's memory limit (dask worker --memory-limit)
        backend.memory_limit = int(limit)
    events = []
    summary = batch.Summary()
    batch.run(pairs, params, backend, ext, threads=threads, skip_existing=skip_existing, on_event=events.append,
              max_disparity=max_disparity, summary=summary, compute=_on_device, png=png)
    for ev in events:
        ev["worker"] = str(where)
    return events, summary.metric_counts, summary.evaluated


def chunk_size(n_pairs: int, slots: int) -> int:
    """Pairs per task: about 4 tasks per worker thread, so that every worker stays busy to
    the end and a lost worker costs little, and at most CHUNK_MAX, so that events flow."""
    return max(1, min(CHUNK_MAX, -(-n_pairs // (4 * max(1, slots)))))


CHUNK_MAX = 32


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
        "nthreads": WORKER_TASKS, "env": envs[i], "silence_logs": 50, "memory_limit": 0}} for i in range(n)}
    # a pair whose worker dies is rerun once on another worker, then reported (KilledWorker)
    # the workers' statistical profiler takes the GIL every 10 ms from threads that are matching: off
    with dask.config.set({"distributed.worker.daemon": False, "distributed.scheduler.allowed-failures": 1,
                          "distributed.worker.profile.enabled": False}):
        cluster = SpecCluster(scheduler={"cls": Scheduler, "options": {"dashboard_address": None}},
                              workers=specs, silence_logs=40, asynchronous=False)
    return cluster


def run(pairs, params, device: str, ext: str, scheduler: str, *, workers: int | None = None, threads: int = 4,
        skip_existing: bool = False, on_event=None, max_disparity=None, summary=None, warn=None,
        png: str = batch.PNG_DEFAULT):
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
            client.wait_for_workers(len(cluster.workers), timeout=120)
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
            summary.startup_s = time.perf_counter() - start
            _run_with_client(client, pairs, params, device, ext, skip_existing, max_disparity, threads, summary,
                             on_event, warn, png)
    finally:
        if cluster is not None:
            cluster.close()
        io.remove_partial_writes(p.output for p in pairs)  # a worker killed while writing
        summary.seconds = time.perf_counter() - start
    return summary


def _run_with_client(client, pairs, params, device, ext, skip_existing, max_disparity, threads, summary, on_event,
                     warn, png):
    from distributed import as_completed

    from . import metrics

    info = client.scheduler_info(n_workers=-1)["workers"]
    nworkers = max(1, len(info))
    slots = sum(w.get("nthreads", 1) for w in info.values()) or 1
    window = slots + nworkers  # every worker thread busy, and one chunk queued on each worker
    size = chunk_size(len(pairs), slots)
    if warn:
        warn(f"sending {len(pairs)} pairs in chunks of {size} to {nworkers} Dask worker(s) at "
             f"{client.scheduler.address}")
    todo = (pairs[i:i + size] for i in range(0, len(pairs), size))
    attempts = {}  # future key -> (chunk, attempt, future): everything sent and not yet reported

    def submit(chunk, attempt=1, avoid=None):
        kw = {}
        if avoid:
            others = [a for a, w in client.scheduler_info(n_workers=-1)["workers"].items()
                      if str(w.get("name")) != avoid and a != avoid]
            if others:
                kw = {"workers": others, "allow_other_workers": False}
        # the parameters go with every chunk (a few hundred bytes), not scattered once: data
        # scattered to the workers lives only there, and when the one worker that held it
        # died before it was copied to another, the scheduler could not recover it and
        # every task waiting for it waited for ever (a batch hung after a killed worker,
        # about once in 60 runs of test_cluster's killed-worker test)
        f = client.submit(_worker_chunk, chunk, params, device, ext, skip_existing, max_disparity, threads, png,
                          pure=False, **kw)
        attempts[f.key] = (chunk, attempt, f)
        return f

    report = summary.reporter(on_event)

    def finish(chunk, attempt, result, ac):
        """Report a chunk's events; its failed pairs go once more to another worker."""
        if isinstance(result, Exception):  # the worker died too often (KilledWorker) or the task could not run
            if attempt == 1:
                ac.add(submit(chunk, 2))
                return
            result = ([batch.failed_event(p, f"{type(result).__name__}: {result}") for p in chunk], None, 0)
        events, counts, evaluated = result
        by_output = {str(p.output): p for p in chunk}
        retry = []
        for ev in events:
            p = by_output.get(ev["output"])
            if ev["status"] == "failed" and attempt == 1 and p is not None and not p.error:
                retry.append((p, ev.get("worker")))
                continue
            ev["attempts"] = attempt
            report(ev)
        for p, worker in retry:  # once more, elsewhere when there is an elsewhere
            ac.add(submit([p], 2, avoid=worker))
        if counts is not None:
            summary.metric_counts = metrics.add(summary.metric_counts, counts)
            summary.evaluated += evaluated

    ac = as_completed()
    for chunk in (next(todo, None) for _ in range(window)):
        if chunk is not None:
            ac.add(submit(chunk))
    try:
        for fut in ac:
            chunk, attempt, _ = attempts.pop(fut.key)
            try:
                result = fut.result()
            except Exception as e:  # the worker died, or the scheduler cancelled the task (FutureCancelledError,
                result = e  # e.g. when the client's connection dropped): sent once more, then reported as failed
            finish(chunk, attempt, result, ac)
            nxt = next(todo, None)
            if nxt is not None:
                ac.add(submit(nxt))
    except KeyboardInterrupt:
        summary.interrupted = True
        # the chunks in flight finish (each output is whole or absent), nothing new is sent
        for chunk, attempt, fut in list(attempts.values()):
            try:
                result = fut.result(timeout=300)
            except Exception as e:
                result = e
            finish(chunk, 2, result, None)  # no second attempt now
        raise
