"""Lloyd's per-cluster sums as exact integers: the same bits at any number of ranks, on any backend.

A float64 sum depends on the order of its additions, so per-cluster sums added
on each rank and then merged by an ``Allreduce`` change in their last bits with
the number of ranks (and with a GPU's atomics, from run to run).  Here every
value a sum takes is first turned into integers, and integers add up to the
same total in any order: the centres, the SSE and everything computed from
them are the same bits at ``-np 1`` and ``-np 7``, on the CPU and on a GPU.

**Encoding.**  Each summed quantity has one power-of-two scale ``2**s`` for the
whole run, fixed from a global bound on its magnitude so that ``|v| 2**s <
2**VBITS`` (:class:`Scales`).  A value ``v`` becomes two integers (:func:`encode`):
``h = floor(t)`` and ``l = floor((t - h) 2**VBITS)``, with ``t = v 2**s`` (a
power-of-two scaling, exact), so ``v = (h + l 2**-VBITS) 2**-s`` up to less than
one unit ``2**-(s + VBITS)``:
a resolution of ``2**-100`` of the largest value of that column.  The rounding
is the same floor on every backend, so a row adds the same integers whoever
adds it.

**Limbs.**  Totals are kept as four int64 limbs ``[h >> 26, h & M, l >> 26,
l & M]`` summed separately (``M = 2**26 - 1``): no limb overflows below ``2**37``
rows, and any partial sums of limbs add up to the same limbs.  A backend may
add ``h`` and ``l`` over a few thousand rows first (``|h| <= 2**VBITS``) and split
the partial sums into limbs afterwards: the total is the same integer.
:func:`decode` turns limbs back into float64 with a fixed sequence of roundings
(at most two), so equal limbs give equal floats on every rank.

**What is summed** (:class:`Scales`): per cluster, ``w x_j`` for each of the
``m`` columns and ``w`` itself (the counts; 1 without weights), ``(k, m + 1, 4)``
limbs; and ``w d²`` of each row to its centre (the SSE), ``(k, 4)`` limbs at a
scale of its own, bounded from the rows' and the centres' magnitudes at each
step.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from numba import int64

from .jit import njit, prange

#: bits of the integer part ``h`` of an encoded value: ``|h| <= 2**VBITS``
VBITS = 50
#: bits of every limb but the first (``h >> LIMB``, ``h & LIMB_MASK``, the same for ``l``)
LIMB = 26
LIMB_MASK = (1 << LIMB) - 1
#: ``2**VBITS`` as a float: the fraction's scale
_FRACTION = float(1 << VBITS)
#: how much a bound is widened before its exponent is taken: the rounding of a product
#: ``w x`` or of a computed ``d²`` may exceed the exact bound by a few units in the last place
_BOUND_MARGIN = 1.0 + 2.0 ** -20


def encode_py(v, f1, f2):
    """The two integers of ``v`` at the scale ``f1 f2 = 2**s`` (see the module docstring).

    Written once in the subset of Python that both Numba's CPU and CUDA targets
    compile: :func:`encode` is this function compiled for the host, and the GPU
    kernels compile the same source as a device function.

    Parameters
    ----------
    v : float
        ``|v| 2**s < 2**VBITS``.
    f1, f2 : float
        Powers of two whose product is ``2**s`` (:func:`scale_factors`).

    Returns
    -------
    h, l : int64
        ``0 <= l <= 2**VBITS`` (``t - h`` rounds to 1 for a tiny negative ``t``: still within one unit).
    """
    t = v * f1 * f2
    h = math.floor(t)
    return int64(h), int64(math.floor((t - h) * _FRACTION))


encode = njit(inline="always")(encode_py)


def scale_factors(s: int) -> tuple[float, float]:
    """Two powers of two whose product is ``2**s`` (which alone may not be a float64)."""
    a = max(min(s, 1000), -1000)
    return math.ldexp(1.0, a), math.ldexp(1.0, s - a)


def exponent_for(bound: float) -> int:
    """The scale ``s`` with ``bound * margin * 2**s < 2**VBITS`` (0 for a zero bound).

    Parameters
    ----------
    bound : float
        A global bound on the magnitudes to encode (finite, >= 0).
    """
    if not bound > 0.0:
        return 0
    if not math.isfinite(bound):
        raise ValueError("a fixed-point scale needs a finite bound")
    mantissa, e = math.frexp(bound)  # the widened bound's exponent, without overflowing at the largest floats
    return VBITS - (e + 1 if mantissa * _BOUND_MARGIN >= 1.0 else e)


@dataclass(frozen=True)
class Scales:
    """The fixed-point scales of one Lloyd run, the same on every rank.

    Attributes
    ----------
    columns : ndarray, shape (m + 1,), int64
        The exponent of each summed column: ``w x_j`` for ``j < m``, ``w`` at ``m``.
    factors : ndarray, shape (m + 1, 2), float64
        :func:`scale_factors` of each exponent, as the kernels take them.
    magnitudes : ndarray, shape (m,), float64
        The global bound on ``|x_j|`` the exponents come from.
    wmax : float
        The largest weight (1 without weights).
    """

    columns: np.ndarray
    factors: np.ndarray
    magnitudes: np.ndarray
    wmax: float

    @classmethod
    def of(cls, magnitudes: np.ndarray, wmax: float = 1.0) -> "Scales":
        """The scales for rows with ``|x_j| <= magnitudes[j]`` and weights at most ``wmax``.

        Parameters
        ----------
        magnitudes : ndarray, shape (m,), float64
            Global (every rank's) bounds on each column's magnitude.
        wmax : float
        """
        mags = np.asarray(magnitudes, dtype=np.float64)
        bounds = np.append(mags * wmax, wmax)
        cols = np.array([exponent_for(float(b)) for b in bounds], dtype=np.int64)
        factors = np.array([scale_factors(int(s)) for s in cols], dtype=np.float64).reshape(-1, 2)
        return cls(cols, factors, mags, float(wmax))

    def sse_exponent(self, centres: np.ndarray) -> int:
        """The scale of ``w d²`` for rows assigned to their nearest of ``centres`` (k, m).

        A row's squared distance to its nearest centre is at most its distance to any one centre
        ``a``, at most ``sum_j (|x_j| + |c_aj|)²``: the bound is the smallest of these, so a far
        centre that keeps no rows changes nothing.
        """
        with np.errstate(over="ignore", invalid="ignore"):
            reach = np.abs(centres) if len(centres) else np.zeros((1, len(self.magnitudes)))
            reach += self.magnitudes  # in place: every step asks, and a (k, m) array made is a cost at large K M
            bound = float(np.min(np.einsum("ij,ij->i", reach, reach))) * self.wmax
        if not math.isfinite(bound):
            raise ValueError("every centre is too far from the rows for a finite SSE")
        return exponent_for(bound)


@njit(inline="always")
def _normalise(a, b, c, d):  # pragma: no cover - compiled
    # the same integer with d, b in [0, 2**26), c in [0, 2**24) (c's unit is 2**26, b's 2**50), a signed
    c += d >> 26
    d &= 67108863
    b += c >> 24
    c &= 16777215
    a += b >> 26
    b &= 67108863
    return a, b, c, d


@njit(parallel=True, cache=True)
def _decode(q, exps, out):  # pragma: no cover - compiled
    for e in prange(q.shape[0]):
        a, b, c, d = _normalise(q[e, 0], q[e, 1], q[e, 2], q[e, 3])
        sign = 1.0
        if a < 0:  # the magnitude's limbs: no cancellation between a negative top and a positive rest
            a, b, c, d = _normalise(-a, -b, -c, -d)
            sign = -1.0
        # the total is a 2**76 + b 2**50 + c 2**26 + d, in units of 2**-(s + VBITS): two roundings at most
        low = (np.float64(b) * 16777216.0 + np.float64(c)) * 67108864.0 + np.float64(d)
        total = np.float64(a) * 75557863725914323419136.0 + low
        out[e] = sign * np.ldexp(total, -(exps[e] + 50))


def decode(limbs: np.ndarray, exponent) -> np.ndarray:
    """Float64 values of fixed-point totals, rounded the same way on every rank.

    Parameters
    ----------
    limbs : ndarray, shape (..., 4), int64
    exponent : int or ndarray broadcastable to ``limbs.shape[:-1]``
        The scale ``s`` of each total.

    Returns
    -------
    ndarray, shape ``limbs.shape[:-1]``, float64
    """
    q = np.ascontiguousarray(limbs, dtype=np.int64)
    shape = q.shape[:-1]
    # always a writable copy (a broadcast scalar is a read-only view): one compiled signature, loaded in the
    # set-up (mpikmeans.lloyd.load_host_kernels) rather than a second one in a run's first iteration
    exps = np.array(np.broadcast_to(np.asarray(exponent, dtype=np.int64), shape), dtype=np.int64, order="C").reshape(-1)
    out = np.empty(exps.shape[0])
    _decode(q.reshape(-1, 4), exps, out)
    return out.reshape(shape)


# ======================================================================== host kernels

@njit(inline="always")
def _add(acc, h, l_):  # pragma: no cover - compiled
    acc[0] += h >> 26
    acc[1] += h & 67108863
    acc[2] += l_ >> 26
    acc[3] += l_ & 67108863


@njit(inline="always")
def _sub(acc, h, l_):  # pragma: no cover - compiled
    acc[0] -= h >> 26
    acc[1] -= h & 67108863
    acc[2] -= l_ >> 26
    acc[3] -= l_ & 67108863


@njit(parallel=True, cache=True)
def _sum_rows(x, w, weighted, new, old, full, f1, f2, nrb, jc, parts):  # pragma: no cover - compiled
    # task t: rows of block t // ncc, columns of chunk t % ncc, into parts[t] (k, jc, 4); integers,
    # so the tasks' order changes nothing
    n, m = x.shape
    mc = m + 1
    ncc = (mc + jc - 1) // jc
    for t in prange(nrb * ncc):
        rb = t // ncc
        j0 = (t - rb * ncc) * jc
        j1 = min(mc, j0 + jc)
        acc = parts[t]
        for i in range(n * rb // nrb, n * (rb + 1) // nrb):
            a = new[i]
            b = -1 if full else old[i]
            if a == b:
                continue
            wi = w[i] if weighted else 1.0
            for j in range(j0, j1):
                v = x[i, j] if j < m else 1.0
                if weighted:
                    v = wi * v
                h, l_ = encode(v, f1[j], f2[j])
                if a >= 0:
                    _add(acc[a, j - j0], h, l_)
                if b >= 0:
                    _sub(acc[b, j - j0], h, l_)


@njit(parallel=True, cache=True)
def _gather_parts(parts, nrb, jc, out):  # pragma: no cover - compiled
    # out (k, m + 1, 4) += the tasks' parts, one cluster per iteration of the parallel loop
    k, mc, _ = out.shape
    ncc = (mc + jc - 1) // jc
    for a in prange(k):
        for t in range(nrb * ncc):
            j0 = (t % ncc) * jc
            for jj in range(min(jc, mc - j0)):
                for q in range(4):
                    out[a, j0 + jj, q] += parts[t, a, jj, q]


#: bytes of the tasks' private sums up to which every task takes all columns of a block of rows
_PARTS_BYTES = 1 << 26


def sum_rows(x: np.ndarray, weights: np.ndarray | None, new: np.ndarray, old: np.ndarray | None, scales: Scales,
             out: np.ndarray, threads: int) -> None:
    """Add each row's limbs to its cluster's sums in ``out`` (and, given ``old``, take them from its old one).

    Without ``old`` every row is added; with it only the rows whose label
    changed move from ``old`` to ``new`` (-1: no cluster).  The rows go to the
    threads in blocks of rows, or, where K x M is large, in blocks of columns so
    that the private partial sums stay small.

    Parameters
    ----------
    x : ndarray, shape (n, m), float64
    weights : ndarray, shape (n,), float64, or None
    new : ndarray, shape (n,), int32
    old : ndarray, shape (n,), int32, or None
    scales : Scales
    out : ndarray, shape (k, m + 1, 4), int64
        Added to, in place.
    threads : int
    """
    n, m = x.shape
    k = out.shape[0]
    if n == 0:
        return
    mc = m + 1
    tasks = 2 * max(1, threads)
    if k * mc * 32 * tasks <= _PARTS_BYTES or mc == 1:
        jc, nrb = mc, min(n, tasks)
    else:
        jc = max(1, -(-mc // tasks))
        nrb = max(1, min(n, tasks // -(-mc // jc)))
    ncc = -(-mc // jc)
    parts = np.zeros((nrb * ncc, k, jc, 4), dtype=np.int64)
    w = weights if weights is not None else np.ones(0)
    _sum_rows(x, w, weights is not None, new, old if old is not None else new, old is None,
              np.ascontiguousarray(scales.factors[:, 0]), np.ascontiguousarray(scales.factors[:, 1]), nrb, jc, parts)
    _gather_parts(parts, nrb, jc, out)


def row_limbs(row: np.ndarray, w: float, scales: Scales) -> np.ndarray:
    """The limbs one row adds to its cluster's sums: ``w x_j`` for each column, then ``w``.

    The compiled kernel of :func:`sum_rows` encodes it, so a run that
    relocates a cluster compiles nothing after a warm-up.

    Parameters
    ----------
    row : ndarray, shape (m,), float64
    w : float
    scales : Scales

    Returns
    -------
    ndarray, shape (m + 1, 4), int64
    """
    x = np.ascontiguousarray(row, dtype=np.float64).reshape(1, -1)
    out = np.zeros((1, x.shape[1] + 1, 4), dtype=np.int64)
    weights = None if w == 1.0 else np.array([w], dtype=np.float64)
    sum_rows(x, weights, np.zeros(1, dtype=np.int32), None, scales, out, 1)
    return out[0]


@njit(parallel=True, cache=True)
def _cluster_values(labels, values, w, weighted, f1, f2, nb, parts):  # pragma: no cover - compiled
    # parts (nb, k, 5): each block's limbs of sum(w v) per cluster, then its rows per cluster
    n = labels.shape[0]
    for b in prange(nb):
        acc = parts[b]
        for i in range(n * b // nb, n * (b + 1) // nb):
            a = labels[i]
            if a < 0:
                continue
            v = values[i]
            if weighted:
                v = w[i] * v
            h, l_ = encode(v, f1, f2)
            _add(acc[a], h, l_)
            acc[a, 4] += 1


def cluster_sizes_and_sums(labels: np.ndarray, values: np.ndarray, weights: np.ndarray | None, k: int,
                           exponent: int) -> np.ndarray:
    """Per cluster, the rows with that label and the limbs of ``sum(w v)`` over them, in one pass (host threads).

    Parameters
    ----------
    labels : ndarray, shape (n,), int32
        -1: the row belongs to no cluster.
    values : ndarray, shape (n,), float64
        E.g. each row's squared distance to its centre.
    weights : ndarray, shape (n,), float64, or None
    k : int
    exponent : int
        The scale of ``w v``.

    Returns
    -------
    ndarray, shape (5 k,), int64
        The ``k`` row counts, then the ``(k, 4)`` limbs flattened: one buffer for one ``Allreduce``.
    """
    n = len(labels)
    nb = max(1, min(n, 64))
    parts = np.zeros((nb, k, 5), dtype=np.int64)
    if n:
        f1, f2 = scale_factors(exponent)
        w = weights if weights is not None else np.ones(0)
        _cluster_values(np.ascontiguousarray(labels, dtype=np.int32), np.ascontiguousarray(values, dtype=np.float64), w,
                        weights is not None, f1, f2, nb, parts)
    total = parts.sum(axis=0)
    return np.concatenate([total[:, 4], total[:, :4].ravel()])


def cluster_sums(labels: np.ndarray, values: np.ndarray, weights: np.ndarray | None, k: int, exponent: int) -> np.ndarray:
    """Per cluster, the limbs of ``sum(w v)`` over the rows with that label: :func:`cluster_sizes_and_sums`
    (the same parameters) without the counts.

    Returns
    -------
    ndarray, shape (k, 4), int64
    """
    return cluster_sizes_and_sums(labels, values, weights, k, exponent)[k:].reshape(k, 4)


@njit(parallel=True, cache=True)
def _column_magnitudes(x, nb, parts):  # pragma: no cover - compiled
    n, m = x.shape
    for b in prange(nb):
        acc = parts[b]
        for i in range(n * b // nb, n * (b + 1) // nb):
            for j in range(m):
                v = abs(x[i, j])
                if v > acc[j]:
                    acc[j] = v


def column_magnitudes(x: np.ndarray) -> np.ndarray:
    """Each column's largest ``|x_j|``, shape (m,), float64 (0 without rows), in one threaded pass.

    Parameters
    ----------
    x : ndarray, shape (n, m), float64
    """
    n, m = x.shape
    nb = max(1, min(n, 64))
    parts = np.zeros((nb, m))
    if n:
        _column_magnitudes(np.ascontiguousarray(x, dtype=np.float64), nb, parts)
    return parts.max(axis=0)
