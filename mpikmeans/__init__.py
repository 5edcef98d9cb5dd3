"""mpikmeans: k-means clustering of large ARFF data sets over MPI ranks and GPUs.

``from mpikmeans import KMeans`` gives the scikit-learn-shaped API
(:mod:`mpikmeans.api`), ``mpikmeans.load(path)`` a fitted one from a saved
model file.  They are imported on first use, so that ``import
mpikmeans`` (and ``mpikmeans --help``) stays cheap: no numba, no mpi4py.
"""

import time as _time

#: When the package was first imported: a command's process start, for its ``launch_s``
IMPORTED_AT = _time.perf_counter()

__version__ = "0.1.0"

import os as _os  # noqa: E402
import sys as _sys  # noqa: E402

from . import cache as _cache  # noqa: E402

# Numba prints its warnings in bold (ESC[1m ... ESC[0m) where colorama is installed: job logs
# and pipes get escape codes.  Plain text unless stderr is a terminal (a user may still set it);
# read once, when numba.core.errors is imported, so before numba is
if not (getattr(_sys.stderr, "isatty", None) and _sys.stderr.isatty()):
    _os.environ.setdefault("NUMBA_DISABLE_ERROR_MESSAGE_HIGHLIGHTING", "1")

# before numba is imported: compiled kernels are cached per source version (see cache.py)
_cache.configure()

__all__ = ["KMeans", "load", "__version__"]

#: What the API module gives on first use
_LAZY = ("KMeans", "load")


def __getattr__(name):
    # PEP 562: load the API (and with it numba) only when it is asked for
    if name in _LAZY:
        from . import api

        return getattr(api, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
    return sorted(list(globals()) + list(_LAZY))
