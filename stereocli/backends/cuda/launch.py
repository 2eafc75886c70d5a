"""Kernel launches without Numba's per-launch host work.

`kernel[grid, block, stream](*args)` costs about 0.12 ms of Python on the H100 host
for a kernel of ten arguments: Numba types every argument, wraps each device array
again, builds a cuda.core stream and launch configuration, and only then calls the
driver, which takes about 10 us of that (benchmarks/profile_host.py). At the shared
scenes' size a match is bound by this host work, not by the GPU.

`Launcher.launch` does Numba's part once per kernel and argument types: the first
launch goes through Numba (the kernel compiled or loaded first on a thread of its own:
_compile_apart says why); later ones flatten the arguments as Numba's
`_Kernel._prepare_args` does (an array is meminfo, parent, size, itemsize, data
pointer, shape, strides) and call cuda.core's `launch` directly. A kernel or an
argument it does not know (a host array, a record) always takes Numba's path. Under
the simulator everything does.
"""
import ctypes
import threading

from . import common as kc

if not kc.SIM:
    from numba import cuda
    from numba.core import types
    from numba.cuda.cudadrv import driver
    from numba.cuda.cudadrv.devicearray import DeviceNDArray
    import numpy as np

    try:
        from cuda.core import LaunchConfig
        from cuda.core import launch as _core_launch
    except ImportError:  # an older numba-cuda without cuda.core: Numba's path only
        _core_launch = None

    def _arg_key(a):
        """What a launch's plan depends on for argument `a`: a device array's dtype and
        number of dimensions when it is C-contiguous (as Numba types it then), else its
        Numba type; a scalar's Python type. (Numba's types hash in Python: a key of them
        cost about a tenth of a launch.)"""
        if isinstance(a, DeviceNDArray):
            if a._dummy.is_c_contig and (a.size == 0 or 0 not in a.strides):
                return (a.dtype, a.ndim)
            return a._numba_type_
        return type(a)

    _SCALARS = (int, float, bool, np.number, np.bool_)


def _convert(ty):
    """How Numba passes a scalar of type `ty` (its _prepare_args), or None for a kind not handled here."""
    if isinstance(ty, types.Boolean):
        return bool
    if isinstance(ty, types.Integer):
        return getattr(ctypes, f"c_{ty}")
    if ty == types.float32:
        return ctypes.c_float
    if ty == types.float64:
        return ctypes.c_double
    return None


def _compile_apart(kernel, args):
    """Compile (or load) the kernel's overload for these arguments on a thread of its own.
    Numba's type inference leaves reference cycles through frames (the exceptions of the
    overloads it tried and rejected keep their tracebacks), and a frame holds its caller:
    compiled on the launching thread, every frame up the stack stayed alive with it until
    Python's next full collection, which in a large process comes seldom. The pipeline's
    frames hold the images, the device buffers and the result map of the match that
    compiled: with the 6000x4000 / 320 pair after gpu.py's table (H100), the map of the
    first match was still held five matches later, and a third 96 MB map was pinned in
    the middle of the timed runs (about 40 ms). A thread's frames hold only its own.
    Nothing is done when the overload exists; on any failure the launch compiles as
    before (and raises there)."""
    try:
        argtypes = tuple(kernel.typeof_pyval(a) for a in args)
        if argtypes in kernel.overloads:
            return
        device = cuda.current_context().device.id
    except Exception:
        return

    def work():
        try:
            with cuda.gpus[device]:
                kernel.compile(argtypes)
        except Exception:
            pass

    # (a daemon: Ctrl-C during a long compile interrupts the join, and the process then
    # exits without waiting for the compile to finish)
    t = threading.Thread(target=work, name="stereocli-compile", daemon=True)
    t.start()
    t.join()


class Launcher:
    """Launches on one device (a backend's): the kernels' argument plans, the launch
    configurations and the cuda.core form of each stream, each built once."""

    def __init__(self):
        self._plans = {}  # (kernel, argument types) -> (cuda.core kernel, [None: array, or scalar converter]) or None
        self._configs = {}  # (grid, block) -> LaunchConfig
        self._streams = {}  # id(numba stream) -> (stream, cuda.core stream)

    def launch(self, kernel, grid, block, stream, *args):
        """kernel[grid, block, stream](*args)."""
        if kc.SIM or _core_launch is None:
            kernel[grid, block, stream](*args)
            return
        key = (kernel, *[_arg_key(a) for a in args])
        plan = self._plans.get(key, False)
        if not plan:
            if plan is False:
                _compile_apart(kernel, args)
            kernel[grid, block, stream](*args)  # compiles or loads, and checks the arguments
            if plan is False:
                self._plans[key] = self._plan(kernel, args)
            return
        func, convert = plan
        flat = []
        for conv, a in zip(convert, args):
            if conv is None:
                flat += (0, 0, a.size, a.dtype.itemsize, a.device_ctypes_pointer.value or 0, *a.shape, *a.strides)
            else:
                flat.append(conv(a))
        cfg = self._configs.get((grid, block))
        if cfg is None:
            cfg = self._configs[(grid, block)] = LaunchConfig(grid=grid, block=block, shmem_size=0)
        s = self._streams.get(id(stream))
        if s is None or s[0] is not stream:
            s = self._streams[id(stream)] = (stream, driver._to_core_stream(stream))
        _core_launch(s[1], cfg, func, *flat)

    @staticmethod
    def _plan(kernel, args):
        """(the compiled kernel, a converter per argument) for the overload Numba chose for
        these arguments, or None to keep Numba's path."""
        if not all(isinstance(a, (DeviceNDArray, *_SCALARS)) for a in args) or getattr(kernel, "specialized", False):
            return None
        try:
            argtypes = tuple(kernel.typeof_pyval(a) for a in args)
            compiled = kernel.overloads.get(argtypes)
            if compiled is None or compiled.argument_types != argtypes or compiled.debug or compiled.cooperative:
                return None
            convert = []
            for ty in argtypes:
                if isinstance(ty, types.Array):
                    convert.append(None)
                else:
                    conv = _convert(ty)
                    if conv is None:
                        return None
                    convert.append(conv)
            return compiled._codelibrary.get_cufunc().kernel, convert
        except Exception:  # internals of another numba-cuda version: Numba's path
            return None

