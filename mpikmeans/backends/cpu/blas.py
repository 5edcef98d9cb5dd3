"""The BLAS library behind the CPU screen's float32 products, one thread per caller.

Numba's ``np.dot`` calls SciPy's BLAS (``scipy.linalg.cython_blas``).  The
screen calls it from each of the backend's threads for one tile at a time, so
the library must not start threads of its own as well: OpenBLAS would split
every small product among the cores the backend's threads already use.
"""

from __future__ import annotations

_controller = None


def one_thread():
    """A context in which the BLAS libraries of this process run each call on the calling thread.

    What they were set to is restored on leaving it (a program that imports
    ``mpikmeans`` keeps its own BLAS threads outside the backend's calls).
    """
    global _controller
    if _controller is None:
        import scipy.linalg.cython_blas  # noqa: F401 - the library Numba calls, loaded before it is looked for
        from threadpoolctl import ThreadpoolController

        _controller = ThreadpoolController()
    return _controller.limit(limits=1, user_api="blas")
