"""The backend interface: what every backend answers about one rank's rows, and what a step returns.

A backend holds one rank's rows (resident where it can: host memory for the CPU
backend, device memory for the GPU backend) and answers questions about them
for a given set of centres.  It knows nothing of MPI: the Lloyd loop in
:mod:`mpikmeans.lloyd` merges what every rank's backend returns.  Tie-breaking
is part of the contract: a row equidistant from several centres goes to the
lowest centre index, so that the CPU and GPU paths give identical labels.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass, field

import numpy as np

from ..exact import HostFixed, fixed_potential, limbs_to_int, to_fixed
from ..fixedsums import scale_factors


@dataclass
class StepResult:
    """What one rank contributes to one Lloyd iteration: exact fixed-point totals (:mod:`mpikmeans.fixedsums`).

    Attributes
    ----------
    sums : ndarray, shape (k, m + 1, 4), int64
        Per cluster, the limbs of ``sum(w x_j)`` over its rows for each column
        ``j < m``, and of ``sum(w)`` (its row count without weights) at ``m``,
        at the step's :class:`~mpikmeans.fixedsums.Scales`.  Valid until the next step.
    sse : ndarray, shape (k, 4), int64
        Per cluster, the limbs of ``sum(w d²)``, ``d²`` each row's exact squared
        distance to the centre it was assigned to, at the scale
        ``scales.sse_exponent(centres)``.
    changed : int
        Local rows whose label differs from the previous step (all rows on
        the first step).
    searched : int
        Local rows whose nearest centre was searched among all K (the others
        kept theirs by a bound); -1 where the backend does not say.
    """

    sums: np.ndarray
    sse: np.ndarray
    changed: int
    searched: int = -1


@dataclass
class BackendInfo:
    """Description of the hardware a backend runs on, for summary.json."""

    name: str
    devices: list = field(default_factory=list)
    threads: int = 1
    dtype: str = "float64"


class RowDistances(abc.ABC):
    """Distances of this rank's rows to given points: what the initialisations ask of a backend.

    Only :meth:`assign` must be written; the others are built on it, and a
    backend overrides them where it can do better (one pass over the rows for
    all candidates, no temporary arrays, the distances kept on the GPU).  Every
    squared distance sums its m terms in attribute order, each product and sum
    rounded once (no FMA), as the CPU's Lloyd step does, so all give
    bit-identical results and the initial centres do not depend on the backend.

    "D²" (the squared distance of each row to its nearest centre so far) is
    whatever :meth:`dist2_to` returns: a host array here, a device array on a
    GPU; only these methods look into it (:meth:`d2_host` copies it out).
    """

    @abc.abstractmethod
    def assign(self, centres: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Nearest centre and squared distance to it for every local row.

        Parameters
        ----------
        centres : ndarray, shape (k, m), float64

        Returns
        -------
        labels : ndarray, shape (n_local,), int32
        dist2 : ndarray, shape (n_local,), float64
        """

    def nearest(self, points: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """:meth:`assign` to a set of points whose number changes from call to call (candidates).

        The same result as :meth:`assign`; a backend whose Lloyd kernels are
        specialised on the number of centres answers it with a generic kernel.

        Parameters
        ----------
        points : ndarray, shape (p, m), float64

        Returns
        -------
        labels : ndarray, shape (n_local,), int32
        dist2 : ndarray, shape (n_local,), float64
        """
        return self.assign(points)

    def dist2_to(self, centre: np.ndarray) -> np.ndarray:
        """Squared distance of every local row to one point.

        Parameters
        ----------
        centre : ndarray, shape (m,), float64

        Returns
        -------
        ndarray, shape (n_local,), float64
        """
        return self.assign(np.asarray(centre, dtype=np.float64).reshape(1, -1))[1]

    def lower_d2(self, d2: np.ndarray, centre: np.ndarray) -> np.ndarray:
        """``min(D², squared distance to centre)`` for every local row (a new array).

        Parameters
        ----------
        d2 : ndarray, shape (n_local,), float64
        centre : ndarray, shape (m,), float64

        Returns
        -------
        ndarray, shape (n_local,), float64
        """
        return np.minimum(d2, self.dist2_to(centre))

    def d2_host(self, d2) -> np.ndarray:
        """D² as a host array, shape (n_local,), float64."""
        return d2

    def d2_max(self, d2, weights: np.ndarray | None) -> float:
        """The largest ``w * D²`` of this rank's rows (0 without rows)."""
        d2 = self.d2_host(d2)
        if not d2.size:
            return 0.0
        return float((d2 if weights is None else d2 * weights).max())

    def d2_fixed(self, d2, weights: np.ndarray | None, s: int):
        """The fixed-point weights ``to_fixed(w * D², s)`` of this rank's rows, for :func:`mpikmeans.exact.draw_rows`.

        Returns
        -------
        object with ``total`` (the exact local sum, int) and ``find(t)`` (the local row
        whose exact inclusive prefix sum first exceeds ``t``)
        """
        d2 = self.d2_host(d2)
        return HostFixed(to_fixed(d2 if weights is None else d2 * weights, s))

    def potentials(self, d2: np.ndarray, cands: np.ndarray, weights: np.ndarray | None, s: int) -> list:
        """Per candidate: the exact fixed-point potential of this rank's rows and the largest value.

        The potential of candidate ``c`` is ``sum(q(w * min(D², |x - c|²)))`` at
        the fixed-point scale ``s`` (:mod:`mpikmeans.exact`): an integer, so the
        ranks' parts add up to the same total for any split.

        Parameters
        ----------
        d2 : ndarray, shape (n_local,), float64
            Squared distance of each row to its nearest centre so far.
        cands : ndarray, shape (t, m), float64
        weights : ndarray, shape (n_local,), float64, or None
        s : int

        Returns
        -------
        list of (int, float), one per candidate
        """
        f1, f2 = scale_factors(s)
        w = weights if weights is not None else d2[:0]
        out = []
        for c in cands:
            hi, lo, vm = fixed_potential(d2, self.dist2_to(c), w, weights is not None, f1, f2)
            out.append((limbs_to_int(hi, lo), float(vm)))
        return out


class Backend(RowDistances):
    """Interface every backend implements.

    Lifecycle: ``load(x)`` once, then any number of ``step`` / ``assign``
    calls, then ``close()``.  ``step`` keeps the labels it computed so the
    next call can count changes; ``assign`` does not touch them.  The
    distance helpers of :class:`RowDistances` serve the initialisations.
    """

    #: the dtype this backend stores the rows in (a GPU's ``--dtype``; its arithmetic is exact either way)
    dtype: str = "float64"

    name: str = "abstract"
    _magnitudes: np.ndarray = np.zeros(0)

    @abc.abstractmethod
    def load(self, x: np.ndarray, weights: np.ndarray | None = None, magnitudes: np.ndarray | None = None) -> None:
        """Take this rank's rows.

        Parameters
        ----------
        x : ndarray, shape (n_local, m), float64, C-contiguous
            May have zero rows.
        weights : ndarray, shape (n_local,), float64, optional
            Instance weights (ARFF ``{w}``); every row weighs 1 when omitted.
            Counts, sums and SSE are weighted.
        magnitudes : ndarray, shape (m,), float64, optional
            A bound on each column's magnitude ``|x_j|`` over these rows (or
            over all ranks' rows); computed here when omitted (:meth:`magnitudes`).
        """

    @abc.abstractmethod
    def step(self, centres: np.ndarray, scales) -> StepResult:
        """Assign every local row to its nearest centre and accumulate.

        Ties go to the lowest centre index; distances are summed in attribute
        order with one rounding per operation; the sums are exact integers, so
        every backend returns the same totals for the same labels.

        Parameters
        ----------
        centres : ndarray, shape (k, m), float64
        scales : mpikmeans.fixedsums.Scales
            The run's fixed-point scales (the same on every rank).

        Returns
        -------
        StepResult
            Fixed-point sums, counts and SSE of the local rows, and how many
            labels changed since the previous call.
        """

    @abc.abstractmethod
    def info(self) -> BackendInfo:
        """What this backend runs on."""

    def farthest(self, centres: np.ndarray, count: int) -> tuple:
        """The ``count`` local rows farthest from their nearest centre, largest distance first, ties to the
        lower row index (the empty-cluster relocation's candidates).

        Parameters
        ----------
        centres : ndarray, shape (k, m), float64
            The last step's centres, as a rule: a backend answers from that step's distances then.
        count : int

        Returns
        -------
        dist2 : ndarray, shape (c,), float64
        rows : ndarray, shape (c,), int64
            Local row indices, ``c = min(count, n_local)``.
        labels : ndarray, shape (c,), int32
        """
        labels, dist2 = self.assign(centres)
        rows = farthest_rows(dist2, count)
        return dist2[rows], rows, labels[rows]

    def stored(self, rows: np.ndarray) -> np.ndarray:
        """``rows`` as this backend holds them, a new float64 array: the values its sums add (a row the
        empty-cluster relocation moves is taken out of those sums with these values).

        Parameters
        ----------
        rows : ndarray, shape (r, m) or (m,), float64
        """
        return np.array(rows, dtype=self.dtype).astype(np.float64)

    def magnitudes(self) -> np.ndarray:
        """Each column's largest magnitude over this rank's rows, shape (m,), float64 (0 without rows).

        The Lloyd loop takes the global maximum as the bound of its fixed-point
        scales; :meth:`load` may be given it (``magnitudes=``) where the caller
        knows it already.
        """
        return self._magnitudes

    def warmup(self, k: int, m: int) -> None:
        """Compile (or load from the cache) every kernel for k centres of m attributes.

        Called once before the timed loop, so compile time is reported apart
        from the per-iteration time.  Default: nothing to do.
        """

    def score_rows(self, labels: np.ndarray, k: int):
        """The quality scores' two passes over these rows where they are, for ``labels``, or None: the scores
        read the host rows (:class:`mpikmeans.scores.HostScoreRows` says what the object answers).

        Parameters
        ----------
        labels : ndarray, shape (n_local,), int32
            Every row's cluster, ``0 .. k-1``.
        k : int
        """
        return None

    def forget_labels(self) -> None:
        """Every row's label unknown: the next :meth:`step` counts every row as changed.

        For a loop that renumbers the clusters (empty ones dropped).
        """
        raise NotImplementedError(f"the {self.name} backend cannot forget its labels")

    def close(self) -> None:
        """Release memory held for the rows (device buffers, threads)."""


def farthest_rows(dist2: np.ndarray, count: int) -> np.ndarray:
    """Indices of the ``count`` largest ``dist2``, largest first, ties to the lower index: a selection, not a sort.

    Every row tied with the ``count``-th largest value is kept before the final
    ordering, so the tie-break is the sort's, exactly.
    """
    n = len(dist2)
    take = min(count, n)
    if take <= 0:
        return np.zeros(0, dtype=np.int64)
    if take < n:
        kth = np.partition(dist2, n - take)[n - take]
        cand = np.flatnonzero(dist2 >= kth)
    else:
        cand = np.arange(n)
    return cand[np.lexsort((cand, -dist2[cand]))][:take].astype(np.int64)


class BackendUnavailable(RuntimeError):
    """The requested backend cannot run here (no GPU, no numba-cuda...)."""


def device_for_rank(node_rank: int, node_size: int, count: int, share: bool) -> int:
    """The GPU of a rank, from its node-local rank: ``node_rank % count``.

    Parameters
    ----------
    node_rank, node_size : int
        Rank among the MPI processes on this node (``Split_type(COMM_TYPE_SHARED)``), and their number.
    count : int
        GPUs visible on this node.
    share : bool
        Allow several ranks on one GPU (``--share-gpus``).

    Raises
    ------
    BackendUnavailable
        No GPU, or more ranks than GPUs on this node without ``share``.
    """
    if count == 0:
        raise BackendUnavailable("no usable CUDA GPU on this node (numba-cuda and a CUDA driver are needed)")
    if node_size > count and not share:
        raise BackendUnavailable(
            f"{node_size} ranks on this node but only {count} visible GPU(s): start at most {count} "
            f"rank(s) per node, or pass --share-gpus to let ranks share GPUs"
        )
    return node_rank % count
