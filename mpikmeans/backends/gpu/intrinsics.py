"""Load and store intrinsics of the kernels: the address arithmetic Numba would not emit.

On a real GPU these are ``@intrinsic`` functions that write LLVM IR directly: a
16-byte vector load of four centre values (:func:`ld4`), array accesses without
Numba's negative-index wraparound select (:func:`ldx`, :func:`stx`), and
column-major loads with 32- or 64-bit index arithmetic (:func:`ldc32`,
:func:`ldc64`), and float64 arithmetic that is never contracted into an FMA
(:func:`dmul_rn`, :func:`dadd_rn`).  Under the CUDA simulator they are plain
Python with bound checks.
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

    @_intrinsic
    def ldx(typingctx, arr, idx):
        """``arr[idx]`` for an index known to be in ``[0, len)``: address and load only.

        Numba's indexing turns a signed index into ``idx < 0 ? idx + len : idx``.
        That select sits between the index arithmetic and the address, so LLVM
        cannot strength-reduce ``j * ld + i`` across a loop, and every access costs a
        64-bit multiply, a sign test and a reload of the array's shape.  Here the
        address is one ``inbounds`` GEP of the data pointer (1-D C-contiguous arrays).
        """
        if not isinstance(arr, _nbtypes.Array) or not isinstance(idx, _nbtypes.Integer):
            return None
        dt = arr.dtype
        sig = dt(arr, idx)

        def codegen(context, builder, signature, args):
            ary = context.make_array(signature.args[0])(context, builder, args[0])
            i = context.cast(builder, args[1], signature.args[1], _nbtypes.intp)
            ptr = builder.gep(ary.data, [i], inbounds=True)
            return builder.load(ptr, align=context.get_abi_sizeof(context.get_data_type(dt)))

        return sig, codegen

    def _make_ldc(bits: int):
        def _ldc(typingctx, arr, j, ld, i):
            """``arr[j * ld + i]`` (a column-major element) with ``bits``-bit index arithmetic.

            No wraparound select (see :func:`ldx`).  With ``bits=32`` (arrays of fewer
            than ``2**31`` elements, checked on the host) the index is one 32-bit
            ``mad.lo.u32``, written as inline PTX because LLVM widens plain 32-bit
            arithmetic on truncated 64-bit values back to 64 bits; the address is
            then one ``IMAD.WIDE.U32``.  With ``bits=64`` the multiply and add carry
            ``nuw nsw`` so LLVM can strength-reduce the address across a loop.
            """
            if not isinstance(arr, _nbtypes.Array) or not all(isinstance(t, _nbtypes.Integer) for t in (j, ld, i)):
                return None
            dt = arr.dtype
            sig = dt(arr, j, ld, i)

            def codegen(context, builder, signature, args):
                ary = context.make_array(signature.args[0])(context, builder, args[0])
                v = [context.cast(builder, args[q], signature.args[q], _nbtypes.intp) for q in (1, 2, 3)]
                if bits == 32:
                    i32 = _llir.IntType(32)
                    v = [builder.trunc(a, i32) for a in v]
                    fty = _llir.FunctionType(i32, [i32, i32, i32])
                    idx = builder.asm(fty, "mad.lo.u32 $0, $1, $2, $3;", "=r,r,r,r", v, side_effect=False)
                    idx = builder.zext(idx, _llir.IntType(64))
                else:
                    idx = builder.mul(v[0], v[1], flags=("nuw", "nsw"))
                    idx = builder.add(idx, v[2], flags=("nuw", "nsw"))
                ptr = builder.gep(ary.data, [idx], inbounds=True)
                return builder.load(ptr, align=context.get_abi_sizeof(context.get_data_type(dt)))

            return sig, codegen

        return _intrinsic(_ldc)

    ldc32 = _make_ldc(32)
    ldc64 = _make_ldc(64)

    @_intrinsic
    def stx(typingctx, arr, idx, val):
        """``arr[idx] = val`` for an index known to be in ``[0, len)`` (see :func:`ldx`)."""
        if not isinstance(arr, _nbtypes.Array) or not isinstance(idx, _nbtypes.Integer):
            return None
        dt = arr.dtype
        sig = _nbtypes.void(arr, idx, val)

        def codegen(context, builder, signature, args):
            ary = context.make_array(signature.args[0])(context, builder, args[0])
            i = context.cast(builder, args[1], signature.args[1], _nbtypes.intp)
            v = context.cast(builder, args[2], signature.args[2], dt)
            ptr = builder.gep(ary.data, [i], inbounds=True)
            builder.store(v, ptr, align=context.get_abi_sizeof(context.get_data_type(dt)))
            return context.get_dummy_value()

        return sig, codegen

    from numba.cuda import libdevice

    # IEEE float64 product and sum, each rounded once: never contracted into an FMA
    # (NVVM contracts a * b + c by default), so a distance summed with them is the
    # CPU's to the last bit
    dmul_rn = libdevice.dmul_rn
    dadd_rn = libdevice.dadd_rn
    rint = libdevice.rint  # round half to even, as numpy.rint
    # one instruction each (min.f32 / max.f32); a NaN operand yields the other one
    fminf = libdevice.fminf
    fmaxf = libdevice.fmaxf

else:

    def dmul_rn(x, y):
        return x * y

    def dadd_rn(x, y):
        return x + y

    def rint(x):
        return float(np.rint(x))

    def fminf(x, y):
        return x if y != y or x < y else y

    def fmaxf(x, y):
        return x if y != y or x > y else y

    def ld4(arr, idx):
        return arr[idx], arr[idx + 1], arr[idx + 2], arr[idx + 3]

    def ldx(arr, idx):
        assert 0 <= idx < arr.shape[0] or arr.shape[0] == 0, (idx, arr.shape)
        return arr[idx]

    def ldc64(arr, j, ld, i):
        idx = j * ld + i
        assert 0 <= idx < arr.shape[0], (idx, arr.shape)
        return arr[idx]

    def ldc32(arr, j, ld, i):
        assert arr.shape[0] < 2**31
        return ldc64(arr, j, ld, i)

    def stx(arr, idx, val):
        assert 0 <= idx < arr.shape[0] or arr.shape[0] == 0, (idx, arr.shape)
        arr[idx] = val
