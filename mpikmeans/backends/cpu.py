"""CPU backend: Numba-compiled assignment and accumulation, threaded per rank.

Rows are cut into a fixed number of contiguous blocks (``_BLOCKS``), whatever the
thread count; each block accumulates its own float64 partial sums and the
partials are added in block order.  So the result of a step is bit-for-bit the
same for any number of threads, and only the number of MPI ranks (which changes
the order of the final Allreduce) can move the last bits.
"""

from __future__ import annotations

import os

import numba
import numpy as np
from numba import njit, prange

from . import Backend, BackendInfo, StepResult

#: Row blocks with private partial sums.  Bounds the useful thread count and the
#: scratch memory (_BLOCKS * k * m float64).
_BLOCKS = 64


@njit(cache=True, fastmath=False, inline="always")
def _nearest(x, i, ct, d):
    # centres transposed (m, k): the inner loop runs over centres with one
    # accumulator each, so it vectorises without reordering any sum (each d[c]
    # still adds its m terms in attribute order, as the GPU kernels do)
    m, k = ct.shape
    for c in range(k):
        d[c] = 0.0
    for j in range(m):
        xj = x[i, j]
        for c in range(k):
            t = xj - ct[j, c]
            d[c] += t * t
    best = 0
    best_d = d[0]
    for c in range(1, k):
        # strict '<': ties go to the lowest centre index (the backends' contract)
        if d[c] < best_d:
            best_d = d[c]
            best = c
    return best, best_d


@njit(parallel=True, cache=True, fastmath=False)
def _lloyd_pass(x, ct, labels, weights, use_weights, part_sums, part_counts, part_sse, part_changed):
    n, m = x.shape
    k = ct.shape[1]
    nb = part_sums.shape[0]
    for b in prange(nb):
        d = np.empty(k, dtype=np.float64)
        lo = n * b // nb
        hi = n * (b + 1) // nb
        sums = part_sums[b]
        counts = part_counts[b]
        sse = 0.0
        changed = 0
        for c in range(k):
            counts[c] = 0.0
            for j in range(m):
                sums[c, j] = 0.0
        for i in range(lo, hi):
            best, best_d = _nearest(x, i, ct, d)
            if labels[i] != best:
                changed += 1
                labels[i] = best
            w = weights[i] if use_weights else 1.0
            counts[best] += w
            for j in range(m):
                sums[best, j] += w * x[i, j]
            sse += w * best_d
        part_sse[b] = sse
        part_changed[b] = changed


@njit(parallel=True, cache=True, fastmath=False)
def _assign_pass(x, ct, labels, dist2):
    n = x.shape[0]
    k = ct.shape[1]
    nb = min(n, 256)
    for b in prange(nb):
        d = np.empty(k, dtype=np.float64)
        for i in range(n * b // nb, n * (b + 1) // nb):
            best, best_d = _nearest(x, i, ct, d)
            labels[i] = best
            dist2[i] = best_d


@njit(cache=True)
def _reduce_blocks(part_sums, part_counts, part_sse, part_changed):
    # fixed block order keeps the result independent of the thread count
    sums = part_sums[0].copy()
    counts = part_counts[0].copy()
    sse = part_sse[0]
    changed = part_changed[0]
    for b in range(1, part_sums.shape[0]):
        sums += part_sums[b]
        counts += part_counts[b]
        sse += part_sse[b]
        changed += part_changed[b]
    return sums, counts, sse, changed


def default_threads(ranks_on_node: int = 1) -> int:
    """Threads for one rank so that ranks x threads stays within the node's cores.

    Parameters
    ----------
    ranks_on_node : int
        MPI ranks sharing this node.

    Returns
    -------
    int
        ``min(cores usable by this process, cores on the node // ranks_on_node)``,
        at least 1.  A launcher that binds each rank to one core gets one thread.
    """
    total = os.cpu_count() or 1
    try:
        usable = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        usable = total
    return max(1, min(usable, total // max(1, ranks_on_node)))


class CPUBackend(Backend):
    """Lloyd iteration on the host with Numba, float64 throughout.

    Parameters
    ----------
    threads : int, optional
        Numba threads for this rank; default :func:`default_threads` for one
        rank per node (the caller passes the MPI-aware figure).
    """

    name = "cpu"

    def __init__(self, threads: int | None = None):
        self.threads = max(1, min(threads or default_threads(), numba.config.NUMBA_NUM_THREADS))
        numba.set_num_threads(self.threads)
        self._x = None
        self._labels = None
        self._weights = None

    def load(self, x: np.ndarray, weights: np.ndarray | None = None) -> None:
        """Keep this rank's rows (see :meth:`Backend.load`).

        Parameters
        ----------
        x : ndarray, shape (n_local, m), float64
        weights : ndarray, shape (n_local,), float64, optional
            Instance weights; all ones when omitted.
        """
        self._x = np.ascontiguousarray(x, dtype=np.float64)
        n = self._x.shape[0]
        self._labels = np.full(n, -1, dtype=np.int32)
        if weights is None:
            self._weights = np.ones(0, dtype=np.float64)
        else:
            self._weights = np.ascontiguousarray(weights, dtype=np.float64)

    def step(self, centres: np.ndarray) -> StepResult:
        centres = np.ascontiguousarray(centres, dtype=np.float64)
        k, m = centres.shape
        nb = _BLOCKS
        part_sums = np.empty((nb, k, m), dtype=np.float64)
        part_counts = np.empty((nb, k), dtype=np.float64)
        part_sse = np.empty(nb, dtype=np.float64)
        part_changed = np.empty(nb, dtype=np.int64)
        _lloyd_pass(self._x, np.ascontiguousarray(centres.T), self._labels, self._weights, self._weights.size > 0,
                    part_sums, part_counts, part_sse, part_changed)
        sums, counts, sse, changed = _reduce_blocks(part_sums, part_counts, part_sse, part_changed)
        return StepResult(sums=sums, counts=counts, sse=float(sse), changed=int(changed))

    def assign(self, centres: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        centres = np.ascontiguousarray(centres, dtype=np.float64)
        n = self._x.shape[0]
        labels = np.empty(n, dtype=np.int32)
        dist2 = np.empty(n, dtype=np.float64)
        _assign_pass(self._x, np.ascontiguousarray(centres.T), labels, dist2)
        return labels, dist2

    def warmup(self, k: int, m: int) -> None:
        x = np.zeros((1, m))
        ct = np.zeros((m, k))
        _lloyd_pass(x, ct, np.full(1, -1, dtype=np.int32), np.ones(0), False, np.empty((1, k, m)),
                    np.empty((1, k)), np.empty(1), np.empty(1, dtype=np.int64))
        _assign_pass(x, ct, np.empty(1, dtype=np.int32), np.empty(1))

    def info(self) -> BackendInfo:
        return BackendInfo(name="cpu", devices=[], threads=self.threads, dtype="float64")

    def close(self) -> None:
        self._x = None
        self._labels = None
