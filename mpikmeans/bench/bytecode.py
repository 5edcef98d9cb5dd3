"""Byte-compile the named packages, as ``pip install`` does at install time.

Used by ``scripts/device_gpu.sh`` on machines whose packages were installed without
``.pyc`` files and whose environment forbids writing them (``PYTHONDONTWRITEBYTECODE``):
with ``PYTHONPYCACHEPREFIX`` set, the cache goes there and the packages stay untouched.
A package that is not installed is skipped.

    PYTHONPYCACHEPREFIX=/tmp/pycache python3 -c \
        'import sys; from mpikmeans.bench.bytecode import compile_packages; print(compile_packages(sys.argv[1:]))' \
        numpy numba ...
"""

from __future__ import annotations

import compileall
import importlib.util
import sys
import time


def package_dirs(name: str) -> list:
    """The directories of an installed package (several for a namespace package); [] if absent."""
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return []
    if spec is None:
        return []
    return list(spec.submodule_search_locations or [])


def compile_packages(names: list) -> tuple[list, list, float]:
    """Byte-compile each installed package of ``names``.

    Returns
    -------
    (compiled, failed, seconds)
        The names compiled, the directories where some file did not compile, the time taken.
    """
    t = time.perf_counter()
    done, failed = [], []
    for name in names:
        for d in package_dirs(name):
            if not compileall.compile_dir(d, quiet=1, workers=0):
                failed.append(d)
            done.append(name)
    return sorted(set(done)), failed, time.perf_counter() - t

