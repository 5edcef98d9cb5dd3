"""The backend-agnostic Lloyd loop: iterations, convergence, empty clusters (collective).

Every rank runs this same code on its own rows.  Per iteration the backend
returns its rows' per-cluster sums, counts and SSE as exact fixed-point
integers (:mod:`mpikmeans.fixedsums`) and the number of changed labels; one
integer ``Allreduce`` merges them; every rank then decodes the same totals into
the same new centres, so the centres never need to be broadcast.  Integers add
up to the same totals in any order, so the centres, the SSE and the labels are
the same bits at any number of ranks and on any backend.  Initial centres come
from :mod:`mpikmeans.init`; several initialisations from :mod:`mpikmeans.restarts`.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field

import numpy as np

from .faults import fault_point
from .fixedsums import Scales, cluster_sizes_and_sums, decode, row_limbs

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
        Empty clusters moved so far (policy ``farthest``).
    dropped : int
        Empty clusters removed so far (policy ``drop``).
    """

    iteration: int
    centres: np.ndarray
    prev_centres: np.ndarray | None
    history: list = field(default_factory=list)
    relocated: int = 0
    dropped: int = 0


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
        (largest centre move), ``changed`` (labels changed), ``seconds``, and
        ``searched`` (rows whose nearest centre was searched, the others kept
        theirs by a bound) where the backend counts them.
    relocated : int
        Empty clusters moved to a far point (policy ``farthest``).
    dropped : int
        Empty clusters removed (policy ``drop``): ``centres`` has that many fewer rows.
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
    dropped: int = 0
    state: LoopState | None = None
    cluster_sse: np.ndarray | None = None


def load_host_kernels() -> None:
    """Load the host kernels every iteration calls (the sums' decoding) now, in a run's set-up: a compiled
    kernel's first call reads Numba's cache (milliseconds), which would otherwise land in the first iteration."""
    decode(np.zeros((1, 4), dtype=np.int64), 0)


def prepare_loop(backend, k: int, m: int) -> None:
    """A run's set-up before its iterations: the backend's kernels and step buffers for ``k`` centres of ``m``
    attributes (:meth:`~mpikmeans.backends.Backend.warmup`) and the loop's own host kernels, so that the first
    iteration is a step like the others."""
    backend.warmup(k, m)
    load_host_kernels()


def run_scales(comm, backend, weights: np.ndarray | None) -> Scales:
    """The fixed-point scales of a run: the global bounds on each column's magnitude and on the weights (collective)."""
    local = np.append(backend.magnitudes(), weights.max() if weights is not None and len(weights) else 0.0)
    both = comm.allreduce(np.ascontiguousarray(local, dtype=np.float64), "max")
    return Scales.of(both[:-1], float(both[-1]) if weights is not None else 1.0)


class _Merged:
    """One iteration's totals over all ranks, decoded: the same values on every rank.

    Attributes
    ----------
    limbs : ndarray, shape (k, m + 1, 4), int64
        The merged sums' limbs (:class:`~mpikmeans.backends.StepResult`); the
        farthest-point relocation of empty clusters edits them.
    sse : float
    changed, searched : int (searched: None where a rank's backend does not count)
    stop : bool
        Some rank was asked to stop.
    """

    def __init__(self, comm, part, stop: bool, scales: Scales, sse_exponent: int):
        k, mc, _ = part.sums.shape
        ns = k * mc * 4
        buf = np.empty(ns + 4 + 4, dtype=np.int64)
        buf[:ns] = part.sums.ravel()
        buf[ns:ns + 4] = part.sse.sum(axis=0)  # integers: the clusters' SSE in any order
        buf[ns + 4:] = (part.changed, max(part.searched, 0), part.searched < 0, stop)
        comm.allreduce_in_place(buf, "sum")
        self.limbs = buf[:ns].reshape(k, mc, 4)
        self.scales = scales
        self.sse = float(decode(buf[ns:ns + 4], sse_exponent))
        self.changed = int(buf[ns + 4])
        self.searched = None if buf[ns + 6] else int(buf[ns + 5])
        self.stop = bool(buf[ns + 7])

    def empty(self) -> np.ndarray:
        """Which clusters have no rows (or zero weight), shape (k,), bool: by the integer their count's
        limbs stand for (limbs split differently can stand for zero)."""
        return decode(self.limbs[:, -1, :], self.scales.columns[-1]) == 0.0

    def sums_counts(self) -> tuple:
        """The decoded sums ``(k, m)`` and counts (weights) ``(k,)``, float64."""
        values = decode(self.limbs, self.scales.columns)
        return values[:, :-1], values[:, -1]


def _relocate_empty(comm, backend, x, row_offset, centres, merged: _Merged, weights=None) -> int:
    """Move each empty cluster to one of the points farthest from their centre.

    As scikit-learn does: the e farthest points (globally, ties to the lower
    row index) are taken out of their clusters' sums and each becomes the sole
    member of one empty cluster.  Works on the merged totals, exactly, so every
    rank makes the same change.  Returns the number of clusters moved.
    """
    empty = np.flatnonzero(merged.empty())
    dist2, rows, labels = backend.farthest(centres, len(empty))
    # each row as the backend's sums hold it (a float32 store rounded it): taken out of them exactly
    mine = [(-float(d), row_offset + int(i), int(a), backend.stored(x[i]),
             1.0 if weights is None else float(weights[i])) for d, i, a in zip(dist2, rows, labels)]
    candidates = sorted((c for part in comm.allgather(mine) for c in part), key=lambda c: (c[0], c[1]))
    moved = 0
    for cluster, (neg_d, _, owner, row, w) in zip(empty, candidates):
        if neg_d == 0.0:  # every remaining point sits on its centre: nothing to gain
            break
        contribution = row_limbs(row, w, merged.scales)
        merged.limbs[owner] -= contribution
        merged.limbs[cluster] = contribution
        moved += 1
    return moved


def _means(sums: np.ndarray, counts: np.ndarray, filled: np.ndarray, layout, weighted: bool) -> np.ndarray:
    """The new centres of the ``filled`` clusters: their means, a nominal attribute's block its mode."""
    new = sums[filled] / counts[filled, None]
    if layout is not None:
        layout.project(new, sums[filled], weighted)
    return new


def _new_centres(sums: np.ndarray, counts: np.ndarray, centres: np.ndarray, layout, weighted: bool) -> tuple:
    """The centres after an update and which clusters had members.

    Parameters
    ----------
    sums : ndarray, shape (k, m), float64
    counts : ndarray, shape (k,), float64
    centres : ndarray, shape (k, m), float64
        The centres the step assigned with: an empty cluster keeps its own (never a NaN).

    Returns
    -------
    new : ndarray, shape (k, m), float64
        A new array.
    filled : ndarray, shape (k,), bool
    """
    filled = counts > 0
    if layout is None and filled.all():
        return np.divide(sums, counts[:, None]), filled
    new = centres.copy()
    new[filled] = _means(sums, counts, filled, layout, weighted)
    return new, filled


def _shift(new: np.ndarray, centres: np.ndarray) -> float:
    """The largest Euclidean distance a centre moved, ``new`` and ``centres`` (k, m).

    An empty cluster kept its centre, so its row of differences is zero and adds nothing.
    """
    diff = np.subtract(new, centres)
    np.square(diff, out=diff)
    return float(np.sqrt(diff.sum(axis=1)).max(initial=0.0))


def lloyd(comm, backend, x: np.ndarray, row_offset: int, centres: np.ndarray, *, max_iter: int = 300,
          tol: float = 0.0, empty_cluster: str = "farthest", resume: LoopState | None = None,
          after_iteration=None, stop_requested=None, weights: np.ndarray | None = None,
          layout=None) -> KMeansResult:
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
    empty_cluster : {"farthest", "keep", "drop"}
        What an empty cluster becomes: the point farthest from its centre
        (scikit-learn's rule), its old centre, or nothing (Weka's: it is removed).
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
    layout : mpikmeans.nominal.Layout, optional
        With nominal attributes (one-hot blocks), each new centre's block is its
        cluster's mode (:meth:`~mpikmeans.nominal.Layout.project`), as Weka's
        SimpleKMeans; None or numeric attributes only: the plain means.

    Returns
    -------
    KMeansResult
        With ``interrupted`` set (and no labels) when a stop request ended it.
    """
    scales = run_scales(comm, backend, weights)
    if resume is not None:
        state = resume
        if state.prev_centres is not None and state.prev_centres.shape == state.centres.shape:
            backend.step(state.prev_centres, scales)  # the labels the uninterrupted run had
    else:
        state = LoopState(0, np.array(centres, dtype=np.float64, copy=True), None, [])
    reason, converged, interrupted = STOP_MAX_ITER, False, False
    if empty_cluster == "farthest":
        # the relocation's compiled kernel is loaded now, not inside the iteration that first empties a
        # cluster (often the second: its loading alone outlasts a step on the GPU)
        row_limbs(np.zeros(state.centres.shape[1]), 1.0, scales)
    while state.iteration < max_iter:
        it = state.iteration + 1
        fault_point(comm.rank, "iteration")
        t0 = time.perf_counter()
        centres = state.centres
        sse_exponent = scales.sse_exponent(centres)
        part = backend.step(centres, scales)
        merged = _Merged(comm, part, bool(stop_requested and stop_requested()), scales, sse_exponent)
        relocated, dropped = state.relocated, state.dropped
        if empty_cluster == "farthest" and merged.empty().any():
            relocated += _relocate_empty(comm, backend, x, row_offset, centres, merged, weights)
        sums, counts = merged.sums_counts()
        new, filled = _new_centres(sums, counts, centres, layout, weights is not None)
        shift = _shift(new, centres)
        if empty_cluster == "drop" and not filled.all():
            # Weka's SimpleKMeans: an empty cluster is removed, the others keep their order.
            # The backend's labels name the old clusters: it starts its count of changes again
            new = new[filled]
            dropped += int((~filled).sum())
            backend.forget_labels()
            log.info("iteration %d: %d empty cluster(s) dropped, %d left", it, int((~filled).sum()), len(new))
        seconds = time.perf_counter() - t0
        sse, changed, searched = merged.sse, merged.changed, merged.searched
        entry = {"iteration": it, "sse": sse, "shift": shift, "changed": changed, "seconds": seconds}
        if searched is not None:
            entry["searched"] = searched
        if relocated > state.relocated:
            entry["relocated"] = relocated - state.relocated
        history = state.history + [entry]
        state = LoopState(it, new, centres, history, relocated, dropped)
        log.info("iter %4d  sse %.10g  max shift %.4g  changed %d%s  %.4fs", it, sse, shift, changed,
                 "" if searched is None else f"  searched {searched}", seconds)
        if changed == 0:
            reason, converged = STOP_UNCHANGED, True
            break
        if tol > 0 and shift <= tol:
            reason, converged = STOP_TOL, True
            break
        if merged.stop:
            reason, interrupted = STOP_INTERRUPTED, True
        if after_iteration is not None and state.iteration < max_iter:
            after_iteration(state, interrupted)
        if interrupted:
            return KMeansResult(centres=state.centres, labels=None, inertia=float("nan"), sizes=None,
                                iterations=state.iteration, converged=False, stop_reason=reason,
                                history=state.history, relocated=state.relocated, interrupted=True,
                                state=state, dropped=state.dropped)
    centres = state.centres
    labels, dist2 = backend.assign(centres)
    k = centres.shape[0]
    sse_exponent = scales.sse_exponent(centres)
    tail = comm.allreduce(cluster_sizes_and_sums(labels, dist2, weights, k, sse_exponent), "sum")
    sizes = tail[:k].copy()
    cluster_limbs = tail[k:].reshape(k, 4)
    if (sizes == 0).any():
        log.warning("%d of %d clusters are empty at the end (fewer distinct rows than k, or a poor start)",
                    int((sizes == 0).sum()), k)
    return KMeansResult(centres=centres, labels=labels, inertia=float(decode(cluster_limbs.sum(axis=0), sse_exponent)),
                        sizes=sizes, iterations=state.iteration, converged=converged, stop_reason=reason,
                        history=state.history, relocated=state.relocated, state=state,
                        cluster_sse=decode(cluster_limbs, sse_exponent), dropped=state.dropped)
