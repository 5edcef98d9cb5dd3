"""The quality scores' per-row passes on the device: the CPU's arithmetic, to the bit.

:func:`mpikmeans.scores.quality_scores` needs two passes over the rows besides
the sums a step already makes (the step's ``accumulate`` kernel gives those):

* ``own_dist2``: each row's squared distance to a reference point of its cluster;
* ``silhouette``: each row's squared distance to its own cluster's mean and its
  squared-Euclidean silhouette (Spark's definition, :mod:`mpikmeans.scores`);

and the sampled silhouette's sums (``sample_sums``: each sample row's summed
Euclidean distances to each label's sample rows, in row order).

Every squared distance adds ``(x_j - c_j)^2`` in attribute order with one
rounding per product and per sum (no FMA), and every other operation is the host
kernel's, in its order, so the per-row values are the host's bits and the scores
do not depend on the backend.  The silhouette pass takes :data:`QT` means at a
time, so each value of a row is read once for all of them.
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

#: threads per block of the three kernels
NT = 32 if SIM else 128
#: means the silhouette pass measures at once (each value of a row read once for all of them)
QT = 8
#: the sample's rows a thread of ``sample_sums`` measures at once (each value of its own row read once for all)
RT = 8


@functools.lru_cache(maxsize=None)
def score_kernels() -> dict:
    """The two passes and the sample's sums, for rows stored as float64 (the scores read the rows the run
    clustered).

    Kernel arguments (arrays 1-D on the device; ``x[j * ld + i]``; grid: one thread a row)
    -------------------------------------------------------------------------------------
    own_dist2(x, ld, n, m, labels, reft, k, d2)
        ``reft`` float64 ``(m * k,)`` the reference points transposed (``reft[j * k + a]``);
        ``d2[i]`` the squared distance of row ``i`` to its cluster's point, 0 for label -1.
    silhouette(x, ld, n, m, p, labels, mt, slot, spread, mass, w, weighted, own, sil)
        ``mt`` float64 ``(m * p,)`` the ``p >= 2`` non-empty clusters' means transposed;
        ``slot`` int64 ``(k,)`` a cluster's column in ``mt`` (-1: empty); ``spread``, ``mass``
        float64 ``(p,)``; ``w`` the weights (any array where not ``weighted``).  Writes
        ``own[i]`` (squared distance to the own mean) and ``sil[i]`` (0 for a row alone in its
        cluster or with no cluster).
    sample_sums(xt, s, m, perm, starts, lo, hi, nlab, out)
        ``xt`` float64 ``(m * s,)`` the sample transposed; ``perm`` int64 ``(s,)`` the sample's rows
        by label, each label's in ascending order, label ``l``'s at ``starts[l] .. starts[l + 1]``;
        grid ``(ceil((hi - lo) / NT), nlab)``; ``out[(t - lo) * nlab + l]`` for ``lo <= t < hi``.
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

    def km_silhouette(x, ld, n, m, p, labels, mt, slot, spread, mass, w, weighted, own, sil):
        i = cuda.grid(1)
        if i >= n:
            return
        own[i] = 0.0
        sil[i] = 0.0
        a = labels[i]
        if a < 0:
            return
        c = slot[a]
        if c < 0:
            return
        mine = 0.0
        bi = math.inf
        dd = cuda.local.array(QT, dtype=float64)
        for q0 in range(0, p, QT):
            # QT distances at once, each still summed in attribute order (loops of a constant length:
            # unrolled, the distances in registers; the means past p are never used)
            for r in range(QT):
                dd[r] = 0.0
            for j in range(m):
                xj = float64(x[j * ld + i])
                base = j * p + q0
                for r in range(QT):
                    if q0 + r < p:
                        t = xj - mt[base + r]
                        dd[r] = dadd_rn(dd[r], dmul_rn(t, t))
            for r in range(QT):
                q = q0 + r
                if q < p:
                    d = dd[r]
                    if q == c:
                        mine = d
                    else:
                        v = d + spread[q]
                        if v < bi:
                            bi = v
        own[i] = mine
        wi = w[i] if weighted else 1.0
        if mass[c] == wi:
            return  # alone in its cluster (by weight): 0, as Spark
        ai = (mine + spread[c]) * mass[c] / (mass[c] - wi)
        if ai < bi:
            sil[i] = 1.0 - ai / bi
        elif ai > bi:
            sil[i] = bi / ai - 1.0

    def km_sample_sums(xt, s, m, perm, starts, lo, hi, nlab, out):
        # thread (t, l): the sum of sample row t's Euclidean distances to the sample's rows of label l,
        # in row order (perm lists each label's rows in ascending order), itself left out; RT rows of
        # label l at a time, so each value of row t is read once for all of them
        t = lo + cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x
        lab = cuda.blockIdx.y
        if t >= hi:
            return
        rr = cuda.local.array(RT, dtype=int64)
        dd = cuda.local.array(RT, dtype=float64)
        acc = 0.0
        q = starts[lab]
        end = starts[lab + 1]
        while q < end:
            for u in range(RT):
                rr[u] = perm[q + u] if q + u < end else -1
                dd[u] = 0.0
            for j in range(m):
                xtj = xt[j * s + t]
                for u in range(RT):
                    if rr[u] >= 0:
                        e = xt[j * s + rr[u]] - xtj
                        dd[u] = dadd_rn(dd[u], dmul_rn(e, e))
            for u in range(RT):
                if rr[u] >= 0 and rr[u] != t:
                    acc += math.sqrt(dd[u])
            q += RT
        out[(t - lo) * nlab + lab] = acc

    return {"own_dist2": cuda.jit(km_own_dist2), "silhouette": cuda.jit(km_silhouette),
            "sample_sums": cuda.jit(km_sample_sums)}


def score_example_args() -> dict:
    """Arguments of the two kernels' types, for compiling them before any data is there."""
    d = lambda dt: cuda.device_array(1, dtype=dt)  # noqa: E731
    x, i32, i64 = d(np.float64), d(np.int32), d(np.int64)
    return {"own_dist2": (x, 1, 1, 1, i32, x, 1, x),
            "silhouette": (x, 1, 1, 1, 1, i32, x, i64, x, x, x, False, x, x),
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
    host : tuple of two ndarray, shape (n,), float64, optional
        Where :meth:`silhouette` copies its two per-row arrays (page-locked memory: a copy at full speed);
        what it returns are these arrays, valid until the next ``silhouette`` into them (the backend
        shares them between its score passes).  Default: new arrays.
    """

    def __init__(self, x, ld: int, n: int, m: int, weights, labels: np.ndarray, k: int, kernels: dict,
                 host: tuple | None = None):
        self.x, self.ld, self.n, self.m, self.k = x, ld, n, m, k
        self.w = weights
        self.labels = cuda.to_device(np.ascontiguousarray(labels, dtype=np.int32))
        self.kernels = kernels
        self.host = host

    def _grid(self) -> int:
        return max(1, -(-self.n // NT))

    def cluster_sums(self, ref: np.ndarray, scales: Scales, ref_exp: int) -> tuple:
        """Per cluster, the fixed-point sums of ``w x`` and ``w`` at ``scales``, and of ``w |x - ref_a|^2``
        at ``2**ref_exp``: ``(sums (k, m + 1, 4), ref_sse (k, 4))``, int64, the host pass's integers."""
        k, m = self.k, self.m
        d2 = cuda.device_array(max(1, self.n), dtype=np.float64)
        reft = cuda.to_device(np.ascontiguousarray(np.asarray(ref, dtype=np.float64).T).ravel())
        disp, kern = self.kernels["own_dist2"]
        launch(disp, kern, (self.x, self.ld, self.n, m, self.labels, reft, k, d2), self._grid(), NT)
        lay = step_layout(k, m)
        factors = cuda.to_device(np.ascontiguousarray(scales.factors.T))  # (2, m + 1): f1 then f2
        sf1, sf2 = scale_factors(ref_exp)
        ns = k * (m + 1) * 4
        out = cuda.to_device(np.zeros(ns + 4 * k + 2, dtype=np.int64))
        weighted = self.w is not None
        disp, kern = self.kernels["accumulate"]
        allow_shared(kern, lay.sum_smem)
        launch(disp, kern, (self.x, self.ld, self.n, m, k, self.labels, self.labels, d2, self.w if weighted else d2,
                            weighted, True, factors[0], factors[1], sf1, sf2, lay.jc, lay.copies, out[:ns],
                            out[ns:ns + 4 * k], out[ns + 4 * k:]),
               lay.sum_grid(self.n, m), STEP_NT, 0, lay.sum_smem)
        host = out.copy_to_host()
        return host[:ns].reshape(k, m + 1, 4), host[ns:ns + 4 * k].reshape(k, 4)

    def silhouette(self, mt: np.ndarray, slot: np.ndarray, spread: np.ndarray, mass: np.ndarray) -> tuple:
        """Each row's squared distance to its own cluster's mean and its squared-Euclidean silhouette:
        ``(own (n,), sil (n,))`` host float64 arrays, the host pass's bits.

        Parameters
        ----------
        mt : ndarray, shape (m, p), float64
            The non-empty clusters' means, transposed.
        slot : ndarray, shape (k,), int64
        spread, mass : ndarray, shape (p,), float64
        """
        p = mt.shape[1]
        own = cuda.device_array(max(1, self.n), dtype=np.float64)
        sil = cuda.device_array(max(1, self.n), dtype=np.float64)
        weighted = self.w is not None
        dev = [cuda.to_device(np.ascontiguousarray(a, dtype=dt)) for a, dt in
               ((np.ravel(mt), np.float64), (slot, np.int64), (spread, np.float64), (mass, np.float64))]
        disp, kern = self.kernels["silhouette"]
        launch(disp, kern, (self.x, self.ld, self.n, self.m, p, self.labels, *dev, self.w if weighted else own,
                            weighted, own, sil), self._grid(), NT)
        if self.host is None or self.n == 0:
            return own.copy_to_host()[: self.n], sil.copy_to_host()[: self.n]
        return own.copy_to_host(self.host[0]), sil.copy_to_host(self.host[1])

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
               (max(1, -(-(hi - lo) // NT)), nlab), NT)
        return dout.copy_to_host().reshape(hi - lo, nlab)
