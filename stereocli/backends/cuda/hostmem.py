"""Result maps in pinned (page-locked) host memory, kept for reuse.

A map copied from the GPU into pageable memory runs at about 11 GB/s (the driver
stages it), and through a pinned buffer it costs a second copy on the host; either way,
at 1920x1080 the download took 0.9 ms of a 7 ms match. Copied into pinned memory it
runs at the bus's speed (8 MiB: 0.19 ms, H100 machine) and is not copied again. So the
pipeline asks the backend for its output array (`CudaBackend.host_empty`), and large
maps are handed out in pinned buffers from this pool.

A buffer goes back to the pool when the caller has dropped the map and every view of
it: the array handed out is made over a `_Lease` (its base), and every view keeps that
array (NumPy makes it their base: it stops collapsing a chain of bases at an owner that
is not an array), so the lease lives exactly as long as any array over the memory.
Pinning is expensive (it costs about what the copy saves, once), so the pool keeps the
freed buffers for the next maps of the same size, up to MAX_BYTES in all (free and
handed out); beyond that, maps come in ordinary memory.
"""
import threading
import weakref

import numpy as np
from numba import cuda

MIN_BYTES = 256 << 10  # smaller maps: ordinary memory (their copies are short anyway)
MAX_BYTES = 512 << 20  # most pinned bytes the pool holds, handed out or free


class _Lease:
    """The owner of one handed-out pinned buffer (NumPy reads it through
    __array_interface__); the buffer goes back to the pool when the lease dies."""
    __slots__ = ("__array_interface__", "buf", "__weakref__")

    def __init__(self, buf, shape, dtype):
        self.buf = buf
        self.__array_interface__ = {"shape": shape, "typestr": dtype.str, "version": 3,
                                    "data": (buf.ctypes.data, False)}


class HostMaps:
    def __init__(self):
        self.free = {}  # nbytes -> [pinned uint8 buffers]
        self.held = 0  # pinned bytes allocated by the pool (free or handed out)
        self.pinned = 0  # buffers pinned so far (benchmarks count them: a 96 MB one took 35-55 ms, H100 host)
        self.lock = threading.Lock()  # the lease finalizers run on whichever thread collects

    def empty(self, shape, dtype):
        """An uninitialised host array: pinned from the pool when large enough and the
        pool has room, else ordinary memory."""
        dtype = np.dtype(dtype)
        nbytes = int(np.prod(shape)) * dtype.itemsize
        if nbytes < MIN_BYTES:
            return np.empty(shape, dtype)
        buf = self._take(nbytes)
        if buf is None:
            return np.empty(shape, dtype)
        lease = _Lease(buf, tuple(shape), dtype)
        fin = weakref.finalize(lease, self._give, nbytes, buf)
        fin.atexit = False
        return np.asarray(lease)

    def _take(self, nbytes):
        with self.lock:
            if self.free.get(nbytes):
                return self.free[nbytes].pop()
            if self.held + nbytes > MAX_BYTES:  # room made by freeing buffers of other sizes
                for size, bufs in self.free.items():
                    while bufs and self.held + nbytes > MAX_BYTES:
                        bufs.pop()
                        self.held -= size
                if self.held + nbytes > MAX_BYTES:
                    return None
            self.held += nbytes
        try:
            buf = cuda.pinned_array(nbytes, np.uint8)
        except Exception:  # page-locked memory refused: ordinary memory serves
            with self.lock:
                self.held -= nbytes
            return None
        with self.lock:  # (counted as held is: the maps may be made on several threads)
            self.pinned += 1
        return buf

    def _give(self, nbytes, buf):
        with self.lock:
            self.free.setdefault(nbytes, []).append(buf)


# Host memory page-locked in place (CudaBackend.pin_host: a batch's read slots, which
# its worker processes fill): start address -> end address.
_registered: dict[int, int] = {}


def add_registered(start: int, nbytes: int) -> None:
    _registered[start] = start + nbytes


def remove_registered(start: int) -> None:
    _registered.pop(start, None)


def is_pinned(a) -> bool:
    """Whether `a` lies in a buffer of this pool (a map it handed out, or a view of one:
    its base is the map, whose base is the lease), or in memory page-locked in place
    (add_registered). The pipeline downloads a whole strip into a view of its map (its
    rows): read as not pinned (only the map's own base was looked at), a 3840x2160 map
    went through the staging buffer and a 33 MB host copy, download stage 5.3-6.2 ms,
    instead of straight in (the bus: 0.64 ms)."""
    b = a
    while isinstance(b, np.ndarray):
        b = b.base
    if isinstance(b, _Lease):
        return True
    if _registered and isinstance(a, np.ndarray):
        start = a.ctypes.data
        end = start + a.nbytes
        return any(s0 <= start and end <= e0 for s0, e0 in list(_registered.items()))
    return False
