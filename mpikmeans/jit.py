"""Numba's compiler decorators, as the package's kernel modules import them.

Importing them from here first hardens Numba's disk cache (a damaged entry is
compiled again, see :func:`mpikmeans.cache.harden_numba_cache`), before any of
the package's cached kernels is defined.
"""

from numba import njit, prange

from .cache import harden_numba_cache

harden_numba_cache()

__all__ = ["njit", "prange"]
