"""Compiled GPU kernels: loaded from the kernel store when this machine type compiled them before.

Numba compiles a ``cuda.jit`` kernel again in every process (seconds per
specialisation: the kernels unroll over K and M), and its own disk cache keys an
entry by the kernel's file only.  Here a compiled kernel (Numba's ``_Kernel``,
with the machine code for this device) is stored in
:class:`mpikmeans.cache.KernelStore` under a key made of everything that changes
the code it compiles to:

* the kernel's name and specialisation (the factory's arguments: shape, plan,
  layouts, dtype, mode...), and the argument types;
* the source of every module whose code goes into a kernel (:data:`SOURCES`);
* the device's compute capability, the CUDA driver's version, and the versions
  of numba-cuda, Numba and Python.

So a run that finds its kernels in the store compiles nothing, and no change of
code, device or toolchain can load an entry compiled for another.
"""

from __future__ import annotations

import functools
import logging
import os
import sys
import time

from ...cache import GPU_SOURCES as SOURCES  # the modules whose code the kernels compile
from ...cache import KernelStore, cache_root, source_hash
from ...jit import record_compile
from .device import SIM, cuda

log = logging.getLogger("mpikmeans.backends.gpu")

#: (kernel name, seconds) of every kernel this process compiled rather than loaded (``bench compile``)
COMPILE_TIMES: list = []
#: The kernels this process has compiled or loaded, by key: the initialisations launch the same
#: few kernels hundreds of times, and each load from the store reads, checks and unpickles a
#: file and loads a module onto the device (milliseconds)
_IN_PROCESS: dict = {}


def store_dir() -> str:
    """The GPU kernels' directory in the cache root."""
    return os.path.join(cache_root(), "cuda")


@functools.lru_cache(maxsize=None)
def _store() -> KernelStore:
    return KernelStore(store_dir())


@functools.lru_cache(maxsize=None)
def toolchain() -> tuple:
    """What, besides the kernel itself, changes the compiled code: sources, versions, device."""
    import numba
    import numba_cuda

    from numba.cuda.cudadrv.driver import driver

    cc = cuda.get_current_device().compute_capability
    try:
        drv = driver.get_version()
    except Exception:  # pragma: no cover - older numba-cuda
        drv = None
    return (source_hash(list(SOURCES)), tuple(cc), drv, numba_cuda.__version__, numba.__version__,
            tuple(sys.version_info[:2]))


def _dumps(kernel) -> bytes:
    from numba.cuda.serialize import dumps

    return dumps(kernel)


def compiled(name: str, spec: tuple, dispatcher, args: tuple):
    """The compiled kernel of ``dispatcher`` for ``args``: from the store, else compiled and stored.

    Parameters
    ----------
    name : str
        The kernel's name (its factory).
    spec : tuple
        Everything the factory specialised the kernel on (plain values).
    dispatcher : numba.cuda dispatcher
    args : tuple
        Example arguments (device arrays, ints) of the launches to come.

    Returns
    -------
    numba.cuda ``_Kernel``, or None under the simulator (launch through the dispatcher)
    """
    if SIM:
        return None
    argtypes = tuple(dispatcher.typeof_pyval(a) for a in args)
    key = (name, spec, tuple(str(t) for t in argtypes), toolchain())
    kernel = _IN_PROCESS.get(key)
    if kernel is not None:
        return kernel
    kernel = _store().get(key)
    if kernel is not None:
        # onto the device now (set-up), not at its first launch inside a step
        kernel._codelibrary.get_cufunc()
        _IN_PROCESS[key] = kernel
        return kernel
    t0 = time.perf_counter()
    kernel = dispatcher.compile(argtypes)
    kernel._codelibrary.get_cubin()  # this device's machine code goes into the entry: a load compiles nothing
    kernel._codelibrary.get_cufunc()
    COMPILE_TIMES.append((name, time.perf_counter() - t0))
    record_compile(COMPILE_TIMES[-1][1])
    log.info("GPU kernel %s compiled in %.2f s (not in the store)", name, COMPILE_TIMES[-1][1])
    _IN_PROCESS[key] = kernel
    try:
        _store().put(key, kernel, dumps=_dumps)
    except Exception as exc:  # pragma: no cover - depends on numba-cuda internals
        log.warning("GPU kernel %s could not be cached (%s): it is compiled in every run", name, exc)
    return kernel


def cached_entries() -> int:
    """Compiled GPU kernels in the store (all devices and versions)."""
    return _store().entries()
