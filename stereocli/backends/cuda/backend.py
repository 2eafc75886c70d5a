"""CUDA backend: device arrays on one stream and the launches of the kernels of
stereocli/backends/cuda/ (one module per stage, named like stereocli/stages/).

Data stays on the GPU from upload to download. Allocation failures become a
StereoError that names the size asked for.
"""
import mmap
import os
import threading
import time
import weakref

import numpy as np
from numba import config as numba_config
from numba import cuda

from ...errors import StereoError
from ...stages import aggregate, cost, refine
from . import aggregate as kagg
from . import aggregate_bands as kband
from . import common as kc
from . import cost as kcost
from . import preprocess as kpre
from . import refine as kref
from . import select as ksel
from . import graphs, hostmem
from .launch import Launcher

_cu = None  # cuda.bindings' driver module, for the calls made without Numba's wrappers
if not kc.SIM:  # the simulator has no DeviceNDArray (and no pool)
    from numba.cuda.cudadrv import driver as _driver
    from numba.cuda.cudadrv.devicearray import DeviceNDArray

    try:
        from cuda.bindings import driver as _cu
    except ImportError:  # an older numba-cuda: Numba's event calls
        _cu = None


def _check(returned, what):
    """The result of a cuda.bindings driver call: raise as Numba's wrapper would on an error."""
    if returned[0] != _cu.CUresult.CUDA_SUCCESS:
        raise _driver.CudaAPIError(returned[0], f"Call to {what} results in {returned[0].name}")
    return returned[1] if len(returned) > 1 else None


class _Handle:
    """The gpu_data of a pooled array and of every array made from it: views and
    reshapes share it, slices hold it (their own handle refers to it), so it dies with
    the last of them, and then its buffer goes back to the pool. Cheaper than Numba's
    own view of the memory (a MemoryPointer and an OwnedPointer with a finalizer)."""
    __slots__ = ("_ptr", "_parent", "device_ctypes_pointer", "__weakref__")

    def __init__(self, ptr, parent=None):
        self._ptr = ptr
        self._parent = parent
        self.device_ctypes_pointer = ptr.device_ctypes_pointer

    def view(self, start, stop=None):
        return _Handle(self._ptr.view(start, stop), self)

    def __getattr__(self, name):
        return getattr(self._ptr, name)

# small images launch small grids on purpose; that is not the user's concern
numba_config.CUDA_LOW_OCCUPANCY_WARNINGS = 0


def gpu_summary():
    """[(key, value)] describing the current GPU, for `stereo info`."""
    if kc.SIM:
        return [("gpu", "none: Numba's CUDA simulator (NUMBA_ENABLE_CUDASIM=1), for tests only")]
    dev = cuda.get_current_device()
    free, total = cuda.current_context().get_memory_info()
    name = dev.name.decode() if isinstance(dev.name, bytes) else str(dev.name)
    return [("gpu", name), ("compute cap.", "%d.%d" % dev.compute_capability),
            ("gpu memory", f"{total / 2**30:.1f} GiB ({free / 2**30:.1f} GiB free)")]


def _grid2(h, w, bx=32, by=8):
    return ((w + bx - 1) // bx, (h + by - 1) // by), (bx, by)


def _grid1(n, tpb=kc.TPB):
    return (max(1, (n + tpb - 1) // tpb),), (tpb,)


class _Pool:
    """Device buffers kept for reuse by (shape, dtype): the next pair of a batch, or the
    next strip, of the same size allocates nothing (a cudaMalloc of the path volumes
    costs as much as a kernel). A buffer comes back when the last array over it is
    garbage (all work is on one stream, so later kernels run after earlier ones); at
    most half the device's memory is kept idle, and `release` (on an allocation that
    fails) frees it all."""

    def __init__(self):
        self.free = {}  # key -> [device memory]
        self.nbytes = 0  # held idle
        self.limit = 0  # most bytes held idle (set from the device's memory); beyond it, buffers are freed
        self.lock = threading.Lock()  # finalizers run on whichever thread collects

    def take(self, key):
        with self.lock:
            if self.free.get(key):
                mem = self.free[key].pop()
                self.nbytes -= mem.size
                return mem
        return None

    def give(self, key, mem):
        with self.lock:
            if self.nbytes + mem.size <= self.limit:
                self.free.setdefault(key, []).append(mem)
                self.nbytes += mem.size

    def release(self):
        with self.lock:
            self.free.clear()
            self.nbytes = 0


_POOL = _Pool()  # one per process, shared by every CudaBackend (they share the device)
_HOST_MAPS = None if kc.SIM else hostmem.HostMaps()  # pinned result maps, one pool per process
_LIVE = {}  # weak reference to a pooled array's _Handle -> (pool, key, memory), until it dies


def _give_back(ref):
    pool, key, mem = _LIVE.pop(ref, (None, None, None))
    try:
        pool.give(key, mem)
    except (ReferenceError, AttributeError):  # at exit, after Numba closed the context and freed the memory
        pass


class PathVolumes:
    """The result of CudaBackend.sgm, shape (k, h, w, n), added by the selection as it
    reads them: the sum over all paths (k = 1; uint16, or uint32 when D % 4 != 0), or with
    STEREOCLI_SGM_SUM=volumes one uint16 volume per path direction; `vec`: uint16 values
    written as packed uint64 words."""

    def __init__(self, sp, vec, ready=None):
        self.sp = sp
        self.vec = vec
        self.ready = ready  # [(first row, end row, events)] in the order they finish (see CudaBackend.select), or None

    @property
    def shape(self):
        return self.sp.shape[1:]


PAGE = mmap.PAGESIZE


def _touch_pages(host):
    """Write a byte of every page of `host` (about to receive a copy), while the GPU
    still works: a fresh array's pages are made by the OS at their first write, which
    otherwise happened inside the copy after the GPU had finished. H100 machine,
    6000x4000 / 320 in one strip, alternated in one process: download stage 26.8 ->
    14.7 ms, the match 233-237 -> 220-234 ms (with the larger upload staging)."""
    if host.nbytes >= 1 << 20 and host.flags.c_contiguous:
        host.reshape(-1).view(np.uint8)[::PAGE] = 0


_COPY_POOL = []
COPY_THREADS = min(4, os.cpu_count() or 1)


def _copy_pool():
    """The threads that copy large inputs into pinned memory (None on one core). NumPy
    releases the GIL inside a large copy."""
    if COPY_THREADS < 2:
        return None
    if not _COPY_POOL:
        from concurrent.futures import ThreadPoolExecutor
        _COPY_POOL.append(ThreadPoolExecutor(COPY_THREADS, thread_name_prefix="stereocli-upload"))
    return _COPY_POOL[0]


class CudaBackend:
    name = "cuda"

    def __init__(self):
        self.stream = cuda.stream()
        self._side = []  # _side_streams
        self._cost_rows = None  # (volume, [(first row, end row, event)]) of the last census volume made in parts
        self._events = []  # timing events free for reuse (recycle_marks)
        self._order_free, self._order_used = [], []  # ordering events free, and handed out since the last sync (_event)
        self._handles = {}  # id(side stream) -> (stream, the driver's handle)
        self._tables = {}  # per-size constant tables on the device (path lines, census scale)
        self._pool = _POOL
        self._launcher = Launcher()
        self._staging = [(None, None)] * self.STAGING_SLOTS  # (pinned buffer, event after its last copy)
        self._staged = 0  # the slot used last
        self._download_buf = None  # pinned, grown to the largest download
        self._pieces = (None, None)  # _upload_in_pieces' pinned buffer, and the event after its last copy
        self._like = {}  # (shape, dtype) -> attributes of a pooled array of that shape (_empty)
        self._graphs = {}  # key -> graphs.Graph, or "seen" (run once), or None (not captured)
        self._graph_events = set()  # ids of the events kept by graphs (never recycled)
        self._cap = None  # the graphs.Capture under way
        self._free = (float("-inf"), 0)  # (when, free bytes): free_memory's last reading
        self._marks_done = False  # the stream was synchronized after the last mark: their times are final
        if not kc.SIM and not _POOL.limit:
            _POOL.limit = cuda.current_context().get_memory_info()[1] // 2
        self._hstream = None if kc.SIM else _driver._stream_handle(self.stream)  # (the driver's handle)
        self.graphs = not kc.SIM and _cu is not None and graphs.enabled()  # (run_graph replays matches)

    def describe(self) -> str:
        return dict(gpu_summary()).get("gpu", "CUDA GPU")

    # ------------------------------------------------------------ memory
    def _empty(self, shape, dtype):
        """An uninitialised device array, from the pool when one of this shape is free."""
        if type(shape) is not tuple or not all(type(v) is int for v in shape):
            shape = tuple(int(v) for v in np.atleast_1d(shape))
        dtype = np.dtype(dtype)
        if kc.SIM:
            return self._allocate(shape, dtype)
        key = (shape, dtype.str)
        mem = self._pool.take(key)
        if mem is None:
            mem = self._allocate(shape, dtype).gpu_data
        handle = _Handle(mem)
        # a new array with the attributes of the last one of this shape (DeviceNDArray's
        # __init__ builds its index description anew each time: most of _empty's cost)
        like = self._like.get(key)
        if like is None:
            if len(self._like) > 256:  # a batch of many sizes
                self._like.clear()
            strides = dtype.itemsize * np.cumprod((1,) + shape[:0:-1])[::-1]  # C order
            like = dict(vars(DeviceNDArray(shape, tuple(int(v) for v in strides), dtype,
                                           stream=self.stream, gpu_data=mem)))
            # (not the memory itself: kept here, the first buffer of every shape would
            # outlive the pool's limit and its release on a failed allocation)
            del like["gpu_data"]
            self._like[key] = like
        arr = DeviceNDArray.__new__(DeviceNDArray)
        vars(arr).update(like)
        arr.gpu_data = handle
        _LIVE[weakref.ref(handle, _give_back)] = (self._pool, key, mem)
        if self._cap is not None:  # the graph uses it as long as the graph is kept
            self._cap.keep.append(arr)
        return arr

    def _allocate(self, shape, dtype):
        for attempt in range(2):
            try:
                return cuda.device_array(shape, dtype=dtype, stream=self.stream)
            except Exception as e:  # CudaAPIError / out of memory from the driver
                if attempt == 0 and not kc.SIM:  # give the pooled buffers back and try once more
                    self._pool.release()
                    cuda.current_context().deallocations.clear()
                    continue
                size = int(np.prod(shape)) * dtype.itemsize
                raise StereoError(f"the GPU could not allocate {size / 2**20:.0f} MiB ({e.__class__.__name__}); "
                                  f"use --max-memory to run in smaller strips, or --device cpu") from None

    STAGING_SLOTS = 4  # pinned host buffers used in turn (a match uploads the two images and the guide)
    # Larger arrays are copied from where they are. 32 MiB stages 8-bit images up to 33
    # MP: at 6000x4000 the weighted median's guide (24 MB), copied from pageable memory
    # in the middle of the match, made the host wait for the GPU (stage 10.1 -> 7.5 ms).
    STAGING_MAX_BYTES = 32 << 20

    def upload(self, a):
        """The array on the device, through a pinned staging buffer: a copy from pageable
        memory makes the host wait until the stream reaches it (a guide uploaded in the
        middle of a match waited for every kernel before it); from pinned memory it is
        only queued. The copy is the driver's call itself: Numba's copy_to_device first
        checks both arrays' layouts through views of them, about 0.1 ms."""
        return self._upload(a, False)

    def _upload(self, a, direct):
        """upload's work; `direct`: copied from where it is whatever its size (upload_inputs)."""
        source, a = a, np.ascontiguousarray(a)
        out = self._empty(a.shape, a.dtype)
        if a.nbytes == 0:
            return out
        if kc.SIM:
            out.copy_to_device(a, stream=self.stream)
            return out
        if self._cap is not None:  # a pinned buffer of the graph's own, refilled before each replay
            pinned = cuda.pinned_array(a.shape, a.dtype)
            np.copyto(pinned, a)
            self._h2d(out, pinned, a.nbytes)
            self._cap.uploaded(source, pinned)
            return out
        if direct or a.nbytes > self.STAGING_MAX_BYTES:
            self._h2d(out, a, a.nbytes)
            return out
        k = self._staged = (self._staged + 1) % self.STAGING_SLOTS
        buf, done = self._staging[k]
        if done is not None:
            done.synchronize()  # its last copy has left the buffer
        if buf is None or buf.size < a.nbytes:
            buf = cuda.pinned_array(max(a.nbytes, 1 << 20), np.uint8)
        host = buf[:a.nbytes].view(a.dtype).reshape(a.shape)
        np.copyto(host, a)
        self._h2d(out, host, a.nbytes)
        done = done or self._kept_event()
        self._record(done, self.stream)
        self._staging[k] = (buf, done)
        return out

    def upload_inputs(self, *arrays):
        """The arrays a strip starts from. When nothing is queued on the stream (a match's
        first strip, or a strip after one whose map the host waited for) they are copied
        straight from where they are: the driver stages a pageable copy in pieces while
        the bus carries the pieces before, quicker than our whole copy into a pinned
        buffer followed by the copy from it (H100, two images, best of 30: 2 x 2 MiB 0.40
        -> 0.29 ms, 2 x 8 MiB 1.60 -> 1.07; in a match, alternated processes, upload
        stage at 1920x1080 0.60-0.97 -> 0.42-0.60 ms, at 3840x2160 2.98-3.02 -> 2.07-2.44).
        With work queued, a pageable copy would make the host wait for it, so then they go
        through upload (and into a graph's own pinned buffers while one is captured)."""
        direct = not kc.SIM and _cu is not None and self._cap is None and self._stream_idle()
        if direct and sum(a.nbytes for a in arrays) >= self.UPLOAD_PIECES_MIN_BYTES and _copy_pool() is not None:
            return self._upload_in_pieces(arrays)
        return [self._upload(a, direct) for a in arrays]

    # Large inputs (two 1920x1080 images and up) go up in pieces: a few host threads copy
    # them into a pinned buffer, and each piece is queued for the bus as soon as it is
    # there, so the host copy runs at several cores' speed and the bus carries the pieces
    # before meanwhile (a pageable copy: the driver stages it through one thread). Two
    # 1920x1080 images (4.1 MB) went straight from pageable memory below 4 MiB; in pieces,
    # H100 machine, stereocli.match best of 30, three rounds alternated in one process:
    # upload stage 0.75-0.82 -> 0.71-0.75 ms, end to end 1920x1080 / 128 / 4 4.98-5.20 ->
    # 4.93-5.12, / 256 / 8 8.69-8.81 -> 8.45-8.67 (a slow start of the host). Smaller
    # volumes replay a CUDA graph, which copies its inputs itself.
    UPLOAD_PIECES_MIN_BYTES = 2 << 20
    UPLOAD_PIECE_BYTES = 1 << 20

    def _upload_in_pieces(self, arrays):
        arrays = [np.ascontiguousarray(a) for a in arrays]
        total = sum(a.nbytes for a in arrays)
        buf, done = self._pieces
        if done is not None:
            done.synchronize()  # the last inputs have left the buffer
        if buf is None or buf.size < total:
            buf = None
            buf = cuda.pinned_array(total, np.uint8)
        outs, jobs, base, pool = [], [], 0, _copy_pool()
        for a in arrays:
            out = self._empty(a.shape, a.dtype)
            outs.append(out)
            src = a.reshape(-1).view(np.uint8)
            dptr = out.device_ctypes_pointer.value
            for s in range(0, a.nbytes, self.UPLOAD_PIECE_BYTES):
                e = min(s + self.UPLOAD_PIECE_BYTES, a.nbytes)
                dst = buf[base + s:base + e]
                jobs.append((pool.submit(np.copyto, dst, src[s:e]), dptr + s, dst.ctypes.data, e - s))
            base += a.nbytes
        for job, dptr, hptr, n in jobs:
            job.result()
            _check(_cu.cuMemcpyHtoDAsync(dptr, hptr, n, self._hstream), "cuMemcpyHtoDAsync")
        done = done or self._kept_event()
        self._record(done, self.stream)
        self._pieces = (buf, done)
        return outs

    def _stream_idle(self):
        return _cu.cuStreamQuery(self._hstream)[0] == _cu.CUresult.CUDA_SUCCESS

    def _zeros(self, shape, dtype):
        out = self._empty(shape, dtype)
        if kc.SIM:
            out.copy_to_device(np.zeros(shape, dtype), stream=self.stream)
        else:
            _driver.device_memset(out, 0, out.nbytes, stream=self.stream)
        return out

    def to_float(self, a):
        """uint8 image -> float32 on the device."""
        h, w = a.shape
        out = self._empty((h, w), np.float32)
        self._launch2(kpre.to_float_kernel, h, w, a, out)
        return out

    DOWNLOAD_STAGING_MIN_BYTES = 16 << 20  # smaller maps come straight into pageable memory
    DOWNLOAD_STAGING_MAX_BYTES = 256 << 20

    def host_empty(self, shape, dtype):
        """A host array for a result map: large ones in pinned memory (hostmem), which
        download fills at the bus's speed without a second copy."""
        return np.empty(shape, dtype) if _HOST_MAPS is None else _HOST_MAPS.empty(shape, dtype)

    def pin_host(self, buffer):
        """Page-lock a host buffer in place (an mmap or a bytearray: a batch's read slot,
        which its worker processes fill) -> a function that unlocks it, or None where the
        driver refuses (then the buffer is copied as any pageable memory). A graph
        replayed on inputs in such a buffer uploads them from there: no host copy (graphs.Graph.feed)."""
        if kc.SIM or _cu is None or len(buffer) == 0:
            return None
        cuda.current_context()  # (the calling thread may be a batch's feeding thread: the context made current there)
        view = np.frombuffer(buffer, np.uint8)
        addr, nbytes = view.ctypes.data, view.nbytes
        del view  # (an export of the buffer would keep it from closing)
        err, = _cu.cuMemHostRegister(addr, nbytes, 0)
        if err != _cu.CUresult.CUDA_SUCCESS:
            return None
        hostmem.add_registered(addr, nbytes)

        def unpin():
            hostmem.remove_registered(addr)
            try:
                cuda.current_context()  # (as above: on whichever thread drops the slot)
                _cu.cuMemHostUnregister(addr)
            except Exception:  # (the context is gone at exit: so is the lock)
                pass
        return unpin

    def download(self, a, out=None, wait=True):
        """The array on the host (into `out` when given). Into a pinned `out`
        (host_empty's), straight, and with wait=False only queued: the pipeline's strips
        do not wait for each other's maps (see pipeline.run). Otherwise maps of 16 MiB or
        more come through a pinned buffer: a copy into pageable memory ran at about 2.5
        GB/s (3840x2160 float32: 13.2 ms; staged 6.2 ms). At 1920x1080 (8 MiB) staging
        gained nothing (1.47 ms against 0.86-1.56: the copy out of the buffer costs as
        much)."""
        if isinstance(a, PathVolumes):
            a = self.sum_paths(a)
        if self._cap is not None and out is not None and a._dummy.is_c_contig:
            pinned = cuda.pinned_array(a.shape, a.dtype)  # (copied into `out` after each replay)
            self._d2h(pinned, a, pinned.nbytes)
            self._cap.out_view = pinned
            self._cap.keep.append(pinned)
            return out
        if kc.SIM or not a._dummy.is_c_contig:
            host = a.copy_to_host(stream=self.stream)
            self.stream.synchronize()
        else:
            fits = out is not None and out.flags.c_contiguous and out.shape == a.shape and out.dtype == a.dtype
            host = out if fits else np.empty(a.shape, a.dtype)
            nbytes = host.nbytes
            if hostmem.is_pinned(host):
                self._d2h(host, a, nbytes)
                if wait:  # (pinned host memory is always `out`: an array made here is not pinned)
                    self.synchronize()
            elif self.DOWNLOAD_STAGING_MIN_BYTES <= nbytes <= self.DOWNLOAD_STAGING_MAX_BYTES:
                if self._download_buf is None or self._download_buf.size < nbytes:
                    self._download_buf = None  # (freed before the larger one is pinned)
                    self._download_buf = cuda.pinned_array(nbytes, np.uint8)
                staged = self._download_buf[:nbytes].view(a.dtype).reshape(a.shape)
                self._d2h(staged, a, nbytes)
                _touch_pages(host)  # while the GPU finishes
                self.synchronize()
                np.copyto(host, staged)
            else:
                _touch_pages(host)
                if nbytes:
                    self._d2h(host, a, nbytes)
                self.synchronize()
        if out is not None and host is not out:
            np.copyto(out, host)
            return out
        return host

    def recycle(self, *arrays):
        pass  # device buffers go back to the pool when the last array over them is garbage

    def synchronize(self):
        if self._cap is not None:
            return  # (a capture records work; nothing runs until the graph is launched)
        if _cu is None:
            self.stream.synchronize()
        else:
            _check(_cu.cuStreamSynchronize(self._hstream), "cuStreamSynchronize")
        self._marks_done = True
        if self._order_used:  # (every side stream's work joined the main stream before it ended)
            self._order_free += self._order_used
            self._order_used = []

    # Copies on the stream by the driver's calls themselves (C-contiguous arrays): Numba's
    # host_to_device and device_to_host look the stream up and wrap the call, several
    # times the call's own cost at the sizes of a match's images.
    def _h2d(self, dst, src, nbytes):
        if _cu is None:
            _driver.host_to_device(dst, src, nbytes, stream=self.stream)
        else:
            _check(_cu.cuMemcpyHtoDAsync(dst.device_ctypes_pointer.value, src.ctypes.data, nbytes, self._hstream),
                   "cuMemcpyHtoDAsync")

    def _d2h(self, dst, src, nbytes):
        if _cu is None:
            _driver.device_to_host(dst, src, nbytes, stream=self.stream)
        else:
            _check(_cu.cuMemcpyDtoHAsync(dst.ctypes.data, src.device_ctypes_pointer.value, nbytes, self._hstream),
                   "cuMemcpyDtoHAsync")

    def mark(self):
        """A CUDA event recorded on the stream (the simulator: the host clock, after a sync)."""
        if kc.SIM:
            self.stream.synchronize()
            return time.perf_counter()
        e = self._events.pop() if self._events else cuda.event(timing=True)
        self._marks_done = False
        if self._cap is not None:  # an event node that records when the graph runs
            _check(_cu.cuEventRecordWithFlags(e.handle, self._hstream,
                                              _cu.CUevent_record_flags.CU_EVENT_RECORD_EXTERNAL),
                   "cuEventRecordWithFlags")
            self._cap.keep.append(e)
            self._graph_events.add(id(e))
        else:
            self._record(e, self.stream)
        return e

    def recycle_marks(self, marks):
        """Events whose times were read go back to a free list: creating one costs
        about as much as launching a kernel, and a run leaves one after every stage."""
        if not kc.SIM:
            self._events.extend(m for m in marks if id(m) not in self._graph_events)

    # ------------------------------------------------------------ graphs
    def run_graph(self, key, inputs, out, timer, body):
        """body(timer): one strip of a match (uploading the host arrays `inputs`, each as
        passed here, and downloading its map into `out`), run as usual the first time
        `key` is seen, then captured as a CUDA graph and from then on replayed with the
        new inputs (graphs.py). The stage times go to `timer` either way."""
        entry = self._graphs.get(key, False)
        if entry is False or entry is None:  # the first time (or a key that could not be captured)
            if entry is False:
                if len(self._graphs) > 256:  # (a stream of many sizes: forget those only seen)
                    self._graphs = {k: g for k, g in self._graphs.items() if isinstance(g, graphs.Graph)}
                self._graphs[key] = "seen"
            body(timer)
            return
        if isinstance(entry, graphs.Graph):
            self._graphs[key] = self._graphs.pop(key)  # (the most recently used last)
            entry.feed(inputs)  # (copied into the graph's buffers, or read where they are when page-locked)
            self.recycle_marks([m for _, m in timer.marks])
            timer.marks = list(entry.marks)
        else:
            entry = self._capture(key, inputs, timer, body)
            if entry is None:
                body(timer)
                return
        direct = entry.retarget(out)  # a pinned map of the pool: the graph's copy fills it, no host copy
        _check(_cu.cuGraphLaunch(entry.exec, self._hstream), "cuGraphLaunch")
        self.synchronize()
        if not direct:
            np.copyto(out, entry.out_view)

    def _capture(self, key, inputs, timer, body):
        """body(timer) captured as key's graph (not yet launched; timer's marks are its
        events), or None when the capture fails (the key is then never captured again;
        timer is as it was)."""
        cap = graphs.Capture(inputs)
        before = list(timer.marks)
        _check(_cu.cuStreamBeginCapture(self._hstream, _cu.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_RELAXED),
               "cuStreamBeginCapture")
        self._cap = cap
        failed = False
        try:
            timer.marks = [(None, self.mark())]  # (the start of the match, in the graph)
            body(timer)
        except Exception:  # (body runs again as usual, and raises there if it must)
            failed = True
        finally:
            self._cap = None
            err, graph = _cu.cuStreamEndCapture(self._hstream)
        marks = list(timer.marks)
        exec_ = None
        if not failed and err == _cu.CUresult.CUDA_SUCCESS and cap.complete():
            err, exec_ = _cu.cuGraphInstantiate(graph, 0)
        if exec_ is None or err != _cu.CUresult.CUDA_SUCCESS:
            if graph is not None and int(graph) != 0:
                _cu.cuGraphDestroy(graph)
            for _, m in marks:
                self._graph_events.discard(id(m))
            timer.marks = before
            self._graphs[key] = None
            return None
        self.recycle_marks([m for _, m in before])
        entry = self._graphs[key] = graphs.Graph(_cu, graph, exec_, cap, marks)
        kept = [k for k, g in self._graphs.items() if isinstance(g, graphs.Graph)]
        for old in kept[:max(0, len(kept) - graphs.GRAPHS_KEPT)]:  # the least recently used go
            gone = self._graphs.pop(old)
            for _, m in gone.marks:
                self._graph_events.discard(id(m))
            gone.destroy()
        return entry

    def elapsed_ms(self, start, end):
        if kc.SIM:
            return (end - start) * 1e3
        if _cu is None:
            end.synchronize()
            return cuda.event_elapsed_time(start, end)
        if not self._marks_done:  # (after a synchronize the events are done: each call here lets other threads in)
            _check(_cu.cuEventSynchronize(end.handle), "cuEventSynchronize")
        return _check(_cu.cuEventElapsedTime(start.handle, end.handle), "cuEventElapsedTime")

    # How long a reading of the device's free memory is trusted (as the CPU backend's
    # AVAILABLE_TTL_S): the query cost 0.07 ms of a 1 ms match of the shared scenes on the
    # H200 machine, and with a batch's codec threads about twice that (the call lets them
    # take this thread's interpreter lock). The pool's free buffers are added fresh.
    FREE_TTL_S = 1.0

    def free_memory(self):
        now = time.monotonic()
        if now - self._free[0] > self.FREE_TTL_S:
            self._free = (now, cuda.current_context().get_memory_info()[0])
        return self._free[1] + self._pool.nbytes  # the pool's free buffers are given back when memory runs short

    def _launch(self, kernel, grid, block, *args):
        """kernel[grid, block, self.stream](*args), with Numba's host work done once (launch.Launcher)."""
        self._launcher.launch(kernel, grid, block, self.stream, *args)

    def _launch2(self, kernel, h, w, *args, bx=32, by=8):
        g, b = _grid2(h, w, bx, by)
        self._launch(kernel, g, b, *args)

    def _launch_rows(self, kernel, h, row, *args):
        """A volume kernel (common._volume_index): one grid row per image row of `row` elements."""
        if h > 65535:
            raise StereoError(f"the GPU kernels take images up to 65535 rows, not {h}; use --device cpu")
        self._launch(kernel, ((row + kc.TPB - 1) // kc.TPB, h), kc.TPB, *args)

    def _launch1(self, kernel, n, *args):
        g, b = _grid1(n)
        self._launch(kernel, g, b, *args)

    # ------------------------------------------------------------ preprocessing
    def dog(self, img, k1, k2):
        h, w = img.shape
        t1, t2, out = (self._empty((h, w), np.float32) for _ in range(3))
        self._launch2(kpre.conv_x_kernel, h, w, img, k1, t1)
        self._launch2(kpre.conv_x_kernel, h, w, img, k2, t2)
        self._launch2(kpre.dog_y_kernel, h, w, t1, t2, k1, k2, out)
        return out

    def bilateral(self, img, r, inv_ss, inv_sc):
        h, w = img.shape
        t, out = self._empty((h, w), np.float32), self._empty((h, w), np.float32)
        self._launch2(kpre.bilateral_x_kernel, h, w, img, r, inv_ss, inv_sc, t)
        self._launch2(kpre.bilateral_y_kernel, h, w, t, r, inv_ss, inv_sc, out)
        return out

    def subtract_mean(self, img, mean):
        h, w = img.shape
        out = self._empty((h, w), np.float32)
        self._launch2(kpre.subtract_mean_kernel, h, w, img, mean.reshape(h, w), out)
        return out

    # ------------------------------------------------------------ costs
    def census_codes(self, left, right, min_d, ndisp, wx, wy, paths):
        """None (the SGM kernels read a stored volume, which the pipeline then asks
        census_volume for), except where SGM will run the horizontal pair first before
        bands (8 paths: aggregate_bands.horizontal_first; 4 paths: use_bands4): then the
        volume, made in parts of rows (kcost.cost_parts), for the pair to start on each
        part as it is made."""
        h, w = left.shape
        if self._sgm_plan(ndisp, paths, h * w * ndisp)[3]:
            return self._census_volume(left, right, min_d, ndisp, wx, wy, kcost.cost_parts(ndisp, paths, h * w * ndisp))
        return None

    @staticmethod
    def _sgm_plan(n, paths, cells):
        """How sgm runs n disparities over `paths` directions and `cells` cells: (8 paths
        in bands, 4 paths in bands, 4 paths as the pairs apart, the horizontal pair alone
        before bands)."""
        vec = kagg.sgm_shape(n)[2]
        bands = kagg.SGM_ATOMIC and kband.use_bands(n, paths, cells, vec)
        bands4 = kagg.SGM_ATOMIC and kband.use_bands4(n, paths, cells, vec)
        apart = kagg.SGM_ATOMIC and not bands and not bands4 and kagg.pairs_apart(paths, cells)
        return bands, bands4, apart, (bands and kband.horizontal_first(cells)) or bands4

    def census_strings(self, left, right, wx, wy):
        """The census strings of both images (uint64 each, census_at's): 8-bit images by
        the kernel that compares four pixels at once, others through a float32 tile."""
        h, w = left.shape
        cl, cr = self._empty((h, w), np.uint64), self._empty((h, w), np.uint64)
        if left.dtype == np.uint8 and right.dtype == np.uint8 and wy <= kcost.CENSUS8_MAX_ROWS:
            census, per = kcost.census8_kernel_for(wx, wy), 4  # (four pixels a thread)
        else:
            tiled = left.dtype in (np.float32, np.uint8, np.uint16) and right.dtype == left.dtype
            census, per = kcost.census_kernel_for(wx, wy, tiled), 1
        bx, by = kcost.CENSUS_BLOCK
        self._launch(census, ((w + per * bx - 1) // (per * bx), (h + by - 1) // by, 2), (bx, by), left, right, cl, cr)
        return cl, cr

    def census_volume(self, left, right, min_d, ndisp, wx, wy):
        return self._census_volume(left, right, min_d, ndisp, wx, wy, 1)

    def _census_volume(self, left, right, min_d, ndisp, wx, wy, parts):
        """The census volume (uint8 h x w x ndisp); in `parts` launches of rows, each
        followed by an event listed in _cost_rows (for _horizontal_first), where the
        kernel with a thread per pixel makes it."""
        h, w = left.shape
        cl, cr = self.census_strings(left, right, wx, wy)
        vol = self._empty((h, w, ndisp), np.uint8)
        self._cost_rows = None
        if ndisp % 8 == 0 and ndisp <= kcost.TILE_MAX_D:
            kernel, tiles = kcost.census_volume_px_kernel_for(wx * wy - 1), (w + kcost.PX_TILE - 1) // kcost.PX_TILE
            made = []
            for y0, y1 in kcost.row_chunks(h, parts):
                self._launch(kernel, (tiles, y1 - y0), kcost.PX_THREADS, cl, cr, min_d, vol.view(np.uint64), np.int32(y0))
                if parts > 1:
                    made.append((y0, y1, self._event()))
                    self._record(made[-1][2], self.stream)
            if len(made) > 1:
                self._cost_rows = (vol, made)
        elif ndisp % 4 == 0 and not kc.SIM:
            self._launch_rows(kcost.census_volume4_kernel, h, w * ndisp // 4, cl, cr, min_d,
                              self._census_scale(wx * wy - 1), vol.view(np.uint32))
        else:
            self._launch_rows(kcost.census_volume_kernel, h, w * ndisp, cl, cr, min_d,
                              self._census_scale(wx * wy - 1), vol)
        return vol

    def _census_scale(self, nbits):
        key = ("census", nbits)
        if key not in self._tables:
            self._tables[key] = self.upload(cost.census_scale(nbits))
        return self._tables[key]

    def diff_volume(self, left, right, min_d, ndisp, kind):
        h, w = left.shape
        vol = self._empty((h, w, ndisp), np.float32)
        self._launch_rows(kcost.diff_volume_kernel, h, w * ndisp, left, right, min_d, kind, vol)
        return vol

    def box_mean(self, vol, rx, ry):
        h, w, n = vol.shape
        tmp, out = self._empty((h, w, n), np.float32), self._empty((h, w, n), np.float32)
        self._launch1(kcost.box_x_kernel, h * n, vol, rx, tmp)
        inv = np.float32(1.0 / ((2 * rx + 1) * (2 * ry + 1)))
        self._launch1(kcost.box_y_kernel, w * n, tmp, ry, inv, out)
        return out

    def finalize_volume(self, m, min_d, kind, ml, ml2, mr, mr2):
        h, w, n = m.shape
        vol = self._empty((h, w, n), np.uint8)
        self._launch_rows(kcost.finalize_kernel, h, w * n, m, min_d, kind, ml, ml2, mr, mr2, vol)
        return vol

    def table_volume(self, ql, qr, table, min_d, ndisp):
        h, w = ql.shape
        vol = self._empty((h, w, ndisp), np.uint8)
        self._launch_rows(kcost.table_volume_kernel, h, w * ndisp, ql, qr, table, min_d, vol)
        return vol

    def joint_histogram(self, ql, qr, disp):
        h, w = ql.shape
        hist = self._zeros((256, 256), np.int32)
        self._launch2(kcost.joint_histogram_kernel, h, w, ql, qr, disp, hist)
        return self.download(hist).astype(np.float64)

    # ------------------------------------------------------------ aggregation
    def box_u8(self, vol, r):
        h, w, n = vol.shape
        tmp, out = self._empty((h, w, n), np.int32), self._empty((h, w, n), np.uint8)
        self._launch1(kagg.box_u8_x_kernel, h * n, vol, r, tmp)
        self._launch1(kagg.box_u8_y_kernel, w * n, tmp, r, out)
        return out

    def sgm(self, vol, guide, p1, p2, adaptive, paths):
        """-> PathVolumes: every path line adds its costs to one sum volume with atomic
        adds of packed words (3 bytes per cell with the cost volume, against 17 for a volume
        per direction; 2-10 % more kernel time at 1920x1080, less at the KITTI size: see
        aggregate.SGM_ATOMIC). 8 paths at large sizes: the six vertical and diagonal paths
        in bands (aggregate_bands) and the horizontal pair beside or before them; 4 paths
        at large sizes: the horizontal pair, then the vertical pair in bands
        (aggregate_bands.use_bands4: disparities a multiple of 128), else the vertical
        pair, then the horizontal pair (aggregate.pairs_apart). Where the horizontal pair runs
        first, it starts on the census volume's parts of rows as they are made
        (census_codes, _horizontal_first). With bands, from
        select.SELECT_WITH_BANDS_MIN_CELLS (4 paths: always), the result lists the ranges
        of rows in the order the bands finish them, each with the events to wait for
        (PathVolumes.ready), so that the selection can start before the last band."""
        h, w, n = vol.shape
        if n > kc.MAX_SGM_DISPARITIES:
            raise StereoError(f"the CUDA SGM handles at most {kc.MAX_SGM_DISPARITIES} disparities, not {n}; "
                              f"use --device cpu")
        pairs = aggregate.direction_pairs(paths)
        vec = kagg.sgm_shape(n)[2]
        bands, bands4, apart, horizontal_first = self._sgm_plan(n, paths, h * w * n)
        first = horizontal_first or apart
        if kagg.SGM_ATOMIC:  # (first: the pair launched first stores where it comes first, so no zeros)
            sp = (self._empty if first else self._zeros)((1, h, w, n), np.uint16 if vec else np.uint32)
        else:
            sp = self._empty((2 * len(pairs), h, w, n), np.uint16)
        c1 = vol.view(np.uint32).reshape(vol.size // 4) if vec else vol.reshape(vol.size)  # flat
        p2t = self._p2_table(p1, p2, adaptive)
        g1, s1 = guide.reshape(h * w), self._rows(sp, vec)
        args = (c1, g1, h, w, n, p1, p2t, s1)
        if bands4:  # the horizontal pair storing, then the vertical pair in bands of one walk a group
            return PathVolumes(sp, vec, self._horizontal_then_bands(args, paths, vol, vec, nw=1))
        if apart:
            self._sgm_lines(args, paths, "rest", self.stream, first_store=True)
            self._sgm_lines(args, paths, "horizontal", self.stream)
        elif not bands:
            self._sgm_lines(args, paths, "all", self.stream)
        elif first:
            return PathVolumes(sp, vec, self._horizontal_then_bands(args, paths, vol, vec))
        else:  # the horizontal pair on a side stream, beside the bands
            side = self._side_streams(1)[0]
            self._fork([side])
            self._sgm_lines(args, paths, "horizontal", side, horizontal=True)
            ready = self._sgm_bands(c1, g1, h, w, n, p1, p2t, self._row0(s1), vec)
            if ready:  # every range waits for the pair too (side holds nothing after it)
                horizontal_done = self._event()
                self._record(horizontal_done, side)
                ready = [(y0, y1, events + [horizontal_done]) for y0, y1, events in ready]
            self._join([side])
            return PathVolumes(sp, vec, ready)
        return PathVolumes(sp, vec)

    def _sgm_lines(self, args, paths, part, stream, first_store=False, horizontal=False, lines=None):
        """One launch of the SGM line kernel over the path lines of `part` (_lines) on
        `stream`, or over lines[0]:lines[1] of them; args: (flat costs, flat guide, h, w,
        n, p1, P2 table, sum rows)."""
        h, w, n = args[2:5]
        dirs, starts = self._lines(h, w, paths, part)
        kernel, G, _ = kagg.sgm_kernel_for(n, starts.shape[0], first_store=first_store, horizontal=horizontal,
                                           cells=h * w * n)
        if lines is not None:  # (the slice kept with the tables: slicing a device array costs more than a launch)
            key = (h, w, paths, part, lines)
            if key not in self._tables:
                self._tables[key] = starts[lines[0]:lines[1]]
            starts = self._tables[key]
        per_block = kagg.sgm_lines_per_block(G)
        threads = G if kc.SIM else 32 * kc.SGM_WARPS
        self._launcher.launch(kernel, (starts.shape[0] + per_block - 1) // per_block, threads, stream,
                              *args, dirs, starts)

    def _horizontal_then_bands(self, args, paths, vol, vec, nw=3):
        """The horizontal pair first (_horizontal_first), then the other paths in bands
        (_sgm_bands: the six others, or with nw = 1 the vertical pair of 4 paths, whose
        selection always follows the bands); returns _sgm_bands' ranges of rows."""
        c1, g1, h, w, n, p1, p2t, s1 = args
        parts = self._horizontal_first(args, paths, vol, horizontal=nw == 3 or kband.pair4_horizontal_shape(n))
        ready = self._sgm_bands(c1, g1, h, w, n, p1, p2t, self._row0(s1), vec, parts, nw=nw,
                                overlap=True if nw == 1 else None)
        if parts:
            self._join(parts[1])
        return ready

    def _horizontal_first(self, args, paths, vol, horizontal=True):
        """The horizontal pair alone, storing where its walks come first (before the
        bands). Where census_volume made `vol` in parts of rows (its _cost_rows), each
        part's lines start on a side stream as soon as that part is made, while the
        census goes on with the next (the horizontal lines are in row order); then the
        result is (the parts' rows and events when done, their streams) for _sgm_bands to
        follow, else None. `horizontal`: the line kernel's shape for the pair alone
        (aggregate.sgm_shape; the 4-path pair: aggregate_bands.pair4_horizontal_shape)."""
        parts, self._cost_rows = self._cost_rows, None
        if parts is None or parts[0] is not vol:
            self._sgm_lines(args, paths, "horizontal", self.stream, first_store=True, horizontal=horizontal)
            return None
        skip = 2 + ksel.SELECT_STREAMS  # (the bands' and the selection's side streams)
        sides = self._side_streams(skip + len(parts[1]))[skip:]
        done = []
        for (y0, y1, made), side in zip(parts[1], sides):
            self._wait(made, side)
            self._sgm_lines(args, paths, "horizontal", side, first_store=True, horizontal=horizontal, lines=(y0, y1))
            if kband.FOLLOW_HORIZONTAL:
                done.append((y0, y1, self._event()))
                self._record(done[-1][2], side)
        if not done:
            self._join(sides)
            return None
        return done, sides

    def _fork(self, streams):
        """The side streams wait for what the main stream has queued so far."""
        ready = self._event()
        self._record(ready, self.stream)
        for st in streams:
            self._wait(ready, st)

    def _join(self, streams):
        """The main stream waits for what the side streams have queued so far."""
        for st in streams:
            done = self._event()
            self._record(done, st)
            self._wait(done, self.stream)

    def _sgm_bands(self, c1, g1, h, w, n, p1, p2t, s1, vec, horizontal=None, nw=3, overlap=None):
        """The six vertical and diagonal paths in bands of rows (aggregate_bands), adding
        into the flat sum s1: the bands from the top for the paths from above, and from
        the bottom for the paths from below, each band starting from the carry the band
        before left. kband.SWEEPS_AT_ONCE: the two sweeps run at once, the one from below
        on a side stream with its own carry (their atomic adds commute). Returns, when the
        selection follows the bands (`overlap`, by default select.select_with_bands), the
        ranges of rows in the order they finish with the events of the bands each waits
        for; else None. `horizontal`: ([(first row, end row, event)], streams) of the
        horizontal pair's parts still running (_horizontal_first): each band waits for the
        parts of its rows only (the pair stores where the bands add), not for the whole
        pair. nw = 1: the vertical paths alone (4 paths), a walk a group."""
        R = kband.rows_a_band(n, h * w * n) if nw == 3 else kband.band4_shape(h * w * n)[1]
        kernel, per_block, threads = kband.band_kernel_for(n, vec, kband.walks(h, w, 0, 1, R, nw), kagg._sm_count(), nw,
                                                           h * w * n)
        at_once = kband.SWEEPS_AT_ONCE and not kc.SIM
        # [sweep][turn]: the carry (uint16 pairs) and the minima, each an array of its own
        # (a slice of one device array costs more host time than a launch: Numba's
        # indexing; the pool hands out buffers of one shape as cheaply as a launch)
        turns = [[(self._empty((nw * w * n // 2,), np.uint32), self._empty((nw * w,), np.int32)) for _ in (0, 1)]
                 for _ in range(2 if at_once else 1)]
        if not at_once:
            turns.append(turns[0])  # the sweep from below after the one from above, in the same carry
        streams = [self.stream, self.stream]
        overlap = ksel.select_with_bands(h * w * n) if overlap is None else overlap
        if at_once:
            streams[1] = self._side_streams(2)[1]
            self._fork(streams[1:])  # the volume, the sum and what came before on the main stream
        nb = (h + R - 1) // R
        order = [(b, k) for b in range(nb) for k in (0, 1)] if at_once else [(b, k) for k in (0, 1) for b in range(nb)]
        done = {}
        waited = [set(), set()]  # [sweep]: the horizontal parts its stream has waited for
        for b, k in order:
            dy = 1 - 2 * k
            ys = b * R if dy > 0 else h - 1 - b * R
            if horizontal:
                lo, hi = (ys, ys + R) if dy > 0 else (ys - R + 1, ys + 1)
                for i, (y0, y1, part_done) in enumerate(horizontal[0]):
                    if y0 < hi and y1 > lo and i not in waited[k]:
                        self._wait(part_done, streams[k])
                        waited[k].add(i)
            blocks = (kband.walks(h, w, ys, dy, R, nw) + per_block - 1) // per_block
            (c_in, m_in), (c_out, m_out) = turns[k][(b + 1) & 1], turns[k][b & 1]  # (b == 0: c_in unread)
            self._launcher.launch(kernel, blocks, threads, streams[k], c1, g1, h, w, n, p1, p2t, s1, ys, R, dy,
                                  c_in, m_in, c_out, m_out, b == 0)
            if overlap:
                done[b, k] = self._event()
                self._record(done[b, k], streams[k])
        if at_once:
            self._join(streams[1:])
        if not overlap:
            return None
        return [(y0, y1, [done[b, k] for b, k in bands])
                for y0, y1, bands in kband.finished_rows(h, R, tuple(order))]

    def mgm(self, vol, guide, p1, p2, adaptive, paths):
        """More Global Matching: a launch per pass (kagg._make_mgm_kernel: tiles of lines
        as a wavefront), the passes at once on their own streams, each adding its costs
        into S (uint16, zeroed first) with atomic adds."""
        h, w, n = vol.shape
        if n > kagg.MGM_MAX_DISPARITIES:
            raise StereoError(f"the CUDA MGM handles at most {kagg.MGM_MAX_DISPARITIES} disparities, not {n}; "
                              f"use --device cpu")
        kernel, _ = kagg.mgm_kernel_for(n)
        cells = h * w * n
        S2 = self._zeros((cells + cells % 2,), np.uint16)  # (an even count: pairs for the uint32 atomics)
        passes = aggregate.MGM_PASSES[:paths]
        T = kagg.MGM_TILE
        tiles = (max(h, w) + T - 1) // T
        per = max((h + T - 1) // T * w, (w + T - 1) // T * h)  # tiles x steps of a pass, by rows or columns
        Lg = self._empty((len(passes), per * n), np.uint16)  # [pass]: each tile's last line (ld.global.cg)
        Mg = self._empty((len(passes), per), np.int32)
        progress = self._zeros((len(passes), tiles), np.int32)
        tickets = self._zeros((len(passes), 1), np.int32)
        p2tab = self._p2_table(p1, p2, adaptive)
        streams = self._side_streams(len(passes))
        self._fork(streams)  # the volume, S's zeros and the tables before any pass
        for k, (a, b) in enumerate(passes):
            row_major, su, sv, (adu, adv), (bdu, bdv) = aggregate.mgm_plan(a, b)
            lines = h if row_major else w
            self._launcher.launch(
                kernel, (lines + T - 1) // T, T * kagg.MGM_LANES, streams[k],
                vol.reshape(cells), guide.reshape(h * w), h, w, n, p1, p2tab, S2.view(np.uint32), Lg[k], Mg[k],
                progress[k], tickets[k], row_major, su, sv, adu, adv, bdu, bdv)
        self._join(streams)  # what follows on the main stream waits for every pass
        return S2[:cells].reshape(h, w, n)

    def _side_streams(self, k):
        """k streams besides the main one, made once (MGM's passes run on them at once)."""
        while len(self._side) < k:
            self._side.append(self.stream if kc.SIM else cuda.stream())
        return self._side[:k]

    def _event(self):
        """An event without timing, for the order between streams within a match. From a
        free list: making one (Numba's event, its finalizer, the context lookup) costs
        about as much host time as a launch, and a match at 1920x1080 / 128 / 4 used 36,
        while the host's queuing of the match took longer than the GPU's work (H100 machine:
        3.2 ms of host time for the cost, SGM, selection and LR check, against 2.65 ms of
        kernels). Every event handed out goes back to the list at the next synchronize():
        the side streams join the main stream before it is waited for, so by then every
        record of the event has passed; a wait queued before a later record is not moved
        by it (CUDA waits for the record last queued when the wait is queued), and one
        queued after it, for a holder of the old record, waits for a later point: longer,
        never too little. The simulator's events take no arguments and are not kept."""
        if kc.SIM:
            return cuda.event()
        e = self._order_free.pop() if self._order_free else cuda.event(timing=False)
        self._order_used.append(e)
        return e

    def _kept_event(self):
        """An event without timing that its holder keeps across matches (the staging
        buffers' last copies): never from or into _event's list."""
        return cuda.event() if kc.SIM else cuda.event(timing=False)

    def _stream_handle(self, stream):
        """The driver's handle of one of the backend's streams (looked up once)."""
        if stream is self.stream:
            return self._hstream
        h = self._handles.get(id(stream))
        if h is None or h[0] is not stream:
            h = self._handles[id(stream)] = (stream, _driver._stream_handle(stream))
        return h[1]

    def _record(self, e, stream):
        """e.record(stream) by the driver's call itself (Numba's wrapper and stream lookup cost more than it)."""
        if kc.SIM or _cu is None:
            e.record(stream)
        else:
            _check(_cu.cuEventRecord(e.handle, self._stream_handle(stream)), "cuEventRecord")

    def _wait(self, e, stream):
        """e.wait(stream): the stream's later work waits for e's last record."""
        if kc.SIM or _cu is None:
            e.wait(stream)
        else:
            _check(_cu.cuStreamWaitEvent(self._stream_handle(stream), e.handle, 0), "cuStreamWaitEvent")

    @staticmethod
    def _row0(rows):
        """The first of _rows' rows (a reshape where it is the only one: cheaper on the host than Numba's indexing)."""
        return rows.reshape(rows.size) if rows.shape[0] == 1 else rows[0]

    @staticmethod
    def _rows(sp, vec):
        """Direction volumes (k, h, w, n) as k flat rows: of uint64 words of four values (vec), or of values."""
        v = sp.view(np.uint64) if vec else sp
        return v.reshape(v.shape[0], v.size // v.shape[0])

    def sum_paths(self, paths):
        """The summed aggregation volume (h, w, n) uint16 of a PathVolumes (for tests and downloads)."""
        sp = paths.sp
        _, h, w, n = sp.shape
        s = self._empty((h, w, n), np.uint16)
        if paths.vec:
            self._launch_rows(kagg.sgm_sum4_kernel, h, w * n // 4, sp.view(np.uint64), s.view(np.uint64))
        else:
            self._launch_rows(kagg.sgm_sum_kernel, h, w * n, sp, s)
        return s

    def _p2_table(self, p1, p2, adaptive):
        """P2 for every grey step 0..255, from the shared penalty2 (so the values are the CPU's)."""
        key = ("p2", p1, p2, bool(adaptive))
        if key not in self._tables:
            self._tables[key] = self.upload(aggregate.p2_table(p1, p2, adaptive))
        return self._tables[key]

    def _lines(self, h, w, paths, part="all"):
        """Device tables of the path lines for an image size, built once: (dirs, starts);
        `part`: every direction pair's lines ("all"), the horizontal pair's ("horizontal")
        or the other pairs' ("rest")."""
        key = (h, w, paths, part)
        if key not in self._tables:
            pairs = aggregate.direction_pairs(paths)
            pairs = {"all": pairs, "horizontal": pairs[:1], "rest": pairs[1:]}[part]
            starts = np.concatenate([np.column_stack([st, np.full(len(st), q)])
                                     for q, (dx, dy) in enumerate(pairs)
                                     for st in [aggregate.line_starts(h, w, dx, dy)]]).astype(np.int32)
            starts = starts[np.argsort(-self._line_lengths(starts, pairs, h, w), kind="stable")]  # long first
            self._tables[key] = (self.upload(np.array(pairs, np.int32)), self.upload(starts))
        return self._tables[key]

    @staticmethod
    def _line_lengths(starts, pairs, h, w):
        """Number of pixels on each line, to launch the long ones first."""
        dxy = np.array(pairs)[starts[:, 2]]
        steps = np.full(len(starts), np.iinfo(np.int64).max)
        for axis, size, col in ((0, h, 1), (1, w, 0)):
            dv = dxy[:, col]
            pos = starts[:, axis].astype(np.int64)
            lim = np.where(dv > 0, (size - 1 - pos) // np.maximum(dv, 1),
                           np.where(dv < 0, pos // np.maximum(-dv, 1), np.iinfo(np.int64).max))
            steps = np.minimum(steps, lim)
        return steps + 1

    def sgm_bytes_per_element(self, paths):
        if kagg.SGM_ATOMIC:
            return 2  # the sum, as on the CPU (uint32 when D % 4 != 0), so --max-memory plans the same strips
        return 2 * paths  # one uint16 volume per direction; their sum is never stored

    # ------------------------------------------------------------ selection
    def select(self, agg, min_d, uniqueness, subpixel, right, confidence=False):
        """(left disparity, right disparity or None, confidence or None) from an aggregated
        volume or the PathVolumes of sgm, in one pass (select._make_select_kernel). Where
        sgm's bands listed the ranges of rows as they finish them (PathVolumes.ready,
        select.select_with_bands), each range is selected on a side stream once its bands
        have run, and the main stream waits for all of them."""
        if isinstance(agg, PathVolumes):
            V, vec, ready = self._rows(agg.sp, agg.vec), agg.vec, agg.ready
        else:
            V, vec, ready = agg.reshape(1, agg.size), False, None
        h, w, n = agg.shape
        if n > 1 << ksel.KEY_SHIFT:  # key = cost << KEY_SHIFT | d, cost < 2**16
            raise StereoError(f"the CUDA selection takes at most {1 << ksel.KEY_SHIFT} disparities, not {n}; "
                              f"use --device cpu")
        out = self._empty((h, w), np.float32)
        out_r = self._empty((h, w), np.float32) if right else out
        out_c = self._empty((h, w), np.float32) if confidence else out
        kernel = ksel.select_kernel_for(vec, n, V.shape[0])
        args = (V, V.shape[0], w, n, min_d, np.float32(uniqueness), bool(subpixel), bool(right), bool(confidence),
                out, out_r, out_c)
        segw, threads = ksel.SELECT_SEGMENT, kc.SGM_LANES * ksel.SELECT_WARPS
        if not ready:
            self._launch(kernel, ((w + segw - 1) // segw, h), threads, *args, np.int32(0))
        else:  # rows as SGM finishes them, on side streams by turns, while it goes on with the others
            sides = self._side_streams(2 + ksel.SELECT_STREAMS)[2:]
            for i, (y0, y1, events) in enumerate(ready):
                side = sides[i % len(sides)]
                for e in events:
                    self._wait(e, side)
                self._launcher.launch(kernel, ((w + segw - 1) // segw, y1 - y0), threads, side, *args, np.int32(y0))
            self._join(sides)
        return out, (out_r if right else None), (out_c if confidence else None)

    # ------------------------------------------------------------ refinement
    def lr_check(self, disp, disp_r, max_diff):
        h, w = disp.shape
        out = self._empty((h, w), np.float32)
        self._launch2(kref.lr_check_kernel, h, w, disp, disp_r, np.float32(max_diff), out)
        return out

    def speckle(self, disp, max_size, max_diff):
        h, w = disp.shape
        labels = self._empty((h * w,), np.int32)
        counts = self._empty((h * w,), np.int32)
        sizes = self._zeros((h * w,), np.int32)
        out = self._empty((h, w), np.float32)
        self._launch2(kref.ccl_tile_kernel, h, w, disp, np.float32(max_diff), labels, counts,
                      bx=kref.CCL_TILE[0], by=kref.CCL_TILE[1])
        self._launch2(kref.ccl_border_kernel, h, w, disp, np.float32(max_diff), labels)
        self._launch1(kref.ccl_count_kernel, h * w, labels, counts, sizes)
        self._launch2(kref.speckle_apply_kernel, h, w, disp, labels, sizes, max_size, out)
        return out

    def keep_confidence(self, conf, disp):
        h, w = disp.shape
        out = self._empty((h, w), np.float32)
        self._launch2(kref.keep_confidence_kernel, h, w, conf, disp, out)
        return out

    def fill(self, disp, mode, lo=-np.inf, hi=np.inf):
        h, w = disp.shape
        if mode in (refine.SLOPE, refine.DIRECTIONS):  # the border strip continued along its slope, then
            first = self._scratch("first", (h, w), np.int32)  # the background fill or the 2-D fill
            slopes = self._scratch("slopes", (h, w), np.float32)
            sloped = self._scratch("sloped", (h, w), np.float32)
            self._launch2(kref.slope_fit_kernel, h, w, disp, first, slopes, sloped)
            out = self._empty((h, w), np.float32)
            after = refine.BACKGROUND if mode == refine.SLOPE else 0  # (0: the runs only)
            self._launch(kref.slope_fill_kernel, h, kref.FILL_THREADS, disp, first, slopes, sloped, after, out,
                         np.float32(lo), np.float32(hi))
            if mode == refine.DIRECTIONS:
                key = ("fill2d",)
                if key not in self._tables:
                    self._tables[key] = self.upload(refine.FILL2D_DIRECTIONS)
                self._launch2(kref.fill2d_kernel, h, w, sloped, self._tables[key], out)
            return out
        out = self._empty((h, w), np.float32)
        self._launch(kref.fill_kernel, h, kref.FILL_THREADS, disp, mode, out)
        return out

    def median(self, disp, r):
        h, w = disp.shape
        out = self._empty((h, w), np.float32)
        self._launch2(kref.median_kernel, h, w, disp, r, out)
        return out

    def weighted_median(self, disp, guide, r):
        h, w = disp.shape
        out = self._empty((h, w), np.float32)
        g, b = _grid2(h, w, *kref.WMF_BLOCK)  # (its shared list holds one entry per thread)
        self._launch(kref.wmf_kernel, g, b, disp, guide, guide.shape[1] // w, self._wmf_lut(), r, out)
        return out

    SCRATCH_MAX_PIXELS = 1 << 22

    def _scratch(self, name, shape, dtype):
        """A stage's internal buffer (never handed on), kept for the next call of the same
        size: at small sizes a match is bound by host work, and an allocation costs about
        as much as a launch. One buffer per name (a new size replaces it, so a batch of
        many sizes holds no more); images over SCRATCH_MAX_PIXELS take pooled buffers."""
        if kc.SIM or shape[0] * (shape[1] if len(shape) > 1 else 1) > self.SCRATCH_MAX_PIXELS:
            return self._empty(shape, dtype)
        key = ("scratch", name)
        dtype = np.dtype(dtype)
        kept = self._tables.get(key)
        if kept is None or kept.shape != tuple(shape) or kept.dtype != dtype:
            kept = self._tables[key] = self._allocate(tuple(shape), dtype)
        return kept

    def _wmf_lut(self):
        if "wmf" not in self._tables:
            self._tables["wmf"] = self.upload(refine.wmf_weights())
        return self._tables["wmf"]
