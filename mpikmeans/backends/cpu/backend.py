"""``CPUBackend``: one rank's rows in host memory, and the kernels each question goes to."""

from __future__ import annotations

import contextlib

import numba
import numpy as np

from ...cpus import process_threads
from ...exact import BlockFixed, limbs_to_int
from ...fixedsums import Scales, cluster_sums, column_magnitudes, scale_factors, sum_rows
from ...memory import available_memory
from ..base import Backend, BackendInfo, StepResult, farthest_rows
from .blas import one_thread
from .bounds import assign_pass, bound_drops, centre_moves, half_gaps, step_pass
from .certified import centre_data, screen_rows
from .seeding import SeedingRows, candidate_data, fixed_blocks, potentials_pass
from .tiles import _tile_dist2, _tile_rows

#: row blocks of a step, handed to the threads one at a time as each comes free
STEP_BLOCKS = 64


@contextlib.contextmanager
def _parallel_pass():
    """The context of the backend's parallel passes over the rows.

    BLAS runs on the calling thread (:mod:`.blas`), and the row blocks go to the
    threads one at a time as each comes free, not in fixed shares: on a host
    whose cores other processes share, a slowed thread then takes fewer blocks.
    The blocks, not the threads, fix the order of the sums, so the bits stay
    the same.
    """
    with one_thread(), numba.parallel_chunksize(1):
        yield


def screened(k: int, m: int) -> bool:
    """Whether a step with ``k`` centres of ``m`` attributes screens in float32 (else: the exact kernels).

    Both give the same bits.  The exact kernels compute every distance in
    float64, one vector lane per row, so their cost grows with K x M; the
    screen pays per row for its float32 copy, the exact distance to the chosen
    centre and a tile's matrix product, and wins once there are more than a
    few centres (2-core Xeon, ms per step on one thread, exact / screened:
    10^6 x 16 K = 8 31.8 / 36.5, 5 10^5 x 64 K = 4 48.8 / 54.7, 3 10^5 x 64
    K = 8 34.3 / 34.7, 10^6 x 16 K = 16 44.8 / 39.9, 10^6 x 4 K = 64 44.0 / 35.5,
    2 10^5 x 100 K = 50 111 / 50).
    """
    return k > 8 or k * m > 256


def search_plan(centres: np.ndarray) -> tuple:
    """How a step with these centres searches for the nearest one: the plan tuple of
    :func:`.bounds.step_pass` and its rows per tile.

    Parameters
    ----------
    centres : ndarray, shape (k, m), float64
    """
    k, m = centres.shape
    if screened(k, m):
        return (True, *centre_data(centres)), screen_rows(k, m)
    return (False, np.zeros(m), np.zeros((k, m), np.float32), np.zeros(k, np.float32), np.float32(0),
            np.float32(0)), _tile_rows(m)


class CPUBackend(Backend):
    """Lloyd iteration on the host with Numba: float64 results, labels screened in float32.

    Labels, distances and sums are bit for bit those of the exact float64
    kernels (:mod:`.tiles`) for any thread count: float32 only ranks the
    centres, and a row whose ranking it cannot certify is computed again in
    float64 (:mod:`.certified`).  From the second step on, a row whose centre
    cannot have changed (its bounds, :mod:`.bounds`) is not searched.

    Parameters
    ----------
    threads : int, optional
        Numba threads for this rank, at most Numba's pool
        (``numba.config.NUMBA_NUM_THREADS``).  A run passes the figure it reads
        with (:func:`mpikmeans.comm.default_threads`, or ``--threads``); without
        one, :func:`mpikmeans.cpus.process_threads`: what a one-rank run would
        use (this process's CPUs within its cgroup quota, lowered by
        ``OMP_NUM_THREADS`` / ``NUMBA_NUM_THREADS``).
    node_ranks : int, optional
        Ranks sharing this node's memory (a run passes ``comm.node_size``): k-means++
        keeps a float32 copy of the rows while it seeds where half of this rank's
        share of the available memory holds it.
    bounds : bool, optional
        Keep each row's bound from step to step (default, :mod:`.bounds`).  False
        searches every row every step: the same results, slower; for measuring
        the full step.
    """

    name = "cpu"

    def __init__(self, threads: int | None = None, node_ranks: int = 1, bounds: bool = True):
        self.node_ranks = max(1, int(node_ranks))
        self.bounds = bool(bounds)
        self.threads = max(1, min(threads or process_threads(), numba.config.NUMBA_NUM_THREADS))
        numba.set_num_threads(self.threads)
        self._x = None
        self._labels = None  # the last step's labels (-1: none)
        self._spare = None  # the next step writes its labels here, then the two swap
        self._dist2 = None  # the last step's exact squared distances
        self._weights = None
        self._cand_dists = None  # (candidates, their distances): what lower_d2 may reuse
        self._seeding = None  # SeedingRows of the k-means++ under way
        #: k-means++ passes: None screens when it pays (SeedingRows.screen_next); True / False always / never
        self.seed_screen = None
        self._lower = None  # per row: a lower bound on its distance to every centre but its own (.bounds)
        self._bounds_for = None  # the centres the labels and bounds hold for (None: they hold for none)
        self._step_centres = None  # the centres of the last step (its labels and distances are for them)
        self._totals = None  # the sums of self._labels' clusters (fixedsums limbs), and the scales they are at
        self._totals_scales = None
        #: rows of the last step that float32 could not certify (computed again exactly)
        self.rows_rechecked = 0
        #: rows of the last step (or assignment) whose nearest centre was searched (the others kept theirs)
        self.rows_searched = 0
        #: whether the last step added every row to the sums (else only the rows that changed label)
        self.full_sums = True

    def load(self, x: np.ndarray, weights: np.ndarray | None = None, magnitudes: np.ndarray | None = None) -> None:
        """Keep this rank's rows (see :meth:`Backend.load`).

        Parameters
        ----------
        x : ndarray, shape (n_local, m), float64
        weights : ndarray, shape (n_local,), float64, optional
            Instance weights; all ones when omitted.
        magnitudes : ndarray, shape (m,), float64, optional
        """
        self._x = np.ascontiguousarray(x, dtype=np.float64)
        self._cand_dists = None
        self._seeding = None
        n = self._x.shape[0]
        self._labels = np.full(n, -1, dtype=np.int32)
        self._spare = np.full(n, -1, dtype=np.int32)
        self._dist2 = np.zeros(n)
        self._lower = np.zeros(n)
        self._bounds_for = None
        self._step_centres = None
        self._totals = None
        self._magnitudes = (column_magnitudes(self._x) if magnitudes is None
                            else np.asarray(magnitudes, dtype=np.float64))
        if weights is None:
            self._weights = None
        else:
            self._weights = np.ascontiguousarray(weights, dtype=np.float64)

    def step(self, centres: np.ndarray, scales: Scales) -> StepResult:
        centres = np.ascontiguousarray(centres, dtype=np.float64)
        # seeding is over: the candidates' distances it kept for lower_d2 (t x n float64,
        # 240 MB for 5 10^6 rows and 6 candidates) and its float32 rows are not needed through the iterations
        self._cand_dists = None
        self._seeding = None
        k, m = centres.shape
        n = len(self._x)
        plan, tile = search_plan(centres)
        use_bounds, drops, halves = self._drops(centres)
        parts = np.zeros((3, STEP_BLOCKS), dtype=np.int64)
        old, new = self._labels, self._spare
        if n:
            with _parallel_pass():
                step_pass(self._x, centres, plan, tile, old, self._lower, use_bounds, drops, halves, new, self._dist2,
                          parts[0], parts[1], parts[2])
        self._labels, self._spare = new, old
        self._bounds_for = centres.copy() if self.bounds else None
        self._step_centres = centres.copy()
        changed, self.rows_searched, self.rows_rechecked = (int(v) for v in parts.sum(axis=1))
        # the sums move with the rows that changed label, while that is less work than adding every row
        keep = (self._totals is not None and self._totals.shape == (k, m + 1, 4)
                and np.array_equal(self._totals_scales, scales.columns) and 2 * changed <= n)
        if not keep:
            self._totals = np.zeros((k, m + 1, 4), dtype=np.int64)
            self._totals_scales = scales.columns
        self.full_sums = not keep
        sum_rows(self._x, self._weights, new, old if keep else None, scales, self._totals, self.threads)
        sse = cluster_sums(new, self._dist2, self._weights, k, scales.sse_exponent(centres))
        return StepResult(sums=self._totals, sse=sse, changed=changed, searched=self.rows_searched)

    def _drops(self, centres: np.ndarray) -> tuple:
        """Whether the labels and bounds of the last step can serve for ``centres``, how much each
        label's bounds drop since (:func:`.bounds.bound_drops`), and the centres' half gaps
        (:func:`.bounds.half_gaps`)."""
        old = self._bounds_for
        k = len(centres)
        if old is None or old.shape != centres.shape:
            return False, np.zeros(k), np.zeros(k)
        # the gaps cost K^2 M, worth it while that is well below the step's own n K M
        halves = half_gaps(centres) if 4 * k <= len(self._x) else np.zeros(k)
        return True, bound_drops(centre_moves(old, centres)), halves

    def farthest(self, centres: np.ndarray, count: int) -> tuple:
        """The last step's labels and distances answer for its own centres (see :meth:`Backend.farthest`)."""
        last = self._step_centres
        if last is None or last.shape != centres.shape or not np.array_equal(last, centres):
            return super().farthest(centres, count)
        rows = farthest_rows(self._dist2, count)
        return self._dist2[rows], rows, self._labels[rows]

    def assign(self, centres: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Nearest centre and exact squared distance of every row (see :meth:`Backend.assign`).

        Rows that the last step's bounds keep with their centre are not searched;
        the step's labels and bounds are left as they are.
        """
        centres = np.ascontiguousarray(centres, dtype=np.float64)
        n = self._x.shape[0]
        labels = np.empty(n, dtype=np.int32)
        dist2 = np.empty(n, dtype=np.float64)
        if n:
            plan, tile = search_plan(centres)
            use_bounds, drops, halves = self._drops(centres)
            with _parallel_pass():
                self.rows_searched = int(assign_pass(self._x, centres, plan, tile, self._labels, self._lower,
                                                     use_bounds, drops, halves, labels, dist2))
        return labels, dist2

    def dist2_to(self, centre: np.ndarray) -> np.ndarray:
        """Squared distance to one point: the tile kernel (see :meth:`Backend.dist2_to`)."""
        n = self._x.shape[0]
        out = np.empty(n, dtype=np.float64)
        if self._seeding is not None:
            self._seeding.near_share = None  # a new D²: its first pass is not screened
        if n:
            c = np.ascontiguousarray(centre, dtype=np.float64).reshape(1, -1)
            _tile_dist2(self._x, c, _tile_rows(c.shape[1]), out)
        return out

    def lower_d2(self, d2: np.ndarray, centre: np.ndarray) -> np.ndarray:
        """``min(D², squared distance to centre)`` (see :meth:`Backend.lower_d2`).

        A centre just chosen among the last :meth:`potentials` candidates costs no
        pass over the rows: their distances were kept.
        """
        centre = np.ascontiguousarray(centre, dtype=np.float64).ravel()
        kept = self._cand_dists
        if kept is not None:
            cands, dists = kept
            for j in range(len(cands)):
                if cands[j].tobytes() == centre.tobytes():
                    return np.minimum(d2, dists[j])
        return np.minimum(d2, self.dist2_to(centre))

    def d2_fixed(self, d2: np.ndarray, weights: np.ndarray | None, s: int):
        """Block totals on the threads; a draw refines one block (:class:`mpikmeans.exact.BlockFixed`)."""
        n = len(d2)
        if not n:
            return super().d2_fixed(d2, weights, s)
        nb = min(n, 256)
        hi = np.empty(nb, dtype=np.int64)
        lo = np.empty(nb, dtype=np.int64)
        fixed_blocks(d2, weights if weights is not None else d2[:0], weights is not None, *scale_factors(s), hi, lo)

        def block_values(a: int, z: int) -> np.ndarray:
            return d2[a:z] if weights is None else d2[a:z] * weights[a:z]

        return BlockFixed(block_values, s, n, nb, hi, lo)

    def potentials(self, d2: np.ndarray, cands: np.ndarray, weights: np.ndarray | None, s: int) -> list:
        """Every candidate's exact potential in one threaded pass over the rows (see :meth:`Backend.potentials`).

        Once few rows are near enough a candidate to be captured, the pass screens
        in float32 and computes exactly only those (:mod:`.seeding`): the same bits.
        """
        n = len(self._x)
        if not n:
            return super().potentials(d2, cands, weights, s)
        f1, f2 = scale_factors(s)
        w = weights if weights is not None else d2[:0]
        cands = np.ascontiguousarray(cands, dtype=np.float64)
        t, m = cands.shape
        nb = min(n, 256)
        hi = np.empty((nb, t), dtype=np.int64)
        lo = np.empty((nb, t), dtype=np.int64)
        vmax = np.empty((nb, t))
        near = np.empty(nb, dtype=np.int64)
        kept = self._cand_dists
        # the last pass's distances were read by lower_d2 (into a new array): their memory serves again
        dists = kept[1] if kept is not None and kept[1].shape == (t, n) else np.empty((t, n))
        if self._seeding is None:
            avail = available_memory()
            self._seeding = SeedingRows(None if avail is None else avail // (2 * self.node_ranks))
        seeding = self._seeding
        screen = seeding.screen_next(m) if self.seed_screen is None else self.seed_screen
        if screen:
            shift, ys, yy, resident = seeding.rows(self._x, cands)
            zm, cc, zlim, tolf = candidate_data(cands, shift)
        else:
            shift, ys, yy, resident = cands[0], np.zeros((1, m), np.float32), np.zeros(1, np.float32), False
            zm, cc, zlim, tolf = np.zeros((m, t), np.float32), np.zeros(t, np.float32), np.float32(0), np.float32(0)
        with _parallel_pass():
            potentials_pass(self._x, screen, ys, yy, resident, shift, cands, zm, cc, zlim, tolf, d2, w,
                            weights is not None, f1, f2, screen_rows(t, m), _tile_rows(m), dists, hi, lo, vmax, near)
        seeding.record(int(near.sum()), t * n)
        self._cand_dists = (cands, dists)
        his, los = hi.sum(axis=0), lo.sum(axis=0)
        return [(limbs_to_int(his[j], los[j]), float(vmax[:, j].max())) for j in range(t)]

    def warmup(self, k: int, m: int) -> None:
        """Compile (or load) the step's, the sums' and the assignment's kernels.

        Both search plans (and steps with or without bounds) run the same
        compiled kernels, and Numba's kernels take any shape: one call compiles
        everything a step runs.
        """
        x = np.zeros((1, m))
        cen = np.zeros((k, m))
        plan, tile = search_plan(cen)
        drops = np.zeros(k)
        labels = np.full(1, -1, dtype=np.int32)
        with _parallel_pass():
            step_pass(x, cen, plan, tile, labels, np.zeros(1), False, drops, drops, np.zeros(1, dtype=np.int32),
                      np.zeros(1), *np.zeros((3, 1), dtype=np.int64))
            assign_pass(x, cen, plan, tile, labels, np.zeros(1), False, drops, drops, np.empty(1, dtype=np.int32),
                        np.empty(1))
        scales = Scales.of(np.ones(m))
        for weights in (None, np.ones(1)):
            sum_rows(x, weights, labels + 1, labels, scales, np.zeros((k, m + 1, 4), dtype=np.int64), 1)
            sum_rows(x, weights, labels + 1, None, scales, np.zeros((k, m + 1, 4), dtype=np.int64), 1)
            cluster_sums(labels + 1, np.zeros(1), weights, k, 0)
        column_magnitudes(x)
        centre_moves(cen, cen)  # the bounds' kernel of a run's K x M (one thread or several)

    def info(self) -> BackendInfo:
        return BackendInfo(name="cpu", devices=[], threads=self.threads, dtype="float64")

    def forget_labels(self) -> None:
        if self._labels is not None:
            self._labels[:] = -1
        self._bounds_for = None
        self._step_centres = None
        self._totals = None

    def close(self) -> None:
        self._x = None
        self._seeding = None
        self._totals = None
        self._spare = None
        self._dist2 = None
        self._labels = None
        self._lower = None
        self._bounds_for = None
        self._cand_dists = None
