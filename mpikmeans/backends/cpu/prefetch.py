"""``prefetch(a, i)``: ask the CPU for the cache line of element ``i`` of ``a`` ahead of its use.

The kernels stream their rows from memory a tile at a time: each tile's rows are
read (and wait for memory), then computed on (and memory is idle).  Asking for
the rows of a tile two ahead while the current one is summed keeps memory busy
through the computing: the 10^6 x 16, K = 8 step went from 33-37 to 27-29 ms on
one thread of the 2-core Xeon, 5 10^5 x 64, K = 4 from 55-60 to 44 ms.  Numba has
no prefetch; this is LLVM's ``llvm.prefetch`` (a read, kept in every cache level).
"""

from __future__ import annotations

from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic


@intrinsic
def prefetch(typingctx, arr, index):  # pragma: no cover - compiled
    """Prefetch the line of flat element ``index`` of the C-contiguous array ``arr`` (no bounds check)."""
    if not isinstance(arr, types.Array) or arr.layout != "C" or not isinstance(index, types.Integer):
        return None

    def codegen(context, builder, signature, args):
        ary = context.make_array(signature.args[0])(context, builder, args[0])
        address = builder.bitcast(builder.gep(ary.data, [args[1]]), ir.IntType(8).as_pointer())
        i32 = ir.IntType(32)
        fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(ir.VoidType(), [address.type, i32, i32,
                                                                                              i32]),
                                            "llvm.prefetch.p0")
        builder.call(fn, [address, i32(0), i32(3), i32(1)])  # read, keep in all levels, data
        return context.get_dummy_value()

    return types.void(arr, index), codegen
