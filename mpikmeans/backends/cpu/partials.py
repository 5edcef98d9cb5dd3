"""The step's row blocks' partial results, added in block order.

Each of the step's row blocks (:data:`.tiles._BLOCKS`) sums its rows into a K x M
partial (:mod:`.bounds`); the partials are added here, block by block in order, so
the result is the same bits for any thread count.  Small K x M on the calling
thread, large K x M split among the threads by chunks of elements.
"""

from __future__ import annotations

import numpy as np

from ...jit import njit, prange

#: elements of the flattened K x M sums one thread of :func:`reduce_blocks` adds over the blocks
REDUCE_CHUNK = 4096


def compile_reductions(part_sums, part_counts, part_sse, part_changed) -> None:
    """Compile (or load from the cache) both of :func:`reduce_blocks`' reductions on these partials:
    which one a call takes depends on K x M, not known to a warm-up on tiny arrays."""
    for reduce in (reduce_serial, reduce_parallel):
        reduce(part_sums, part_counts, part_sse, part_changed)


def reduce_blocks(part_sums, part_counts, part_sse, part_changed):
    """The blocks' partial sums added in block order: ``((p0 + p1) + p2) + ...`` for every element.

    The fixed order keeps the result independent of the thread count.  Up to
    :data:`REDUCE_CHUNK` elements one thread adds them (:func:`reduce_serial`):
    waking the pool for one chunk cost more than the additions (10^6 x 16,
    K = 8: 0.05 ms a step on one thread, more with each thread woken); past it
    the elements are split among the threads (:func:`reduce_parallel`; at
    K = 1000, M = 257 the partials are 64 x 2 MB, which one thread took 15-30 ms
    to read).

    Parameters
    ----------
    part_sums : ndarray, shape (nb, k, m), float64
    part_counts : ndarray, shape (nb, k), float64
    part_sse : ndarray, shape (nb,), float64
    part_changed : ndarray, shape (nb,), int64

    Returns
    -------
    (sums (k, m), counts (k,), sse, changed)
    """
    _, k, m = part_sums.shape
    reduce = reduce_parallel if k * m > REDUCE_CHUNK else reduce_serial
    return reduce(part_sums, part_counts, part_sse, part_changed)


@njit(cache=True, fastmath=False, forceinline=True)
def _reduce_chunk(flat, sums, lo, hi):  # pragma: no cover - compiled
    """``sums[lo:hi]``: elements ``lo .. hi-1`` of the flattened partials ``flat`` (nb, k m), in block order."""
    part = sums[lo:hi]
    part[:] = flat[0, lo:hi]
    for b in range(1, flat.shape[0]):
        part += flat[b, lo:hi]


@njit(cache=True, fastmath=False, forceinline=True)
def _reduce_scalars(part_counts, part_sse, part_changed):  # pragma: no cover - compiled
    """The counts, SSE and changed labels of the blocks, added in block order."""
    counts = part_counts[0].copy()
    sse = part_sse[0]
    changed = part_changed[0]
    for b in range(1, part_counts.shape[0]):
        counts += part_counts[b]
        sse += part_sse[b]
        changed += part_changed[b]
    return counts, sse, changed


@njit(cache=True, fastmath=False)
def reduce_serial(part_sums, part_counts, part_sse, part_changed):  # pragma: no cover - compiled
    """:func:`reduce_blocks` on the calling thread."""
    nb, k, m = part_sums.shape
    sums = np.empty(k * m)
    _reduce_chunk(part_sums.reshape(nb, k * m), sums, 0, k * m)
    counts, sse, changed = _reduce_scalars(part_counts, part_sse, part_changed)
    return sums.reshape(k, m), counts, sse, changed


@njit(parallel=True, cache=True, fastmath=False)
def reduce_parallel(part_sums, part_counts, part_sse, part_changed):  # pragma: no cover - compiled
    """:func:`reduce_blocks` with chunks of :data:`REDUCE_CHUNK` elements on the threads."""
    nb, k, m = part_sums.shape
    flat = part_sums.reshape(nb, k * m)
    sums = np.empty(k * m)
    for q in prange((k * m + REDUCE_CHUNK - 1) // REDUCE_CHUNK):
        lo = q * REDUCE_CHUNK
        _reduce_chunk(flat, sums, lo, min(lo + REDUCE_CHUNK, k * m))
    counts, sse, changed = _reduce_scalars(part_counts, part_sse, part_changed)
    return sums.reshape(k, m), counts, sse, changed
