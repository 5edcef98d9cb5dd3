"""Initial centres: every initialisation, behind :func:`initial_centres` (collective).

``range`` (uniform in the global per-attribute [min, max], the specification's
first method), ``sample`` (K distinct rows drawn uniformly over the whole file,
the second), ``k-means++`` (D² sampling with scikit-learn's greedy candidates)
and ``k-means||`` (scalable oversampling, as Spark and cuML).

All give bit-identical centres for any number of ranks: random numbers are
keyed by global row indices, and every sum that decides which row is drawn is
an exact fixed-point sum (:mod:`mpikmeans.exact`).  The distance passes run on
the backend the rows are loaded on (threads, a GPU) through its
:class:`~mpikmeans.backends.RowDistances` methods, or on a serial kernel when
none is given.
"""

from __future__ import annotations

import logging
import math

import numpy as np

from .backends.serial import SerialRows, weighted_lloyd
from .choices import INIT_METHODS
from .comm import SerialComm
from .errors import InputError, UsageError
from .exact import (draw_rows, exact_label_sums, fixed_scale, global_max, local_total, to_fixed, uniform53)

log = logging.getLogger("mpikmeans")


#: Rows per random stream of k-means|| (keyed by the global block index, so
#: every row's random number is the same whichever rank holds it).
_RNG_BLOCK = 1 << 16


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


# =========================================================================== D² sampling

def _rows(backend, x):
    """Where the distance passes run: the run's backend, else a serial kernel on ``x``."""
    return backend if backend is not None else SerialRows(x)


def _first_centre(comm, x, row_offset, n, rng, weights):
    """One row drawn uniformly (or with probability proportional to its weight)."""
    if weights is None:
        idx = int(rng.integers(n))
        return gather_rows(comm, x, row_offset, np.array([idx]))[0]
    wmax = global_max(comm, weights)
    if wmax == 0.0:
        raise InputError("every instance weight is 0: nothing to cluster")
    return draw_rows(comm, x, row_offset, to_fixed(weights, fixed_scale(wmax)), uniform53(rng, 1))[1][0]


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
    :func:`mpikmeans.exact.draw_rows`).  Cost: ``(k - 1) * n_local_trials + 1`` row-to-point
    distances per row, O(n m) each: one pass over the rows per centre where the backend
    measures all of a centre's candidates at once and keeps their distances (the CPU; the GPU
    with resident rows, up to 8 trials and room for the distances), else about
    ``n_local_trials + 1`` passes; and three small collectives per centre.

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
        Already loaded with ``x``: its distance methods run the passes
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
    rows = _rows(backend, x)
    trials = n_local_trials or 2 + int(np.log(k))
    rng = np.random.default_rng(seed)
    centres = np.empty((k, x.shape[1]), dtype=np.float64)
    centres[0] = _first_centre(comm, x, row_offset, n, rng, weights)
    d2 = rows.dist2_to(centres[0])
    vmax = global_max(comm, np.array([rows.d2_max(d2, weights)]))
    duplicates = 0
    for c in range(1, k):
        if vmax == 0.0:
            # every row sits on a centre (fewer distinct rows than k): nothing
            # to gain from any choice; a uniform row keeps the result defined
            if not duplicates:
                which = f"centre {c} duplicates a row" if c == k - 1 else f"centres {c} to {k - 1} duplicate rows"
                log.warning("k-means++: the data has only %d distinct row%s for k = %d: %s", c, "" if c == 1 else "s",
                            k, which)
            duplicates += 1
            centres[c] = gather_rows(comm, x, row_offset, np.array([int(rng.integers(n))]))[0]
            continue
        s = fixed_scale(vmax)
        _, cand = draw_rows(comm, x, row_offset, rows.d2_fixed(d2, weights, s), uniform53(rng, trials))
        # the potential of each candidate (exact at scale s: a choice that
        # does not depend on the split), and the largest w * D² it would leave,
        # which gives the next step's scale without another collective
        parts = comm.allgather(rows.potentials(d2, cand, weights, s))
        pots = [sum(p[j][0] for p in parts) for j in range(trials)]
        best = min(range(trials), key=lambda j: (pots[j], j))
        centres[c] = cand[best]
        d2 = rows.lower_d2(d2, cand[best])
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


def _local_lloyd(cands: np.ndarray, cw: np.ndarray, centres: np.ndarray, max_iter: int, layout,
                 weighted: bool) -> np.ndarray:
    """:func:`weighted_lloyd` on the candidates, each new centre's nominal blocks its cluster's mode."""
    from .lloyd import _means

    rows = SerialRows(cands)
    labels = None
    k, m = centres.shape
    for _ in range(max_iter):
        new_labels = rows.assign(centres)[0]
        if labels is not None and np.array_equal(new_labels, labels):
            break
        labels = new_labels
        sums = np.zeros((k, m))
        np.add.at(sums, labels, cw[:, None] * cands)
        counts = np.bincount(labels, weights=cw, minlength=k)
        filled = counts > 0
        centres[filled] = _means(sums, counts, filled, layout, weighted)
    return centres


def init_kmeans_parallel(comm, k: int, x: np.ndarray, row_offset: int, n: int, seed: int, rounds: int = 5,
                         oversampling: float | None = None, weights: np.ndarray | None = None, *, backend=None,
                         local_iter: int = 30, layout=None) -> np.ndarray:
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
    layout : mpikmeans.nominal.Layout, optional
        With nominal attributes, those iterations give each centre's blocks its
        cluster's mode (as the main loop does).

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
    rows = _rows(backend, x)
    ell = (2.0 if oversampling is None else float(oversampling)) * k
    rng = np.random.default_rng(seed)
    first = _first_centre(comm, x, row_offset, n, rng, weights)
    local_seed = int(rng.integers(1 << 62))
    cands = [first[None, :]]
    d2 = rows.d2_host(rows.dist2_to(first))  # the rounds' sampling works on the host
    for r in range(rounds):
        v = _weighted(d2, weights)
        vmax = global_max(comm, v)
        if vmax == 0.0:
            break  # every row is a candidate already
        s = fixed_scale(vmax)
        q = to_fixed(v, s)
        phi = math.ldexp(float(sum(comm.allgather(local_total(q)))), -s)
        u = row_uniforms((seed, 2, r), row_offset, len(x))
        chosen = np.flatnonzero(u * phi < ell * v)  # u < min(1, l v / phi), without a division
        picked = comm.allgather((row_offset + chosen, x[chosen]))
        idx = np.concatenate([p[0] for p in picked])
        new = np.concatenate([p[1] for p in picked]).reshape(-1, x.shape[1])[np.argsort(idx, kind="stable")]
        if len(new):
            cands.append(new)
            d2 = np.minimum(d2, rows.nearest(new)[1])
    cands = np.ascontiguousarray(np.vstack(cands))
    cw = exact_label_sums(comm, rows.nearest(cands)[0], weights, len(cands))
    if int((cw > 0).sum()) < k:
        distinct = int((cw > 0).sum())
        log.warning("k-means||: %d distinct candidate%s for k = %d; using k-means++ instead", distinct,
                    "" if distinct == 1 else "s", k)
        return init_kmeanspp(comm, k, x, row_offset, n, seed, weights=weights, backend=backend)
    centres = None
    if comm.rank == 0:
        # one computation, broadcast: every rank gets the same bits even on
        # nodes whose CPUs might round differently
        centres = init_kmeanspp(SerialComm(), k, cands, 0, len(cands), local_seed, weights=cw)
        if layout is not None and layout.has_nominal:
            centres = _local_lloyd(cands, cw, centres, local_iter, layout, weights is not None)
        else:
            centres = weighted_lloyd(cands, cw, centres, local_iter)
    log.info("k-means||: %d candidates from %d rounds", len(cands), rounds)
    return comm.bcast(centres, root=0)


# =========================================================================== choosing an initialisation

def initial_centres(comm, method: str, k: int, x: np.ndarray, row_offset: int, n: int, seed: int, *,
                    weights: np.ndarray | None = None, backend=None, mins: np.ndarray | None = None,
                    maxs: np.ndarray | None = None, rounds: int = 5, oversampling: float | None = None,
                    n_local_trials: int | None = None, layout=None) -> np.ndarray:
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
    layout : mpikmeans.nominal.Layout, optional
        Nominal attributes' one-hot blocks: every centre's blocks are one-hot
        (rows drawn as centres are already; ``range`` takes each block's largest
        draw, so a uniform category).

    Returns
    -------
    ndarray, shape (k, m), float64
        The same on every rank, for any number of ranks.
    """
    if method == "k-means++":
        return init_kmeanspp(comm, k, x, row_offset, n, seed, n_local_trials, weights, backend=backend)
    if method == "k-means||":
        return init_kmeans_parallel(comm, k, x, row_offset, n, seed, rounds, oversampling, weights, backend=backend,
                                    layout=layout)
    if method == "range":
        if mins is None or maxs is None:
            mins, maxs = global_extent(comm, x)
        centres = init_range(k, mins, maxs, seed)
        return centres if layout is None else layout.project(centres)
    if method == "sample":
        return init_sample(comm, k, x, row_offset, n, seed)
    raise UsageError(f"--init {method!r}: expected one of {', '.join(INIT_METHODS)} or a file of centres")
