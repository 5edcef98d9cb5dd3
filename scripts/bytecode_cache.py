"""Byte-compile the named packages, as ``pip install`` does at install time.

Used by ``scripts/device_gpu.sh`` on machines whose packages were installed without
``.pyc`` files and whose environment forbids writing them (``PYTHONDONTWRITEBYTECODE``):
with ``PYTHONPYCACHEPREFIX`` set, the cache goes there and the packages stay untouched.
A package that is not installed is skipped.

    PYTHONPYCACHEPREFIX=/tmp/pycache python3 scripts/bytecode_cache.py numpy numba ...
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


def main(names: list) -> int:
    t = time.perf_counter()
    done = []
    for name in names:
        for d in package_dirs(name):
            if not compileall.compile_dir(d, quiet=1, workers=0):
                print(f"bytecode_cache: some files of {d} did not compile", file=sys.stderr)
            done.append(name)
    print(f"bytecode cache ({sys.pycache_prefix or 'beside the sources'}): {', '.join(sorted(set(done)))} "
          f"in {time.perf_counter() - t:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
