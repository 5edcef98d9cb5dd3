"""Several initialisations, each followed by the Lloyd loop; the lowest SSE kept (collective).

Seeds are derived from one (:func:`restart_seeds`), and the choice of the kept
restart treats SSEs equal up to rounding as equal (:func:`best_restart`), so
the result is the same at any ``-np``.
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass, field

import numpy as np

from .errors import UsageError
from .init import check_centres, initial_centres
from .lloyd import KMeansResult, LoopState, lloyd

log = logging.getLogger("mpikmeans")

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
                 empty_cluster: str = "farthest", init_options: dict | None = None, resume: LoopState | None = None,
                 after_iteration=None, stop_requested=None, layout=None) -> RestartsResult:
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
        A method of :data:`mpikmeans.init.INIT_METHODS`, or the initial centres (then
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
    layout : mpikmeans.nominal.Layout, optional
        Nominal attributes' one-hot blocks: centres take their clusters' modes
        there (see :func:`lloyd` and :func:`initial_centres`).

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
                                      layout=layout, **(init_options or {}))
        t1 = time.perf_counter()
        res = lloyd(comm, backend, x, row_offset, centres, max_iter=max_iter, tol=tol, empty_cluster=empty_cluster,
                    resume=resume, after_iteration=after_iteration, stop_requested=stop_requested, weights=weights,
                    layout=layout)
        t2 = time.perf_counter()
        summaries.append({"restart": i, "seed": s, "inertia": res.inertia, "iterations": res.iterations,
                          "converged": res.converged, "stop_reason": res.stop_reason, "init_s": t1 - t0,
                          "compute_s": t2 - t1})
        if res.interrupted:  # no SSE: the last assignment was never made
            log.info("restart %d/%d (seed %d): stopped by a signal after %d iteration%s", i + 1, n_init, s,
                     res.iterations, "" if res.iterations == 1 else "s")
        else:
            log.info("restart %d/%d (seed %d): SSE %.10g after %d iteration%s", i + 1, n_init, s, res.inertia,
                     res.iterations, "" if res.iterations == 1 else "s")
        if res.interrupted:
            return RestartsResult(res, i, summaries)
        keep = best_restart([r["inertia"] for r in summaries])
        if keep == i:
            best, best_index = res, i
        else:
            res.labels = None  # only the kept restart's labels stay in memory
    return RestartsResult(best, best_index, summaries)
