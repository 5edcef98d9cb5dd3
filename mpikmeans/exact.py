"""Exact, rank-independent sums: the fixed-point arithmetic behind every random draw.

k-means++ and k-means|| sample rows with probability proportional to their
(weighted) squared distance D².  A floating-point sum of D² depends on the
order of the additions, hence on how the rows are split over the ranks, and a
draw that lands within rounding of a boundary between two rows would then pick
a different row at -np 1 and -np 4.  So every sum that decides a draw is exact:
each value v >= 0 becomes the integer q = rint(v * 2**s), with one global
power-of-two scale s chosen so that the largest value has all of its 53 bits
(q < 2**53); integer sums are associative, so totals, prefix sums and the drawn
rows are the same for any split.  Values below 2**-53 of the largest one round
to 0 (and are never drawn): the same resolution float64 itself has relative to
that largest value.  Integers are summed as two int64 limbs (q = hi * 2**27 +
lo) so that no partial sum can overflow below 2**36 rows per rank; totals are
Python ints.

This module holds the arithmetic (:func:`fixed_scale`, :func:`to_fixed`,
:func:`limb_sums`) and the collectives built on it: global totals, weighted draws
of rows (:func:`draw_rows`), per-label totals (:func:`exact_label_sums`).  It
knows nothing of backends or of the initialisations that use it.
"""

from __future__ import annotations

import bisect
import itertools
import math

import numpy as np
from .jit import njit, prange

from .errors import InputError
from .fixedsums import scale_factors

FIXED_BITS = 53
LIMB = 27
LIMB_MASK = (1 << LIMB) - 1


def fixed_scale(vmax: float) -> int:
    """The exponent ``s`` with ``vmax * 2**s`` in ``[2**52, 2**53)``.

    Parameters
    ----------
    vmax : float
        Largest magnitude of the values to sum (global: from an Allreduce MAX).

    Returns
    -------
    int
        0 when ``vmax`` is 0 (all values are 0).
    """
    if vmax == 0.0:
        return 0
    if not math.isfinite(vmax):
        raise InputError("a non-finite value reached a sum (the data must be finite)")
    return FIXED_BITS - math.frexp(vmax)[1]


def to_fixed(v: np.ndarray, s: int) -> np.ndarray:
    """``rint(v * 2**s)`` as int64 (exact scaling: ``s`` is a power of two).

    Parameters
    ----------
    v : ndarray, any shape, float64
        ``|v| <= vmax`` of :func:`fixed_scale`.
    s : int or ndarray of int broadcastable to ``v``

    Returns
    -------
    ndarray, same shape, int64, ``|q| <= 2**53``
    """
    return np.rint(np.ldexp(v, s)).astype(np.int64)


def limb_sums(q: np.ndarray, axis=None) -> tuple[np.ndarray, np.ndarray]:
    """Exact sums of fixed-point integers as two int64 limbs.

    Parameters
    ----------
    q : ndarray, int64, ``|q| <= 2**53``
    axis : int or None

    Returns
    -------
    hi, lo : int64 ndarrays (0-d for ``axis=None``)
        ``sum(q) == hi * 2**27 + lo``, exactly, for fewer than 2**36 terms.
    """
    return (q >> LIMB).sum(axis=axis, dtype=np.int64), (q & LIMB_MASK).sum(axis=axis, dtype=np.int64)


def limbs_to_int(hi, lo) -> int:
    """The Python int ``hi * 2**27 + lo``."""
    return (int(hi) << LIMB) + int(lo)


def local_total(q: np.ndarray) -> int:
    """The exact sum of fixed-point integers ``q`` (any shape) as a Python int."""
    return limbs_to_int(*limb_sums(q))


def global_max(comm, v: np.ndarray) -> float:
    """Largest element of ``v`` over all ranks (0 when every rank's ``v`` is empty or <= 0)."""
    local = float(v.max()) if v.size else 0.0
    return float(comm.allreduce(np.array([max(local, 0.0)]), "max")[0])


@njit(cache=True, forceinline=True)
def fixed_limbs(v, f1, f2):  # pragma: no cover - compiled
    """``q = to_fixed(v, s)`` as its two limbs ``(q >> LIMB, q & LIMB_MASK)``: ``f1 f2 = 2**s``
    (:func:`scale_factors`) scales exactly, so ``rint(v f1 f2)`` is :func:`to_fixed`'s integer."""
    q = np.int64(np.rint(v * f1 * f2))
    return q >> 27, q & 134217727


@njit(cache=True)
def fixed_potential(d2, dist, w, use_w, f1, f2):  # pragma: no cover - compiled
    """The exact fixed-point total of ``v = min(D², dist) (* w)`` and the largest ``v``.

    One pass instead of NumPy's nine: the integers are those of
    :func:`to_fixed` / :func:`limb_sums` (the scaling by ``f1 * f2 = 2**s`` is
    exact, see :func:`scale_factors`).

    Parameters
    ----------
    d2, dist : ndarray, shape (n,), float64
    w : ndarray, shape (n,) (read only when ``use_w``), float64
    use_w : bool
    f1, f2 : float

    Returns
    -------
    hi, lo : int
        The limbs of the total.
    vmax : float
    """
    hi = 0
    lo = 0
    vmax = 0.0
    for i in range(d2.shape[0]):
        v = min(d2[i], dist[i])
        if use_w:
            v *= w[i]
        if v > vmax:
            vmax = v
        a, b = fixed_limbs(v, f1, f2)
        hi += a
        lo += b
    return hi, lo, vmax


@njit(parallel=True, cache=True)
def _column_limbs(x, f1, f2, center, square, hi, lo):  # pragma: no cover - compiled
    # one pass over the rows, row blocks on threads: per column the limbs of
    # rint(v * 2**s), v = x or (x - center)**2 (the same float operations as
    # NumPy's x - c and d * d); integer sums, so the blocks change nothing
    n, m = x.shape
    parts = hi.shape[0]
    for t in prange(parts):
        for i in range(n * t // parts, n * (t + 1) // parts):
            for j in range(m):
                v = x[i, j]
                if square:
                    d = v - center[j]
                    v = d * d
                a, b = fixed_limbs(v, f1[j], f2[j])
                hi[t, j] += a
                lo[t, j] += b


def column_limb_sums(x: np.ndarray, scales: np.ndarray, center: np.ndarray | None = None) -> tuple:
    """Per column, the exact sum of ``to_fixed(v, s)`` as two int64 limbs, in one compiled pass.

    Parameters
    ----------
    x : ndarray, shape (n, m), float64
    scales : ndarray, shape (m,), int
        Each column's fixed-point exponent (:func:`fixed_scale` of its largest ``|v|``).
    center : ndarray, shape (m,), float64, optional
        Sum ``(x - center)**2`` instead of ``x``.

    Returns
    -------
    hi, lo : ndarray, shape (m,), int64
        ``sum(to_fixed(v[:, j], s_j)) == hi[j] * 2**27 + lo[j]`` (:func:`limb_sums`' limbs).
    """
    x = np.ascontiguousarray(x, dtype=np.float64)
    m = x.shape[1]
    f = np.array([scale_factors(int(s_)) for s_ in scales], dtype=np.float64).reshape(m, 2)
    parts = max(1, min(len(x), 256))
    hi = np.zeros((parts, m), dtype=np.int64)
    lo = np.zeros((parts, m), dtype=np.int64)
    square = center is not None
    c = np.ascontiguousarray(center, dtype=np.float64) if square else np.zeros(m)
    if len(x):
        _column_limbs(x, np.ascontiguousarray(f[:, 0]), np.ascontiguousarray(f[:, 1]), c, square, hi, lo)
    return hi.sum(axis=0), lo.sum(axis=0)


def first_above(hi_c: np.ndarray, lo_c: np.ndarray, t: int) -> int:
    """The first index whose exact prefix ``hi_c * 2**27 + lo_c`` exceeds ``t``.

    Parameters
    ----------
    hi_c, lo_c : ndarray, shape (p,), int64
        Cumulative limb sums (:func:`limb_sums` of consecutive parts, accumulated): non-decreasing
        prefixes whose last exceeds ``t``.
    t : int

    Returns
    -------
    int
    """
    lo, hi = 0, len(hi_c) - 1
    while lo < hi:
        mid = (lo + hi) // 2
        if limbs_to_int(hi_c[mid], lo_c[mid]) > t:
            hi = mid
        else:
            lo = mid + 1
    return lo


class HostFixed:
    """Fixed-point weights of this rank's rows held in host memory: exact total and prefix search.

    Parameters
    ----------
    q : ndarray, shape (n_local,), int64
        :func:`to_fixed` values, ``0 <= q <= 2**53``.

    Attributes
    ----------
    total : int
        ``sum(q)``, exactly.
    """

    def __init__(self, q: np.ndarray):
        self.q = q
        self.total = local_total(q)
        self._prefix = None

    def find(self, t: int) -> int:
        """The first local row whose exact inclusive prefix sum exceeds ``t`` (``0 <= t < total``)."""
        if self._prefix is None:
            self._prefix = (np.cumsum(self.q >> LIMB, dtype=np.int64), np.cumsum(self.q & LIMB_MASK, dtype=np.int64))
        return first_above(*self._prefix, t)


class BlockFixed:
    """Fixed-point weights known by the exact totals of ``nb`` consecutive row blocks (see :func:`draw_rows`).

    A backend sums each block's ``to_fixed(w * D², s)`` where the rows live (threads,
    a GPU); a draw finds its block by the blocks' exact prefix sums, then asks for
    that block's ``w * D²`` alone and finds the row there with the same integers
    (:class:`HostFixed`): no prefix sums over all rows.  Any number of blocks finds
    the same rows; more, smaller blocks make a draw's share cheaper.

    Parameters
    ----------
    block_values : callable
        ``block_values(a, z)``: ``w * D²`` of rows ``a .. z-1``, a host float64 array.
    s : int
        The fixed-point scale.
    n, nb : int
        Rows and blocks; block ``b`` is rows ``n b / nb`` to ``n (b + 1) / nb``.
    hi, lo : ndarray, shape (nb,), int64
        Each block's exact total as its two limbs (:func:`limb_sums`).

    Attributes
    ----------
    total : int
        The exact sum over every block.
    hi_c, lo_c : ndarray, shape (nb,), int64
        The blocks' cumulative limbs: block ``b`` ends at ``hi_c[b] * 2**27 + lo_c[b]``.
    """

    def __init__(self, block_values, s: int, n: int, nb: int, hi: np.ndarray, lo: np.ndarray):
        self.block_values, self.s, self.n, self.nb = block_values, s, n, nb
        self.hi_c = np.cumsum(hi, dtype=np.int64)
        self.lo_c = np.cumsum(lo, dtype=np.int64)
        self.total = limbs_to_int(self.hi_c[-1], self.lo_c[-1]) if nb else 0

    def find(self, t: int) -> int:
        """The first local row whose exact inclusive prefix sum exceeds ``t`` (``0 <= t < total``)."""
        b = first_above(self.hi_c, self.lo_c, t)
        before = limbs_to_int(self.hi_c[b - 1], self.lo_c[b - 1]) if b else 0
        a, z = self.n * b // self.nb, self.n * (b + 1) // self.nb
        return a + HostFixed(to_fixed(self.block_values(a, z), self.s)).find(t - before)


def draw_rows(comm, x: np.ndarray, row_offset: int, q, r53) -> tuple[np.ndarray, np.ndarray]:
    """Draw global rows with probability ``q_i / sum(q)``, identically for any split (collective).

    Every rank holds the same ``r53``; target ``t = floor(r * Q / 2**53)`` for the
    exact global total ``Q`` falls in exactly one row's interval of the exact
    global prefix sums (the ranks' totals in rank order, then the row inside
    the owning rank).  The owner contributes the row to one Allreduce.

    Parameters
    ----------
    comm : Comm or SerialComm
    x : ndarray, shape (n_local, m), float64
    row_offset : int
        Global index of ``x[0]``; ranks hold consecutive rows in rank order.
    q : ndarray, shape (n_local,), int64, or an object with ``total`` and ``find(t)``
        Fixed-point weights (:func:`to_fixed`), not all zero over the ranks; or
        their exact total and prefix search kept where the weights are
        (:class:`HostFixed`, or a backend's, e.g. on a GPU).
    r53 : sequence of int
        Uniform integers in ``[0, 2**53)``, one per draw, the same on every rank.

    Returns
    -------
    indices : ndarray, shape (len(r53),), int64
        Global row indices.
    rows : ndarray, shape (len(r53), m), float64
    """
    fixed = HostFixed(q) if isinstance(q, np.ndarray) else q
    totals = comm.allgather(fixed.total)
    ends = list(itertools.accumulate(totals))
    total = ends[-1]
    if total <= 0:
        raise ValueError("draw_rows needs a positive total weight")
    m = x.shape[1]
    buf = np.zeros((len(r53), m + 1), dtype=np.float64)
    for j, r in enumerate(r53):
        t = (int(r) * total) >> FIXED_BITS
        owner = bisect.bisect_right(ends, t)
        if owner == comm.rank:
            i = fixed.find(t - (ends[owner] - totals[owner]))
            buf[j, 0] = row_offset + i
            buf[j, 1:] = x[i]
    buf += 0.0  # -0.0 -> +0.0, as the other ranks' zeros would make it: the same bytes at any -np
    buf = comm.allreduce(buf, "sum")
    return buf[:, 0].astype(np.int64), buf[:, 1:]


def uniform53(rng, size: int) -> list:
    """``size`` uniform integers in ``[0, 2**53)`` from ``rng`` (the draws of :func:`draw_rows`)."""
    return [int(v) for v in rng.integers(0, 1 << FIXED_BITS, size=size, dtype=np.int64)]


def exact_label_sums(comm, labels: np.ndarray, weights, size: int) -> np.ndarray:
    """Per-label row counts (or weight totals) over all ranks, the same for any split (collective).

    Parameters
    ----------
    comm : Comm or SerialComm
    labels : ndarray, shape (n_local,), int
        Values in ``[0, size)``.
    weights : ndarray, shape (n_local,), float64, or None
    size : int

    Returns
    -------
    ndarray, shape (size,), float64
    """
    if weights is None:
        return comm.allreduce(np.bincount(labels, minlength=size).astype(np.int64), "sum").astype(np.float64)
    s = fixed_scale(global_max(comm, weights))
    q = to_fixed(weights, s)
    hi = np.zeros(size, dtype=np.int64)
    lo = np.zeros(size, dtype=np.int64)
    step = 1 << 25  # a float64 bincount of 2**25 values below 2**27 each stays below 2**52: exact
    for a in range(0, len(q), step):
        part, lab = q[a : a + step], labels[a : a + step]
        hi += np.rint(np.bincount(lab, weights=(part >> LIMB).astype(np.float64), minlength=size)).astype(np.int64)
        lo += np.rint(np.bincount(lab, weights=(part & LIMB_MASK).astype(np.float64), minlength=size)).astype(np.int64)
    both = comm.allreduce(np.concatenate([hi, lo]), "sum")
    return np.array([math.ldexp(float(limbs_to_int(h, l_)), -s) for h, l_ in zip(both[:size], both[size:])])


# =========================================================================== exact column sums and means

def exact_column_sums(comm, v: np.ndarray, vmax: np.ndarray | None = None, center: np.ndarray | None = None) -> list:
    """Per-column sums over all ranks as exact Python ints with their scales (collective).

    Parameters
    ----------
    v : ndarray, shape (n_local, m), float64
    vmax : ndarray, shape (m,), optional
        Each column's largest magnitude over all ranks, when known (the reader's
        global min and max give it): saves a pass and a collective.
    center : ndarray, shape (m,), optional
        Sum ``(v - center)**2`` instead (``vmax`` then bounds those).

    Returns
    -------
    list of (int, int)
        Per column ``(total, s)``: the global sum is ``total * 2**-s`` up to
        a rounding of each value to ``2**-53`` of the column's largest
        magnitude; exactly the same for any split of the rows.
    """
    m = v.shape[1]
    if vmax is None:
        local = np.zeros(m)
        if len(v):
            local = np.abs(v).max(axis=0) if center is None else ((v - center) ** 2).max(axis=0)
        vmax = comm.allreduce(local, "max")
    scales = np.array([fixed_scale(float(a)) for a in vmax], dtype=np.int64)
    hi, lo = column_limb_sums(v, scales, center)
    both = comm.allreduce(np.concatenate([hi, lo]).astype(np.int64), "sum")
    return [(limbs_to_int(both[j], both[m + j]), int(scales[j])) for j in range(m)]


def exact_column_means(comm, v: np.ndarray, n, vmax=None, center=None) -> np.ndarray:
    """Per-column means over all ranks: :func:`exact_column_sums` divided by ``n``, rounded once (collective).

    Parameters
    ----------
    v, vmax, center
        As :func:`exact_column_sums`.
    n : int or ndarray, shape (m,), int
        The divisor: the rows, or each column's own count (> 0).

    Returns
    -------
    ndarray, shape (m,), float64
        The same bits for any split of the rows (Python's int / int is correctly rounded).
    """
    sums = exact_column_sums(comm, v, vmax, center)
    counts = np.broadcast_to(np.asarray(n, dtype=np.int64), (len(sums),))
    return np.array([math.ldexp(total / int(c), -s) if total else 0.0 for (total, s), c in zip(sums, counts)])
