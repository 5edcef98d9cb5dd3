"""Launching a compiled kernel, its shared memory beyond 48 KB, and pinned host buffers."""

from __future__ import annotations

import numpy as np

from .device import cuda


def allow_shared(kernel, nbytes: int) -> None:
    """Let a compiled kernel use ``nbytes`` of dynamic shared memory (past 48 KB a kernel must opt in,
    ``CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES``, which Numba does not do).

    Parameters
    ----------
    kernel : numba.cuda ``_Kernel`` or None
        None under the simulator (nothing to do).
    nbytes : int
    """
    if kernel is None or nbytes <= 48 * 1024:
        return
    from cuda.bindings import driver as cudrv
    from numba.cuda.cudadrv.driver import driver

    cufunc = kernel._codelibrary.get_cufunc()
    attr = cudrv.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
    driver.cuKernelSetAttribute(attr, int(nbytes), cufunc.handle, cufunc.device.id)


def _dim3(d) -> tuple:
    d = tuple(d) if isinstance(d, tuple) else (int(d),)
    return d + (1,) * (3 - len(d))


#: the attribute a device array keeps its kernel parameters in (a device array's pointer never changes)
_WORDS = "_mpikmeans_kernel_words"


def _array_words(a) -> tuple:
    """The parameters a compiled kernel takes for a device array, as Numba passes them: meminfo, parent,
    size, itemsize, data pointer, shape, strides in bytes."""
    w = getattr(a, _WORDS, None)
    if w is None:
        w = (0, 0, a.size, a.dtype.itemsize, a.device_ctypes_pointer.value or 0, *a.shape, *a.strides)
        setattr(a, _WORDS, w)
    return w


def _packers(types) -> tuple | None:
    """One function per argument type, appending its kernel parameters; None where a type is not one the
    step's kernels take (such a kernel goes through Numba's own launch)."""
    import ctypes

    from numba.cuda import types as nt

    out = []
    for ty in types:
        if isinstance(ty, nt.Array):
            out.append(lambda v, p: p.extend(_array_words(v)))
        elif isinstance(ty, nt.Integer):
            cls = getattr(ctypes, f"c_{ty}")
            out.append(lambda v, p, cls=cls: p.append(cls(v)))
        elif ty == nt.float64:
            out.append(lambda v, p: p.append(ctypes.c_double(v)))
        elif ty == nt.float32:
            out.append(lambda v, p: p.append(ctypes.c_float(v)))
        elif ty == nt.boolean:
            out.append(lambda v, p: p.append(bool(v)))
        else:
            return None
    return tuple(out)


class _Launcher:
    """A compiled kernel's launch without Numba's per-argument dispatch: the host's cost of a step is its
    launches, and Numba's generic path takes tens of microseconds an argument."""

    def __init__(self, compiled):
        from cuda.core import LaunchConfig
        from cuda.core import launch as core_launch

        self.compiled = compiled
        self.kernel = compiled._codelibrary.get_cufunc().kernel
        self.packers = _packers(compiled.argument_types)
        self.core_launch, self.config_cls = core_launch, LaunchConfig
        self.configs = {}

    def __call__(self, args: tuple, grid, block, stream, smem: int) -> None:
        if self.packers is None:
            from numba.cuda.cudadrv import driver

            self.compiled.launch(args, _dim3(grid), _dim3(block), driver._to_core_stream(stream), smem)
            return
        params = []  # every array argument a device array: a host array would raise here, never launch
        for pack, v in zip(self.packers, args):
            pack(v, params)
        key = (grid, block, smem)
        config = self.configs.get(key)
        if config is None:
            config = self.configs[key] = self.config_cls(grid=_dim3(grid), block=_dim3(block), shmem_size=smem)
        self.core_launch(_core_stream(stream), config, self.kernel, *params)


_STREAMS = {}


def _core_stream(stream):
    """cuda.core's view of a Numba stream (or of the default stream, 0), made once a stream."""
    key = int(stream.handle) if stream else 0
    s = _STREAMS.get(key)
    if s is None:
        from numba.cuda.cudadrv import driver

        s = _STREAMS[key] = driver._to_core_stream(stream)
    return s


def launch(kern, compiled, args: tuple, grid, block, stream=0, smem: int = 0) -> None:
    """One launch of a kernel compiled for ``args``' types (no dispatch on them).

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
    prepare(compiled)(args, grid, block, stream, smem)


def prepare(compiled) -> _Launcher:
    """The launcher of a compiled kernel, made on its first use (or in a run's set-up: it imports cuda.core
    and reads the kernel's argument types).

    Parameters
    ----------
    compiled : numba.cuda ``_Kernel``
    """
    launcher = getattr(compiled, "_mpikmeans_launcher", None)
    if launcher is None:
        launcher = compiled._mpikmeans_launcher = _Launcher(compiled)
    return launcher


def pinned(n: int, dtype) -> np.ndarray:
    """A page-locked host array (copies to and from the device run asynchronously, at full speed)."""
    try:
        return cuda.pinned_array(n, dtype=dtype)
    except Exception:  # pragma: no cover - pinning refused: pageable (copies then block)
        return np.empty(n, dtype=dtype)
