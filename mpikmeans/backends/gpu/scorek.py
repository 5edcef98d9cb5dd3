"""The quality scores' per-row passes on the device: the CPU's arithmetic, to the bit.

:func:`mpikmeans.scores.quality_scores` needs two passes over the rows besides
the sums a step already makes (the step's ``accumulate`` kernel gives those):

* ``own_dist2``: each row's squared distance to a reference point of its cluster;
* ``silhouette``: each row's squared distance to its own cluster's mean, its
  square root and its squared-Euclidean silhouette (Spark's definition,
  :mod:`mpikmeans.scores`), which ``accumulate`` then sums per cluster on the
  device (only ``3 K`` totals cross to the host);

and the sampled silhouette's sums (``sample_sums``: each sample row's summed
Euclidean distances to each label's sample rows, in row order).

Every squared distance adds ``(x_j - c_j)^2`` in attribute order with one
rounding per product and per sum (no FMA), and every other operation is the host
kernel's, in its order, so the per-row values are the host's bits and the scores
do not depend on the backend.  The silhouette pass takes :data:`QR` rows a
thread against :data:`QT` means at a time, so each value of a row is read once
for all of those means and each mean's once for those rows.  ``sample_sums``
measures a tile of sample rows against a chunk of one label's rows at a time,
both staged in shared memory, many threads a tile whatever the number of
labels; each sample row then adds its chunk's distances in row order.
"""

from __future__ import annotations

import functools
import math

import numpy as np

from ...fixedsums import Scales, scale_factors
from .device import SIM, cuda
from .intrinsics import dadd_rn, dmul_rn
from .launch import allow_shared, launch
from .policy import SMEM_BYTES
from .stepk import NT as STEP_NT
from .stepk import SUM_ROWS, sum_layout, sum_shared_bytes

if cuda is not None:
    from numba import float64, int64

#: threads per block of the two row passes
NT = 32 if SIM else 128
#: the silhouette pass's register tile: ``QR`` rows a thread against ``QT`` means at a time
QR = 2
QT = 8
QRT = QR * QT
#: ``sample_sums``' tiles: ``ST`` sample rows a block (one a thread of a warp), ``SY`` threads each, every one
#: measuring ``SQ`` of a chunk's ``SR`` label rows; ``SJ`` attributes staged in shared memory at a time
ST = 8 if SIM else 32
SY = 2 if SIM else 8
SQ = 4
SR = SY * SQ
SJ = 8 if SIM else 32
#: the row stride of the chunk's distances in shared memory (one more than a chunk: no bank conflicts)
SRP = SR + 1


@functools.lru_cache(maxsize=None)
def score_kernels() -> dict:
    """The two passes and the sample's sums, for rows stored as float64 (the scores read the rows the run
    clustered).

    Kernel arguments (arrays 1-D on the device; ``x[j * ld + i]``; grid: one thread a row)
    -------------------------------------------------------------------------------------
    own_dist2(x, ld, n, m, labels, reft, k, d2)
        ``reft`` float64 ``(m * k,)`` the reference points transposed (``reft[j * k + a]``);
        ``d2[i]`` the squared distance of row ``i`` to its cluster's point, 0 for label -1.
    silhouette(x, ld, n, m, p, pp, labels, mt, slot, spread, mass, w, weighted, own, dist, sil)
        Grid ``ceil(n / (QR NT))``.  ``mt`` float64 ``(m * pp,)`` the ``p >= 2`` non-empty
        clusters' means transposed, padded to ``pp`` (a multiple of :data:`QT`) with any values;
        ``slot`` int64 ``(k,)`` a cluster's column in ``mt`` (-1: empty); ``spread``, ``mass``
        float64 ``(p,)``; ``w`` the weights (any array where not ``weighted``).  Writes
        ``own[i]`` (squared distance to the own mean), ``dist[i]`` (its square root) and
        ``sil[i]`` (0 for a row alone in its cluster or with no cluster).
    sample_sums(xt, s, m, perm, starts, lo, hi, nlab, out)
        ``xt`` float64 ``(m * s,)`` the sample transposed; ``perm`` int64 ``(s,)`` the sample's rows
        by label, each label's in ascending order, label ``l``'s at ``starts[l] .. starts[l + 1]``;
        grid ``(ceil((hi - lo) / ST), nlab)``, block ``(ST, SY)``; ``out[(t - lo) * nlab + l]`` for
        ``lo <= t < hi``.
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

    def km_silhouette(x, ld, n, m, p, pp, labels, mt, slot, spread, mass, w, weighted, own, dist, sil):
        # QR rows a thread (rows i, i + NT, ...: each load coalesced) against QT means at a time: each
        # mean's value read once for QR rows, each row's value once for QT means (loops of a constant
        # length: unrolled, the distances in registers); every distance summed in attribute order, and
        # the nearest other mean is a minimum, whatever order the means come in
        i0 = cuda.blockIdx.x * QR * NT + cuda.threadIdx.x
        cs = cuda.local.array(QR, dtype=int64)
        rows = cuda.local.array(QR, dtype=int64)
        mine = cuda.local.array(QR, dtype=float64)
        bi = cuda.local.array(QR, dtype=float64)
        xv = cuda.local.array(QR, dtype=float64)
        dd = cuda.local.array(QRT, dtype=float64)
        scored = False
        for r in range(QR):
            i = i0 + r * NT
            cs[r] = -1
            rows[r] = i if i < n else n - 1  # past the end: the last row again, ignored
            mine[r] = 0.0
            bi[r] = math.inf
            if i < n:
                own[i] = 0.0
                dist[i] = 0.0
                sil[i] = 0.0
                if labels[i] >= 0:
                    cs[r] = slot[labels[i]]
                    scored = scored or cs[r] >= 0
        if not scored:
            return
        for q0 in range(0, p, QT):
            for e in range(QRT):
                dd[e] = 0.0
            for j in range(m):
                for r in range(QR):
                    xv[r] = float64(x[j * ld + rows[r]])
                base = j * pp + q0
                for q in range(QT):
                    cj = mt[base + q]  # past p: a padding mean, never used
                    for r in range(QR):
                        t = xv[r] - cj
                        dd[r * QT + q] = dadd_rn(dd[r * QT + q], dmul_rn(t, t))
            for q in range(QT):
                if q0 + q < p:
                    for r in range(QR):
                        mine[r], bi[r] = fold(dd[r * QT + q], q0 + q, cs[r], mine[r], bi[r], spread)
        for r in range(QR):
            if cs[r] >= 0:
                finish(i0 + r * NT, mine[r], bi[r], cs[r], mass, w, weighted, spread, own, dist, sil)

    def km_sample_sums(xt, s, m, perm, starts, lo, hi, nlab, out):
        # block (x, lab): sample rows t = lo + x ST + tx against label lab's rows (perm lists them in
        # ascending order), a chunk of SR at a time: thread (tx, ty) measures its row against the
        # chunk's rows ty, ty + SY, ... (each distance in attribute order), then the ty == 0 threads
        # add their row's SR distances in row order, itself left out: the host's sum, bit for bit
        tx = cuda.threadIdx.x
        ty = cuda.threadIdx.y
        tid = ty * ST + tx
        lab = cuda.blockIdx.y
        t = lo + cuda.blockIdx.x * ST + tx
        tt = cuda.shared.array((SJ, ST), dtype=float64)
        rt = cuda.shared.array((SJ, SR), dtype=float64)
        dist = cuda.shared.array((ST, SRP), dtype=float64)
        rows = cuda.shared.array(SR, dtype=int64)
        dd = cuda.local.array(SQ, dtype=float64)
        acc = 0.0
        q0 = starts[lab]
        end = starts[lab + 1]
        while q0 < end:
            if tid < SR:
                rows[tid] = perm[q0 + tid] if q0 + tid < end else -1
            for u in range(SQ):
                dd[u] = 0.0
            for j0 in range(0, m, SJ):
                cuda.syncthreads()  # the chunk's rows listed; the tiles' last values used
                nj = min(SJ, m - j0)
                for jj in range(ty, nj, SY):
                    tt[jj, tx] = xt[(j0 + jj) * s + t] if t < hi else 0.0
                for e in range(tid, nj * SR, ST * SY):
                    jj = e // SR
                    u = e - jj * SR
                    r = rows[u]
                    rt[jj, u] = xt[(j0 + jj) * s + r] if r >= 0 else 0.0
                cuda.syncthreads()
                for jj in range(nj):
                    v = tt[jj, tx]
                    for u in range(SQ):
                        g = rt[jj, ty + SY * u] - v
                        dd[u] = dadd_rn(dd[u], dmul_rn(g, g))
            for u in range(SQ):
                dist[tx, ty + SY * u] = math.sqrt(dd[u])
            cuda.syncthreads()
            if ty == 0 and t < hi:
                for u in range(SR):
                    r = rows[u]
                    if r >= 0 and r != t:
                        acc += dist[tx, u]
            cuda.syncthreads()  # the distances and the rows read before the next chunk's
            q0 += SR
        if ty == 0 and t < hi:
            out[(t - lo) * nlab + lab] = acc

    return {"own_dist2": cuda.jit(km_own_dist2), "silhouette": cuda.jit(km_silhouette),
            "sample_sums": cuda.jit(km_sample_sums)}


def score_example_args() -> dict:
    """Arguments of the two kernels' types, for compiling them before any data is there."""
    d = lambda dt: cuda.device_array(1, dtype=dt)  # noqa: E731
    x, i32, i64 = d(np.float64), d(np.int32), d(np.int64)
    return {"own_dist2": (x, 1, 1, 1, i32, x, 1, x),
            "silhouette": (x, 1, 1, 1, 1, 1, i32, x, i64, x, x, x, False, x, x, x),
            "sample_sums": (x, 1, 1, i64, i64, 1, 1, 1, x)}


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
        ``own_dist2``, ``silhouette``, ``sample_sums`` and ``accumulate`` (the step's): (dispatcher, compiled
        kernel).
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
        jc, copies = sum_layout(k, m, SMEM_BYTES)
        smem = sum_shared_bytes(k, jc, copies)
        weighted = self.w is not None
        disp, kern = self.kernels["accumulate"]
        allow_shared(kern, smem)
        counters = cuda.device_array(2, dtype=np.int64)
        launch(disp, kern, (x, self.ld, self.n, m, k, self.labels, self.labels, values,
                            self.w if weighted else values, weighted, True, factors[0], factors[1], sf[0], sf[1], jc,
                            copies, sums, sse, counters),
               (max(1, -(-self.n // SUM_ROWS)), -(-(m + 1) // jc)), STEP_NT, 0, smem)

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
        pp = -(-p // QT) * QT
        padded = np.zeros((m, pp))
        padded[:, :p] = mt
        per_row = [cuda.device_array(max(1, self.n), dtype=np.float64) for _ in range(3)]  # d, sqrt(d), s
        dev = [cuda.to_device(np.ascontiguousarray(a, dtype=dt)) for a, dt in
               ((padded.ravel(), np.float64), (slot, np.int64), (spread, np.float64), (mass, np.float64))]
        disp, kern = self.kernels["silhouette"]
        launch(disp, kern, (self.x, self.ld, self.n, self.m, p, pp, self.labels, *dev,
                            self.w if self.w is not None else per_row[0], self.w is not None, *per_row),
               max(1, -(-self.n // (QR * NT))), NT)
        # each per-row value summed per cluster by the step's kernel with no column of rows (the weights'
        # column it adds as well is not used)
        out = cuda.to_device(np.zeros(3 * 8 * k, dtype=np.int64))
        ones = cuda.to_device(np.ones((2, 1)))
        for q in range(3):
            at = 8 * k * q
            self._accumulate(self.x, 0, per_row[q], ones, scale_factors(exponents[q]), out[at:at + 4 * k],
                             out[at + 4 * k:at + 8 * k])
        return out.copy_to_host().reshape(3, 2, k, 4)[:, 1]

    def sample_sums(self, xs: np.ndarray, lab: np.ndarray, nlab: int, lo: int, hi: int) -> np.ndarray:
        """:func:`mpikmeans.scores.sample_label_sums` on the device: the same sums, the same bits.

        Parameters
        ----------
        xs : ndarray, shape (s, m), float64
        lab : ndarray, shape (s,), int
        nlab, lo, hi : int

        Returns
        -------
        ndarray, shape (hi - lo, nlab), float64
        """
        s = len(lab)
        out = np.empty((hi - lo, nlab))
        if hi <= lo:
            return out
        lab = np.asarray(lab, dtype=np.int64)
        perm = np.argsort(lab, kind="stable").astype(np.int64)
        starts = np.searchsorted(lab[perm], np.arange(nlab + 1)).astype(np.int64)
        xt = cuda.to_device(np.ascontiguousarray(np.asarray(xs, dtype=np.float64).T).ravel())
        dout = cuda.device_array(out.size, dtype=np.float64)
        disp, kern = self.kernels["sample_sums"]
        launch(disp, kern, (xt, s, xs.shape[1], cuda.to_device(perm), cuda.to_device(starts), lo, hi, nlab, dout),
               (max(1, -(-(hi - lo) // ST)), nlab), (ST, SY))
        return dout.copy_to_host().reshape(hi - lo, nlab)
