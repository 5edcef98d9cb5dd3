"""Single-threaded host kernels for small row sets.

The initialisations get their distances from the run's backend (threads or a
GPU, the same arithmetic as the Lloyd loop).  Where there is none (the
candidates of k-means||, a library call on a few rows, the in-process rank
simulation of the tests, where several "ranks" run on threads of one process)
these serial kernels do the same work: each squared distance adds its m terms
in attribute order and ties go to the lowest centre, as in the CPU backend, so
both give bit-identical D²; being serial, several may run at once.
"""

from __future__ import annotations

import numpy as np
from ..jit import njit

from .base import RowDistances


@njit(cache=True, forceinline=True)
def _nearest_row(x, i, c):  # pragma: no cover - compiled
    """Nearest centre of row ``i`` and its squared distance (lowest index on ties)."""
    m = x.shape[1]
    best = 0
    best_d = np.inf
    for j in range(c.shape[0]):
        d = 0.0
        for a in range(m):
            t = x[i, a] - c[j, a]
            d += t * t
        if j == 0 or d < best_d:
            best_d = d
            best = j
    return best, best_d


@njit(cache=True)
def _assign_serial(x, c, labels, dist2):  # pragma: no cover - compiled
    for i in range(x.shape[0]):
        labels[i], dist2[i] = _nearest_row(x, i, c)


@njit(cache=True)
def weighted_lloyd(x, w, centres, max_iter):  # pragma: no cover - compiled
    """A small weighted k-means, serial: Lloyd iterations on ``centres`` in place.

    For the k-means|| candidates (as Spark's LocalKMeans): it runs once, on one
    rank, and the result is broadcast.  An empty cluster keeps its centre.

    Parameters
    ----------
    x : ndarray, shape (n, m), float64
    w : ndarray, shape (n,), float64
    centres : ndarray, shape (k, m), float64
        Initial centres; updated in place.
    max_iter : int

    Returns
    -------
    ndarray, shape (k, m), float64
        ``centres``.
    """
    n, m = x.shape
    k = centres.shape[0]
    labels = np.full(n, -1, dtype=np.int64)
    sums = np.zeros((k, m))
    counts = np.zeros(k)
    for _ in range(max_iter):
        sums[:] = 0.0
        counts[:] = 0.0
        changed = 0
        for i in range(n):
            best, _ = _nearest_row(x, i, centres)
            if labels[i] != best:
                changed += 1
                labels[i] = best
            counts[best] += w[i]
            for a in range(m):
                sums[best, a] += w[i] * x[i, a]
        for j in range(k):
            if counts[j] > 0.0:  # an empty cluster keeps its centre
                for a in range(m):
                    centres[j, a] = sums[j, a] / counts[j]
        if changed == 0:
            break
    return centres


class SerialRows(RowDistances):
    """The distances of :class:`~mpikmeans.backends.RowDistances` for rows in host memory, one thread.

    Parameters
    ----------
    x : ndarray, shape (n, m)
        Converted to C-contiguous float64 once.
    """

    def __init__(self, x: np.ndarray):
        self._x = np.ascontiguousarray(x, dtype=np.float64)

    def assign(self, centres: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        centres = np.ascontiguousarray(centres, dtype=np.float64)
        n = self._x.shape[0]
        labels = np.empty(n, dtype=np.int32)
        dist2 = np.empty(n, dtype=np.float64)
        if n:
            _assign_serial(self._x, centres, labels, dist2)
        return labels, dist2
