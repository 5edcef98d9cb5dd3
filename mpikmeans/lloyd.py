"""The backend-agnostic Lloyd loop: iterations, convergence, empty clusters (collective).

Every rank runs this same code on its own rows.  Per iteration the backend
returns local float64 sums, counts, SSE and the number of changed labels; one
``Allreduce`` merges them; every rank then computes the same new centres, so
the centres never need to be broadcast.  Nothing here depends on the number of
ranks except the order in which the Allreduce adds the partial sums, which
moves only the last bits of the centres.  Initial centres come from
:mod:`mpikmeans.init`; several initialisations from :mod:`mpikmeans.restarts`.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field

import numpy as np

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


class _Scratch:
    """The loop's K x M work arrays, kept from iteration to iteration (made again when K or M changes).

    At K x M = 257,000 each fresh 2 MB array met its pages for the first time
    every iteration: the merge, the new centres and the shift took 4.8 ms an
    iteration on the 2-core Xeon with fresh arrays and 0.8 ms with these.
    """

    def __init__(self):
        self.packed = np.empty(0)
        self.diff = np.empty((0, 0))

    def merge_buffer(self, k: int, m: int) -> np.ndarray:
        """The flat buffer of :func:`_merge`: K x M sums, K counts, rows searched, SSE, changes, stop."""
        if self.packed.size != k * m + k + 4:
            self.packed = np.empty(k * m + k + 4, dtype=np.float64)
        return self.packed

    def diff_buffer(self, shape: tuple) -> np.ndarray:
        """A (k, m) float64 array for :func:`_shift`."""
        if self.diff.shape != shape:
            self.diff = np.empty(shape, dtype=np.float64)
        return self.diff


def _merge(comm, part, stop: bool, scratch: _Scratch) -> tuple:
    """One Allreduce for sums, counts, rows searched, SSE, the change count and stop requests.

    A signal reaches the ranks at slightly different times; adding the ranks'
    stop flags into the same Allreduce makes every rank see the request at the
    same iteration.  The sums and counts returned are views of ``scratch``'s
    buffer: valid until the next merge.  Rows searched is None where a backend
    does not count them.
    """
    k, m = part.sums.shape
    buf = scratch.merge_buffer(k, m)
    np.copyto(buf[: k * m].reshape(k, m), part.sums)
    buf[k * m : k * m + k] = part.counts
    buf[-4] = part.searched if part.searched >= 0 else np.nan  # a rank that does not count makes the sum NaN
    buf[-3] = part.sse
    buf[-2] = part.changed  # exact in float64 below 2**53 rows
    buf[-1] = 1.0 if stop else 0.0
    comm.allreduce_in_place(buf, "sum")
    searched = None if np.isnan(buf[-4]) else int(buf[-4])
    return (buf[: k * m].reshape(k, m), buf[k * m : k * m + k], float(buf[-3]), int(buf[-2]), buf[-1] > 0,
            searched)


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


def _label_means(comm, x: np.ndarray, labels: np.ndarray, weights, centres: np.ndarray, layout=None) -> np.ndarray:
    """Centres as the global means of the rows with each label, summed in a fixed order (collective).

    An empty cluster keeps its centre; nominal attributes take their cluster's mode (``layout``).
    """
    from .backends.cpu import label_sums

    k, m = centres.shape
    sums, counts = label_sums(x, labels, k, weights)
    buf = comm.allreduce(np.concatenate([sums.ravel(), counts]), "sum")
    sums, counts = buf[: k * m].reshape(k, m), buf[k * m:]
    filled = counts > 0
    new = centres.copy()
    new[filled] = _means(sums, counts, filled, layout, weights is not None)
    return new


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
        # the same divisions as below in one pass, without the row selections' copies
        return np.divide(sums, counts[:, None]), filled
    new = centres.copy()
    new[filled] = _means(sums, counts, filled, layout, weighted)
    return new, filled


def _shift(new: np.ndarray, centres: np.ndarray, diff: np.ndarray) -> float:
    """The largest Euclidean distance a centre moved, ``new`` and ``centres`` (k, m).

    ``diff`` (k, m) is scratch.  An empty cluster kept its centre, so its row of
    differences is zero and adds nothing; each row is summed as NumPy sums a
    contiguous row, so the figure is the same bits as summing only the moved rows.
    """
    np.subtract(new, centres, out=diff)
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
    if resume is not None:
        state = resume
        if state.prev_centres is not None and state.prev_centres.shape == state.centres.shape:
            backend.step(state.prev_centres)  # the labels the uninterrupted run had
    else:
        state = LoopState(0, np.array(centres, dtype=np.float64, copy=True), None, [])
    reason, converged, interrupted = STOP_MAX_ITER, False, False
    scratch = _Scratch()
    while state.iteration < max_iter:
        it = state.iteration + 1
        fault_point(comm.rank, "iteration")
        t0 = time.perf_counter()
        centres = state.centres
        part = backend.step(centres)
        sums, counts, sse, changed, stop, searched = _merge(comm, part, bool(stop_requested and stop_requested()),
                                                            scratch)
        relocated, dropped = state.relocated, state.dropped
        if empty_cluster == "farthest" and (counts == 0).any():
            relocated += _relocate_empty(comm, backend, x, row_offset, centres, sums, counts, weights)
        new, filled = _new_centres(sums, counts, centres, layout, weights is not None)
        shift = _shift(new, centres, scratch.diff_buffer(new.shape))
        if empty_cluster == "drop" and not filled.all():
            # Weka's SimpleKMeans: an empty cluster is removed, the others keep their order.
            # The backend's labels name the old clusters: it starts its count of changes again
            new = new[filled]
            dropped += int((~filled).sum())
            backend.forget_labels()
            log.info("iteration %d: %d empty cluster(s) dropped, %d left", it, int((~filled).sum()), len(new))
        seconds = time.perf_counter() - t0
        entry = {"iteration": it, "sse": sse, "shift": shift, "changed": changed, "seconds": seconds}
        if searched is not None:
            entry["searched"] = searched
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
        if stop:
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
    if reason == STOP_UNCHANGED and not getattr(backend, "deterministic", True) and len(x) == len(labels):
        # a fixed point: the centres are the means of these labels.  The device added
        # them with atomics, in an order that changes from run to run; summed again
        # here in a fixed order, they are the same bits in every run
        centres = _label_means(comm, x, labels, weights, centres, layout)
        labels, dist2 = backend.assign(centres)
        state.centres = centres
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
                        history=state.history, relocated=state.relocated, state=state, cluster_sse=tail[k:],
                        dropped=state.dropped)
