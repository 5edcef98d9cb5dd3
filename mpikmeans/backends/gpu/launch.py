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
    from numba.cuda.cudadrv import driver

    compiled.launch(args, _dim3(grid), _dim3(block), driver._to_core_stream(stream), smem)


def pinned(n: int, dtype) -> np.ndarray:
    """A page-locked host array (copies to and from the device run asynchronously, at full speed)."""
    try:
        return cuda.pinned_array(n, dtype=dtype)
    except Exception:  # pragma: no cover - pinning refused: pageable (copies then block)
        return np.empty(n, dtype=dtype)
