"""Small arrays on the stack, for the CPU drivers' per-walk buffers.

An SGM walk keeps its path costs at the previous pixel and this one in a small buffer
that every step reads and writes beside the sum volume S and the cost volume C. LLVM
vectorises each step's loop over the disparities, and as it cannot tell a heap buffer
from S or C it checks at every step, before the loop, that none of them overlap (about
60 instructions of x86-64 code a step, more than the loop's own work at 16-32
disparities). A buffer on the stack (an `alloca`) cannot overlap anything the function
was given, so those checks go. The array lives in the stack frame of the function that
calls `stack_rows` (the drivers inline their helpers, so that is the parallel loop's
body): it must not be returned or kept past it.
"""
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic
from numba.np.arrayobj import make_array, populate_array

# uint16 elements of a stack buffer (64 KiB: far below any thread's stack).
STACK_ELEMENTS = 32768


@intrinsic
def stack_rows(typingctx, rows, cols):
    """A C-contiguous (rows, cols) uint16 array in STACK_ELEMENTS elements of the calling
    function's stack frame, not initialised; the caller checks rows * cols <=
    STACK_ELEMENTS."""
    arrty = types.Array(types.uint16, 2, "C")

    def codegen(context, builder, signature, args):
        nrows, ncols = args
        intp = context.get_value_type(types.intp)
        nrows = context.cast(builder, nrows, signature.args[0], types.intp)
        ncols = context.cast(builder, ncols, signature.args[1], types.intp)
        data = cgutils.alloca_once(builder, ir.IntType(16), size=STACK_ELEMENTS)  # (in the entry block: one a call site)
        ary = make_array(arrty)(context, builder)
        itemsize = ir.Constant(intp, 2)
        populate_array(ary, data=data, shape=cgutils.pack_array(builder, [nrows, ncols]),
                       strides=cgutils.pack_array(builder, [builder.mul(ncols, itemsize), itemsize]),
                       itemsize=itemsize, meminfo=None)
        return ary._getvalue()

    return arrty(rows, cols), codegen
