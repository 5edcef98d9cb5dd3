"""The backend-agnostic Lloyd loop: initial centres, iterations, convergence.

Every rank runs this same code on its own rows.  Per iteration the backend
returns local float64 sums, counts, SSE and the number of changed labels; one
``Allreduce`` merges them; every rank then computes the same new centres, so
the centres never need to be broadcast.  Nothing here depends on the number of
ranks except the order in which the Allreduce adds the partial sums, which
moves only the last bits of the centres.

The initialisations (``range``, ``sample``, ``k-means++``, ``k-means||``) give
bit-identical centres for any number of ranks: random numbers are keyed by
global row indices, and every sum that decides which row is drawn is an exact
fixed-point sum (see "exact, rank-independent sums" below).  ``run_restarts``
runs several initialisations with seeds derived from one and keeps the lowest
SSE.
"""

from __future__ import annotations

import bisect
import itertools
import logging
import math
import time
from dataclasses import dataclass, field

import numpy as np
from numba import njit, prange

from .comm import SerialComm
from .errors import InputError, UsageError
from .faults import fault_point

log = logging.getLogger("mpikmeans")

STOP_UNCHANGED = "assignment unchanged"
STOP_TOL = "centre shift <= tol"
STOP_MAX_ITER = "max-iter reached"
STOP_INTERRUPTED = "interrupted by a signal"


@dataclass
class LoopState:
    """Everything the loop needs to go on exactly where it was (a checkpoint's content).

    Attributes
    ----------
    iteration : int
        Iterations completed.
    centres : ndarray, shape (k, m), float64
        Centres after ``iteration`` iterations.
    prev_centres : ndarray, shape (k, m), float64, or None
        The centres iteration ``iteration`` assigned the rows with: assigning
        with them again restores the labels, so the next iteration counts
        changed labels exactly as an uninterrupted run does.
    history : list of dict
    relocated : int
    """

    iteration: int
    centres: np.ndarray
    prev_centres: np.ndarray | None
    history: list = field(default_factory=list)
    relocated: int = 0


@dataclass
class KMeansResult:
    """Outcome of :func:`lloyd`.

    Attributes
    ----------
    centres : ndarray, shape (k, m), float64
    labels : ndarray, shape (n_local,), int32
        This rank's rows, assigned to the final centres.
    inertia : float
        Global SSE of the final assignment to the final centres.
    sizes : ndarray, shape (k,), int64
        Global cluster sizes of the final assignment.
    iterations : int
    converged : bool
    stop_reason : str
    history : list of dict
        Per iteration: ``iteration``, ``sse`` (before the update), ``shift``
        (largest centre move), ``changed`` (labels changed), ``seconds``.
    relocated : int
        Empty clusters moved to a far point (policy ``farthest``).
    cluster_sse : ndarray, shape (k,), float64
        Within-cluster SSE of the final assignment (weighted when rows are).
    """

    centres: np.ndarray
    labels: np.ndarray
    inertia: float
    sizes: np.ndarray
    iterations: int
    converged: bool
    stop_reason: str
    history: list = field(default_factory=list)
    relocated: int = 0
    interrupted: bool = False
    state: LoopState | None = None
    cluster_sse: np.ndarray | None = None


# --------------------------------------------------------------------------- init

def init_range(k: int, mins: np.ndarray, maxs: np.ndarray, seed: int) -> np.ndarray:
    """Centres uniform in the global per-attribute [min, max] (the specification's first method).

    Parameters
    ----------
    k : int
    mins, maxs : ndarray, shape (m,), float64
        Global per-attribute bounds (the same on every rank).
    seed : int

    Returns
    -------
    ndarray, shape (k, m), float64
        The same on every rank, whatever their number.
    """
    rng = np.random.default_rng(seed)
    return mins + rng.random((k, mins.shape[0])) * (maxs - mins)


def sample_indices(k: int, n: int, seed: int) -> np.ndarray:
    """``k`` distinct global row indices drawn uniformly from ``n`` (rank-independent).

    Returns
    -------
    ndarray, shape (k,), int64
    """
    if k > n:
        raise UsageError(f"-k {k} is more than the {n} rows of the data: 'sample' needs k distinct rows")
    return np.random.default_rng(seed).choice(n, size=k, replace=False)


def gather_rows(comm, x: np.ndarray, row_offset: int, indices: np.ndarray) -> np.ndarray:
    """Rows with the given global indices, on every rank (collective).

    Each rank fills the rows it owns and zeros elsewhere; an Allreduce sum then
    gives every rank the exact rows (x + 0 = x), with no root and no Bcast.

    Parameters
    ----------
    x : ndarray, shape (n_local, m)
    row_offset : int
        Global index of ``x[0]``.
    indices : ndarray, shape (r,), int

    Returns
    -------
    ndarray, shape (r, m), float64
    """
    out = np.zeros((len(indices), x.shape[1]), dtype=np.float64)
    local = (indices >= row_offset) & (indices < row_offset + x.shape[0])
    out[local] = x[indices[local] - row_offset]
    return comm.allreduce(out, "sum")


def init_sample(comm, k: int, x: np.ndarray, row_offset: int, n: int, seed: int) -> np.ndarray:
    """``k`` distinct rows drawn uniformly over the whole file (the specification's second method).

    Returns
    -------
    ndarray, shape (k, m), float64
    """
    return gather_rows(comm, x, row_offset, sample_indices(k, n, seed))


def check_centres(centres: np.ndarray, k: int, m: int, source: str) -> np.ndarray:
    """Validate user-supplied initial centres against k and m."""
    if centres.shape != (k, m):
        raise InputError(f"{source}: has {centres.shape[0]} x {centres.shape[1]} centres, expected k x m = {k} x {m}")
    if not np.isfinite(centres).all():
        raise InputError(f"{source}: centres must be finite numbers")
    return np.ascontiguousarray(centres, dtype=np.float64)


# --------------------------------------------------------------------------- loop

def _merge(comm, part, stop: bool) -> tuple:
    """One Allreduce for sums, counts, SSE, the change count and stop requests.

    A signal reaches the ranks at slightly different times; adding the ranks'
    stop flags into the same Allreduce makes every rank see the request at the
    same iteration.
    """
    k, m = part.sums.shape
    buf = np.empty(k * m + k + 3, dtype=np.float64)
    buf[: k * m] = part.sums.ravel()
    buf[k * m : k * m + k] = part.counts
    buf[-3] = part.sse
    buf[-2] = part.changed  # exact in float64 below 2**53 rows
    buf[-1] = 1.0 if stop else 0.0
    buf = comm.allreduce(buf, "sum")
    return buf[: k * m].reshape(k, m), buf[k * m : k * m + k], float(buf[-3]), int(buf[-2]), buf[-1] > 0


def _relocate_empty(comm, backend, x, row_offset, centres, sums, counts, weights=None) -> int:
    """Move each empty cluster to one of the points farthest from their centre.

    As scikit-learn does: the e farthest points (globally, ties to the lower
    row index) are taken out of their clusters' sums and each becomes the sole
    member of one empty cluster.  Works on the merged sums, so every rank
    makes the same change.  Returns the number of clusters moved.
    """
    empty = np.flatnonzero(counts == 0)
    e = len(empty)
    labels, dist2 = backend.assign(centres)
    take = min(e, len(dist2))
    if take:
        order = np.lexsort((np.arange(len(dist2)), -dist2))[:take]
        mine = [(-float(dist2[i]), row_offset + int(i), int(labels[i]), x[i].copy(),
                 1.0 if weights is None else float(weights[i])) for i in order]
    else:
        mine = []
    candidates = sorted((c for part in comm.allgather(mine) for c in part), key=lambda c: (c[0], c[1]))
    moved = 0
    for cluster, (neg_d, _, owner, row, w) in zip(empty, candidates):
        if neg_d == 0.0:  # every remaining point sits on its centre: nothing to gain
            break
        sums[owner] -= w * row
        counts[owner] -= w
        sums[cluster] = w * row
        counts[cluster] = w
        moved += 1
    return moved


def lloyd(comm, backend, x: np.ndarray, row_offset: int, centres: np.ndarray, *, max_iter: int = 300,
          tol: float = 0.0, empty_cluster: str = "keep", resume: LoopState | None = None,
          after_iteration=None, stop_requested=None, weights: np.ndarray | None = None) -> KMeansResult:
    """Lloyd's iterations until convergence, ``max_iter`` or a stop request (collective).

    Parameters
    ----------
    comm : Comm or SerialComm
    backend : mpikmeans.backends.Backend
        Already loaded with ``x``.
    x : ndarray, shape (n_local, m), float64
        This rank's rows (used only to relocate empty clusters).
    row_offset : int
        Global index of ``x[0]``.
    centres : ndarray, shape (k, m), float64
        Initial centres, the same on every rank (ignored when resuming).
    max_iter : int
    tol : float
        Stop when no centre moved more than ``tol`` (Euclidean).  With 0, stop
        when no label changed.
    empty_cluster : {"keep", "farthest"}
    resume : LoopState, optional
        Go on from a checkpoint; the result is bit for bit that of the
        uninterrupted run with the same ranks.
    after_iteration : callable(LoopState, bool), optional
        Called on every rank after each iteration that did not finish the run;
        the flag is True when the run stops there because of a stop request
        (a checkpoint must be written now).
    stop_requested : callable() -> bool, optional
        Polled once per iteration (a signal handler's flag).
    weights : ndarray, shape (n_local,), float64, optional
        The instance weights the backend was loaded with (for the final SSE
        and for relocating empty clusters).

    Returns
    -------
    KMeansResult
        With ``interrupted`` set (and no labels) when a stop request ended it.
    """
    if resume is not None:
        state = resume
        if state.prev_centres is not None:
            backend.step(state.prev_centres)  # the labels the uninterrupted run had
    else:
        state = LoopState(0, np.array(centres, dtype=np.float64, copy=True), None, [])
    reason, converged, interrupted = STOP_MAX_ITER, False, False
    while state.iteration < max_iter:
        it = state.iteration + 1
        fault_point(comm.rank, "iteration")
        t0 = time.perf_counter()
        centres = state.centres
        part = backend.step(centres)
        sums, counts, sse, changed, stop = _merge(comm, part, bool(stop_requested and stop_requested()))
        relocated = state.relocated
        if empty_cluster == "farthest" and (counts == 0).any():
            relocated += _relocate_empty(comm, backend, x, row_offset, centres, sums, counts, weights)
        filled = counts > 0
        new = centres.copy()  # an empty cluster keeps its centre: never a NaN
        new[filled] = sums[filled] / counts[filled, None]
        shift = float(np.sqrt(((new - centres) ** 2).sum(axis=1)).max())
        seconds = time.perf_counter() - t0
        history = state.history + [{"iteration": it, "sse": sse, "shift": shift, "changed": changed,
                                    "seconds": seconds}]
        state = LoopState(it, new, centres, history, relocated)
        log.info("iter %4d  sse %.10g  max shift %.4g  changed %d  %.4fs", it, sse, shift, changed, seconds)
        if changed == 0:
            reason, converged = STOP_UNCHANGED, True
            break
        if tol > 0 and shift <= tol:
            reason, converged = STOP_TOL, True
            break
        if stop:
            reason, interrupted = STOP_INTERRUPTED, True
        if after_iteration is not None and state.iteration < max_iter:
            after_iteration(state, interrupted)
        if interrupted:
            return KMeansResult(centres=state.centres, labels=None, inertia=float("nan"), sizes=None,
                                iterations=state.iteration, converged=False, stop_reason=reason,
                                history=state.history, relocated=state.relocated, interrupted=True,
                                state=state)
    centres = state.centres
    labels, dist2 = backend.assign(centres)
    k = centres.shape[0]
    wd2 = dist2 if weights is None else weights * dist2
    tail = np.empty(2 * k, dtype=np.float64)
    tail[:k] = np.bincount(labels, minlength=k)
    tail[k:] = np.bincount(labels, weights=wd2, minlength=k)
    tail = comm.allreduce(tail, "sum")
    sizes = tail[:k].astype(np.int64)
    if (sizes == 0).any():
        log.warning("%d of %d clusters are empty at the end (fewer distinct rows than k, or a poor start)",
                    int((sizes == 0).sum()), k)
    return KMeansResult(centres=centres, labels=labels, inertia=float(tail[k:].sum()), sizes=sizes,
                        iterations=state.iteration, converged=converged, stop_reason=reason,
                        history=state.history, relocated=state.relocated, state=state, cluster_sse=tail[k:])


# =========================================================================== exact, rank-independent sums
#
# k-means++ and k-means|| sample rows with probability proportional to their
# (weighted) squared distance D².  A floating-point sum of D² depends on the
# order of the additions, hence on how the rows are split over the ranks, and
# a draw that lands within rounding of a boundary between two rows would then
# pick a different row at -np 1 and -np 4.  So every sum that decides a draw is
# exact: each value v >= 0 becomes the integer q = rint(v * 2**s), with one
# global power-of-two scale s chosen so that the largest value has all of its
# 53 bits (q < 2**53); integer sums are associative, so totals, prefix sums
# and the drawn rows are the same for any split.  Values below 2**-53 of the
# largest one round to 0 (and are never drawn): the same resolution float64
# itself has relative to that largest value.  Integers are summed as two int64
# limbs (q = hi * 2**27 + lo) so that no partial sum can overflow below
# 2**36 rows per rank; totals are Python ints.

_FIXED_BITS = 53
_LIMB = 27
_LIMB_MASK = (1 << _LIMB) - 1
#: Rows per random stream of k-means|| (keyed by the global block index, so
#: every row's random number is the same whichever rank holds it).
_RNG_BLOCK = 1 << 16


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
    return _FIXED_BITS - math.frexp(vmax)[1]


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
    return (q >> _LIMB).sum(axis=axis, dtype=np.int64), (q & _LIMB_MASK).sum(axis=axis, dtype=np.int64)


def limbs_to_int(hi, lo) -> int:
    """The Python int ``hi * 2**27 + lo``."""
    return (int(hi) << _LIMB) + int(lo)


def _local_total(q: np.ndarray) -> int:
    return limbs_to_int(*limb_sums(q))


def _global_max(comm, v: np.ndarray) -> float:
    """Largest element of ``v`` over all ranks (0 when every rank's ``v`` is empty or <= 0)."""
    local = float(v.max()) if v.size else 0.0
    return float(comm.allreduce(np.array([max(local, 0.0)]), "max")[0])


# =========================================================================== serial row kernels
#
# Distances for the initialisation come from the backend when one is given
# (threads or a GPU, and the same arithmetic as the Lloyd loop).  Without one,
# these serial kernels do it: the same operations in the same order as the CPU
# backend's (each squared distance adds its m terms in attribute order, ties go
# to the lowest centre), so both give bit-identical D², and being serial they
# may run on several threads at once (the in-process rank simulation).

@njit(cache=True, inline="always")
def _nearest_row(x, i, c):
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
def _assign_serial(x, c, labels, dist2):
    for i in range(x.shape[0]):
        labels[i], dist2[i] = _nearest_row(x, i, c)


@njit(cache=True)
def _weighted_lloyd_serial(x, w, centres, max_iter):
    # the small weighted k-means on the k-means|| candidates (as Spark's
    # LocalKMeans): every rank gets the result by broadcast, so this runs once
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


@njit(cache=True)
def _candidate_potential(d2, dist, w, use_w, f1, f2):
    # one pass instead of NumPy's nine: v = min(D², d) (* w), then the exact
    # fixed-point total of v (the same integers as to_fixed/limb_sums: the
    # scaling by f1 * f2 = 2**s is exact) and the largest v
    hi = 0
    lo = 0
    vmax = 0.0
    for i in range(d2.shape[0]):
        v = min(d2[i], dist[i])
        if use_w:
            v *= w[i]
        if v > vmax:
            vmax = v
        q = np.int64(np.rint(v * f1 * f2))
        hi += q >> 27
        lo += q & 134217727
    return hi, lo, vmax


@njit(parallel=True, cache=True)
def _greedy_potentials(x, cands, d2, w, use_w, f1, f2, hi, lo, vmax):
    # the greedy step of k-means++ in one pass over the rows for all candidates
    # (the rows are read once, not once per candidate); each squared distance
    # adds its m terms in attribute order, as the backends do, and the
    # per-block sums are integers, so neither the threads nor the blocks
    # change the result
    n, m = x.shape
    trials = cands.shape[0]
    nb = hi.shape[0]
    for b in prange(nb):
        dd = np.empty(trials)
        for i in range(n * b // nb, n * (b + 1) // nb):
            for j in range(trials):
                dd[j] = 0.0
            for a in range(m):
                xa = x[i, a]
                for j in range(trials):
                    t = xa - cands[j, a]
                    dd[j] += t * t
            for j in range(trials):
                v = min(d2[i], dd[j])
                if use_w:
                    v *= w[i]
                if v > vmax[b, j]:
                    vmax[b, j] = v
                q = np.int64(np.rint(v * f1 * f2))
                hi[b, j] += q >> 27
                lo[b, j] += q & 134217727


@njit(parallel=True, cache=True)
def _lower_d2(x, c, d2):
    # D² <- min(D², |x - c|²) in place, the distance in attribute order as everywhere
    n, m = x.shape
    nb = min(n, 256)
    for b in prange(nb):
        for i in range(n * b // nb, n * (b + 1) // nb):
            d = 0.0
            for a in range(m):
                t = x[i, a] - c[a]
                d += t * t
            if d < d2[i]:
                d2[i] = d


def _lower_to(rows, x, d2, centre) -> np.ndarray:
    """``min(D², squared distance to centre)`` per local row."""
    from .backends.cpu import CPUBackend

    if isinstance(rows, CPUBackend) and len(x):
        d2 = d2.copy()
        _lower_d2(x, np.ascontiguousarray(centre, dtype=np.float64), d2)
        return d2
    return np.minimum(d2, _dist2_to(rows, centre))


def _potentials(rows, x, d2, cands, weights, s):
    """Per candidate: the exact fixed-point potential ``sum(q(w * min(D², d)))`` and the largest value.

    Returns
    -------
    list of (int, float), one per candidate
    """
    f1, f2 = _scale_factors(s)
    w = weights if weights is not None else d2[:0]
    from .backends.cpu import CPUBackend

    if isinstance(rows, CPUBackend) and len(x):
        nb = min(len(x), 256)
        hi = np.zeros((nb, len(cands)), dtype=np.int64)
        lo = np.zeros((nb, len(cands)), dtype=np.int64)
        vmax = np.zeros((nb, len(cands)))
        _greedy_potentials(x, np.ascontiguousarray(cands), d2, w, weights is not None, f1, f2, hi, lo, vmax)
        his, los = hi.sum(axis=0), lo.sum(axis=0)
        return [(limbs_to_int(his[j], los[j]), float(vmax[:, j].max())) for j in range(len(cands))]
    out = []
    for c in cands:  # another backend (a GPU: one pass per candidate there), or the serial kernel
        hi, lo, vm = _candidate_potential(d2, _dist2_to(rows, c), w, weights is not None, f1, f2)
        out.append((limbs_to_int(hi, lo), float(vm)))
    return out


def _scale_factors(s: int) -> tuple[float, float]:
    """Two powers of two whose product is ``2**s`` (which alone may not be a float64)."""
    a = min(s, 1023)
    return math.ldexp(1.0, a), math.ldexp(1.0, s - a)


class _SerialRows:
    """The ``assign`` of a backend for rows held in host memory, single-threaded."""

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


def _rows_backend(backend, x):
    return backend if backend is not None else _SerialRows(x)


def _dist2_to(rows, centre: np.ndarray) -> np.ndarray:
    """Squared distance of every local row to one centre, shape (n_local,)."""
    return rows.assign(np.asarray(centre, dtype=np.float64).reshape(1, -1))[1]


# =========================================================================== D² sampling

def _cumulative_limbs(q: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    return np.cumsum(q >> _LIMB, dtype=np.int64), np.cumsum(q & _LIMB_MASK, dtype=np.int64)


def _search_cumulative(hi_c: np.ndarray, lo_c: np.ndarray, t: int) -> int:
    """First ``i`` whose exact inclusive prefix sum exceeds ``t`` (binary search)."""
    lo, hi = 0, len(hi_c) - 1
    while lo < hi:
        mid = (lo + hi) // 2
        if limbs_to_int(hi_c[mid], lo_c[mid]) > t:
            hi = mid
        else:
            lo = mid + 1
    return lo


def draw_rows(comm, x: np.ndarray, row_offset: int, q: np.ndarray, r53) -> tuple[np.ndarray, np.ndarray]:
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
    q : ndarray, shape (n_local,), int64
        Fixed-point weights (:func:`to_fixed`), not all zero over the ranks.
    r53 : sequence of int
        Uniform integers in ``[0, 2**53)``, one per draw, the same on every rank.

    Returns
    -------
    indices : ndarray, shape (len(r53),), int64
        Global row indices.
    rows : ndarray, shape (len(r53), m), float64
    """
    totals = comm.allgather(_local_total(q))
    ends = list(itertools.accumulate(totals))
    total = ends[-1]
    if total <= 0:
        raise ValueError("draw_rows needs a positive total weight")
    m = x.shape[1]
    buf = np.zeros((len(r53), m + 1), dtype=np.float64)
    mine = []
    for j, r in enumerate(r53):
        t = (int(r) * total) >> _FIXED_BITS
        owner = bisect.bisect_right(ends, t)
        if owner == comm.rank:
            mine.append((j, t - (ends[owner] - totals[owner])))
    if mine:
        hi_c, lo_c = _cumulative_limbs(q)
        for j, t in mine:
            i = _search_cumulative(hi_c, lo_c, t)
            buf[j, 0] = row_offset + i
            buf[j, 1:] = x[i]
    buf += 0.0  # -0.0 -> +0.0, as the other ranks' zeros would make it: the same bytes at any -np
    buf = comm.allreduce(buf, "sum")
    return buf[:, 0].astype(np.int64), buf[:, 1:]


def _uniform53(rng, size: int) -> list:
    return [int(v) for v in rng.integers(0, 1 << _FIXED_BITS, size=size, dtype=np.int64)]


def _first_centre(comm, x, row_offset, n, rng, weights):
    """One row drawn uniformly (or with probability proportional to its weight)."""
    if weights is None:
        idx = int(rng.integers(n))
        return gather_rows(comm, x, row_offset, np.array([idx]))[0]
    wmax = _global_max(comm, weights)
    if wmax == 0.0:
        raise InputError("every instance weight is 0: nothing to cluster")
    return draw_rows(comm, x, row_offset, to_fixed(weights, fixed_scale(wmax)), _uniform53(rng, 1))[1][0]


def _weighted(d2: np.ndarray, weights) -> np.ndarray:
    return d2 if weights is None else d2 * weights


def init_kmeanspp(comm, k: int, x: np.ndarray, row_offset: int, n: int, seed: int, n_local_trials: int | None = None,
                  weights: np.ndarray | None = None, *, backend=None) -> np.ndarray:
    """k-means++ (D² sampling) over the whole data set, with scikit-learn's greedy step (collective).

    The first centre is a uniform row (with weights: proportional to the
    weight).  Each next centre: ``n_local_trials`` candidate rows are drawn
    with probability proportional to ``w * D²`` (D² = squared distance to the
    nearest centre so far), and the candidate that lowers the potential
    ``sum(w * D²)`` most is kept, as scikit-learn's ``_kmeans_plusplus``.

    The centres depend only on the data, ``k``, ``seed`` and the trials, not
    on the number of ranks or the split: per-row D² are computed row by row,
    and every sum that decides a draw or a choice is exact (see
    :func:`draw_rows`).  Cost: ``(k - 1) * (n_local_trials + 1) + 1`` distance
    passes over the rows, each O(n m), and three small collectives per centre.

    Parameters
    ----------
    comm : Comm or SerialComm
    k : int
    x : ndarray, shape (n_local, m), float64
        This rank's rows.
    row_offset : int
        Global index of ``x[0]`` (ranks hold consecutive rows in rank order).
    n : int
        Rows over all ranks.
    seed : int
    n_local_trials : int, optional
        Candidates per centre; default ``2 + int(ln k)`` (scikit-learn's).
    weights : ndarray, shape (n_local,), float64, optional
        Instance weights.
    backend : Backend, optional
        Already loaded with ``x``: its ``assign`` computes the distances
        (threads, GPU).  Default: a serial kernel on ``x``.

    Returns
    -------
    ndarray, shape (k, m), float64
        The same on every rank.

    Raises
    ------
    UsageError
        ``k > n``.
    """
    if k > n:
        raise UsageError(f"-k {k} is more than the {n} rows of the data")
    x = np.ascontiguousarray(x, dtype=np.float64)
    rows = _rows_backend(backend, x)
    trials = n_local_trials or 2 + int(np.log(k))
    rng = np.random.default_rng(seed)
    centres = np.empty((k, x.shape[1]), dtype=np.float64)
    centres[0] = _first_centre(comm, x, row_offset, n, rng, weights)
    d2 = _dist2_to(rows, centres[0])
    vmax = _global_max(comm, _weighted(d2, weights))
    for c in range(1, k):
        if vmax == 0.0:
            # every row sits on a centre (fewer distinct rows than k): nothing
            # to gain from any choice; a uniform row keeps the result defined
            log.warning("k-means++: only %d distinct rows for %d centres; centre %d duplicates a row", c, k, c)
            centres[c] = gather_rows(comm, x, row_offset, np.array([int(rng.integers(n))]))[0]
            continue
        s = fixed_scale(vmax)
        _, cand = draw_rows(comm, x, row_offset, to_fixed(_weighted(d2, weights), s), _uniform53(rng, trials))
        # the potential of each candidate (exact at scale s: a choice that
        # does not depend on the split), and the largest w * D² it would leave,
        # which gives the next step's scale without another collective
        parts = comm.allgather(_potentials(rows, x, d2, cand, weights, s))
        pots = [sum(p[j][0] for p in parts) for j in range(trials)]
        best = min(range(trials), key=lambda j: (pots[j], j))
        centres[c] = cand[best]
        d2 = _lower_to(rows, x, d2, cand[best])
        vmax = max(p[best][1] for p in parts)
    return centres


# =========================================================================== k-means||

def row_uniforms(key: tuple, row_offset: int, n_local: int) -> np.ndarray:
    """One uniform number in [0, 1) per global row, whichever rank holds the row.

    Rows are cut into global blocks of ``_RNG_BLOCK``; block ``b`` draws its
    numbers from ``default_rng([*key, b])``, so a row's number depends only on
    ``key`` and its global index.

    Parameters
    ----------
    key : tuple of int >= 0
    row_offset, n_local : int
        This rank's rows are ``[row_offset, row_offset + n_local)``.

    Returns
    -------
    ndarray, shape (n_local,), float64
    """
    out = np.empty(n_local, dtype=np.float64)
    lo, hi = row_offset, row_offset + n_local
    for b in range(lo // _RNG_BLOCK, (hi - 1) // _RNG_BLOCK + 1 if hi > lo else 0):
        b0 = b * _RNG_BLOCK
        a, z = max(lo, b0), min(hi, b0 + _RNG_BLOCK)
        out[a - lo : z - lo] = np.random.default_rng([*key, b]).random(z - b0)[a - b0 :]
    return out


def _exact_label_sums(comm, labels: np.ndarray, weights, size: int) -> np.ndarray:
    """Per-label row counts (or weight totals) over all ranks, the same for any split.

    Returns
    -------
    ndarray, shape (size,), float64
    """
    if weights is None:
        return comm.allreduce(np.bincount(labels, minlength=size).astype(np.int64), "sum").astype(np.float64)
    s = fixed_scale(_global_max(comm, weights))
    q = to_fixed(weights, s)
    hi = np.zeros(size, dtype=np.int64)
    lo = np.zeros(size, dtype=np.int64)
    step = 1 << 25  # a float64 bincount of 2**25 values below 2**27 each stays below 2**52: exact
    for a in range(0, len(q), step):
        part, lab = q[a : a + step], labels[a : a + step]
        hi += np.rint(np.bincount(lab, weights=(part >> _LIMB).astype(np.float64), minlength=size)).astype(np.int64)
        lo += np.rint(np.bincount(lab, weights=(part & _LIMB_MASK).astype(np.float64), minlength=size)).astype(np.int64)
    both = comm.allreduce(np.concatenate([hi, lo]), "sum")
    return np.array([math.ldexp(float(limbs_to_int(h, l_)), -s) for h, l_ in zip(both[:size], both[size:])])


def init_kmeans_parallel(comm, k: int, x: np.ndarray, row_offset: int, n: int, seed: int, rounds: int = 5,
                         oversampling: float | None = None, weights: np.ndarray | None = None, *, backend=None,
                         local_iter: int = 30) -> np.ndarray:
    """k-means|| (Bahmani et al. 2012), as Spark and cuML do it (collective).

    One uniform first centre; then ``rounds`` rounds in which every row joins
    the candidates independently with probability ``min(1, l * w * D² / phi)``
    (``l = oversampling * k``, ``phi = sum(w * D²)``); then each candidate is
    weighted by the rows (total weight) nearest to it, and a weighted
    k-means++ followed by up to ``local_iter`` weighted Lloyd iterations on the
    candidates (small: about ``1 + rounds * l`` rows) gives the k centres.

    Independent of the rank count for a seed: a row's random number comes
    from (seed, round, global row index) (:func:`row_uniforms`), ``phi`` and
    the candidate weights are exact sums, and the candidate stage runs on
    rank 0 and is broadcast.  Cost: about ``2 * rounds * oversampling`` Lloyd
    iterations' worth of distance work, in ``rounds + 2`` large passes.

    Parameters
    ----------
    comm, k, x, row_offset, n, seed, weights, backend
        As :func:`init_kmeanspp`.
    rounds : int
        Oversampling rounds (Bahmani et al. find 5 enough; Spark's default is 2).
    oversampling : float, optional
        ``l / k``; default 2.
    local_iter : int
        Weighted Lloyd iterations on the candidates (Spark: 30).

    Returns
    -------
    ndarray, shape (k, m), float64
        The same on every rank.

    Notes
    -----
    With fewer distinct candidates than ``k`` (tiny or highly duplicated
    data) it falls back to :func:`init_kmeanspp` with the same seed.
    """
    if k > n:
        raise UsageError(f"-k {k} is more than the {n} rows of the data")
    x = np.ascontiguousarray(x, dtype=np.float64)
    rows = _rows_backend(backend, x)
    ell = (2.0 if oversampling is None else float(oversampling)) * k
    rng = np.random.default_rng(seed)
    first = _first_centre(comm, x, row_offset, n, rng, weights)
    local_seed = int(rng.integers(1 << 62))
    cands = [first[None, :]]
    d2 = _dist2_to(rows, first)
    for r in range(rounds):
        v = _weighted(d2, weights)
        vmax = _global_max(comm, v)
        if vmax == 0.0:
            break  # every row is a candidate already
        s = fixed_scale(vmax)
        q = to_fixed(v, s)
        phi = math.ldexp(float(sum(comm.allgather(_local_total(q)))), -s)
        u = row_uniforms((seed, 2, r), row_offset, len(x))
        chosen = np.flatnonzero(u * phi < ell * v)  # u < min(1, l v / phi), without a division
        picked = comm.allgather((row_offset + chosen, x[chosen]))
        idx = np.concatenate([p[0] for p in picked])
        new = np.concatenate([p[1] for p in picked]).reshape(-1, x.shape[1])[np.argsort(idx, kind="stable")]
        if len(new):
            cands.append(new)
            d2 = np.minimum(d2, rows.assign(new)[1])
    cands = np.ascontiguousarray(np.vstack(cands))
    cw = _exact_label_sums(comm, rows.assign(cands)[0], weights, len(cands))
    if int((cw > 0).sum()) < k:
        log.warning("k-means||: %d distinct candidates for k = %d; using k-means++ instead", int((cw > 0).sum()), k)
        return init_kmeanspp(comm, k, x, row_offset, n, seed, weights=weights, backend=backend)
    centres = None
    if comm.rank == 0:
        # one computation, broadcast: every rank gets the same bits even on
        # nodes whose CPUs might round differently
        centres = init_kmeanspp(SerialComm(), k, cands, 0, len(cands), local_seed, weights=cw)
        centres = _weighted_lloyd_serial(cands, cw, centres, local_iter)
    log.info("k-means||: %d candidates from %d rounds", len(cands), rounds)
    return comm.bcast(centres, root=0)


# =========================================================================== choosing an initialisation

INIT_METHODS = ("k-means++", "k-means||", "range", "sample")


def global_extent(comm, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per-attribute global minimum and maximum (Allreduce MIN/MAX; exact, any split).

    Returns
    -------
    mins, maxs : ndarray, shape (m,), float64
        ``+inf``/``-inf`` where no rank has a row.
    """
    m = x.shape[1]
    lo = x.min(axis=0) if len(x) else np.full(m, np.inf)
    hi = x.max(axis=0) if len(x) else np.full(m, -np.inf)
    return comm.allreduce(np.asarray(lo, np.float64), "min"), comm.allreduce(np.asarray(hi, np.float64), "max")


def initial_centres(comm, method: str, k: int, x: np.ndarray, row_offset: int, n: int, seed: int, *,
                    weights: np.ndarray | None = None, backend=None, mins: np.ndarray | None = None,
                    maxs: np.ndarray | None = None, rounds: int = 5, oversampling: float | None = None,
                    n_local_trials: int | None = None) -> np.ndarray:
    """Initial centres by method name (collective).

    Parameters
    ----------
    comm, k, x, row_offset, n, seed, weights, backend
        As :func:`init_kmeanspp`.
    method : {"k-means++", "k-means||", "range", "sample"}
    mins, maxs : ndarray, shape (m,), optional
        Global bounds for ``range`` (computed when omitted).
    rounds, oversampling : for ``k-means||``
    n_local_trials : for ``k-means++``

    Returns
    -------
    ndarray, shape (k, m), float64
        The same on every rank, for any number of ranks.
    """
    if method == "k-means++":
        return init_kmeanspp(comm, k, x, row_offset, n, seed, n_local_trials, weights, backend=backend)
    if method == "k-means||":
        return init_kmeans_parallel(comm, k, x, row_offset, n, seed, rounds, oversampling, weights, backend=backend)
    if method == "range":
        if mins is None or maxs is None:
            mins, maxs = global_extent(comm, x)
        return init_range(k, mins, maxs, seed)
    if method == "sample":
        return init_sample(comm, k, x, row_offset, n, seed)
    raise UsageError(f"--init {method!r}: expected one of {', '.join(INIT_METHODS)} or a file of centres")


# =========================================================================== restarts

def restart_seeds(seed: int, n_init: int) -> list:
    """Seeds of ``n_init`` restarts derived from one seed.

    Restart 0 uses ``seed`` itself (so ``n_init=1`` is the plain run) and
    restart ``i`` the ``i``-th child of ``SeedSequence(seed)``; the list for
    ``R`` restarts is a prefix of the list for more, so more restarts never
    give a higher SSE.

    Returns
    -------
    list of int
        Each in ``[0, 2**63)``.
    """
    if n_init < 1:
        raise UsageError(f"--n-init {n_init}: expected an integer >= 1")
    children = np.random.SeedSequence(seed).spawn(n_init)
    return [int(seed)] + [int(c.generate_state(1, np.uint64)[0] >> np.uint64(1)) for c in children[1:]]


def best_restart(inertias, rtol: float = 1e-9) -> int:
    """Index of the restart to keep: in order, a restart replaces the kept one
    only when its SSE is lower by more than ``rtol`` (relative).

    Two restarts that reach the same partition report SSEs that differ only in
    rounding, which depends on the number of ranks; treating them as equal and
    keeping the earlier one makes the choice the same at any ``-np``.  The
    rule looks only at the kept SSE and the next one, so it can be applied
    as the restarts finish.

    Parameters
    ----------
    inertias : sequence of float
        NaN (an interrupted restart) is never chosen.

    Returns
    -------
    int
    """
    best = None
    for i, v in enumerate(inertias):
        if math.isnan(v):
            continue
        if best is None or v < inertias[best] - rtol * abs(inertias[best]):
            best = i
    return 0 if best is None else best


@dataclass
class RestartsResult:
    """Outcome of :func:`run_restarts`.

    Attributes
    ----------
    best : KMeansResult
        The kept restart (with this rank's labels), or the interrupted one.
    best_index : int
    restarts : list of dict
        Per restart: ``restart``, ``seed``, ``inertia``, ``iterations``,
        ``converged``, ``stop_reason``, ``init_s``, ``compute_s``.
    """

    best: KMeansResult
    best_index: int
    restarts: list = field(default_factory=list)


def run_restarts(comm, backend, x: np.ndarray, row_offset: int, n: int, k: int, *, init="k-means++", seed: int = 0,
                 n_init: int = 1, weights: np.ndarray | None = None, max_iter: int = 300, tol: float = 0.0,
                 empty_cluster: str = "keep", init_options: dict | None = None, resume: LoopState | None = None,
                 after_iteration=None, stop_requested=None) -> RestartsResult:
    """``n_init`` initialisations, each followed by :func:`lloyd`; keep the lowest SSE (collective).

    Parameters
    ----------
    comm : Comm or SerialComm
    backend : Backend
        Loaded with ``x`` (and ``weights``); reloaded between restarts so that
        each restart starts with no labels, exactly as a single run.
    x : ndarray, shape (n_local, m), float64
    row_offset, n, k : int
    init : str or ndarray, shape (k, m)
        A method of :data:`INIT_METHODS`, or the initial centres (then
        ``n_init`` must be 1).
    seed : int
        Restart ``i`` uses ``restart_seeds(seed, n_init)[i]``.
    n_init : int
    weights : ndarray, shape (n_local,), optional
        Instance weights (the backend must be loaded with them too); the
        result's ``inertia`` is then the weighted SSE.
    max_iter, tol, empty_cluster, after_iteration, stop_requested
        Passed to :func:`lloyd`.
    init_options : dict, optional
        Extra keywords of :func:`initial_centres` (``mins``, ``maxs``,
        ``rounds``, ``oversampling``, ``n_local_trials``).
    resume : LoopState, optional
        Go on from a checkpoint (``n_init`` must be 1).

    Returns
    -------
    RestartsResult
    """
    explicit = not isinstance(init, str)
    if n_init > 1 and (explicit or resume is not None):
        raise UsageError("--n-init > 1 needs a random initialisation and cannot resume a checkpoint")
    seeds = restart_seeds(seed, n_init)
    best, best_index, summaries = None, 0, []
    for i, s in enumerate(seeds):
        t0 = time.perf_counter()
        if i > 0:
            backend.load(x, weights)  # labels back to "none", as in a fresh run
        if resume is not None:
            centres = None
        elif explicit:
            centres = check_centres(np.asarray(init, dtype=np.float64), k, x.shape[1], "initial centres")
        else:
            centres = initial_centres(comm, init, k, x, row_offset, n, s, weights=weights, backend=backend,
                                      **(init_options or {}))
        t1 = time.perf_counter()
        res = lloyd(comm, backend, x, row_offset, centres, max_iter=max_iter, tol=tol, empty_cluster=empty_cluster,
                    resume=resume, after_iteration=after_iteration, stop_requested=stop_requested, weights=weights)
        t2 = time.perf_counter()
        summaries.append({"restart": i, "seed": s, "inertia": res.inertia, "iterations": res.iterations,
                          "converged": res.converged, "stop_reason": res.stop_reason, "init_s": t1 - t0,
                          "compute_s": t2 - t1})
        log.info("restart %d/%d (seed %d): SSE %.10g after %d iterations", i + 1, n_init, s, res.inertia,
                 res.iterations)
        if res.interrupted:
            return RestartsResult(res, i, summaries)
        keep = best_restart([r["inertia"] for r in summaries])
        if keep == i:
            best, best_index = res, i
        else:
            res.labels = None  # only the kept restart's labels stay in memory
    return RestartsResult(best, best_index, summaries)
