"""What the CUDA kernels of every stage share: the device twins of the stages' shared
functions (their Python source compiled a second time, with cuda.jit), the launch
constants, the warp exchange (with shared-memory stand-ins under the simulator) and
the volume indexing.

The kernels live one module per stage, named like `stereocli/stages/`: preprocess,
cost, aggregate (SGM), select, refine. Imported only by the CUDA backend (it needs
numba-cuda).
"""
import inspect
import os
import types

import numpy as np

from numba import config, cuda, int32, uint32

from ...stages import cost as _cost
from ...stages import CACHE, SHARED  # noqa: F401  (CACHE: for the kernel modules)

OUTSIDE = _cost.OUTSIDE  # the cost of a match outside the right image


_DEVICE = {}  # id of a CPU-compiled shared function -> its device twin


def _dev(f):
    """The device function of a shared function: its Python source compiled again with
    cuda.jit, with the shared functions it calls replaced by their device twins."""
    if id(f) not in _DEVICE:
        py = f.py_func
        env = dict(py.__globals__)
        for name in py.__code__.co_names:
            if any(env.get(name) is g for g in SHARED):
                env[name] = _dev(env[name])
        fn = types.FunctionType(py.__code__, env, py.__name__, py.__defaults__, py.__closure__)
        _DEVICE[id(f)] = cuda.jit(device=True, inline=True)(fn)
    return _DEVICE[id(f)]


def device_twins(stage):
    """A module object holding the device twin of every shared function of the stage
    module `stage`, taken from the SHARED registry: a kernel calls `cst.census_at(...)`
    where `cst = device_twins(stereocli.stages.cost)`."""
    twins = types.ModuleType(f"{__name__}.twins_of_{stage.__name__.rsplit('.', 1)[-1]}")
    for name, f in vars(stage).items():
        if any(f is g for g in SHARED):
            setattr(twins, name, _dev(f))
    return twins


def _llvm_inline():
    """cuda.jit's options for a device function inlined into its callers by LLVM
    (numba-cuda's forceinline): its Numba IR is typed and lowered once, where inline=True
    (Numba IR inlining) copies and processes it again at every call site. The SGM line
    kernel's unrolled loop calls its step functions up to 10 times: about 11 s to compile
    at prefetch depth 2 with inline=True, 3.3 s this way, the same sm_90 SASS. The
    simulator, and a numba-cuda without forceinline: inline=True."""
    if SIM or "forceinline" not in inspect.signature(cuda.jit).parameters:
        return {"inline": True}
    return {"forceinline": True}


def _REGS(var, default=0):
    """A register cap (cuda.jit's max_registers; 0 = the compiler's choice), with a
    tuning knob in the environment variable `var`."""
    r = int(os.environ.get(var, default))
    return {"max_registers": r} if r and not SIM else {}


def auto_on_off(setting: str, auto: bool) -> bool:
    """A launch choice with a tuning knob (STEREOCLI_..._=auto|on|off, read into a module
    constant that tests may set): "on" or "off" as told, anything else the measured
    rule's answer `auto` (pairs_apart, use_bands, horizontal_first, select_with_bands)."""
    if setting in ("on", "off"):
        return setting == "on"
    return auto


SIM = bool(config.ENABLE_CUDASIM)
LLVM_INLINE = _llvm_inline()
TPB = 256
BIG = 65535
# SGM: one group of G lanes per path line, 32 / G lines per warp (as libSGM does); lane
# l keeps disparities 16l .. 16l + 15 in registers and swaps edge values and the minimum
# with its neighbours through warp shuffles. The simulator has no shuffles and its
# barriers are slow: there a group is one thread by default (STEREOCLI_SIM_LANES=4
# tests the exchange through a shared-memory twin), one group per block.
if SIM:
    SGM_LANES = int(os.environ.get("STEREOCLI_SIM_LANES", "1"))
    SGM_WARPS = 1  # groups per block: the twin's syncthreads must be a group barrier
else:
    SGM_LANES = 32
    SGM_WARPS = 4
# disparities per lane (at most); under the simulator's multi-lane test, 2, so that few disparities span lanes
SGM_K = 2 if SIM and SGM_LANES > 1 else 16
MAX_SGM_DISPARITIES = SGM_LANES * SGM_K


# ------------------------------------------------------------- warp exchange
if SIM:
    @cuda.jit(device=True)
    def warp_min(v, scratch, w, lane):
        if SGM_LANES == 1:
            return v
        scratch[w, lane] = v
        cuda.syncthreads()
        m = scratch[w, 0]
        for i in range(1, SGM_LANES):
            m = min(m, scratch[w, i])
        cuda.syncthreads()
        return m

    @cuda.jit(device=True)
    def from_lane_below(v, scratch, w, lane):
        if SGM_LANES == 1:
            return int32(BIG)
        scratch[w, lane] = v
        cuda.syncthreads()
        r = scratch[w, lane - 1] if lane > 0 else int32(BIG)
        cuda.syncthreads()
        return r

    @cuda.jit(device=True)
    def from_lane_above(v, scratch, w, lane):
        if SGM_LANES == 1:
            return int32(BIG)
        scratch[w, lane] = v
        cuda.syncthreads()
        r = scratch[w, lane + 1] if lane < SGM_LANES - 1 else int32(BIG)
        cuda.syncthreads()
        return r

    @cuda.jit(device=True)
    def from_lane(v, src, scratch, w, lane):
        if SGM_LANES == 1:
            return v
        scratch[w, lane] = v
        cuda.syncthreads()
        r = scratch[w, src]
        cuda.syncthreads()
        return r
else:
    @cuda.jit(device=True, inline=True)
    def warp_min(v, scratch, w, lane):
        v = min(v, cuda.shfl_xor_sync(0xFFFFFFFF, v, 16))
        v = min(v, cuda.shfl_xor_sync(0xFFFFFFFF, v, 8))
        v = min(v, cuda.shfl_xor_sync(0xFFFFFFFF, v, 4))
        v = min(v, cuda.shfl_xor_sync(0xFFFFFFFF, v, 2))
        v = min(v, cuda.shfl_xor_sync(0xFFFFFFFF, v, 1))
        return v

    @cuda.jit(device=True, inline=True)
    def from_lane_below(v, scratch, w, lane):
        r = cuda.shfl_up_sync(0xFFFFFFFF, v, 1)
        return r if lane > 0 else int32(BIG)

    @cuda.jit(device=True, inline=True)
    def from_lane_above(v, scratch, w, lane):
        r = cuda.shfl_down_sync(0xFFFFFFFF, v, 1)
        return r if lane < 31 else int32(BIG)

    @cuda.jit(device=True, inline=True)
    def from_lane(v, src, scratch, w, lane):
        return cuda.shfl_sync(0xFFFFFFFF, v, src)


# ------------------------------------------------- one PTX instruction on 32-bit registers
def _ptx32(asm, sig):
    """A Numba intrinsic of one PTX instruction over 32-bit registers (the GPU only):
    `asm` with $0 the result and $1.. the operands, `sig` its Numba signature (two or
    three operands)."""
    from llvmlite import ir
    from numba.cuda.extending import intrinsic

    def codegen(context, builder, signature, args):
        fnty = ir.FunctionType(ir.IntType(32), [ir.IntType(32)] * len(args))
        return builder.call(ir.InlineAsm(fnty, asm, ",".join(["=r"] + ["r"] * len(args))), args)

    if len(sig.args) == 2:
        @intrinsic
        def op2(typingctx, a, b):
            return sig, codegen
        return op2

    @intrinsic
    def op3(typingctx, a, b, c):
        return sig, codegen
    return op3


# ------------------------------------------------- two uint16 values in a uint32
def byte_perm():
    """byte_perm(a, b, sel): PTX prmt.b32 (CUDA's __byte_perm): byte k of the result is
    byte sel's nibble k of the eight bytes of (b, a), a's lowest first (a nibble's top
    bit: that byte's sign, replicated); one instruction. Under the simulator the same
    permutation by shifts and masks, so that the tests there check the selectors."""
    if SIM:
        def prmt_twin(a, b, sel):  # (plain Python, called from the simulator's kernels: a
            # simulated device function's call costs more than this whole permutation)
            x = int(a) | (int(b) << 32)
            r = 0
            for k in range(4):
                n = (int(sel) >> (4 * k)) & 0xF
                v = (x >> (8 * (n & 7))) & 0xFF
                if n & 8:
                    v = 0xFF if v & 0x80 else 0
                r |= v << (8 * k)
            return uint32(r)
        return prmt_twin
    from numba import types
    _prmt = _ptx32("prmt.b32 $0, $1, $2, $3;", types.uint32(types.uint32, types.uint32, types.uint32))

    @cuda.jit(device=True, inline=True)
    def prmt(a, b, sel):
        return _prmt(uint32(a), uint32(b), sel)
    return prmt


def min_u16x2_for(cc):
    """min_u16x2(a, b): the unsigned minimum of each 16-bit half of two uint32 words, for
    a device of compute capability cc: Hopper's one instruction (PTX min.u16x2, sm_90
    and up), else two 16-bit minima (the simulator: Python)."""
    if SIM or cc < (9, 0):
        lo16 = np.uint32(0xFFFF)
        sh = np.uint32(16)

        @cuda.jit(device=True, inline=True)
        def min_u16x2(a, b):
            return uint32(min(uint32(a & lo16), uint32(b & lo16)) | uint32(min(uint32(a >> sh), uint32(b >> sh)) << sh))
        return min_u16x2

    from numba import types
    _min = _ptx32("min.u16x2 $0, $1, $2;", types.uint32(types.uint32, types.uint32))

    @cuda.jit(device=True, inline=True)
    def min_u16x2(a, b):
        return _min(uint32(a), uint32(b))
    return min_u16x2


def _flat_atomic_add():
    """atomic_add_at(a, i, v): a[i] += v atomically for a flat C-contiguous array and an
    unsigned index, with no negative-index fix-up (cuda.atomic.add wraps every index as
    if it could be negative: four instructions an add in the SGM kernels' loops)."""
    if SIM:
        @cuda.jit(device=True)
        def atomic_add_at(a, i, v):
            cuda.atomic.add(a, i, v)
        return atomic_add_at

    from numba import types
    from numba.cuda.extending import intrinsic

    @intrinsic
    def atomic_add_at(typingctx, a, i, v):
        if not (isinstance(a, types.Array) and a.ndim == 1 and isinstance(a.dtype, types.Integer)):
            return None

        def codegen(context, builder, sig, args):
            ary = context.make_array(sig.args[0])(context, builder, args[0])
            builder.atomic_rmw("add", builder.gep(ary.data, [args[1]]), args[2], "monotonic")
            return context.get_dummy_value()
        return types.void(a, types.uint64, a.dtype), codegen
    return atomic_add_at


atomic_add_at = _flat_atomic_add()


def _redux_min():
    """redux_min(v, mask): PTX redux.sync.min.s32 (CUDA's __reduce_min_sync, sm_80 and up):
    the min of v over the lanes of mask, one instruction."""
    from numba import types
    return _ptx32("redux.sync.min.s32 $0, $1, $2;", types.int32(types.int32, types.uint32))


def group_min3_for(G):
    """group_min3(a, b, c, scratch, w, gl): group_min_for(G) of three values, their
    shuffle chains interleaved (the simulator: warp_min's shared-memory twin, three times)."""
    if SIM:
        @cuda.jit(device=True)
        def sim_min3(a, b, c, scratch, w, lane):
            return warp_min(a, scratch, w, lane), warp_min(b, scratch, w, lane), warp_min(c, scratch, w, lane)
        return sim_min3

    @cuda.jit(device=True, inline=True)
    def group_min3(a, b, c, scratch, w, gl):
        off = G // 2
        while off > 0:
            a = min(a, cuda.shfl_xor_sync(0xFFFFFFFF, a, off))
            b = min(b, cuda.shfl_xor_sync(0xFFFFFFFF, b, off))
            c = min(c, cuda.shfl_xor_sync(0xFFFFFFFF, c, off))
            off //= 2
        return a, b, c
    return group_min3


def group_min_for(G, redux=False):
    """group_min(v, scratch, w, gl): the min of v over an aligned group of G lanes of a
    warp (G a power of two up to 32), by shuffles in which every lane of the warp takes
    part (the GPU's; the simulator has warp_min's shared-memory twin). redux (a whole
    warp, G = 32, on compute capability 8.0 and up): one redux.sync instead."""
    if redux and not SIM:
        assert G == 32
        redux_min = _redux_min()

        @cuda.jit(device=True, inline=True)
        def group_min_r(v, scratch, w, gl):
            return redux_min(int32(v), uint32(0xFFFFFFFF))
        return group_min_r

    @cuda.jit(device=True, inline=True)
    def group_min(v, scratch, w, gl):
        off = G // 2
        while off > 0:
            v = min(v, cuda.shfl_xor_sync(0xFFFFFFFF, v, off))
            off //= 2
        return v
    return group_min


@cuda.jit(device=True, inline=True)
def _volume_index(w, n):
    """(y, x, d, inside) of this thread's element of a (h, w, n) volume, d fastest (so
    consecutive threads touch consecutive bytes), launched by CudaBackend._launch_rows:
    one grid row per image row, the division in unsigned 32 bits (a 64-bit one costs
    more than the element's work)."""
    i = uint32(cuda.blockIdx.x) * uint32(cuda.blockDim.x) + uint32(cuda.threadIdx.x)
    x = i // uint32(n)
    return int32(cuda.blockIdx.y), int32(x), int32(i - x * uint32(n)), x < uint32(w)


# ------------------------------------------------- kernel cache keys of factory-made kernels

class _Unstable(Exception):
    pass


def _describe(obj, seen=None) -> str:
    """A text for `obj` (a kernel's closure value) that is the same in every process for
    the same code and values: plain values by repr, functions by their code, their
    closure and the globals they name, Numba's dispatchers and intrinsics by the function
    behind them. Anything else raises _Unstable."""
    seen = set() if seen is None else seen
    if isinstance(obj, (bool, int, float, str, bytes, type(None), np.generic, np.dtype)):
        return repr(obj)
    if isinstance(obj, (tuple, list)):
        return "(" + ",".join(_describe(x, seen) for x in obj) + ")"
    if isinstance(obj, types.ModuleType):
        return "module " + obj.__name__
    from numba.core import types as nbtypes
    from numba.core.typing.templates import Signature
    if isinstance(obj, (nbtypes.Type, Signature)):
        return repr(obj)
    if isinstance(obj, types.FunctionType):
        if id(obj) in seen:
            return "recursion " + obj.__qualname__
        seen.add(id(obj))
        code = obj.__code__
        cells = [c.cell_contents for c in obj.__closure__ or ()]
        names = {n: obj.__globals__[n] for n in _code_names(code) if n in obj.__globals__}
        return (f"fn {obj.__module__}.{obj.__qualname__} {_describe_code(code)} "
                f"cells {_describe(tuple(cells), seen)} defaults {_describe(obj.__defaults__, seen)} "
                f"{_describe(tuple(sorted((obj.__kwdefaults__ or {}).items())), seen)} "
                f"globals {','.join(f'{n}={_describe_global(v, seen)}' for n, v in sorted(names.items()))}")
    if hasattr(obj, "py_func") and hasattr(obj, "targetoptions"):  # a dispatcher (a device function)
        return f"jit {sorted((k, repr(v)) for k, v in obj.targetoptions.items())} {_describe(obj.py_func, seen)}"
    defn = getattr(obj, "_defn", None)  # an @intrinsic
    if isinstance(defn, types.FunctionType):
        return "intrinsic " + _describe(defn, seen)
    raise _Unstable(type(obj).__name__)


def _describe_global(value, seen) -> str:
    try:
        return _describe(value, seen)
    except _Unstable:  # (a module-level object of another kind: by its type, as Numba's own key does)
        return f"{type(value).__module__}.{type(value).__qualname__}"


def _code_names(code) -> set:
    names = set(code.co_names)
    for c in code.co_consts:
        if isinstance(c, types.CodeType):
            names |= _code_names(c)
    return names


def _describe_code(code) -> str:
    import hashlib
    consts = ",".join(_describe_code(c) if isinstance(c, types.CodeType) else repr(c) for c in code.co_consts)
    return hashlib.sha256(code.co_code + consts.encode() + " ".join(code.co_names).encode()).hexdigest()


def stable_cache_key(kernel):
    """A kernel made in a factory, with a kernel-cache index key that the next process
    computes alike, so that it loads the kernel instead of compiling it again.

    Numba-cuda keys a cached kernel by its code and a hash of its closure's values
    pickled, and a closure that holds device functions (the factories' group minima,
    PTX helpers, inner functions) pickles differently in every process: the SGM line,
    census and selection kernels missed the cache in every run and were compiled again
    (H200: `stereo match` of the sample pair 20 s in a second process, every process).
    The key here hashes the closure's description (_describe) instead; the rest of the
    key is Numba-cuda's (signature, target and its version, launch configuration). If
    the closure holds something _describe does not know, or Numba-cuda's cache looks
    different, the kernel keeps Numba-cuda's own key."""
    import hashlib
    cache = getattr(kernel, "_cache", None)
    py = getattr(kernel, "py_func", None)
    if SIM or py is None or not hasattr(cache, "_index_key"):
        return kernel
    try:
        closure = hashlib.sha256(_describe(tuple(c.cell_contents for c in py.__closure__ or ()))
                                 .encode()).hexdigest()
    except (_Unstable, AttributeError, ValueError):
        return kernel
    try:
        import numba_cuda
        version = numba_cuda.__version__
    except ImportError:  # (Numba's own CUDA target)
        import numba
        version = numba.__version__
    code = hashlib.sha256(py.__code__.co_code).hexdigest()

    def index_key(sig, codegen):
        key = (sig, codegen.magic_tuple(), version, (code, closure))
        extra = getattr(cache, "_launch_config_key", None)
        return key if extra is None else key + (("launch_config", extra),)

    cache._index_key = index_key
    return kernel
