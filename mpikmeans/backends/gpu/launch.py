"""Launching a step: the step buffer with its pinned host mirrors, and prepared kernel launches.

Per step the host writes the centre data into a pinned buffer (:class:`Pack`),
copies it to the device in one asynchronous copy (which also zeroes the outputs),
launches the fused and the recheck kernels through parameter blocks marshalled
once (:class:`Launch`), and copies the outputs back in one more copy.  Both
copies and the launches are asynchronous; the caller synchronises once.  With
resident rows the copies and launches of a step are one CUDA graph, launched with
one call (:class:`StepGraph`).
"""

from __future__ import annotations

import logging
import os

import numpy as np

from .device import SIM, cuda
from .hostk import copy_centres, fill_centres
from .plan import pack_layout

log = logging.getLogger("mpikmeans.backends.gpu")


def cu():
    """The CUDA driver bindings (``cuda.bindings.driver``) that numba-cuda itself uses."""
    from cuda.bindings import driver as cub

    return cub


def cucheck(res, what: str):
    """Raise on a non-success ``CUresult``; return the call's other results."""
    err = res[0]
    if int(err) != 0:
        raise RuntimeError(f"{what} failed: {err!r}")
    return res[1:]


def fast_launch_wanted(tune: dict) -> bool:
    """Whether launches go through prepared parameter blocks (else Numba's dispatcher)."""
    if SIM:
        return False
    mode = str(tune.get("launch", os.environ.get("MPIKMEANS_GPU_LAUNCH", "fast")))
    return mode != "numba"


def prepare(kernel, nbytes: int) -> int | None:
    """Allow a compiled kernel ``nbytes`` of dynamic shared memory; return its registers per thread.

    Past 48 KB a kernel must opt in to more dynamic shared memory
    (``CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES``), which Numba does not do.

    Parameters
    ----------
    kernel : numba.cuda ``_Kernel`` or None
        None under the simulator (nothing to do).
    nbytes : int
    """
    if kernel is None:
        return None
    try:
        cufunc = kernel._codelibrary.get_cufunc()
    except Exception:  # pragma: no cover - numba internals moved
        return None
    if nbytes > 48 * 1024:
        from cuda.bindings import driver as cudrv
        from numba.cuda.cudadrv.driver import driver

        attr = cudrv.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
        driver.cuKernelSetAttribute(attr, int(nbytes), cufunc.handle, cufunc.device.id)
    try:
        return int(cufunc.attrs.regs)
    except Exception:  # pragma: no cover
        return None


def _dim3(d) -> tuple:
    d = tuple(d) if isinstance(d, tuple) else (int(d),)
    return d + (1,) * (3 - len(d))


def launch_once(kern, compiled, args: tuple, grid, block, stream=0, smem: int = 0) -> None:
    """One launch through Numba's launch path (types and marshals ``args`` every call).

    Parameters
    ----------
    kern : numba.cuda dispatcher
        Used under the simulator, where there is no compiled kernel.
    compiled : numba.cuda ``_Kernel`` or None
    args : tuple
    grid, block : int or tuple of int
    stream : numba.cuda stream or 0
    smem : int
        Dynamic shared memory, bytes.
    """
    if compiled is None:
        kern[grid, block, stream, smem](*args)
        return
    from numba.cuda.cudadrv import driver

    compiled.launch(args, _dim3(grid), _dim3(block), driver._to_core_stream(stream), smem)


class Launch:
    """One kernel launch whose arguments are marshalled once and replayed every step.

    Numba's launch path types every argument, flattens every array into seven
    parameters and hands them to ``cuda.core`` on each call: tens of microseconds for
    a kernel with many array arguments.  The kernels of a step take the same device
    buffers every step, so the parameter block is built once, with Numba's own
    marshalling (``_Kernel._prepare_args``), checked against the compiled kernel's
    parameter sizes (``cuFuncGetParamInfo``) and launched with one
    ``cuLaunchKernel``.  If any of that is unavailable (changed Numba internals,
    ``tune={"launch": "numba"}`` or ``MPIKMEANS_GPU_LAUNCH=numba``) the compiled kernel
    is launched through Numba's launch path; under the simulator, through the
    dispatcher.

    Parameters
    ----------
    kern : numba.cuda dispatcher
    compiled : numba.cuda ``_Kernel`` or None
        ``kern`` compiled for ``args`` (:func:`.compiled.compiled`); None under the simulator.
    args : tuple
    grid, block, smem : int
    stream : numba.cuda stream or 0
    fast : bool
        Try the prepared parameter block.
    """

    def __init__(self, kern, compiled, args, grid: int, block: int, smem: int, stream, fast: bool):
        self.kern = kern
        self.compiled = compiled
        self.args = args
        self.grid = int(grid)
        self.block = int(block)
        self.smem = int(smem)
        self.stream = stream
        self.fast = False
        if fast and compiled is not None:
            try:
                self._build()
                self.fast = True
            except Exception as exc:  # pragma: no cover - depends on numba-cuda internals
                log.info("GPU backend: Numba's launch path for %s (%s)", getattr(kern, "__name__", kern), exc)

    def _build(self):
        import ctypes

        cub = cu()
        kobj = self.compiled
        kargs, retr = [], []
        for t, v in zip(kobj.argument_types, self.args):
            kobj._prepare_args(t, v, self.stream, retr, kargs)
        if retr:
            raise RuntimeError("an argument needs a copy back (host array)")
        objs = []
        for a in kargs:
            if isinstance(a, ctypes._SimpleCData):
                objs.append(a)
            elif isinstance(a, (int, np.integer)) and not isinstance(a, (bool, np.bool_)):
                objs.append(ctypes.c_int64(int(a)))  # pointers and extents: intptr_t, as cuda.core passes them
            else:
                raise TypeError(f"unexpected kernel parameter {type(a).__name__}")
        params = (ctypes.c_void_p * len(objs))(*[ctypes.addressof(o) for o in objs])
        cufunc = kobj._codelibrary.get_cufunc()
        handle = cufunc.handle
        try:
            (fn,) = cucheck(cub.cuKernelGetFunction(handle), "cuKernelGetFunction")
        except Exception:
            if isinstance(handle, cub.CUfunction):
                fn = handle
            else:
                fn = cub.CUfunction(int(handle))
        # the parameter block must match the compiled kernel, parameter by parameter
        if hasattr(cub, "cuFuncGetParamInfo"):
            for i, o in enumerate(objs):
                _off, size = cucheck(cub.cuFuncGetParamInfo(fn, i), "cuFuncGetParamInfo")
                if int(size) != ctypes.sizeof(o):
                    raise RuntimeError(f"parameter {i}: kernel takes {size} bytes, block has {ctypes.sizeof(o)}")
            if int(cub.cuFuncGetParamInfo(fn, len(objs))[0]) == 0:
                raise RuntimeError("the kernel takes more parameters than Numba marshalled")
        if self.smem > 48 * 1024:
            attr = cub.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
            cucheck(cub.cuFuncSetAttribute(fn, attr, self.smem), "cuFuncSetAttribute")
        self._keep = (objs, params, kobj)
        self._fn = fn
        self._params = ctypes.addressof(params)
        self._hstream = 0 if isinstance(self.stream, int) else int(self.stream.handle)
        self._launch_kernel = cub.cuLaunchKernel

    def __call__(self):
        if self.fast:
            self.on(self._hstream)
        else:
            launch_once(self.kern, self.compiled, self.args, self.grid, self.block, self.stream, self.smem)

    def on(self, hstream: int) -> None:
        """The prepared launch on the stream with handle ``hstream`` (a :class:`StepGraph`'s capture)."""
        err = self._launch_kernel(self._fn, self.grid, 1, 1, self.block, 1, 1, self.smem, hstream, self._params,
                                  0)[0]
        if int(err) != 0:
            raise RuntimeError(f"cuLaunchKernel failed: {err!r}")


class Steps:
    """Launches called as one, in order (a step's kernels in place of the fused kernel's launch; the
    bounds test after the centres' moves)."""

    def __init__(self, launches: list, grid: int):
        self.launches = launches
        self.grid = grid
        self.fast = all(launch.fast for launch in launches)
        #: the same step's launches with the screen on the rows the bounds test lists, and the
        #: screen's label array the test writes kept rows' labels into (full steps); see
        #: :func:`.gemm.step_launches`
        self.listed = None
        self.newlab = None
        #: the centres' attribute-major float64 copy the launches make, and its pitch, for the exact
        #: kernel (:func:`.recheck.recheck_kernel`'s ``ct``); None where they make none
        self.centres_t = None

    def __call__(self) -> None:
        for launch in self.launches:
            launch()

    def on(self, hstream: int) -> None:
        """The prepared launches, in order, on the stream with handle ``hstream`` (all must be :attr:`fast`)."""
        for launch in self.launches:
            launch.on(hstream)


def pinned(n: int, dtype) -> np.ndarray:
    try:
        return cuda.pinned_array(n, dtype=dtype)
    except Exception:  # pragma: no cover - pinning refused: pageable (copies then block)
        return np.empty(n, dtype=dtype)


#: outputs of a step buffer from which the upload clears them with a memset rather than copying
#: zeros from the host (a memset is one more operation on the stream: not for a few bytes)
MEMSET_OUTPUTS = 64 * 1024


class Pack:
    """The step buffer of one (k, plan) on the device, with pinned host mirrors.

    ``hin`` mirrors the whole buffer: the centre data, written in place each step,
    and zeros for the outputs, which are never written on the host.  Uploading it
    therefore also clears the sums, counts, SSE and counters: no zeroing kernel.  Where
    the outputs take :data:`MEMSET_OUTPUTS` bytes or more, the upload copies the inputs
    alone and a memset on the same stream clears the outputs (D's 2 MB of sums were
    copied from the host's zeros every step).  ``hout`` receives the outputs.  The
    copies are asynchronous on the legacy default stream, so a step synchronises once.
    """

    def __init__(self, k: int, m: int, TC: int, nct: int, storage: str, nslots: int, on_device: bool = False):
        self.k, self.m, self.TC, self.nct = k, m, TC, nct
        self.f32 = storage == "float32"
        #: whether the kernels make the shift and the centre data the screen reads (the tiles, norms and
        #: their bound) from the centres on the device (:mod:`.gemmcentres`): the host copies the centres
        #: alone, the buffer has no tiles and norms, and the upload zeroes the bound, which the device's
        #: atomic maximum starts from
        self.on_device = bool(on_device)
        self.layout, self.out0, self.total = pack_layout(k, m, TC, nct, storage, nslots, not self.on_device)
        L = self.layout
        words = self.total // 8
        o = self.out0 // 8
        self.nslots = max(1, nslots)
        self.dev = cuda.device_array(words, dtype=np.float64)
        self.p32 = self.dev.view(np.float32)
        self.ctr = self.dev.view(np.int64)
        self.i32 = self.dev.view(np.int32)
        self.dout = self.dev[o:]
        self.hin = pinned(words, np.float64)
        self.hin[:] = 0.0
        self.hout = pinned(words - o, np.float64)
        h32 = self.hin.view(np.float32)
        kp = nct * TC
        self.cm = self.cc = None  # where the device makes them, the buffer has neither
        if not self.on_device:
            self.cm = h32[L.p32_cm: L.p32_cm + kp * m].reshape(nct, m, TC)
            self.cc = h32[L.p32_cc: L.p32_cc + kp]
            self.cc[:] = np.inf  # padding centres never win
        self.sh = h32[L.p32_sh: L.p32_sh + m] if self.f32 else self.hin[L.p64_sh: L.p64_sh + m]
        self.zl = h32[L.p32_zl: L.p32_zl + 1]
        self.c64 = self.hin[L.p64_c64: L.p64_c64 + k * m].reshape(k, m)
        # results: views of hout
        self.r_sums = self.hout[L.p64_sums - o: L.p64_sums - o + k * m].reshape(k, m)
        self.r_cnt = self.hout[L.p64_cnt - o: L.p64_cnt - o + k]
        self.r_sse = L.p64_sse - o
        self.r_ctr = self.hout.view(np.int64)[L.i64_chg - o: L.i64_chg - o + 1 + self.nslots]
        #: the counter of the rows the bounds test left to pass 1 (:mod:`.bounds`), and its result
        self.gslot = L.i64_chg + 1 + self.nslots
        self.r_gat = self.hout.view(np.int64)[self.gslot - o: self.gslot - o + 1]
        #: the counter of the rows the TF32 screen left to the float32 screen (:mod:`.tensor`), and its result
        self.cslot = self.gslot + 1
        self.r_cas = self.hout.view(np.int64)[self.cslot - o: self.cslot - o + 1]
        if not SIM:
            from numba.cuda.cudadrv.driver import device_pointer

            self._dptr = int(device_pointer(self.dev))
            self._hin_ptr = int(self.hin.ctypes.data)
            self._hout_ptr = int(self.hout.ctypes.data)
            cub = cu()
            self._h2d = cub.cuMemcpyHtoDAsync
            self._d2h = cub.cuMemcpyDtoHAsync
            self._memset = cub.cuMemsetD32Async

    def fill(self, centres: np.ndarray) -> None:
        """Write this step's centre data into the pinned input buffer (host only): all of it, or where
        :attr:`on_device` the centres alone."""
        c = np.ascontiguousarray(centres, dtype=np.float64)
        if self.on_device:
            copy_centres(c, self.c64)
        else:
            fill_centres(c, self.f32, self.sh, self.cc, self.cm, self.c64, self.zl)

    def upload(self, hstream: int = 0) -> None:
        """Inputs and zeroed outputs to the device: one asynchronous copy, or where the outputs take
        :data:`MEMSET_OUTPUTS` bytes or more, a copy of the inputs and a memset of the outputs (same stream:
        the legacy default one, or the stream with handle ``hstream``)."""
        if SIM:
            self.dev.copy_to_device(self.hin)
        elif self.total - self.out0 >= MEMSET_OUTPUTS:
            cucheck(self._h2d(self._dptr, self._hin_ptr, self.out0, hstream), "cuMemcpyHtoDAsync")
            cucheck(self._memset(self._dptr + self.out0, 0, (self.total - self.out0) // 4, hstream),
                    "cuMemsetD32Async")
        else:
            cucheck(self._h2d(self._dptr, self._hin_ptr, self.total, hstream), "cuMemcpyHtoDAsync")

    def download(self, hstream: int = 0) -> None:
        """Outputs to ``hout``: one asynchronous copy (the caller synchronises)."""
        if SIM:
            self.dout.copy_to_host(self.hout)
        else:
            cucheck(self._d2h(self._hout_ptr, self._dptr + self.out0, self.total - self.out0, hstream),
                    "cuMemcpyDtoHAsync")


def graphs_wanted(tune: dict, fast: bool) -> bool:
    """Whether a resident step runs as one CUDA graph (:class:`StepGraph`): with prepared launches
    (``fast``), not under the simulator, unless ``tune={"graph": False}``."""
    return fast and not SIM and bool(tune.get("graph", True))


class StepGraph:
    """A step's copies and launches captured once into a CUDA graph and launched with one call.

    Each step of a state takes the same buffers and the same prepared parameter blocks, so the
    sequence (the step buffer's upload, the kernels, the outputs' download) is captured on a
    stream of its own (nothing runs while it is captured) and instantiated; a step then costs
    the host one ``cuGraphLaunch`` on the legacy default stream, ordered behind the work before it
    there, instead of a driver call for every copy and kernel (D, 3e5 x 257, K = 1000: 118-164 us
    of launches a listed step, during which its short kernels leave the device waiting).  The
    copies read and write the pinned buffers at their fixed addresses when the graph runs.

    Parameters
    ----------
    parts : sequence of callables
        Each takes a stream handle and enqueues its work there (:meth:`Pack.upload`,
        :meth:`Launch.on`, :meth:`Steps.on`, :meth:`Pack.download`), in order.
    """

    def __init__(self, parts):
        cub = cu()
        (stream,) = cucheck(cub.cuStreamCreate(int(cub.CUstream_flags.CU_STREAM_NON_BLOCKING)), "cuStreamCreate")
        self._exec = self._graph = None
        try:
            # Numba frees device memory lazily, in batches: a free (not allowed while a stream captures)
            # would end the capture, so none happens during it
            with cuda.defer_cleanup():
                mode = cub.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_THREAD_LOCAL
                cucheck(cub.cuStreamBeginCapture(stream, mode), "cuStreamBeginCapture")
                try:
                    for part in parts:
                        part(int(stream))
                except BaseException:
                    err, graph = cub.cuStreamEndCapture(stream)  # the capture ends either way; its graph dropped
                    if int(err) == 0:
                        cub.cuGraphDestroy(graph)
                    raise
                (self._graph,) = cucheck(cub.cuStreamEndCapture(stream), "cuStreamEndCapture")
            (self._exec,) = cucheck(cub.cuGraphInstantiate(self._graph, 0), "cuGraphInstantiate")
        except BaseException:
            self.close()
            raise
        finally:
            cub.cuStreamDestroy(stream)  # only the capture used it: the graph keeps no reference
        self._launch = cub.cuGraphLaunch

    def __call__(self) -> None:
        err = self._launch(self._exec, 0)[0]
        if int(err) != 0:
            raise RuntimeError(f"cuGraphLaunch failed: {err!r}")

    def close(self) -> None:
        """Free the executable graph and the graph (idempotent)."""
        cub = cu()
        if self._exec is not None:
            cub.cuGraphExecDestroy(self._exec)
            self._exec = None
        if self._graph is not None:
            cub.cuGraphDestroy(self._graph)
            self._graph = None
