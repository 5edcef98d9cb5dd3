"""The quality scores' per-row passes on the device: the CPU's arithmetic, to the bit.

:func:`mpikmeans.scores.quality_scores` needs two passes over the rows besides
the sums a step already makes (the step's ``accumulate`` kernel gives those):

* ``own_dist2``: each row's squared distance to a reference point of its cluster;
* ``silhouette``: each row's squared distance to its own cluster's mean, its
  square root and its squared-Euclidean silhouette (Spark's definition,
  :mod:`mpikmeans.scores`), which ``accumulate`` then sums per cluster on the
  device in one pass, the first two as columns of rows and the third as a
  squared distance (only ``3 K`` totals cross to the host);

and the sampled silhouette: ``sample_pairs`` measures every pair of the
sample's rows (a batch of rows at a time, against all of them),
``sample_sums`` adds each row's distances to each label's rows, in row order,
and ``sample_rows`` turns each row's sums into its silhouette, so only one
value a row crosses to the host.

Every squared distance adds ``(x_j - c_j)^2`` in attribute order with one
rounding per product and per sum (no FMA), and every other operation is the host
kernel's, in its order, so the per-row values are the host's bits and the scores
do not depend on the backend.  The silhouette pass is a tiled product
(``tile_d2``): a block takes :data:`BM` rows against :data:`BN` means, both
staged in shared memory :data:`BK` attributes at a time, each thread :data:`TR`
x :data:`TC` distances, so a row's values are read from the device's memory
once per :data:`BN` means rather than once per few, and the float64 units, not
the loads, set its pace.  A thread's distances are summed in attribute order
whatever the tile, so the tiles change no bit.  The sample's pairs run a thread
per ``PR`` pairs with no barrier: the CUDA simulator, which the CI runs the
kernels on, takes milliseconds for each barrier, and a sample's pairs would
need thousands.
"""

from __future__ import annotations

import functools
import math

import numpy as np

from ...fixedsums import Scales, scale_factors
from .device import SIM, cuda
from .intrinsics import dadd_rn, dmul_rn
from .launch import allow_shared, launch
from .policy import step_layout
from .stepk import NT as STEP_NT

if cuda is not None:
    from numba import float64, int64

#: threads per block of the row passes that take one row a thread
NT = 32 if SIM else 128
#: the silhouette pass's tiles of rows against means: threads of a block along the means and along the rows,
#: rows and means a thread, the block's tile, and the attributes of a staged slice (under the simulator two
#: threads and large tiles: each barrier there waits for Python's thread switches)
TX = 2 if SIM else 16
TY = 1 if SIM else 16
TR = 16 if SIM else 4
TC = 4
BM = TR * TY
BN = TC * TX
BK = 16 if SIM else 8
#: threads per block of the tiled kernels
TNT = TX * TY
#: ``sample_pairs``: threads a block and sample rows a thread (the distances of one sample row to ``PT * PR`` others)
PT = 2 if SIM else 128
PR = 128 if SIM else 4
#: bytes of one batch of the sample's pairwise distances on the device
PAIR_BYTES = (256 << 10) if SIM else (64 << 20)


@functools.lru_cache(maxsize=None)
def score_kernels() -> dict:
    """The two passes and the sampled silhouette's three kernels, for rows stored as float64 (the scores read
    the rows the run clustered).

    Kernel arguments (arrays 1-D on the device; ``x[j * ld + i]``; grid: one thread a row, :data:`NT` a
    block, but where said)
    -----------------------------------------------------------------------------------------------------
    own_dist2(x, ld, n, m, labels, reft, k, d2)
        ``reft`` float64 ``(m * k,)`` the reference points transposed (``reft[j * k + a]``);
        ``d2[i]`` the squared distance of row ``i`` to its cluster's point, 0 for label -1.
    silhouette(x, ld, n, m, p, pp, labels, mt, slot, spread, mass, w, weighted, own, dist, sil)
        Grid ``ceil(n / BM)``, :data:`TNT` threads a block.  ``mt`` float64 ``(m * pp,)`` the ``p >= 2``
        non-empty clusters' means transposed, padded to ``pp`` (a multiple of :data:`BN`) with zeros;
        ``slot`` int64 ``(k,)`` a cluster's column in ``mt`` (-1: empty); ``spread``, ``mass``
        float64 ``(p,)``; ``w`` the weights (any array where not ``weighted``).  Writes
        ``own[i]`` (squared distance to the own mean), ``dist[i]`` (its square root) and
        ``sil[i]`` (0 for a row alone in its cluster or with no cluster).
    sample_pairs(xt, s, m, t0, dist)
        ``xt`` float64 ``(m * s,)`` the sample transposed; grid ``(ceil(s / (PT PR)), tb)`` for ``tb``
        rows from ``t0``, block ``PT``; ``dist[t * s + r]``: the Euclidean distance of sample rows
        ``t0 + t`` and ``r``.
    sample_sums(dist, s, perm, starts, t0, tb, nlab, out)
        ``perm`` int64 ``(s,)`` the sample's rows by label, each label's in ascending order, label
        ``l``'s at ``starts[l] .. starts[l + 1]``; grid ``(ceil(tb / NT), nlab)``;
        ``out[t * nlab + l]`` for ``t < tb``: row ``t0 + t``'s distances to label ``l``'s rows
        summed, itself left out.
    sample_rows(sums, t0, tb, nlab, lab, starts, lo, out)
        ``sums`` ``sample_sums``' ``out``; ``lab`` int64 ``(s,)`` the sample's labels; grid
        ``ceil(tb / NT)``; ``out[t0 - lo + t]``: row ``t0 + t``'s silhouette
        (:func:`mpikmeans.scores.row_silhouettes`).
    """

    def km_own_dist2(x, ld, n, m, labels, reft, k, d2):
        i = cuda.grid(1)
        if i < n:
            a = labels[i]
            d = 0.0
            if a >= 0:
                for j in range(m):
                    t = float64(x[j * ld + i]) - reft[j * k + a]
                    d = dadd_rn(d, dmul_rn(t, t))
            d2[i] = d

    @cuda.jit(device=True)
    def fold(d, q, c, mine, bi, spread):
        # mean q's distance d into a row of cluster c: its own mean's distance, or the nearest other's
        if q == c:
            return d, bi
        v = d + spread[q]
        return mine, (v if v < bi else bi)

    @cuda.jit(device=True)
    def finish(i, mine, bi, c, mass, w, weighted, spread, own, dist, sil):
        own[i] = mine
        dist[i] = math.sqrt(mine)
        wi = w[i] if weighted else 1.0
        if mass[c] == wi:
            return  # alone in its cluster (by weight): 0, as Spark
        ai = (mine + spread[c]) * mass[c] / (mass[c] - wi)
        if ai < bi:
            sil[i] = 1.0 - ai / bi
        elif ai > bi:
            sil[i] = bi / ai - 1.0

    XQ, CQ = BK * BM // TNT, BK * BN // TNT  # a slice's values each thread stages: rows, then columns
    # shared arrays' sizes: constants of the closure (an expression inside the kernel is not one)
    XS_N, CS_N, MERGE_N, ACC_N = BK * BM, BK * BN, TX * BM, TR * TC

    @cuda.jit(device=True)
    def stage(a, lda, a0, alast, b, ldb, b0, m, j0, px, pc):
        # this thread's values of the slice from attribute j0: element e = tid + q TNT of a slice is row e % BM
        # (or column e % BN) and attribute j0 + e // BM (or // BN); zeros past m
        tid = cuda.threadIdx.x
        for q in range(XQ):
            e = tid + q * TNT
            j = j0 + e // BM
            ia = a0 + e % BM
            ia = ia if ia <= alast else alast
            px[q] = float64(a[j * lda + ia]) if j < m else 0.0
        for q in range(CQ):
            e = tid + q * TNT
            j = j0 + e // BN
            ib = b0 + e % BN
            pc[q] = float64(b[j * ldb + ib]) if j < m else 0.0

    @cuda.jit(device=True)
    def tile_d2(a, lda, a0, alast, b, ldb, b0, m, xs, cs, acc, px, pc):
        # acc[r * TC + c]: the squared distance of row a0 + ty + r TY of a (clamped to alast) and row
        # b0 + tx + c TX of b (its rows padded to a multiple of BN), both stored x[j * ld + i], staged BK
        # attributes at a time in shared memory (the next slice in flight while this one is summed); every
        # thread of the block calls it
        tid = cuda.threadIdx.x
        tx = tid % TX
        ty = tid // TX
        for e in range(ACC_N):
            acc[e] = 0.0
        stage(a, lda, a0, alast, b, ldb, b0, m, 0, px, pc)
        nst = (m + BK - 1) // BK
        for st in range(nst):
            cuda.syncthreads()  # every thread is done with the last slice
            for q in range(XQ):
                xs[tid + q * TNT] = px[q]
            for q in range(CQ):
                cs[tid + q * TNT] = pc[q]
            cuda.syncthreads()
            if st + 1 < nst:
                stage(a, lda, a0, alast, b, ldb, b0, m, (st + 1) * BK, px, pc)
            for kk in range(BK):  # past m both values are 0: the sums gain exact zeros
                for r in range(TR):
                    av = xs[kk * BM + ty + r * TY]
                    for c in range(TC):
                        t = av - cs[kk * BN + tx + c * TX]
                        acc[r * TC + c] = dadd_rn(acc[r * TC + c], dmul_rn(t, t))

    def km_silhouette(x, ld, n, m, p, pp, labels, mt, slot, spread, mass, w, weighted, own, dist, sil):
        # block: BM rows against every mean, a tile of BN at a time (tile_d2); each thread folds its TR rows'
        # distances to its TC means of the tile into the row's own distance and nearest other mean, and a
        # thread per row merges the TX threads' (a minimum, and a sum with one non-zero term: exact)
        xs = cuda.shared.array(XS_N, dtype=float64)
        cs = cuda.shared.array(CS_N, dtype=float64)
        smine = cuda.shared.array(MERGE_N, dtype=float64)
        sbi = cuda.shared.array(MERGE_N, dtype=float64)
        acc = cuda.local.array(ACC_N, dtype=float64)
        px = cuda.local.array(XQ, dtype=float64)
        pc = cuda.local.array(CQ, dtype=float64)
        mine = cuda.local.array(TR, dtype=float64)
        bi = cuda.local.array(TR, dtype=float64)
        own_slot = cuda.local.array(TR, dtype=int64)
        tid = cuda.threadIdx.x
        tx = tid % TX
        ty = tid // TX
        row0 = cuda.blockIdx.x * BM
        for r in range(TR):
            i = row0 + ty + r * TY
            own_slot[r] = slot[labels[i]] if i < n and labels[i] >= 0 else -1
            mine[r] = 0.0
            bi[r] = math.inf
        for b0 in range(0, pp, BN):
            tile_d2(x, ld, row0, n - 1, mt, pp, b0, m, xs, cs, acc, px, pc)
            for c in range(TC):
                q = b0 + tx + c * TX
                if q < p:  # past p: a padding mean
                    for r in range(TR):
                        mine[r], bi[r] = fold(acc[r * TC + c], q, own_slot[r], mine[r], bi[r], spread)
        for r in range(TR):
            smine[tx * BM + ty + r * TY] = mine[r]
            sbi[tx * BM + ty + r * TY] = bi[r]
        cuda.syncthreads()
        for rl in range(tid, BM, TNT):
            i = row0 + rl
            if i < n:
                own[i] = 0.0
                dist[i] = 0.0
                sil[i] = 0.0
                c = slot[labels[i]] if labels[i] >= 0 else -1
                if c >= 0:
                    tot = 0.0
                    best = math.inf
                    for t in range(TX):
                        tot += smine[t * BM + rl]
                        v = sbi[t * BM + rl]
                        best = v if v < best else best
                    finish(i, tot, best, c, mass, w, weighted, spread, own, dist, sil)

    def km_sample_pairs(xt, s, m, t0, dist):
        # block (x, t): sample row t0 + t against rows r = x PT PR + tid + u PT, u < PR (each load of theirs
        # coalesced, t's value the same for the whole block); dist[t * s + r]: the Euclidean distance,
        # its squares summed in attribute order
        t = t0 + cuda.blockIdx.y
        r0 = cuda.blockIdx.x * PT * PR + cuda.threadIdx.x
        dd = cuda.local.array(PR, dtype=float64)
        for u in range(PR):
            dd[u] = 0.0
        for j in range(m):
            v = xt[j * s + t]
            for u in range(PR):
                r = r0 + u * PT
                if r < s:
                    g = xt[j * s + r] - v
                    dd[u] = dadd_rn(dd[u], dmul_rn(g, g))
        for u in range(PR):
            r = r0 + u * PT
            if r < s:
                dist[(t - t0) * s + r] = math.sqrt(dd[u])

    def km_sample_sums(dist, s, perm, starts, t0, tb, nlab, out):
        # thread (t, lab): sample row t0 + t's distances to label lab's rows added in row order (perm lists
        # them in ascending order), itself left out: the host's sum, bit for bit
        t = cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x
        lab = cuda.blockIdx.y
        if t >= tb:
            return
        acc = 0.0
        for q in range(starts[lab], starts[lab + 1]):
            r = perm[q]
            if r != t0 + t:
                acc += dist[t * s + r]
        out[t * nlab + lab] = acc

    def km_sample_rows(sums, t0, tb, nlab, lab, starts, lo, out):
        # thread t: sample row t0 + t's silhouette from its sums, scores.row_silhouettes' operations in its
        # order (a label's size from starts); 0 for a row alone in its label (0/0) or where a = b = 0
        t = cuda.grid(1)
        if t >= tb:
            return
        own = lab[t0 + t]
        a = sums[t * nlab + own] / (float64(starts[own + 1] - starts[own]) - 1.0)
        b = math.inf
        for q in range(nlab):
            if q != own:
                v = sums[t * nlab + q] / float64(starts[q + 1] - starts[q])
                if v < b:
                    b = v
        value = 0.0
        if a == a:
            top = a if a > b else b
            if top > 0.0:
                value = (b - a) / top
        out[t0 - lo + t] = value

    # the tiles: two blocks a multiprocessor at least (registers capped at 128 a thread)
    tiled = {} if SIM else {"launch_bounds": (TNT, 2)}
    return {"own_dist2": cuda.jit(km_own_dist2), "silhouette": cuda.jit(km_silhouette, **tiled),
            "sample_pairs": cuda.jit(km_sample_pairs), "sample_sums": cuda.jit(km_sample_sums),
            "sample_rows": cuda.jit(km_sample_rows)}


def score_example_args() -> dict:
    """Arguments of the scores' kernels' types, for compiling them before any data is there."""
    d = lambda dt: cuda.device_array(1, dtype=dt)  # noqa: E731
    x, i32, i64 = d(np.float64), d(np.int32), d(np.int64)
    return {"own_dist2": (x, 1, 1, 1, i32, x, 1, x),
            "silhouette": (x, 1, 1, 1, 1, 1, i32, x, i64, x, x, x, False, x, x, x),
            "sample_pairs": (x, 1, 1, 1, x),
            "sample_sums": (x, 1, i64, i64, 1, 1, 1, x),
            "sample_rows": (x, 1, 1, 1, i64, i64, 1, x)}


class DeviceScoreRows:
    """The scores' passes over one rank's resident float64 rows, for one set of labels
    (:meth:`mpikmeans.backends.base.Backend.score_rows`).

    Parameters
    ----------
    x : device array, shape (m * ld,), float64
        The rows, column-major.
    ld, n, m : int
    weights : device array, shape (n,), float64, or None
    labels : ndarray, shape (n,), int32
        Every row's cluster, ``0 .. k-1``.
    k : int
    kernels : dict
        ``own_dist2``, ``silhouette``, ``sample_pairs``, ``sample_sums``, ``sample_rows`` and ``accumulate``
        (the step's): (dispatcher, compiled kernel).
    """

    def __init__(self, x, ld: int, n: int, m: int, weights, labels: np.ndarray, k: int, kernels: dict):
        self.x, self.ld, self.n, self.m, self.k = x, ld, n, m, k
        self.w = weights
        self.labels = cuda.to_device(np.ascontiguousarray(labels, dtype=np.int32))
        self.kernels = kernels

    def _grid(self) -> int:
        return max(1, -(-self.n // NT))

    def _accumulate(self, x, m: int, values, factors, sf: tuple, sums, sse) -> None:
        """``accumulate`` over every row: per cluster, the limbs of ``w x_j`` (``m`` columns and the weights) at
        ``factors`` into ``sums`` and of ``w values`` at ``sf`` into ``sse``."""
        k = self.k
        lay = step_layout(k, m)
        weighted = self.w is not None
        disp, kern = self.kernels["accumulate"]
        allow_shared(kern, lay.sum_smem)
        counters = cuda.device_array(2, dtype=np.int64)
        launch(disp, kern, (x, self.ld, self.n, m, k, self.labels, self.labels, values,
                            self.w if weighted else values, weighted, True, factors[0], factors[1], sf[0], sf[1], lay.jc,
                            lay.copies, sums, sse, counters),
               lay.sum_grid(self.n, m), STEP_NT, 0, lay.sum_smem)

    def cluster_sums(self, ref: np.ndarray, scales: Scales, ref_exp: int) -> tuple:
        """Per cluster, the fixed-point sums of ``w x`` and ``w`` at ``scales``, and of ``w |x - ref_a|^2``
        at ``2**ref_exp``: ``(sums (k, m + 1, 4), ref_sse (k, 4))``, int64, the host pass's integers."""
        k, m = self.k, self.m
        d2 = cuda.device_array(max(1, self.n), dtype=np.float64)
        reft = cuda.to_device(np.ascontiguousarray(np.asarray(ref, dtype=np.float64).T).ravel())
        disp, kern = self.kernels["own_dist2"]
        launch(disp, kern, (self.x, self.ld, self.n, m, self.labels, reft, k, d2), self._grid(), NT)
        ns = k * (m + 1) * 4
        out = cuda.to_device(np.zeros(ns + 4 * k, dtype=np.int64))
        factors = cuda.to_device(np.ascontiguousarray(scales.factors.T))  # (2, m + 1): f1 then f2
        self._accumulate(self.x, m, d2, factors, scale_factors(ref_exp), out[:ns], out[ns:])
        host = out.copy_to_host()
        return host[:ns].reshape(k, m + 1, 4), host[ns:].reshape(k, 4)

    def silhouette_sums(self, mt: np.ndarray, slot: np.ndarray, spread: np.ndarray, mass: np.ndarray,
                        exponents: tuple) -> np.ndarray:
        """Per cluster, the limbs of the sums of ``w d``, ``w sqrt(d)`` and ``w s`` over its rows, ``d`` a
        row's squared distance to its cluster's mean and ``s`` its squared-Euclidean silhouette, at the three
        ``exponents``: the host pass's integers.

        Parameters
        ----------
        mt : ndarray, shape (m, p), float64
            The non-empty clusters' means, transposed.
        slot : ndarray, shape (k,), int64
        spread, mass : ndarray, shape (p,), float64
        exponents : tuple of three int

        Returns
        -------
        ndarray, shape (3, k, 4), int64
        """
        k, (m, p) = self.k, mt.shape
        pp = -(-p // BN) * BN
        padded = np.zeros((m, pp))
        padded[:, :p] = mt
        # d and sqrt(d) as two columns of rows (stride ld), s beside them: the step's accumulate kernel then
        # sums them per cluster as it sums a row's columns and its squared distance, in one pass
        cols = cuda.device_array(2 * self.ld, dtype=np.float64)
        sil = cuda.device_array(max(1, self.n), dtype=np.float64)
        dev = [cuda.to_device(np.ascontiguousarray(a, dtype=dt)) for a, dt in
               ((padded.ravel(), np.float64), (slot, np.int64), (spread, np.float64), (mass, np.float64))]
        disp, kern = self.kernels["silhouette"]
        launch(disp, kern, (self.x, self.ld, self.n, self.m, p, pp, self.labels, *dev,
                            self.w if self.w is not None else sil, self.w is not None, cols[:self.ld],
                            cols[self.ld:], sil),
               max(1, -(-self.n // BM)), TNT)
        f1, f2 = zip(*(scale_factors(e) for e in exponents))
        factors = cuda.to_device(np.array([[f1[0], f1[1], 1.0], [f2[0], f2[1], 1.0]]))  # the weights' column unused
        out = cuda.to_device(np.zeros(3 * 4 * k + 4 * k, dtype=np.int64))
        self._accumulate(cols, 2, sil, factors, (f1[2], f2[2]), out[:12 * k], out[12 * k:])
        host = out.copy_to_host()
        sums = host[:12 * k].reshape(k, 3, 4)
        return np.stack([sums[:, 0], sums[:, 1], host[12 * k:].reshape(k, 4)])

    def sample_silhouettes(self, xs: np.ndarray, lab: np.ndarray, nlab: int, lo: int, hi: int) -> np.ndarray:
        """:func:`mpikmeans.scores.row_silhouettes` of the sample's rows ``lo .. hi-1`` on the device: the
        host's sums and values, the same bits; only the values cross to the host.

        Parameters
        ----------
        xs : ndarray, shape (s, m), float64
        lab : ndarray, shape (s,), int
        nlab, lo, hi : int

        Returns
        -------
        ndarray, shape (hi - lo,), float64
        """
        s = len(lab)
        if hi <= lo:
            return np.empty(0)
        lab = np.asarray(lab, dtype=np.int64)
        order = np.argsort(lab, kind="stable").astype(np.int64)
        perm = cuda.to_device(order)
        starts = cuda.to_device(np.searchsorted(lab[order], np.arange(nlab + 1)).astype(np.int64))
        dlab = cuda.to_device(lab)
        xt = cuda.to_device(np.ascontiguousarray(np.asarray(xs, dtype=np.float64).T).ravel())
        # a batch of rows' distances to every row at a time, in PAIR_BYTES of device memory
        batch = max(1, min(hi - lo, PAIR_BYTES // (8 * s)))
        dist = cuda.device_array(batch * s, dtype=np.float64)
        sums = cuda.device_array(batch * nlab, dtype=np.float64)
        out = cuda.device_array(hi - lo, dtype=np.float64)
        (pairs, pairs_k), (add, add_k), (rows, rows_k) = (self.kernels[name] for name in
                                                         ("sample_pairs", "sample_sums", "sample_rows"))
        for t0 in range(lo, hi, batch):
            tb = min(batch, hi - t0)
            launch(pairs, pairs_k, (xt, s, xs.shape[1], t0, dist), (-(-s // (PT * PR)), tb), PT)
            launch(add, add_k, (dist, s, perm, starts, t0, tb, nlab, sums), (-(-tb // NT), nlab), NT)
            launch(rows, rows_k, (sums, t0, tb, nlab, dlab, starts, lo, out), -(-tb // NT), NT)
        return out.copy_to_host()
