"""512-bit vectors for the CPU kernels on cores that have them.

On Intel's AVX-512 cores (Skylake-SP and later) LLVM's tuning prefers 256-bit
vectors (``prefer-256-bit``: wide instructions once lowered the clock), so
Numba compiles the float32 distance screen
(:mod:`mpikmeans.backends.cpu.certified`) eight lanes wide while the BLAS of
scikit-learn and oneDAL runs sixteen.  :func:`configure` turns that tuning off
through ``NUMBA_CPU_FEATURES`` (the host's features, ``-prefer-256-bit``
added), before Numba reads its configuration.  Results do not change: the
exact kernels are not reassociated, whatever the vector width, and the screen's
bound holds for any order of its additions.

``MPIKMEANS_WIDE_VECTORS=0``, or a ``NUMBA_CPU_FEATURES`` of the user's, leaves
Numba's choice alone.  Like :mod:`mpikmeans.cache`, this module imports
neither Numba nor NumPy.
"""

from __future__ import annotations

import os
import sys

_VAR = "NUMBA_CPU_FEATURES"
_OURS = "MPIKMEANS_SET_NUMBA_CPU_FEATURES"


def _cpu_flags(path: str = "/proc/cpuinfo") -> set:
    """The first CPU's flags (empty where there is no /proc/cpuinfo)."""
    try:
        with open(path, encoding="ascii", errors="replace") as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.partition(":")[2].split())
    except OSError:
        pass
    return set()


def wide_features(host_features: str) -> str | None:
    """The feature string that lifts the 256-bit preference, or None where there is nothing to lift.

    Parameters
    ----------
    host_features : str
        LLVM's host features, ``+avx2,+avx512f,-amx-tile,...``.
    """
    feats = host_features.split(",")
    if "+avx512f" not in feats:
        return None
    return ",".join([f for f in feats if f.lstrip("+-") != "prefer-256-bit"] + ["-prefer-256-bit"])


def configure(flags: set | None = None) -> str | None:
    """Set ``NUMBA_CPU_FEATURES`` for 512-bit vectors where the CPU has AVX-512; the value, or None.

    Call before Numba is imported (``mpikmeans/__init__.py`` does); where it
    already is, its configuration is reloaded (kernels compiled before keep
    their code).
    """
    theirs = os.environ.get(_VAR)
    if os.environ.get("MPIKMEANS_WIDE_VECTORS", "1") == "0" or (theirs and theirs != os.environ.get(_OURS)):
        return None
    if "avx512f" not in (_cpu_flags() if flags is None else flags):
        return None  # the common case, decided without loading LLVM
    from llvmlite import binding as ll

    value = wide_features(ll.get_host_cpu_features().flatten())
    if value is None:
        return None
    os.environ[_VAR] = os.environ[_OURS] = value
    if "numba" in sys.modules:
        from numba.core import config

        config.reload_config()
    return value
