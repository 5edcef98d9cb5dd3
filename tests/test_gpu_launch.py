"""The GPU kernels' launch parameters (:mod:`mpikmeans.backends.gpu.launch`) against Numba's own, with no GPU.

A compiled kernel is launched through cuda.core with the parameters that
``launch._packers`` makes; a parameter out of place, or of another C type, would
have the kernel read garbage on the device, where the simulator never looks.
So, in a child process with numba-cuda and no simulator (this pytest process has
imported numba for the CPU tests), every argument type the kernels take is packed
both ways, ours and Numba's ``_Kernel._prepare_args``, for device arrays described
as Numba describes its own, and the two lists must agree item for item: value
and C type.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from conftest import HANG_GUARD_S

_PROGRAM = textwrap.dedent(
    r"""
    import ctypes, json
    from types import SimpleNamespace

    import numpy as np
    from numba.cuda import types as nt
    from numba.cuda.cudadrv.devicearray import _StridedLayoutShim, _StridedMemoryViewShim
    from numba.cuda.dispatcher import _Kernel

    from mpikmeans.backends.gpu.launch import _packers


    class DeviceArray:
        # what Numba reads of a device array (its memory view's shim) and what the packer reads (the
        # array's own attributes), made from the same numbers
        __cuda_memory__ = True

        def __init__(self, ptr, n, dtype):
            self.dtype = np.dtype(dtype)
            self.size, self.shape, self.strides = n, (n,), (self.dtype.itemsize,)
            self.device_ctypes_pointer = ctypes.c_void_p(ptr)
            layout = _StridedLayoutShim(strides_in_bytes=self.strides, is_contiguous_c=True, is_contiguous_f=True,
                                        is_contiguous_any=True)
            self._strided_memory_view_shim = _StridedMemoryViewShim(ptr=ptr, shape=self.shape, dtype=self.dtype,
                                                                    size=n, _layout=layout)


    cases = [(nt.Array(nt.float64, 1, "C"), DeviceArray(0x7F0000001000, 12345, np.float64)),
             (nt.Array(nt.float32, 1, "C"), DeviceArray(0x7F0000002000, 7, np.float32)),
             (nt.Array(nt.int32, 1, "C"), DeviceArray(0x7F0000003000, 3, np.int32)),
             (nt.Array(nt.int64, 1, "A"), DeviceArray(0x7F0000004000, 1, np.int64)),
             (nt.int32, 7), (nt.int32, np.int32(-5)), (nt.int64, 2**40 + 3), (nt.uint64, 2**63 + 5),
             (nt.float64, 0.1), (nt.float64, np.float64(-2.5)), (nt.float32, np.float32(1.5)),
             (nt.boolean, True), (nt.boolean, False)]


    def described(items):
        return [[type(v).__name__, v.value if isinstance(v, ctypes._SimpleCData) else v] for v in items]


    numba_side = []
    holder = SimpleNamespace(extensions=[])
    for ty, value in cases:
        _Kernel._prepare_args(holder, ty, value, 0, [], numba_side)
    ours = []
    for pack, (_, value) in zip(_packers([ty for ty, _ in cases]), cases):
        pack(value, ours)
    print(json.dumps({"numba": described(numba_side), "ours": described(ours),
                      "unsupported": _packers([nt.float64, nt.complex128]) is None}))
    """)


def test_packed_parameters_are_numbas_for_every_argument_type():
    """Arrays (meminfo, parent, size, itemsize, pointer, shape, strides), signed and unsigned integers, float64,
    float32 and booleans: the same values in the same C types as Numba's launch; a type the kernels never
    take leaves the kernel to Numba's own launch."""
    pytest.importorskip("numba.cuda")
    env = {key: v for key, v in os.environ.items() if key != "NUMBA_ENABLE_CUDASIM"}
    r = subprocess.run([sys.executable, "-c", _PROGRAM], capture_output=True, text=True, env=env,
                       timeout=HANG_GUARD_S * 2)
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["ours"] == out["numba"]
    assert len(out["numba"]) == 4 * 7 + 9  # each 1-D array seven parameters, each scalar one
    assert out["unsupported"]
