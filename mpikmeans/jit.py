"""Numba's compiler decorators, as the package's kernel modules import them, and a count of compiles.

Importing them from here first hardens Numba's disk cache (a damaged entry is
compiled again, see :func:`mpikmeans.cache.harden_numba_cache`), before any of
the package's cached kernels is defined.  Every compile this process makes
(a kernel Numba did not find in its cache, CPU or GPU) is counted and timed,
so a run can report what it compiled (``summary.json``'s ``timings``).
"""

import time

from numba import njit, prange
from numba.core import event

from .cache import harden_numba_cache

harden_numba_cache()


class _CompileCounter(event.Listener):
    """Counts the outermost ``numba:compile`` events (a kernel's callees compile inside its event)."""

    def __init__(self):
        self.count = 0
        self.seconds = 0.0
        self._depth = 0
        self._t0 = 0.0

    def on_start(self, event):  # noqa: ARG002 - Numba's listener interface
        if self._depth == 0:
            self._t0 = time.perf_counter()
        self._depth += 1

    def on_end(self, event):  # noqa: ARG002
        self._depth -= 1
        if self._depth == 0:
            self.count += 1
            self.seconds += time.perf_counter() - self._t0


_COUNTER = _CompileCounter()
event.register("numba:compile", _COUNTER)


def record_compile(seconds: float) -> None:
    """Count a compile made outside Numba's CPU dispatchers (a GPU kernel compiled for the store)."""
    _COUNTER.count += 1
    _COUNTER.seconds += seconds


def compile_stats() -> tuple:
    """(kernels compiled, seconds compiling) by this process so far."""
    return _COUNTER.count, _COUNTER.seconds


__all__ = ["compile_stats", "njit", "prange", "record_compile"]
