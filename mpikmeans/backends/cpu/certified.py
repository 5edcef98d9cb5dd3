"""The CPU step with float32 distance screening, certified, so the labels are the exact ones.

Finding each row's nearest of K centres is the bulk of a Lloyd step (N K M
operations).  Here it is done as the GPU does it (see
:mod:`mpikmeans.backends.gpu`): on data shifted by the mean of the centres
(``y = x - s``, ``z = c - s``), in float32, in the dot-product form
``|z|^2 - 2 y.z``.  The products ``-2 z . y`` of a tile of rows and every
centre are one float32 matrix product, by the BLAS library (``sgemm`` through
Numba's ``np.dot``, one thread per caller: the backend's threads each make
their own), whose register-blocked kernels run near the core's multiply-add
peak.  Each row keeps its best and second-best estimate; when their gap
exceeds a rigorous bound on the float32 rounding error (the GPU's; it holds
for any order of the additions, so for any BLAS), the best is certainly the
nearest.  A row whose gap does not (ties, near-ties, huge values) gets every
distance again in exact float64, in attribute order, lowest index on ties.  The
labels are therefore those of the exact float64 computation.

What is summed is unchanged: every row's exact float64 squared distance to its
centre (attribute order) and its values, block by block, rows in order, as
:func:`mpikmeans.backends.cpu.tiles._lloyd_pass` does.  So a step here gives the
same bits as the exact kernels, faster.
"""

from __future__ import annotations

import numpy as np

from ...jit import njit, prange
from ..serial import _nearest_row as _exact_nearest  # every distance in float64, lowest index on ties
from .tiles import _prefetch_row

#: float32 unit roundoff; the bound is the GPU kernel's (kernels.py): tol = TOLF (|y|^2 + zlim) + tiny
_U32 = 2.0 ** -24
#: rows whose |y|^2 + 2 max|z|^2 exceeds this take the exact path (float32 overflow guard)
_BIG = np.float32(1.0e30)
_TINY = np.float32(1.0e-36)
#: bytes of one tile's float32 rows and estimates ((rows + centres) x 4): with the tile's float64
#: rows and the next tile's, asked for ahead, well inside a core's L2 (2-core Xeon, 2 MB L2:
#: 2 10^5 x 100, K = 50 on two threads 34 ms a step with 512 KB, 25 with 128 KB)
_TILE_BYTES = 1 << 17
#: the fewest rows of a tile: a matrix product of fewer rows pays its packing of the centres
#: for too little work (10^5 x 257, K = 1000 with 16-row tiles: 655 against 460 ms)
_MIN_ROWS = 96


def screen_rows(k: int, m: int) -> int:
    """Rows per tile of the screen: the tile's float32 rows (rows x m) and estimates (k x rows) in L2.

    Multiples of 16 (whole vectors of the ranking loop), 96 to 512.
    """
    rows = _TILE_BYTES // (4 * max(1, k + m))
    return int(min(512, max(_MIN_ROWS, rows - rows % 16)))


def centre_data(centres: np.ndarray) -> tuple:
    """What the float32 screen needs of the centres.

    Parameters
    ----------
    centres : ndarray, shape (k, m), float64

    Returns
    -------
    shift : ndarray, shape (m,), float64
        ``s``, the mean of the centres.
    zt : ndarray, shape (k, m), float32
        ``-2 z`` with ``z = float32(c - s)``.
    cc : ndarray, shape (k,), float32
        ``|z|^2``.
    zlim : float
        ``2 max |z|^2`` with a margin, the bound's centre term (inf when a centre
        is not finite: every row then takes the exact path).
    tolf : float
        The bound's factor ``2.1 (m + 5) u``.
    """
    k, m = centres.shape
    # huge or non-finite centres overflow float32 here; zlim then sends every row to the exact path
    with np.errstate(over="ignore", invalid="ignore"):
        shift = centres.mean(axis=0)
        z = (centres - shift).astype(np.float32)
        z64 = z.astype(np.float64)
        norms = np.einsum("ij,ij->i", z64, z64)
        zt = np.multiply(z, np.float32(-2.0))
        cc = norms.astype(np.float32)
    finite = bool(np.isfinite(centres).all())
    zlim = min(2.0 * float(norms.max()) * (1.0 + 1e-6), 3.0e38) if finite else np.inf
    return shift, zt, cc, np.float32(zlim), np.float32(2.1 * (m + 5) * _U32)


@njit(cache=True, nogil=True, fastmath={"contract", "reassoc"})
def _shifted_rows(x, t0, rt, shift, ys, yy):  # pragma: no cover - compiled
    """Rows ``t0..t0+rt-1`` as float32 ``y = x - s`` into ``ys[:rt]``, and their ``|y|^2`` (float32) into ``yy``.

    Compiled on its own so that only these float32 operations may be fused and
    reordered (``contract``, ``reassoc``): the float64 arithmetic of the callers
    stays one rounding per operation in attribute order.  The bound holds for any
    order of the additions.
    """
    m = x.shape[1]
    for r in range(rt):
        yr = ys[r]
        acc = np.float32(0.0)
        for j in range(m):
            v = np.float32(x[t0 + r, j] - shift[j])
            yr[j] = v
            acc += v * v
        yy[r] = acc


@njit(cache=True, nogil=True)
def _rank(est, cc, rt, b1, b2, i1):  # pragma: no cover - compiled
    """Best (``b1``, its centre ``i1``) and second-best (``b2``) of ``cc[c] + est[c, r]`` for rows ``r < rt``.

    Centres outside, rows inside: every operation is the same for each row, so
    the row loop runs in vectors, without branches (which centre is nearest
    follows the data: a branch on it is mispredicted often).  Strict '<': the
    lowest index wins, and an exact tie leaves a gap of 0, so the row is
    rechecked; a NaN estimate never certifies a row.
    """
    for r in range(rt):
        b1[r] = np.float32(np.inf)
        b2[r] = np.float32(np.inf)
        i1[r] = 0
    for c in range(est.shape[0]):
        row = est[c]
        w = cc[c]
        for r in range(rt):
            d = row[r] + w
            o1 = b1[r]
            nearer = d < o1
            b2[r] = min(b2[r], max(o1, d))  # d < o1: the old best; else min(o2, d)
            i1[r] = c if nearer else i1[r]
            b1[r] = d if nearer else o1


@njit(cache=True, nogil=True)
def _screen_tile(x, t0, rt, shift, zt, cc, ys, est, yy, b1, b2, i1):  # pragma: no cover - compiled
    """Float32 estimates for rows ``t0..t0+rt-1``: best and second-best centre per row.

    ``est = zt @ ys.T`` (k x tile) is one ``sgemm``: rows past ``rt`` hold an
    earlier tile's values, whose estimates are not read.
    """
    _shifted_rows(x, t0, rt, shift, ys, yy)
    np.dot(zt, ys.T, est)
    _rank(est, cc, rt, b1, b2, i1)


@njit(cache=True, forceinline=True)
def _recheck_tile(x, t0, rt, cen, zlim, tolf, yy, b1, b2, i1):  # pragma: no cover - compiled
    """Exact labels (``i1``) for the tile's rows that float32 could not certify; how many there were.

    A row is certified when its float32 gap exceeds the bound (and nothing
    overflowed: NaN and huge values fail the test); the others get every
    distance again in float64.
    """
    exact = 0
    for r in range(rt):
        scale = yy[r] + zlim
        if not (b2[r] - b1[r] > tolf * scale + _TINY and scale < _BIG):
            i1[r] = _exact_nearest(x, t0 + r, cen)[0]
            exact += 1
    return exact


@njit(cache=True, forceinline=True)
def _dist4(x, cen, i1, t0, rt, q):  # pragma: no cover - compiled
    """Exact squared distances of rows ``t0+q .. t0+q+3`` to their centres ``i1[q..q+3]``.

    Each in attribute order with one rounding per operation, as the exact
    kernels and :func:`_exact_nearest` sum it (the same bits); four rows side by
    side: four independent chains of additions instead of one.  Past the
    tile's end the last row is repeated (its value is not used).
    """
    qb = min(q + 1, rt - 1)
    qc = min(q + 2, rt - 1)
    qd = min(q + 3, rt - 1)
    return _four_chains(x[t0 + q], x[t0 + qb], x[t0 + qc], x[t0 + qd], cen[i1[q]], cen[i1[qb]], cen[i1[qc]],
                        cen[i1[qd]])


@njit(cache=True, forceinline=True)
def _four_chains(xa, xb, xc, xd, ca, cb, cc, cd):  # pragma: no cover - compiled
    """``|xa - ca|², |xb - cb|², |xc - cc|², |xd - cd|²`` (rows of m values), each in attribute
    order with one rounding per operation, side by side: four independent chains of additions."""
    da = 0.0
    db = 0.0
    dc = 0.0
    de = 0.0
    for j in range(xa.shape[0]):
        ta = xa[j] - ca[j]
        tb = xb[j] - cb[j]
        tc = xc[j] - cc[j]
        td = xd[j] - cd[j]
        da += ta * ta
        db += tb * tb
        dc += tc * tc
        de += td * td
    return da, db, dc, de


@njit(cache=True, forceinline=True)
def _nth(d4, g):  # pragma: no cover - compiled
    """Element ``g`` of :func:`_dist4`'s four distances (a tuple takes only constant indices)."""
    return d4[0] if g == 0 else (d4[1] if g == 1 else (d4[2] if g == 2 else d4[3]))


@njit(cache=True, forceinline=True)
def _sum_tile(x, t0, rt, cen, i1, labels, weights, use_weights, sums, counts, sse, ahead):  # pragma: no cover
    """Add the tile's rows, in increasing index (the exact kernels' order), to their clusters' sums
    and counts, and their weighted squared distances to ``sse``; store the labels.  Returns the
    new ``sse`` (one running sum over the block's rows, as the exact kernels add it) and how many
    labels changed.  Asks for the rows ``ahead`` rows on meanwhile (the next tile's)."""
    m = x.shape[1]
    changed = 0
    for q in range(0, rt, 4):
        d4 = _dist4(x, cen, i1, t0, rt, q)
        for g in range(min(4, rt - q)):
            r = q + g
            i = t0 + r
            _prefetch_row(x, i + ahead)
            bi = i1[r]
            if labels[i] != bi:
                changed += 1
                labels[i] = bi
            d = _nth(d4, g)
            row = x[i]
            acc = sums[bi]
            if use_weights:
                w = weights[i]
                counts[bi] += w
                for j in range(m):
                    acc[j] += w * row[j]
                sse += w * d
            else:
                # w = 1: w * v is v, the same sums as the weighted form without its multiplies
                counts[bi] += 1.0
                for j in range(m):
                    acc[j] += row[j]
                sse += d
    return sse, changed


@njit(cache=True, forceinline=True)
def _tile_buffers(tile, k, m):  # pragma: no cover - compiled
    """One thread's scratch for a tile: float32 rows, estimates (k x tile), |y|^2, best, second, label."""
    return (np.zeros((tile, m), dtype=np.float32), np.zeros((k, tile), dtype=np.float32),
            np.empty(tile, dtype=np.float32), np.empty(tile, dtype=np.float32), np.empty(tile, dtype=np.float32),
            np.empty(tile, dtype=np.int32))


@njit(parallel=True, cache=True)
def certified_pass(x, cen, shift, zt, cc, zlim, tolf, tile, labels, weights, use_weights, part_sums, part_counts,
                   part_sse, part_changed, part_exact):  # pragma: no cover - compiled
    """A Lloyd step: labels (certified float32, else exact), then sums, counts, SSE in the exact kernels' order.

    Row block ``b`` of ``part_sums.shape[0]`` (``n b / nb`` to ``n (b + 1) / nb``) is
    summed into ``part_sums[b]``, ``part_counts[b]``, ``part_sse[b]`` in row order,
    as :func:`mpikmeans.backends.cpu.tiles._lloyd_pass` sums it; ``part_changed[b]``
    counts the labels that changed, ``part_exact[b]`` the rows rechecked in float64.
    """
    n = x.shape[0]
    nb = part_sums.shape[0]
    for b in prange(nb):
        ys, est, yy, b1, b2, i1 = _tile_buffers(tile, zt.shape[0], zt.shape[1])
        lo = n * b // nb
        hi = n * (b + 1) // nb
        sums = part_sums[b]
        counts = part_counts[b]
        sums[:, :] = 0.0
        counts[:] = 0.0
        sse = 0.0
        changed = 0
        exact = 0
        for t0 in range(lo, hi, tile):
            rt = min(tile, hi - t0)
            _screen_tile(x, t0, rt, shift, zt, cc, ys, est, yy, b1, b2, i1)
            exact += _recheck_tile(x, t0, rt, cen, zlim, tolf, yy, b1, b2, i1)
            sse, moved = _sum_tile(x, t0, rt, cen, i1, labels, weights, use_weights, sums, counts, sse, tile)
            changed += moved
        part_sse[b] = sse
        part_changed[b] = changed
        part_exact[b] = exact


@njit(parallel=True, cache=True)
def certified_assign(x, cen, shift, zt, cc, zlim, tolf, tile, labels, dist2):  # pragma: no cover - compiled
    """Nearest centre (certified, else exact) and exact squared distance of every row."""
    n, m = x.shape
    nb = min(n, 256)
    for b in prange(nb):
        ys, est, yy, b1, b2, i1 = _tile_buffers(tile, zt.shape[0], zt.shape[1])
        hi = n * (b + 1) // nb
        for t0 in range(n * b // nb, hi, tile):
            rt = min(tile, hi - t0)
            _screen_tile(x, t0, rt, shift, zt, cc, ys, est, yy, b1, b2, i1)
            _recheck_tile(x, t0, rt, cen, zlim, tolf, yy, b1, b2, i1)
            for q in range(0, rt, 4):
                d4 = _dist4(x, cen, i1, t0, rt, q)
                for g in range(min(4, rt - q)):
                    _prefetch_row(x, t0 + q + g + tile)
                    labels[t0 + q + g] = i1[q + g]
                    dist2[t0 + q + g] = _nth(d4, g)
