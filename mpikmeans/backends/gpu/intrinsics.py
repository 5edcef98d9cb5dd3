"""What the kernels need that plain Numba code would not give them.

On a real GPU: a 16-byte vector load of four centre values (:func:`ld4`, an
``@intrinsic`` writing LLVM IR directly), and float64 arithmetic that is never
contracted into an FMA (:func:`dmul_rn`, :func:`dadd_rn`), so that a distance is
the CPU's to the last bit.  Under the CUDA simulator they are plain Python.
"""

from __future__ import annotations

import numpy as np

from .device import HAVE_NUMBA_CUDA, SIM

if HAVE_NUMBA_CUDA and not SIM:
    from llvmlite import ir as _llir
    from numba import types as _nbtypes
    from numba.cuda.extending import intrinsic as _intrinsic

    @_intrinsic
    def ld4(typingctx, arr, idx):
        """Four consecutive elements ``arr[idx:idx+4]`` in one 16-byte vector load.

        ``idx`` must be a multiple of 4 and the array 16-byte aligned; Numba emits
        scalar loads for the plain indexing form, which would make the centre reads
        (not the FMAs) the limit of the assignment loop.
        """
        dt = arr.dtype
        sig = _nbtypes.UniTuple(dt, 4)(arr, idx)

        def codegen(context, builder, signature, args):
            aryty = signature.args[0]
            ary = context.make_array(aryty)(context, builder, args[0])
            i = context.cast(builder, args[1], signature.args[1], _nbtypes.intp)
            ptr = builder.gep(ary.data, [i])
            lt = context.get_data_type(dt)
            vptr = builder.bitcast(ptr, _llir.VectorType(lt, 4).as_pointer())
            v = builder.load(vptr, align=16)
            vals = [builder.extract_element(v, _llir.Constant(_llir.IntType(32), q)) for q in range(4)]
            return context.make_tuple(builder, signature.return_type, vals)

        return sig, codegen

    from numba.cuda import libdevice

    # IEEE float64 product and sum, each rounded once: never contracted into an FMA
    # (NVVM contracts a * b + c by default), so a distance summed with them is the
    # CPU's to the last bit
    dmul_rn = libdevice.dmul_rn
    dadd_rn = libdevice.dadd_rn
    rint = libdevice.rint  # round half to even, as numpy.rint

else:

    def dmul_rn(x, y):
        return x * y

    def dadd_rn(x, y):
        return x + y

    def rint(x):
        return float(np.rint(x))

    def ld4(arr, idx):
        return arr[idx], arr[idx + 1], arr[idx + 2], arr[idx + 3]
