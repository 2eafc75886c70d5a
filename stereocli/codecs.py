"""A batch's file work, one pair at a time: read and decode a pair (`load_pair`), encode
and write its map and extras (`save_result`), and `Workers`, which runs both in worker
processes.

Why processes (`stereo batch --io-processes N`; by default, auto, for GPU batches): on the
H200 machine's 16-core host a pair of the shared scenes (two 450x375 colour PNGs in,
one 16-bit PNG map out) costs 16-18 ms of one core's time in this work, against about
1 ms for its match, and threads in the batch's own process share one interpreter lock
with the matching thread. In `Workers` each read and each write is a task of a process
pool; the workers decode a pair and make it grey (`load_prepared`) into a shared
memory read slot, and encode a map from a write slot (files mapped by both sides: in
/dev/shm, or the temporary folder where /dev/shm has no room). Where the backend can
page-lock the slots (the GPU's pin_host), it uploads a pair straight from its read
slot and downloads the map straight into a write slot, so the matching process copies
nothing. Measured there (benchmarks/batch.py --device cuda --pairs 1600, code of
a709423): 15 processes 599-669 pairs/s, 14 608, 16 threads 521 (the file work alone
in 15 processes 801-823 pairs/s, in 16 threads 469). The pool's processes start in
the background as soon as it is made, and `stereo batch` makes it before its backend,
whose start hides theirs; so `--io-processes auto`, the default, uses them for GPU
batches (batch.auto_io_processes).

The workers are forked from a server process that has imported this module (numpy,
OpenCV) once, so they start in milliseconds; they never import Numba or touch a GPU.
A worker that dies (a decoder crashing on a hostile file) fails the pairs it had; the
pool is made again for the rest. Workers ignore Ctrl-C: the batch stops them.
"""
from __future__ import annotations

import atexit
import errno
import mmap
import os
import queue
import shutil
import signal
import tempfile
import threading
import time
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from types import SimpleNamespace

import numpy as np

from . import io, metrics
from .errors import StereoError


# ----------------------------------------------------------------------------- one pair

def load_pair(pair):
    """Decode one pair -> (left, right, ms)."""
    t = time.perf_counter()
    left = io.read_image(pair.left)
    if pair.right is None:
        left, right = io.split_side_by_side(left, pair.left)
    else:
        right = io.read_image(pair.right)
    return left, right, (time.perf_counter() - t) * 1e3


def load_prepared(pair):
    """Decode one pair and make it ready to match (io.prepare_pair: grey images) ->
    (io.PairInput, ms): a batch's readers do this, not its matching thread."""
    t = time.perf_counter()
    left, right, _ = load_pair(pair)
    return io.prepare_pair(left, right), (time.perf_counter() - t) * 1e3


def save_result(pair, disp, ext: str, max_disparity=None, seconds: float = 0.0, left=None, confidence=None,
                png: str = "small"):
    """Encode and write one map (a PNG as `png` says: io.PNG_COMPRESSIONS), evaluate it
    if it has ground truth -> (write ms, metric counts or None); `seconds` (the match's
    time) goes to the pair's time file if it has one, and the pair's extras (preview,
    depth, point cloud of the `left` image, `confidence` map, error picture) are written
    too."""
    t = time.perf_counter()
    io.write_file(pair.output, io.encode_disparity(disp, ext, png))
    if pair.time_file:
        io.write_file(pair.time_file, f"{seconds:.4f}\n".encode())
    if pair.extras:
        _write_extras(pair, disp, left, confidence)
    write_ms = (time.perf_counter() - t) * 1e3
    counts = None
    if pair.gt is not None:
        gt = io.read_disparity(pair.gt)
        counts = metrics.counts(disp, gt, max_disparity=max_disparity)
        if pair.extras and pair.extras["error_map"]:
            io.write_image(pair.extras["error_map"], metrics.error_image(disp, gt))
    return write_ms, counts


def _write_extras(pair, disp, left, confidence=None) -> None:
    from . import geometry
    x = pair.extras
    if x["confidence"]:
        io.write_file(x["confidence"], io.encode_disparity(confidence, ".pfm"))
    if x["preview"]:
        io.write_preview(x["preview"], disp, *x["range"])
    if x["depth"] or x["ply"]:
        focal, baseline, doffs, calib = x["camera"]
        if calib and not os.path.isabs(calib) and not os.path.exists(calib):  # a name: beside the left image
            calib = os.path.join(os.path.dirname(pair.left), calib)
        cam = geometry.camera(focal, baseline, doffs, calib)
        if cam is None:
            raise StereoError("--depth-dir and --ply-dir need --focal and --baseline, or --calib")
        if x["depth"]:
            io.write_disparity(x["depth"], geometry.depth(disp, cam))
        if x["ply"]:
            io.write_file(x["ply"], geometry.encode_ply(geometry.point_cloud(disp, left, cam)))


# ----------------------------------------------------------------------------- worker processes

_FIELDS = ("left", "right", "output", "gt", "time_file", "extras")


def _plain(pair) -> SimpleNamespace:
    """What a worker needs of a pair, without the batch module (which imports Numba)."""
    return SimpleNamespace(**{k: getattr(pair, k) for k in _FIELDS})


class _Slots:
    """Shared buffers handed out and back: each a file that the batch's process and the
    workers map. A slot is made larger (a new file) when something does not fit it."""

    RESERVE = 64 << 20  # of /dev/shm left to others

    def __init__(self, count: int, kind: str):
        self.kind = kind
        self.free: queue.Queue = queue.Queue()
        self.maps: dict[int, tuple[str, mmap.mmap]] = {}
        self.made = 0
        self.lock = threading.Lock()  # (the feeding thread and the matching thread both fit slots)
        self.pin = None  # pin(mmap) -> unpin function or None (set_pin)
        self.unpins: dict[int, object] = {}  # slot -> its unpin function
        for i in range(count):
            self.free.put(i)

    def set_pin(self, pin) -> None:
        """Page-lock every slot, now and as made, with pin(mmap) -> unpin or None (the
        GPU backend's pin_host: a graph then uploads a pair from its slot, no copy)."""
        with self.lock:
            if pin == self.pin:  # (a bound method is a new object at each look-up, and equal)
                return
            for i in list(self.unpins):
                self.unpins.pop(i)()
            self.pin = pin
            if pin is not None:
                for i, (_, m) in self.maps.items():
                    self._pin(i, m)

    def _pin(self, i: int, m: mmap.mmap) -> None:
        unpin = self.pin(m)
        if unpin is not None:
            self.unpins[i] = unpin

    def take(self, stop: threading.Event | None = None) -> int:
        while True:
            try:
                return self.free.get(timeout=0.1)
            except queue.Empty:
                if stop is not None and stop.is_set():
                    raise Stopped from None

    def give(self, i: int) -> None:
        self.free.put(i)

    def fit(self, i: int, nbytes: int) -> str | None:
        """Slot i's file, at least `nbytes` long (made anew if smaller), or None when no
        folder has the room (the caller then pickles the arrays instead)."""
        with self.lock:
            have = self.maps.get(i)
            if have is not None and len(have[1]) >= nbytes:
                return have[0]
            size = max(nbytes, 1 << 20) * 5 // 4  # (room for a slightly larger next pair)
            made = self._make(size)
            if made is None:
                return None
            self._drop(i)
            self.maps[i] = made
            if self.pin is not None:
                self._pin(i, made[1])
            return made[0]

    def array(self, i: int, shape, dtype, offset: int = 0) -> np.ndarray:
        return np.ndarray(shape, dtype, buffer=self.maps[i][1], offset=offset)

    def _make(self, size: int):
        self.made += 1
        name = f"stereocli-slot-{os.getpid()}-{id(self):x}{self.kind}{self.made}"
        for folder in _slot_folders(size + self.RESERVE):
            path = os.path.join(folder, name)
            try:
                fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
            except OSError:
                continue
            try:
                try:
                    os.posix_fallocate(fd, 0, size)  # the room is taken now: no SIGBUS on a full /dev/shm later
                except OSError as e:
                    if e.errno == errno.ENOSPC:
                        raise
                    os.ftruncate(fd, size)  # (a file system without fallocate)
                return path, mmap.mmap(fd, size)
            except OSError:
                os.unlink(path)
            finally:
                os.close(fd)
        return None

    def _drop(self, i: int) -> None:
        unpin = self.unpins.pop(i, None)
        if unpin is not None:
            unpin()
        old = self.maps.pop(i, None)
        if old is not None:
            try:
                os.unlink(old[0])
            except OSError:
                pass
            try:
                old[1].close()
            except BufferError:  # (an array over it is still alive: the mapping goes with it)
                pass

    def close(self) -> None:
        with self.lock:
            for i in list(self.maps):
                self._drop(i)


def _remove_stale_slots() -> None:
    """Slot files of batches whose process is gone (killed before it could remove them)."""
    for folder in ("/dev/shm", tempfile.gettempdir()):
        try:
            names = [n for n in os.listdir(folder) if n.startswith("stereocli-slot-")]
        except OSError:
            continue
        for name in names:
            try:
                os.kill(int(name.split("-")[2]), 0)
            except ProcessLookupError:
                try:
                    os.unlink(os.path.join(folder, name))
                except OSError:
                    pass
            except (ValueError, IndexError, OSError):  # (not ours, or a process of another user: alive)
                pass


def _slot_folders(need: int):
    """/dev/shm when it has `need` bytes free, then the temporary folder."""
    try:
        if shutil.disk_usage("/dev/shm").free >= need:
            yield "/dev/shm"
    except OSError:
        pass
    yield tempfile.gettempdir()


class Stopped(Exception):
    pass


_mapped: dict[str, mmap.mmap] = {}  # in a worker: the slot files it has mapped


def _view(path: str, shape, dtype, offset: int = 0) -> np.ndarray:
    m = _mapped.get(path)
    if m is None:
        if len(_mapped) > 256:  # (slots made larger leave old files behind)
            for old in _mapped.values():
                try:
                    old.close()
                except BufferError:
                    pass
            _mapped.clear()
        with open(path, "r+b") as f:
            m = _mapped[path] = mmap.mmap(f.fileno(), 0)
    return np.ndarray(shape, dtype, buffer=m, offset=offset)


WORKER_NICE = int(os.environ.get("STEREOCLI_IO_NICE", "10"))


PRESTART_HOLD_S = 0.1


def _start_processes(pool: ProcessPoolExecutor, n: int) -> None:
    """Have `pool` start its n processes: n tasks that each hold a process a moment, so
    that none is idle when the next is submitted (the pool then starts another)."""
    try:
        for f in [pool.submit(time.sleep, PRESTART_HOLD_S) for _ in range(n)]:
            f.result()
    except Exception:  # (a pool shut down or broken meanwhile: the batch sees it itself)
        pass


def _init_worker() -> None:
    import cv2
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the batch's: it stops us
    cv2.setNumThreads(1)  # one pair per process at a time; OpenCV's pool would only contend
    try:
        os.nice(WORKER_NICE)  # the matching thread first: it waits on the device between short bursts
    except OSError:
        pass


_SHIPPED = ("grey_left", "grey_right", "left")  # a PairInput's arrays that cross in a read slot


def _shipped(inp) -> list:
    """[(field, array)] of a PairInput that cross in a read slot: the left image only
    where it is not the grey one (an 8-bit grey left image is)."""
    return [(k, getattr(inp, k)) for k in _SHIPPED if not (k == "left" and inp.left is inp.grey_left)]


def _read_task(pair, path, room):
    """In a worker: decode and prepare the pair (load_prepared) into the slot file `path`
    (`room` bytes) -> (ms, {field: (shape, dtype str, offset)} when in the slot, else the
    PairInput itself, pickled)."""
    inp, ms = load_prepared(pair)
    arrays = _shipped(inp)
    if path is None or sum(a.nbytes for _, a in arrays) > room:
        return ms, inp
    out, offset = {"bad_left": inp.bad_left, "bad_right": inp.bad_right}, 0
    for k, a in arrays:
        _view(path, a.shape, a.dtype, offset)[...] = a
        out[k] = (a.shape, a.dtype.str, offset)
        offset += a.nbytes
    return ms, out


def _write_task(pair, disp, ext, max_disparity, seconds, left, confidence, png):
    """In a worker: save_result, with `disp` a (path, shape) of a slot or the array."""
    if isinstance(disp, tuple):
        disp = _view(disp[0], disp[1], np.float32)
    return save_result(pair, disp, ext, max_disparity, seconds, left, confidence, png)


class Read:
    """A pair being read by a worker: result() -> (io.PairInput, ms), its images views
    of a slot until release()."""

    def __init__(self, workers, future, slot):
        self._workers, self._future, self._slot = workers, future, slot

    def result(self):
        try:
            ms, got = self._future.result()
        except BaseException:
            self.release()
            raise
        if isinstance(got, io.PairInput):  # (did not fit: the slot is made larger for the next pair)
            self._workers.reads.fit(self._slot, sum(a.nbytes for _, a in _shipped(got)))
            return got, ms
        views = {k: self._workers.reads.array(self._slot, shape, np.dtype(dt), off)
                 for k, (shape, dt, off) in ((k, got[k]) for k in _SHIPPED if k in got)}
        left = views.get("left", views["grey_left"])
        return io.PairInput(left, views["grey_left"], views["grey_right"], got["bad_left"], got["bad_right"]), ms

    def cancel(self) -> bool:
        return self._future.cancel()

    def release(self) -> None:
        """The images are no longer used: the slot may take the next pair."""
        if self._slot is not None:
            self._workers.reads.give(self._slot)
            self._slot = None


class Workers:
    """A pool of `processes` codec workers with their slots; `read` and `write` start a
    pair's work, `close` ends them. Made once per process and count (`get`) and kept for
    later batches: a pool starts in about a third of a second."""

    _kept: dict = {}
    _lock = threading.Lock()

    @classmethod
    def get(cls, processes: int) -> Workers:
        with cls._lock:
            w = cls._kept.get(processes)
            if w is None:
                w = cls._kept[processes] = cls(processes)
            return w

    @classmethod
    def drop(cls, processes: int) -> None:
        """Close the kept pool of `processes` workers, if any (made, then not needed)."""
        with cls._lock:
            w = cls._kept.pop(processes, None)
        if w is not None:
            w.close()

    def __init__(self, processes: int):
        _remove_stale_slots()
        self.processes = processes
        self.reads = _Slots(processes + 2, "r")
        self.writes = _Slots(processes + 2, "w")
        self._pool = None
        self._start()

    def _start(self) -> None:
        import multiprocessing as mp
        try:
            ctx = mp.get_context("forkserver")
            # The server imports the main module once (so the workers, forked from it, do
            # not run it again each; a script that starts a batch needs the usual
            # `if __name__ == "__main__":`) and this module, with numpy and OpenCV.
            ctx.set_forkserver_preload(["__main__", __name__])
        except ValueError:  # (no forkserver on this system)
            ctx = mp.get_context("spawn")
        self._pool = ProcessPoolExecutor(self.processes, mp_context=ctx, initializer=_init_worker)
        # The pool makes its processes one a task as tasks come; start them all now, in the
        # background, so that they are ready when the first pairs are (the batch command
        # makes the pool before its backend, whose start this overlaps). H200 machine, 16
        # cores, `stereo batch --device cuda -n 64 --io-processes 15` over 400 / 1600 /
        # 4000 pairs of the shared scenes, the batch's own seconds, two rounds: 1.2-1.3 /
        # 2.9-3.0 / 6.1-6.2 s with the processes started as tasks came, 0.7-0.9 / 2.3-2.5 /
        # 5.6-5.9 started here (16 threads: 0.9 / 3.1-3.5 / 7.6-8.2).
        threading.Thread(target=_start_processes, args=(self._pool, self.processes), daemon=True,
                         name="stereo-pool-start").start()

    def _submit(self, fn, *args) -> Future:
        try:
            return self._pool.submit(fn, *args)
        except BrokenProcessPool:  # a worker died: the pairs it had failed; a new pool for the rest
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._start()
            return self._pool.submit(fn, *args)

    def read(self, pair, stop: threading.Event | None = None) -> Read:
        """Start decoding and preparing `pair` (waits for a free slot; raises Stopped
        when `stop` is set)."""
        slot = self.reads.take(stop)
        try:
            path = self.reads.fit(slot, 0)
            room = len(self.reads.maps[slot][1]) if path else 0
            return Read(self, self._submit(_read_task, _plain(pair), path, room), slot)
        except BaseException:
            self.reads.give(slot)
            raise

    def map_buffer(self, shape) -> tuple[int, np.ndarray] | None:
        """(slot, float32 array of `shape` in it): a write slot taken for the next map, for
        the match to put it straight there (pipeline.run_prepared's `out`; page-locked
        like the read slots where the backend can) and `write(..., slot=)` to hand it on
        without a copy; None where no folder has the room. Give it back with
        `writes.give(slot)` if it is not written."""
        slot = self.writes.take()
        path = self.writes.fit(slot, int(np.prod(shape)) * 4)
        if path is None:
            self.writes.give(slot)
            return None
        return slot, self.writes.array(slot, shape, np.float32)

    def write(self, pair, disp: np.ndarray, ext: str, max_disparity=None, seconds: float = 0.0, left=None,
              confidence=None, png: str = "small", slot: int | None = None) -> Future:
        """Start encoding and writing `disp` -> Future of save_result's (ms, counts).
        `disp` is in write slot `slot` (map_buffer), or is copied into a free one here.
        `left` and `confidence` (only for extras) are copied."""
        if slot is None:
            slot = self.writes.take()
        try:
            disp = np.asarray(disp, np.float32)
            path = self.writes.fit(slot, disp.nbytes)
            if path is not None:
                into = self.writes.array(slot, disp.shape, np.float32)
                if into.ctypes.data != disp.ctypes.data:
                    np.copyto(into, disp)
                disp = (path, disp.shape)
            else:
                disp = np.array(disp)
            left = None if left is None or not pair.extras else np.array(left)
            confidence = None if confidence is None else np.array(confidence)
            fut = self._submit(_write_task, _plain(pair), disp, ext, max_disparity, seconds, left, confidence,
                                png)
        except BaseException:
            self.writes.give(slot)
            raise
        fut.add_done_callback(lambda _: self.writes.give(slot))
        return fut

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None
        self.reads.close()
        self.writes.close()


@atexit.register
def _close_all() -> None:
    for w in Workers._kept.values():
        w.close()
    Workers._kept.clear()
