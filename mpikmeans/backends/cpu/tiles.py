"""The CPU backend's exact kernels: float64 distances in attribute order, tile by tile.

Rows go through the distance kernel (:func:`_nearest_tile`) a tile at a time:
the tile is transposed so that the innermost loop runs over its rows (one
vector lane per row) and each loaded value serves several centres and
attributes.  Each distance is still summed attribute by attribute in order,
with no FMA, so the labels and distances are bit-for-bit those of a plain
row-at-a-time loop, whatever the tile or the thread count.
"""

from __future__ import annotations

import numpy as np

from ...exact import fixed_potential
from ...jit import njit, prange
from .prefetch import prefetch

#: Centres whose distances one pass over a row tile computes together.  Each
#: loaded attribute value then feeds four accumulators, which keeps the inner
#: loop bound by arithmetic rather than by loads and stores.
_GROUP = 4


def _tile_rows(m: int) -> int:
    """Rows per tile: whole 8-wide vectors, and a transposed tile (m x rows
    float64) that stays in the L1/L2 cache while every centre passes over it."""
    return 64 if m <= 128 else 32


#: Spare columns in a transposed tile's rows: a row length of 64 or 32 float64
#: (a power of two) would put every attribute's row in the same few L1 sets.
_PAD = 8


@njit(cache=True, fastmath=False, forceinline=True)
def _put4(xt, r, a, b, c, d):  # pragma: no cover - compiled
    """Rows ``a, b, c, d`` (m values each) into columns ``r .. r+3`` of the transposed scratch ``xt``.

    Four rows at a time: each column of ``xt`` then takes four neighbouring
    values per visit (2-core Xeon, 16 attributes: 5.1 against 7.7 ns a row,
    ``bench/experiments/cpu_small_k_parts.py``).
    """
    for j in range(a.shape[0]):
        col = xt[j]
        col[r] = a[j]
        col[r + 1] = b[j]
        col[r + 2] = c[j]
        col[r + 3] = d[j]


@njit(cache=True, fastmath=False, forceinline=True)
def _load_tile(x, t0, rt, xt):  # pragma: no cover - compiled
    """Rows ``t0 .. t0+rt-1`` of ``x`` into the transposed scratch ``xt`` (m, >= T)."""
    m = x.shape[1]
    r4 = rt - rt % 4
    for r in range(0, r4, 4):
        _put4(xt, r, x[t0 + r], x[t0 + r + 1], x[t0 + r + 2], x[t0 + r + 3])
    for r in range(r4, rt):
        for j in range(m):
            xt[j, r] = x[t0 + r, j]


@njit(cache=True, fastmath=False, forceinline=True)
def _load_rows(x, t0, rows, f, xt):  # pragma: no cover - compiled
    """Rows ``t0 + rows[q]`` of ``x``, ``q < f``, into columns ``q`` of the transposed scratch ``xt``."""
    m = x.shape[1]
    f4 = f - f % 4
    for q in range(0, f4, 4):
        _put4(xt, q, x[t0 + rows[q]], x[t0 + rows[q + 1]], x[t0 + rows[q + 2]], x[t0 + rows[q + 3]])
    for q in range(f4, f):
        for j in range(m):
            xt[j, q] = x[t0 + rows[q], j]


@njit(cache=True, fastmath=False, forceinline=True)
def _four_dists(xt, rv, cen, c0, c1, c2, c3, acc):  # pragma: no cover - compiled
    """Squared distances of the tile's rows to centres ``c0..c3`` into ``acc[0..3, :rv]``.

    Every distance is the sum of ``(x[i, j] - cen[c, j])**2`` over ``j = 0 ..
    m-1`` in that order, in float64, one rounding per operation (no fastmath,
    so no FMA and no reassociation): the same number the GPU kernels and a
    plain loop compute.  What changes is only which sums run side by side: the
    innermost loop runs over the rows of the tile (LLVM vectorises it, one lane
    per row), four centres share each load of an attribute, and four
    attributes are added in a row (in order) before the partial sum goes back
    to memory, so that the loop is bound by arithmetic, not by loads and stores.
    """
    m = xt.shape[0]
    a0 = acc[0]
    a1 = acc[1]
    a2 = acc[2]
    a3 = acc[3]
    m4 = m - m % 4
    for r in range(rv):
        a0[r] = 0.0
        a1[r] = 0.0
        a2[r] = 0.0
        a3[r] = 0.0
    for j in range(0, m4, 4):
        p0 = cen[c0, j]
        p1 = cen[c1, j]
        p2 = cen[c2, j]
        p3 = cen[c3, j]
        q0 = cen[c0, j + 1]
        q1 = cen[c1, j + 1]
        q2 = cen[c2, j + 1]
        q3 = cen[c3, j + 1]
        u0 = cen[c0, j + 2]
        u1 = cen[c1, j + 2]
        u2 = cen[c2, j + 2]
        u3 = cen[c3, j + 2]
        v0 = cen[c0, j + 3]
        v1 = cen[c1, j + 3]
        v2 = cen[c2, j + 3]
        v3 = cen[c3, j + 3]
        xp = xt[j]
        xq = xt[j + 1]
        xu = xt[j + 2]
        xv = xt[j + 3]
        for r in range(rv):
            e = xp[r]
            f = xq[r]
            g = xu[r]
            h = xv[r]
            # (((d + t_j^2) + t_j+1^2) + t_j+2^2) + t_j+3^2: attribute order
            tp = e - p0
            tq = f - q0
            tu = g - u0
            tv = h - v0
            a0[r] = (((a0[r] + tp * tp) + tq * tq) + tu * tu) + tv * tv
            tp = e - p1
            tq = f - q1
            tu = g - u1
            tv = h - v1
            a1[r] = (((a1[r] + tp * tp) + tq * tq) + tu * tu) + tv * tv
            tp = e - p2
            tq = f - q2
            tu = g - u2
            tv = h - v2
            a2[r] = (((a2[r] + tp * tp) + tq * tq) + tu * tu) + tv * tv
            tp = e - p3
            tq = f - q3
            tu = g - u3
            tv = h - v3
            a3[r] = (((a3[r] + tp * tp) + tq * tq) + tu * tu) + tv * tv
    for j in range(m4, m):
        p0 = cen[c0, j]
        p1 = cen[c1, j]
        p2 = cen[c2, j]
        p3 = cen[c3, j]
        xp = xt[j]
        for r in range(rv):
            e = xp[r]
            tp = e - p0
            a0[r] += tp * tp
            tp = e - p1
            a1[r] += tp * tp
            tp = e - p2
            a2[r] += tp * tp
            tp = e - p3
            a3[r] += tp * tp


@njit(cache=True, fastmath=False, forceinline=True)
def _one_dist(xt, rv, cen, c0, acc):  # pragma: no cover - compiled
    """:func:`_four_dists` for one centre, into ``acc[0, :rv]``: the same operations, so the same bits."""
    m = xt.shape[0]
    a0 = acc[0]
    m4 = m - m % 4
    for r in range(rv):
        a0[r] = 0.0
    for j in range(0, m4, 4):
        p0 = cen[c0, j]
        q0 = cen[c0, j + 1]
        u0 = cen[c0, j + 2]
        v0 = cen[c0, j + 3]
        xp = xt[j]
        xq = xt[j + 1]
        xu = xt[j + 2]
        xv = xt[j + 3]
        for r in range(rv):
            tp = xp[r] - p0
            tq = xq[r] - q0
            tu = xu[r] - u0
            tv = xv[r] - v0
            a0[r] = (((a0[r] + tp * tp) + tq * tq) + tu * tu) + tv * tv
    for j in range(m4, m):
        p0 = cen[c0, j]
        xp = xt[j]
        for r in range(rv):
            tp = xp[r] - p0
            a0[r] += tp * tp


@njit(cache=True, fastmath=False)
def _nearest_tile(x, t0, rt, cen, xt, acc, best_d, best):  # pragma: no cover - compiled
    """Nearest centre for rows ``t0 .. t0+rt-1`` of ``x``.

    Parameters
    ----------
    x : ndarray, shape (n, m), float64
    t0, rt : int
        First row and number of rows, ``rt <= T``.
    cen : ndarray, shape (k, m), float64
    xt : ndarray, shape (m, >= T), float64
        Scratch: the tile, transposed.
    acc : ndarray, shape (_GROUP, T), float64
        Scratch: the distances of the rows to one group of centres.
    best_d : ndarray, shape (T,), float64
        Out: squared distance to the nearest centre, for ``r < rt``.
    best : ndarray, shape (T,), int64
        Out: index of the nearest centre, for ``r < rt``.

    Notes
    -----
    The distances are :func:`_four_dists`' (exact float64, attribute order).
    """
    _load_tile(x, t0, rt, xt)
    _nearest_loaded(xt, min(best_d.shape[0], (rt + 7) // 8 * 8), cen, acc, best_d, best, best_d, False)


@njit(cache=True, fastmath=False, forceinline=True)
def _nearest_loaded(xt, rv, cen, acc, best_d, best, second_d, want_second):  # pragma: no cover - compiled
    """Nearest centre (``best``, ``best_d``) of the ``rv`` rows loaded in ``xt``; with ``want_second``
    also the second-smallest squared distance (``second_d``, ``inf`` when K = 1).

    ``rv`` is whole 8-wide vectors: the extra columns of ``xt`` hold zeros or rows
    of an earlier tile, finite numbers whose distances are never read.
    """
    k = cen.shape[0]
    for c0 in range(0, k, _GROUP):
        # a short last group repeats the last centre; the copies are not compared
        _four_dists(xt, rv, cen, c0, min(c0 + 1, k - 1), min(c0 + 2, k - 1), min(c0 + 3, k - 1), acc)
        first = 0
        if c0 == 0:
            a0 = acc[0]
            for r in range(rv):
                best_d[r] = a0[r]
                best[r] = 0
            if want_second:
                for r in range(rv):
                    second_d[r] = np.inf
            first = 1
        for g in range(first, min(_GROUP, k - c0)):
            a = acc[g]
            c = c0 + g
            if want_second:
                for r in range(rv):
                    v = a[r]
                    bd = best_d[r]
                    # v < bd: the old best becomes the second; else v may be
                    second_d[r] = min(second_d[r], max(bd, v))
            for r in range(rv):
                # strict '<' in increasing centre order, starting from centre 0:
                # ties go to the lowest centre index (the backends' contract)
                # and NaNs behave exactly as in a plain argmin loop
                v = a[r]
                bd = best_d[r]
                lt = v < bd
                best_d[r] = v if lt else bd
                best[r] = c if lt else best[r]


@njit(cache=True, forceinline=True)
def exact_search(x, t0, rows, f, cen, xt, acc, best_d, best, second_d):  # pragma: no cover - compiled
    """Nearest centres of rows ``t0 + rows[q]``, ``q < f`` (``f <= T``), every distance exact.

    On return ``best[q]``, ``best_d[q]`` and ``second_d[q]`` are row ``q``'s
    nearest centre, its squared distance and the second-smallest squared
    distance (:func:`_nearest_loaded`; the same labels and distances as
    :func:`_nearest_tile`).
    """
    _load_rows(x, t0, rows, f, xt)
    _nearest_loaded(xt, min(best_d.shape[0], (f + 7) // 8 * 8), cen, acc, best_d, best, second_d, True)


@njit(cache=True, forceinline=True)
def _four_chains(xa, xb, xc, xd, ca, cb, cc, cd):  # pragma: no cover - compiled
    """``|xa - ca|², |xb - cb|², |xc - cc|², |xd - cd|²`` (rows of m values), each in attribute
    order with one rounding per operation (the bits of :func:`_four_dists`), side by side: four
    independent chains of additions."""
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
    """Element ``g`` of :func:`_four_chains`' four distances (a tuple takes only constant indices)."""
    return d4[0] if g == 0 else (d4[1] if g == 1 else (d4[2] if g == 2 else d4[3]))


@njit(cache=True, forceinline=True)
def nearest_two(xr, cen):  # pragma: no cover - compiled
    """The nearest centre of one row ``xr`` (m,), its squared distance, and the second-smallest one.

    Four centres side by side (:func:`_four_chains`: the exact kernels' bits),
    strict '<' in increasing centre order (ties to the lowest index), as
    :func:`_nearest_tile`; ``inf`` for the second when K = 1.
    """
    k = cen.shape[0]
    best = 0
    best_d = np.inf
    second = np.inf
    for c0 in range(0, k, 4):
        d4 = _four_chains(xr, xr, xr, xr, cen[c0], cen[min(c0 + 1, k - 1)], cen[min(c0 + 2, k - 1)],
                          cen[min(c0 + 3, k - 1)])
        for g in range(min(4, k - c0)):
            v = _nth(d4, g)
            if c0 + g == 0:
                best_d = v
            else:
                second = min(second, max(best_d, v))
                if v < best_d:
                    best_d = v
                    best = c0 + g
    return best, best_d, second


@njit(cache=True, forceinline=True)
def label_dists(x, t0, rows, f, cen, lab, dt):  # pragma: no cover - compiled
    """``dt[r] = |x[t0 + r] - cen[lab[r]]|²`` (exact, attribute order) for ``r = rows[q]``, ``q < f``.

    Four rows side by side (:func:`_four_chains`); past ``f`` the last row is
    repeated (its value is not stored).
    """
    for q in range(0, f, 4):
        ra = rows[q]
        rb = rows[min(q + 1, f - 1)]
        rc = rows[min(q + 2, f - 1)]
        rd = rows[min(q + 3, f - 1)]
        d4 = _four_chains(x[t0 + ra], x[t0 + rb], x[t0 + rc], x[t0 + rd], cen[lab[ra]], cen[lab[rb]], cen[lab[rc]],
                          cen[lab[rd]])
        for g in range(min(4, f - q)):
            dt[rows[q + g]] = _nth(d4, g)


@njit(cache=True, forceinline=True)
def _prefetch_row(x, i):  # pragma: no cover - compiled
    """Ask for the cache lines of row ``i`` of ``x`` (none past the last row)."""
    n, m = x.shape
    if i < n:
        for j in range(0, m, 8):  # 8 float64: a 64-byte line
            prefetch(x, i * m + j)


@njit(cache=True, forceinline=True)
def _cand_dists(x, t0, rt, cands, tile, xt, acc, dists):  # pragma: no cover - compiled
    """Exact squared distances of rows ``t0 .. t0+rt-1`` to every candidate into ``dists[:, t0:t0+rt]``.

    :func:`_four_dists`' numbers (exact, attribute order), ``tile`` rows at a
    time through the transposed scratch ``xt`` (m, >= tile) and ``acc`` (_GROUP, tile).
    """
    t = cands.shape[0]
    end = t0 + rt
    for s0 in range(t0, end, tile):
        srt = min(tile, end - s0)
        rv = (srt + 7) // 8 * 8 if srt + 7 < tile else tile
        _load_tile(x, s0, srt, xt)
        for c0 in range(0, t, _GROUP):
            if t - c0 >= _GROUP:
                _four_dists(xt, rv, cands, c0, c0 + 1, c0 + 2, c0 + 3, acc)
            else:  # the last few one at a time: no distances computed only to be dropped
                for g in range(t - c0):
                    _one_dist(xt, rv, cands, c0 + g, acc[g:])
            for g in range(min(_GROUP, t - c0)):
                dc = dists[c0 + g]
                a = acc[g]
                for r in range(srt):
                    dc[s0 + r] = a[r]


@njit(cache=True, forceinline=True)
def _add_potentials(d2, dc, w, use_w, t0, rt, f1, f2, hi_b, lo_b, vm_b, c):  # pragma: no cover - compiled
    """Rows ``t0 .. t0+rt-1``' ``v = min(D², dc) (* w)`` added, in fixed point, to candidate ``c``'s
    limbs ``hi_b[c]``, ``lo_b[c]`` (integers: any order gives the same total); the largest into ``vm_b[c]``.
    Returns how many of the rows have ``dc < D²`` (the candidate would capture them)."""
    end = t0 + rt
    h, lw, vm = fixed_potential(d2[t0:end], dc[t0:end], w[t0:end] if use_w else w, use_w, f1, f2)
    hi_b[c] += h
    lo_b[c] += lw
    vm_b[c] = max(vm_b[c], vm)
    captured = 0
    for i in range(t0, end):
        captured += dc[i] < d2[i]
    return captured


@njit(parallel=True, cache=True, fastmath=False)
def _tile_dist2(x, c, tile, out):  # pragma: no cover - compiled
    """Every row's exact squared distance to one point ``c`` (1, m), the tile form, into ``out`` (n,)."""
    n, m = x.shape
    nb = min(n, 256)
    for b in prange(nb):
        xt = np.zeros((m, tile + _PAD), dtype=np.float64)
        acc = np.empty((_GROUP, tile), dtype=np.float64)
        end = n * (b + 1) // nb
        for t0 in range(n * b // nb, end, tile):
            rt = min(tile, end - t0)
            rv = (rt + 7) // 8 * 8 if rt + 7 < tile else tile
            _load_tile(x, t0, rt, xt)
            _one_dist(xt, rv, c, 0, acc)
            a = acc[0]
            for r in range(rt):
                out[t0 + r] = a[r]
