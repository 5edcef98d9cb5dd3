"""Quality scores of a clustering over all ranks' rows, the same bits at any rank count (collective).

Four scores of given labels, in the units the rows are given in (a run's
scaled units, where its SSE is measured too):

* **Calinski–Harabasz** and **Davies–Bouldin**, scikit-learn's definitions
  (``calinski_harabasz_score``, ``davies_bouldin_score``) over every row;
* the **squared-Euclidean silhouette** over every row, Spark's
  ``ClusteringEvaluator`` definition: a point's mean squared distance to a
  cluster ``C`` is ``|x - mu_C|^2 + V_C`` (``mu_C`` its mean, ``V_C`` its mean
  squared deviation), so every point needs its distance to the K means only,
  ``O(N K M)`` in all instead of the ``O(N^2 M)`` of the pairwise definition;
  the own cluster's mean leaves the point itself out (a factor ``W / (W - w)``)
  and a point alone in its cluster scores 0, as in Spark;
* scikit-learn's **Euclidean silhouette** (``silhouette_score``) on a sample
  of rows: their global indices are ``numpy.random.default_rng(seed).choice(n,
  S, replace=False)``, sorted, whatever the number of ranks, so
  ``silhouette_score(X[idx], labels[idx])`` reproduces it.

**Exact under MPI.**  Every total that reaches a score is an exact integer
(:mod:`mpikmeans.fixedsums`): per cluster, the weighted sums of the rows and the
weights (the means), of each row's squared distance to a reference point (the
spread ``V``), of its squared and plain distance to its cluster's mean and of
its silhouette.  Every per-row value depends on the row and on these global
totals only, so the scores are the same bits at ``-np 1`` and ``-np 7``.  The
sample is gathered on every rank; each rank takes a share of the sample's rows
and gives each row's silhouette (its sums, and so its value, do not depend on
who computes them); the values are gathered in row order and averaged.

**Passes.**  One pass of ``O(N M)`` for the means and spreads, one of ``O(N K M)``
that gives each row's silhouette and, on the way, its distance to its
cluster's mean (Calinski–Harabasz's and Davies–Bouldin's dispersions); the
sample's ``O(S^2 M)``, shared by the ranks.

**Weights.**  Instance weights act as frequency weights where the definitions
allow: Calinski–Harabasz and Davies–Bouldin equal scikit-learn's on the data
with each row repeated ``w`` times (integer weights): counts become sums of
weights, means and dispersions are weighted.  The squared-Euclidean silhouette
is Spark's weighted one (the weighted mean of the points' silhouettes; a
point's own cluster leaves out its whole weight).  The sampled silhouette has
no weighted definition in scikit-learn: the sample is drawn uniformly over the
rows and the weights are not used.

**Undefined scores** are None, with the reason in ``undefined``: fewer than 2
non-empty clusters, or (scikit-learn's rule for CH, DB and the sample) as many
clusters as rows.
"""

from __future__ import annotations

import math
import time

import numpy as np

from .choices import DEFAULT_SCORE_SAMPLE as DEFAULT_SAMPLE, SCORE_CHOICES
from .fixedsums import Scales, cluster_sums, column_magnitudes, decode, exponent_for, sum_rows
from .jit import njit, prange

#: The scores' names in the returned dict, in the order a table shows them
SCORE_NAMES = ("calinski_harabasz", "davies_bouldin", "silhouette_sqeuclidean", "silhouette_sample")


# ======================================================================== kernels

#: Row blocks of a pass: each thread takes whole blocks, every row's value is the same whatever the block
_BLOCKS = 256


@njit(parallel=True, cache=True)
def _dist2_all(x, ct, out):  # pragma: no cover - compiled
    # ct (m, k): the centres transposed, so that the inner loop runs over the centres (vectorised)
    # while each distance still adds its m terms in attribute order, one rounding per operation
    n, m = x.shape
    k = ct.shape[1]
    nb = min(n, _BLOCKS)
    for b in prange(nb):
        for i in range(n * b // nb, n * (b + 1) // nb):
            row = out[i]
            for q in range(k):
                row[q] = 0.0
            for j in range(m):
                xj = x[i, j]
                cj = ct[j]
                for q in range(k):
                    t = xj - cj[q]
                    row[q] += t * t


def all_dist2(x: np.ndarray, centres: np.ndarray) -> np.ndarray:
    """Squared Euclidean distance of every row to every centre, each summed in attribute order.

    The backends' arithmetic (``(x_j - c_j)^2`` added in attribute order, one
    rounding per operation, no FMA): the nearest centre's value is the
    ``dist2`` a backend's ``assign`` gives, to the bit.

    Parameters
    ----------
    x : ndarray, shape (n, m), float64
    centres : ndarray, shape (k, m), float64

    Returns
    -------
    ndarray, shape (n, k), float64
    """
    x = np.ascontiguousarray(x, dtype=np.float64)
    ct = np.ascontiguousarray(np.asarray(centres, dtype=np.float64).T)
    out = np.empty((x.shape[0], ct.shape[1]))
    if len(x) and ct.shape[1]:
        _dist2_all(x, ct, out)
    return out


@njit(parallel=True, cache=True)
def _own_dist2(x, labels, ref, out):  # pragma: no cover - compiled
    # each row's squared distance to the reference point of its cluster (0 for a row of none)
    n, m = x.shape
    nb = min(n, _BLOCKS)
    for b in prange(nb):
        for i in range(n * b // nb, n * (b + 1) // nb):
            a = labels[i]
            d = 0.0
            if a >= 0:
                for j in range(m):
                    t = x[i, j] - ref[a, j]
                    d += t * t
            out[i] = d


@njit(parallel=True, cache=True)
def _silhouette_rows(x, labels, w, weighted, mt, slot, spread, mass, own_out, s_out):  # pragma: no cover
    # mt (m, p): the means of the p >= 2 non-empty clusters, transposed; slot[a]: cluster a's column
    # (-1: empty).  Per row: its squared distance to its own mean, and Spark's squared-Euclidean silhouette
    n, m = x.shape
    p = mt.shape[1]
    nb = min(n, _BLOCKS)
    for b in prange(nb):
        acc = np.empty(p)
        for i in range(n * b // nb, n * (b + 1) // nb):
            a = labels[i]
            own_out[i] = 0.0
            s_out[i] = 0.0
            if a < 0 or slot[a] < 0:
                continue
            c = slot[a]
            for q in range(p):
                acc[q] = 0.0
            for j in range(m):
                xj = x[i, j]
                for q in range(p):
                    t = xj - mt[j, q]
                    acc[q] += t * t
            own_out[i] = acc[c]
            wi = w[i] if weighted else 1.0
            if mass[c] == wi:
                continue  # alone in its cluster (by weight): 0, as Spark
            # mean squared distance to the own cluster's other points, and to the nearest other cluster
            ai = (acc[c] + spread[c]) * mass[c] / (mass[c] - wi)
            bi = np.inf
            for q in range(p):
                if q != c:
                    v = acc[q] + spread[q]
                    if v < bi:
                        bi = v
            if ai < bi:
                s_out[i] = 1.0 - ai / bi
            elif ai > bi:
                s_out[i] = bi / ai - 1.0


#: Sample rows a task of the sampled silhouette takes at once (each column of the sample read once for all of them)
_TILE_ROWS = 8
#: Sample rows whose distances a task holds at once (the tile's distances stay in the first-level cache)
_TILE_COLS = 512


@njit(parallel=True, cache=True)
def _sample_sums(xt, lab, nlab, lo, hi, out):  # pragma: no cover - compiled
    # xt (m, s): the sample transposed.  out[i - lo, l]: the sum of row i's Euclidean distances to the
    # sample's rows of label l (itself left out), added in row order, for the rows lo <= i < hi.
    # A task takes a tile of rows against the sample a chunk of columns at a time; four attributes a
    # pass keep a distance in a register, still added in attribute order
    m, s = xt.shape
    tiles = (hi - lo + _TILE_ROWS - 1) // _TILE_ROWS
    for tile in prange(tiles):
        i0 = lo + tile * _TILE_ROWS
        nt = min(hi, i0 + _TILE_ROWS) - i0
        d2 = np.empty((_TILE_ROWS, _TILE_COLS))
        acc = np.zeros((_TILE_ROWS, nlab))
        for r0 in range(0, s, _TILE_COLS):
            nr = min(s, r0 + _TILE_COLS) - r0
            d2[:, :] = 0.0
            j = 0
            while j + 4 <= m:
                c0 = xt[j, r0:r0 + nr]
                c1 = xt[j + 1, r0:r0 + nr]
                c2 = xt[j + 2, r0:r0 + nr]
                c3 = xt[j + 3, r0:r0 + nr]
                for t in range(nt):
                    v0 = xt[j, i0 + t]
                    v1 = xt[j + 1, i0 + t]
                    v2 = xt[j + 2, i0 + t]
                    v3 = xt[j + 3, i0 + t]
                    row = d2[t]
                    for r in range(nr):
                        u0 = c0[r] - v0
                        u1 = c1[r] - v1
                        u2 = c2[r] - v2
                        u3 = c3[r] - v3
                        d = row[r] + u0 * u0
                        d = d + u1 * u1
                        d = d + u2 * u2
                        row[r] = d + u3 * u3
                j += 4
            while j < m:
                cs = xt[j, r0:r0 + nr]
                for t in range(nt):
                    v = xt[j, i0 + t]
                    row = d2[t]
                    for r in range(nr):
                        u = cs[r] - v
                        row[r] += u * u
                j += 1
            ls = lab[r0:r0 + nr]
            for t in range(nt):
                row = d2[t]
                a = acc[t]
                skip = i0 + t - r0
                for r in range(nr):
                    if r != skip:
                        a[ls[r]] += math.sqrt(row[r])
        for t in range(nt):
            for q in range(nlab):
                out[i0 - lo + t, q] = acc[t, q]


class HostScoreRows:
    """The scores' two passes over host rows (what :func:`quality_scores` asks of its ``rows``).

    Parameters
    ----------
    x : ndarray, shape (n, m), float64
    weights : ndarray, shape (n,), float64, or None
    labels : ndarray, shape (n,), int32
        ``-1 .. k-1`` (-1: left out).
    k, threads : int
    """

    def __init__(self, x: np.ndarray, weights: np.ndarray | None, labels: np.ndarray, k: int, threads: int):
        self.x, self.w, self.labels, self.k, self.threads = x, weights, labels, k, threads

    def cluster_sums(self, ref: np.ndarray, scales: Scales, ref_exp: int) -> tuple:
        """Per cluster, the fixed-point sums of ``w x`` and ``w`` at ``scales`` and of ``w |x - ref_a|^2`` at
        ``2**ref_exp``.

        Parameters
        ----------
        ref : ndarray, shape (k, m), float64
        scales : Scales
        ref_exp : int

        Returns
        -------
        sums : ndarray, shape (k, m + 1, 4), int64
        ref_sse : ndarray, shape (k, 4), int64
        """
        n, m = self.x.shape
        sums = np.zeros((self.k, m + 1, 4), dtype=np.int64)
        sum_rows(self.x, self.w, self.labels, None, scales, sums, self.threads)
        dref = np.empty(n)
        if n:
            _own_dist2(self.x, self.labels, ref, dref)
        return sums, cluster_sums(self.labels, dref, self.w, self.k, ref_exp)

    def silhouette_sums(self, mt: np.ndarray, slot: np.ndarray, spread: np.ndarray, mass: np.ndarray,
                        exponents: tuple) -> np.ndarray:
        """Per cluster, the fixed-point sums of ``w d``, ``w sqrt(d)`` and ``w s`` over its rows, ``d`` a row's
        squared distance to its cluster's mean and ``s`` its squared-Euclidean silhouette.

        Parameters
        ----------
        mt : ndarray, shape (m, p), float64
            The ``p >= 2`` non-empty clusters' means, transposed.
        slot : ndarray, shape (k,), int64
            A cluster's column in ``mt`` (-1: empty).
        spread, mass : ndarray, shape (p,), float64
            Each cluster's mean squared deviation and weight.
        exponents : tuple of three int
            The scales of the three sums.

        Returns
        -------
        ndarray, shape (3, k, 4), int64
        """
        n = len(self.x)
        own = np.zeros(n)
        sil = np.zeros(n)
        w = self.w
        if n:
            _silhouette_rows(self.x, self.labels, w if w is not None else np.ones(0), w is not None, mt, slot, spread,
                             mass, own, sil)
        return np.stack([cluster_sums(self.labels, v, w, self.k, e)
                         for v, e in zip((own, np.sqrt(own), sil), exponents)])

    def sample_silhouettes(self, xs: np.ndarray, lab: np.ndarray, nlab: int, lo: int, hi: int) -> np.ndarray:
        """:func:`row_silhouettes` of the sample's rows ``lo .. hi-1`` (the sample's rows are given: they are
        every rank's).

        Returns
        -------
        ndarray, shape (hi - lo,), float64
        """
        return row_silhouettes(sample_label_sums(xs, lab, nlab, lo, hi), lab, nlab, lo)


# ======================================================================== the scores

def _empty_result(reason: str, sample_size: int = 0, seed: int = 0) -> dict:
    out = {name: None for name in SCORE_NAMES}
    out.update({"silhouette_sample_size": sample_size, "silhouette_sample_seed": seed, "clusters_scored": 0,
                "undefined": reason})
    return out


def sample_indices(n: int, size: int, seed: int) -> np.ndarray:
    """The global row indices of the sampled silhouette: the same for any number of ranks.

    Parameters
    ----------
    n : int
        Rows over all ranks.
    size : int
        Rows wanted; all rows when ``size >= n``.
    seed : int

    Returns
    -------
    ndarray, shape (min(size, n),), int64
        ``numpy.random.default_rng(seed).choice(n, size, replace=False)``, sorted.
    """
    if size >= n:
        return np.arange(n, dtype=np.int64)
    return np.sort(np.random.default_rng(seed).choice(n, size=size, replace=False)).astype(np.int64)


def sample_label_sums(xs: np.ndarray, lab: np.ndarray, nlab: int, lo: int, hi: int) -> np.ndarray:
    """For the sample's rows ``lo .. hi-1``: the sum of each one's Euclidean distances to every label's rows.

    Each distance adds its terms in attribute order and the sums go in row
    order, so a row's sums do not depend on the threads nor on which rows a
    call takes: the ranks may share the rows.

    Parameters
    ----------
    xs : ndarray, shape (s, m), float64
    lab : ndarray, shape (s,), int64
        Labels ``0 .. nlab-1``.
    nlab : int
    lo, hi : int

    Returns
    -------
    ndarray, shape (hi - lo, nlab), float64
        The row itself is left out of its own label's sum.
    """
    out = np.empty((hi - lo, nlab))
    if hi > lo:
        _sample_sums(np.ascontiguousarray(np.asarray(xs, dtype=np.float64).T), np.ascontiguousarray(lab, dtype=np.int64),
                     nlab, lo, hi, out)
    return out


def row_silhouettes(sums: np.ndarray, lab: np.ndarray, nlab: int, lo: int = 0) -> np.ndarray:
    """scikit-learn's silhouette of the sample's rows ``lo .. lo + len(sums) - 1`` from their
    :func:`sample_label_sums`.

    Parameters
    ----------
    sums : ndarray, shape (h, nlab), float64
    lab : ndarray, shape (s,), int64
        The whole sample's labels (each label's size counts every row).
    nlab : int
    lo : int
        The sample row of ``sums[0]``.

    Returns
    -------
    ndarray, shape (h,), float64
        ``(b - a) / max(a, b)`` of each row, 0 for a row alone in its label.
    """
    h = len(sums)
    freqs = np.bincount(lab, minlength=nlab).astype(np.float64)
    own = lab[lo:lo + h]
    rows = np.arange(h)
    with np.errstate(divide="ignore", invalid="ignore"):
        intra = sums[rows, own] / (freqs[own] - 1.0)  # 0/0 for a label of one row: 0 below
        others = sums / freqs
        others[rows, own] = np.inf
        inter = others.min(axis=1)
        sil = (inter - intra) / np.maximum(intra, inter)
    return np.nan_to_num(sil)


def sampled_silhouette(xs: np.ndarray, labels: np.ndarray) -> float | None:
    """scikit-learn's ``silhouette_score(xs, labels)`` (Euclidean), by the same definition, in this process.

    Parameters
    ----------
    xs : ndarray, shape (s, m), float64
    labels : ndarray, shape (s,), int

    Returns
    -------
    float or None
        None where scikit-learn refuses: fewer than 2 labels, or one per row.
    """
    present, lab = np.unique(np.asarray(labels), return_inverse=True)
    nlab = len(present)
    if not 1 < nlab < len(lab):
        return None
    return float(np.mean(row_silhouettes(sample_label_sums(xs, lab, nlab, 0, len(lab)), lab, nlab)))


def quality_scores(comm, x: np.ndarray, labels: np.ndarray, k: int, *, weights: np.ndarray | None = None,
                   centres: np.ndarray | None = None, magnitudes: np.ndarray | None = None,
                   sample_size: int = DEFAULT_SAMPLE, seed: int = 0, scores: str = "all",
                   threads: int = 1, rows=None) -> dict:
    """Calinski–Harabasz, Davies–Bouldin and two silhouettes of ``labels`` over all ranks' rows (collective).

    See the module's docstring for the definitions, the weights and what
    "exact" means here.

    Parameters
    ----------
    comm : Comm or SerialComm
    x : ndarray, shape (n_local, m), float64
        This rank's rows (ranks hold consecutive slices of the rows, in rank
        order), in the units the scores are wanted in.
    labels : ndarray, shape (n_local,), int
        Each row's cluster in ``0 .. k-1``; -1: the row is left out.
    k : int
        Number of clusters the labels name (empty ones are left out).
    weights : ndarray, shape (n_local,), float64, optional
        Instance weights (>= 0).
    centres : ndarray, shape (k, m), float64, optional
        Points near the clusters' means (a run's final centres): the spreads
        are measured from them, which keeps their rounding small; any value
        gives the same scores up to that rounding.  Default: the origin.
    magnitudes : ndarray, shape (m,), float64, optional
        A global bound on each column's ``|x_j|`` (found with one more pass and
        a collective when omitted).
    sample_size : int
        Rows of the sampled silhouette; 0 leaves it out.
    seed : int
        Seed of the sample (:func:`sample_indices`).
    scores : {"all", "none"}
        ``none`` computes nothing (every score None).
    threads : int
        Host threads of the fixed-point sums.
    rows : object, optional
        The two passes over the rows where the rows are (a backend's
        :meth:`~mpikmeans.backends.base.Backend.score_rows` for these labels)
        and the sampled silhouette's per-row values: the same integers and bits as
        :class:`HostScoreRows`, which reads ``x`` when omitted.  The sample's
        rows are always gathered from ``x``.

    Returns
    -------
    dict
        ``calinski_harabasz``, ``davies_bouldin``, ``silhouette_sqeuclidean``,
        ``silhouette_sample`` (float or None), ``silhouette_sample_size`` (rows
        sampled), ``silhouette_sample_seed``, ``clusters_scored`` (non-empty
        clusters), ``rows``, ``weighted``, ``per_cluster`` (each cluster's
        silhouette and mean distance to its mean, None for an empty one),
        ``undefined`` (why a score is None, or None) and ``seconds``: the same
        on every rank, JSON-ready.

    Raises
    ------
    ValueError
        Unknown ``scores``; labels outside ``-1 .. k-1``; shapes that do not match.
    """
    if scores not in SCORE_CHOICES:
        raise ValueError(f"scores={scores!r}: expected one of {', '.join(SCORE_CHOICES)}")
    t0 = time.perf_counter()
    if scores == "none":
        return _empty_result("not computed (scores none)")
    x = np.ascontiguousarray(x, dtype=np.float64)
    labels = np.ascontiguousarray(labels, dtype=np.int32)
    n_local, m = x.shape
    if labels.shape != (n_local,):
        raise ValueError(f"labels of shape {labels.shape} for {n_local} rows")
    lowest = int(labels.min()) if n_local else 0
    if n_local and (lowest < -1 or labels.max() >= k):
        raise ValueError(f"labels outside -1 .. {k - 1}")
    w = None if weights is None else np.ascontiguousarray(weights, dtype=np.float64)
    ref = np.zeros((k, m)) if centres is None else np.ascontiguousarray(centres, dtype=np.float64)
    if ref.shape != (k, m):
        raise ValueError(f"centres of shape {ref.shape}, expected {(k, m)}")

    # ---- the global bounds of the fixed-point scales and the split (one small collective)
    local = np.empty(m + 1)
    local[:m] = column_magnitudes(x) if magnitudes is None else 0.0
    local[m] = w.max() if w is not None and len(w) else 0.0
    bounds = comm.allreduce(local, "max")
    mags = bounds[:m] if magnitudes is None else np.asarray(magnitudes, dtype=np.float64)
    weighted = bool(comm.allreduce(np.array([w is not None], dtype=np.int64), "max")[0])
    wmax = float(bounds[m]) if weighted else 1.0
    scales = Scales.of(mags, wmax)
    counts = comm.allgather(n_local)
    row_offset = sum(counts[: comm.rank])

    passes = rows if rows is not None else HostScoreRows(x, w, labels, k, threads)

    # ---- pass 1: per cluster, the sums of w x and of w, and of each row's squared distance to ref
    ref_exp = scales.sse_exponent(ref)
    sums, ref_sse = passes.cluster_sums(ref, scales, ref_exp)
    parts = [sums.ravel(), ref_sse.ravel()]
    if weighted:  # the rows per cluster (without weights each row adds exactly 1 to the weights' column)
        parts.append(np.bincount(labels[labels >= 0] if lowest < 0 else labels, minlength=k).astype(np.int64))
    buf = comm.allreduce(np.concatenate(parts), "sum")
    ns = k * (m + 1) * 4
    sums = buf[:ns].reshape(k, m + 1, 4)
    values = decode(sums, scales.columns)
    mass = values[:, m]  # sum of weights (rows, unweighted) per cluster
    rows_per_cluster = buf[ns + 4 * k:] if weighted else np.rint(mass).astype(np.int64)
    present = (rows_per_cluster > 0) & (mass > 0)
    p = int(present.sum())
    rows = int(rows_per_cluster.sum())
    if p < 2:
        return _empty_result(f"fewer than 2 non-empty clusters ({p})", 0, seed) | {"rows": rows, "weighted": weighted,
                                                                                   "clusters_scored": p,
                                                                                   "seconds": time.perf_counter() - t0}
    means = values[present, :m] / mass[present, None]
    total_mean = decode(sums[present, :m].sum(axis=0), scales.columns[:m]) / float(mass[present].sum())
    ref_sq = decode(buf[ns:ns + 4 * k].reshape(k, 4), ref_exp)[present]
    # V = the mean squared deviation from the mean: (sum w |x - ref|^2) / W - |mean - ref|^2
    spread = np.maximum(ref_sq / mass[present] - ((means - ref[present]) ** 2).sum(axis=1), 0.0)

    # ---- pass 2: per cluster, the sums of each row's squared distance to its mean, of that distance and of
    # its silhouette
    slot = np.full(k, -1, dtype=np.int64)
    slot[present] = np.arange(p)
    own_exp = scales.sse_exponent(means)
    reach = mags + np.abs(means).max(axis=0)  # |x_j - mean_j| <= |x_j| + |mean_j|
    dist_exp = exponent_for(math.sqrt(float(np.dot(reach, reach))) * wmax)
    sil_exp = exponent_for(wmax)
    buf = passes.silhouette_sums(np.ascontiguousarray(means.T), slot, spread, np.ascontiguousarray(mass[present]),
                                 (own_exp, dist_exp, sil_exp)).ravel()
    buf = comm.allreduce(buf, "sum").reshape(3, k, 4)
    intra = float(decode(buf[0][present].sum(axis=0), own_exp))  # sum of w |x - mean|^2
    mean_dist = decode(buf[1], dist_exp)[present] / mass[present]
    sil_sums = decode(buf[2], sil_exp)[present]
    silhouette = float(decode(buf[2][present].sum(axis=0), sil_exp)) / float(mass[present].sum())

    # ---- the scores from the totals (the same values on every rank)
    n_eff = float(mass[present].sum())  # frequency weights: the rows' count, or the weights' sum
    undefined = None
    ch = db = None
    if p < rows:
        extra = float((mass[present] * ((means - total_mean) ** 2).sum(axis=1)).sum())
        ch = 1.0 if intra == 0.0 else extra * (n_eff - p) / (intra * (p - 1.0))
        db = _davies_bouldin(means, mean_dist)
    else:
        undefined = f"as many clusters as rows ({rows}): Calinski-Harabasz and Davies-Bouldin are undefined"

    sample = None
    taken = 0
    if sample_size > 0:
        idx = sample_indices(sum(counts), int(sample_size), seed)
        lo = row_offset
        mine = idx[(idx >= lo) & (idx < lo + n_local)] - lo
        keep = mine[labels[mine] >= 0]
        pieces = comm.allgather((x[keep], labels[keep]))
        xs = np.concatenate([xp for xp, _ in pieces])
        present_s, lab = np.unique(np.concatenate([lp for _, lp in pieces]), return_inverse=True)
        taken, nlab = len(lab), len(present_s)
        if 1 < nlab < taken:
            # every rank its share of the sample's rows; their silhouettes gathered in row order
            lo, hi = taken * comm.rank // comm.size, taken * (comm.rank + 1) // comm.size
            sample = float(np.mean(np.concatenate(comm.allgather(passes.sample_silhouettes(xs, lab, nlab, lo, hi)))))
        if sample is None and undefined is None:
            undefined = "the sample has fewer than 2 clusters, or one row per cluster: no sampled silhouette"

    per_sil = [None] * k
    per_dist = [None] * k
    for c, a in enumerate(np.flatnonzero(present)):
        per_sil[a] = float(sil_sums[c] / mass[present][c])
        per_dist[a] = float(mean_dist[c])
    return {
        "calinski_harabasz": ch,
        "davies_bouldin": db,
        "silhouette_sqeuclidean": silhouette,
        "silhouette_sample": sample,
        "silhouette_sample_size": int(taken),
        "silhouette_sample_seed": int(seed),
        "clusters_scored": p,
        "rows": rows,
        "weighted": weighted,
        "per_cluster": {"silhouette_sqeuclidean": per_sil, "mean_distance_to_mean": per_dist},
        "undefined": undefined,
        "seconds": time.perf_counter() - t0,
    }


def _davies_bouldin(means: np.ndarray, mean_dist: np.ndarray) -> float:
    """scikit-learn's Davies–Bouldin index from the clusters' means (p, m) and mean distances to them (p,).

    The centroids' distances come from :func:`all_dist2` (threaded, no ``p x p x m`` temporary:
    K = 1000 of 257 attributes would take 2 GB)."""
    centroid_dist = np.sqrt(all_dist2(means, means))
    if np.allclose(mean_dist, 0) or np.allclose(centroid_dist, 0):
        return 0.0
    centroid_dist[centroid_dist == 0] = np.inf
    combined = mean_dist[:, None] + mean_dist[None, :]
    return float(np.mean(np.max(combined / centroid_dist, axis=1)))


__all__ = ["DEFAULT_SAMPLE", "HostScoreRows", "SCORE_CHOICES", "SCORE_NAMES", "all_dist2", "quality_scores",
           "sample_indices",
           "row_silhouettes", "sample_label_sums", "sampled_silhouette"]
