"""k-means++'s greedy step on the CPU, screened in float32 and certified: the exact potentials, fewer float64 operations.

Each new centre of k-means++ costs one pass over the rows for its ``t``
candidates: every row's ``v = min(D², |x - c|²)`` (times its weight), summed in
fixed point (:func:`potentials_pass`; unscreened, every distance by the exact
kernels' tile form, :func:`.tiles._cand_dists`).  After the
first few centres most rows are far nearer a centre already chosen than any
candidate, and ``min(D², d) = D²`` whatever ``d`` is, to the last bit.  So the
distances are first estimated in float32, as the Lloyd screen does
(:mod:`.certified`): on rows shifted by a point ``s`` (``y = x - s``, ``z = c -
s``), ``e = |y|² + |z|² - 2 y.z``, the products of a tile of rows and the
candidates one ``sgemm``.  Where ``e`` minus a rigorous bound on its error
still exceeds D², the row keeps D²; every other row gets its exact float64
distance in attribute order, the number the exact kernel computes.  The
potentials, the largest values and the lowered D² are therefore the exact
kernel's, bit for bit.

The bound.  With ``u = 2^-24``, ``y_j = fl32(fl64(x_j - s_j))`` and ``z_j`` alike
are within a relative ``u (1 + 2^-29)`` of ``a_j = x_j - s_j`` and ``b_j = c_j - s_j``,
so ``|(y - z)² - (a - b)²| <= 4 u (|a|² + |b|²)`` (Cauchy-Schwarz, and ``|a - b|² <=
2 (|a|² + |b|²)``).  The float32 sums ``|y|²`` and ``-2 y.z`` in any order, and
``|z|²`` rounded once, add at most ``(2 m + 1)(1 + eps) u (|y|² + |z|²)``, and the
exact kernel's own float64 sum is within ``(m + 2) 2^-53 |x - c|²`` of the true
value.  All of it, about ``(2 m + 5) u (|y|² + |z|²)``, is below ``tol = 2.1 (m +
5) u (|y|² + zlim)`` with ``zlim >= 2 max |z|²`` (:func:`.certified.centre_data`'s
certificate, which covers the same terms for two centres); products and values
below float32's normal range err by less than the ``1e-36`` added to it.  A row
keeps D² when ``e - tol > D²``.  Rows whose
``|y|² + zlim`` reaches ``1e30`` (float32 overflow) or whose D² or estimate is not
a number never pass that test and are computed exactly.

The float32 rows ``y`` are computed once per seeding and kept (``n m`` float32,
half the rows' own size) when memory allows: a pass then reads 4 bytes a value
instead of 8 and converts nothing; otherwise each pass converts its tiles again.
"""

from __future__ import annotations

import numpy as np

from ...exact import fixed_limbs
from ...jit import njit, prange
from .certified import _BIG, _TINY, _U32, _shifted_rows
from .tiles import _GROUP, _PAD, _add_potentials, _cand_dists, _four_chains


def candidate_data(cands: np.ndarray, shift: np.ndarray) -> tuple:
    """What the float32 screen needs of this pass's candidates.

    Parameters
    ----------
    cands : ndarray, shape (t, m), float64
    shift : ndarray, shape (m,), float64
        ``s``, the point the rows were shifted by.

    Returns
    -------
    zm : ndarray, shape (m, t), float32
        ``-2 z`` transposed, ``z = float32(c - s)``.
    cc : ndarray, shape (t,), float32
        ``|z|²`` (float64 sum, rounded once).
    zlim : float32
        ``2 max |z|²`` with a margin (inf when a candidate is not finite: every
        row is then computed exactly).
    tolf : float32
        The bound's factor ``2.1 (m + 5) u``.
    """
    t, m = cands.shape
    with np.errstate(over="ignore", invalid="ignore"):
        z = (cands - shift).astype(np.float32)
        z64 = z.astype(np.float64)
        norms = np.einsum("ij,ij->i", z64, z64)
        zm = np.ascontiguousarray(np.multiply(z, np.float32(-2.0)).T)
        cc = norms.astype(np.float32)
    finite = bool(np.isfinite(cands).all()) and bool(np.isfinite(norms).all())
    zlim = min(2.0 * float(norms.max()) * (1.0 + 1e-6), 3.0e38) if finite else np.inf
    return zm, cc, np.float32(zlim), np.float32(2.1 * (m + 5) * _U32)


@njit(parallel=True, cache=True)
def shifted_rows(x, shift, ys, yy):  # pragma: no cover - compiled
    """Every row as float32 ``y = x - s`` into ``ys`` (n, m) and ``|y|²`` (float32) into ``yy`` (n,)."""
    n = x.shape[0]
    nb = min(n, 256)
    for b in prange(nb):
        lo = n * b // nb
        hi = n * (b + 1) // nb
        _shifted_rows(x, lo, hi - lo, shift, ys[lo:hi], yy[lo:hi])


@njit(cache=True, forceinline=True)
def _exact_pairs(x, t0, cands, pr, pc, p, npairs, dists):  # pragma: no cover - compiled
    """Exact ``|x[t0 + pr[q]] - cands[pc[q]]|²`` into ``dists[pc[q], t0 + pr[q]]`` for ``q = p .. p+3``.

    Each in attribute order with one rounding per operation (the exact kernels'
    number); four pairs side by side, four independent chains of additions
    (one chain alone waits on each addition).  Past ``npairs`` the last pair is
    repeated.
    """
    qa = p
    qb = min(p + 1, npairs - 1)
    qc = min(p + 2, npairs - 1)
    qd = min(p + 3, npairs - 1)
    da, db, dc, de = _four_chains(x[t0 + pr[qa]], x[t0 + pr[qb]], x[t0 + pr[qc]], x[t0 + pr[qd]], cands[pc[qa]],
                                  cands[pc[qb]], cands[pc[qc]], cands[pc[qd]])
    dists[pc[qa], t0 + pr[qa]] = da
    dists[pc[qb], t0 + pr[qb]] = db
    dists[pc[qc], t0 + pr[qc]] = dc
    dists[pc[qd], t0 + pr[qd]] = de


@njit(parallel=True, cache=True)
def potentials_pass(x, screen, ys_all, yy_all, resident, shift, cands, zm, cc, zlim, tolf, d2, w, use_w, f1, f2, tile,
                    xtile, dists, hi, lo, vmax, part_near):  # pragma: no cover - compiled
    """k-means++'s greedy step for ``t`` candidates in one pass over the rows: exact potentials.

    Per candidate ``c`` and row block ``b``: the exact fixed-point total of
    ``v = min(D², |x - c|²) (* w)`` (``hi``, ``lo``: the integers of
    :func:`mpikmeans.exact.fixed_potential`) and the largest ``v`` (``vmax``).  The
    distances that matter are :func:`.tiles._four_dists`' (exact, attribute order);
    the per-block sums are integers, so neither threads nor blocks change the result.

    Parameters
    ----------
    x : ndarray, shape (n, m), float64
    screen : bool
        Estimate in float32 first and compute exactly only where a candidate may
        be nearer than D²; else every distance exactly (the first centres, when
        candidates capture many rows).
    ys_all, yy_all : ndarray, shape (n, m) and (n,), float32
        ``resident``: the rows shifted by ``shift`` and their ``|y|²``
        (:func:`shifted_rows`); otherwise unused (any shape) and each tile is
        converted here.
    shift : ndarray, shape (m,), float64
    cands : ndarray, shape (t, m), float64
    zm, cc, zlim, tolf
        :func:`candidate_data` of ``cands`` and ``shift`` (unused without ``screen``).
    d2 : ndarray, shape (n,), float64
        D²: each row's squared distance to its nearest centre so far.
    w : ndarray, shape (n,) or (0,), float64
        Weights, read when ``use_w``.
    f1, f2 : float
        The fixed-point scale (:func:`mpikmeans.exact.scale_factors`).
    tile, xtile : int
        Rows per tile of the screen, and of the exact kernel (:func:`.tiles._tile_rows`).
    dists : ndarray, shape (t, n), float64
        Out: ``|x - c|²``, exactly, wherever it may be below D²; else (screened
        rows) D² itself.  ``min(D², dists[c])`` is ``min(D², |x - c|²)`` either way.
    hi, lo, vmax : ndarray, shape (blocks, t)
        Out: the blocks' fixed-point limbs and largest values.
    part_near : ndarray, shape (blocks,), int64
        Out, per block: with ``screen``, the pairs computed exactly (those the
        estimates could not rule out); without, the pairs whose candidate is
        nearer than D².  What decides whether the next pass screens.
    """
    n, m = x.shape
    t = cands.shape[0]
    nb = hi.shape[0]
    for b in prange(nb):
        ybuf = np.zeros((tile if screen and not resident else 1, m), dtype=np.float32)
        yybuf = np.zeros(tile if screen and not resident else 1, dtype=np.float32)
        estbuf = np.zeros(tile * t if screen else 1, dtype=np.float32)
        tol = np.empty(tile)
        base = np.empty(tile)
        xt = np.zeros((m, xtile + _PAD), dtype=np.float64)
        acc = np.empty((_GROUP, xtile), dtype=np.float64)
        pr = np.empty(tile * t if screen else 1, dtype=np.int32)
        pc = np.empty(tile * t if screen else 1, dtype=np.int32)
        fm = np.empty(t, dtype=np.int64)
        hi_b = hi[b]
        lo_b = lo[b]
        vm_b = vmax[b]
        hi_b[:] = 0
        lo_b[:] = 0
        vm_b[:] = 0.0
        near = 0
        end = n * (b + 1) // nb
        for t0 in range(n * b // nb, end, tile):
            rt = min(tile, end - t0)
            npairs = 0
            if screen:
                npairs = _screen_candidates(t0, rt, ys_all, yy_all, resident, x, shift, zm, cc, zlim, tolf, d2,
                                            ybuf, yybuf, estbuf, tol, base, pr, pc, dists)
                near += npairs
            if not screen or npairs * 3 > rt * t:
                # unscreened, or many pairs a candidate may capture: every distance of the tile the exact
                # kernels' way (vectors over rows), cheaper then than pair after pair
                _cand_dists(x, t0, rt, cands, xtile, xt, acc, dists)
                for c in range(t):
                    captured = _add_potentials(d2, dists[c], w, use_w, t0, rt, f1, f2, hi_b, lo_b, vm_b, c)
                    if not screen:
                        near += captured
            else:
                for p in range(0, npairs, 4):
                    _exact_pairs(x, t0, cands, pr, pc, p, npairs, dists)
                _add_screened(d2, dists, w, use_w, t0, rt, f1, f2, pr, pc, npairs, fm, hi_b, lo_b, vm_b)
        part_near[b] = near


@njit(cache=True, forceinline=True)
def _screen_candidates(t0, rt, ys_all, yy_all, resident, x, shift, zm, cc, zlim, tolf, d2, ybuf, yybuf, estbuf, tol,
                       base, pr, pc, dists):  # pragma: no cover - compiled
    """:func:`potentials_pass`' screen of rows ``t0 .. t0+rt-1``.

    ``dists[c, i] = D²`` where candidate ``c`` is certainly farther than D² (then
    ``min(D², d) = D²``); the other pairs, row ``t0 + pr[p]`` and candidate
    ``pc[p]``, are listed for the exact distance.  Returns how many.
    """
    t = zm.shape[1]
    if resident:
        ys = ys_all[t0:t0 + rt]
        yy = yy_all[t0:t0 + rt]
    else:
        _shifted_rows(x, t0, rt, shift, ybuf, yybuf)
        ys = ybuf[:rt]
        yy = yybuf[:rt]
    est = estbuf[:rt * t].reshape((rt, t))
    np.dot(ys, zm, est)
    for r in range(rt):
        scale = yy[r] + zlim
        # NaN or float32 overflow: a tolerance no estimate passes
        tol[r] = np.float64(tolf * scale + _TINY) if scale < _BIG else np.inf
        base[r] = np.float64(yy[r])
    npairs = 0
    for c in range(t):
        dc = dists[c, t0:t0 + rt]
        cf = np.float64(cc[c])
        for r in range(rt):
            far = (base[r] + cf + np.float64(est[r, c])) - tol[r] > d2[t0 + r]
            dc[r] = d2[t0 + r] if far else -1.0
        for r in range(rt):
            if not dc[r] >= 0.0:
                pr[npairs] = r
                pc[npairs] = c
                npairs += 1
    return npairs


@njit(cache=True, forceinline=True)
def _add_screened(d2, dists, w, use_w, t0, rt, f1, f2, pr, pc, npairs, fm, hi_b, lo_b, vm_b):  # pragma: no cover
    """:func:`.tiles._add_potentials` for every candidate of a screened tile, the same integers and maxima.

    A row a candidate cannot capture adds ``q(w D²)`` to every candidate's
    potential: the tile's total of those is added once to each, and only the
    listed pairs are corrected to ``q(w min(D², d))`` (integers: exact in any
    order).  The largest value: every ``v <= w D²`` (weights are not negative),
    so a candidate's is the tile's largest ``w D²`` unless each row holding it
    is one of its listed pairs; then its rows are scanned.
    """
    t = hi_b.shape[0]
    th = 0
    tl = 0
    top = 0.0
    for i in range(t0, t0 + rt):
        v = d2[i] * w[i] if use_w else d2[i]
        a, z = fixed_limbs(v, f1, f2)
        th += a
        tl += z
        if v > top:
            top = v
    ntop = 0
    for i in range(t0, t0 + rt):
        ntop += (d2[i] * w[i] if use_w else d2[i]) == top
    for c in range(t):
        hi_b[c] += th
        lo_b[c] += tl
        fm[c] = 0
    for p in range(npairs):
        i = t0 + pr[p]
        c = pc[p]
        v0 = d2[i] * w[i] if use_w else d2[i]
        v = min(d2[i], dists[c, i])
        if use_w:
            v *= w[i]
        a0, z0 = fixed_limbs(v0, f1, f2)
        a1, z1 = fixed_limbs(v, f1, f2)
        hi_b[c] += a1 - a0
        lo_b[c] += z1 - z0
        fm[c] += v0 == top
    for c in range(t):
        if fm[c] < ntop:
            vm_b[c] = max(vm_b[c], top)
        else:
            vm = vm_b[c]
            for i in range(t0, t0 + rt):
                v = min(d2[i], dists[c, i])
                if use_w:
                    v *= w[i]
                if v > vm:
                    vm = v
            vm_b[c] = vm


@njit(parallel=True, cache=True)
def fixed_blocks(d2, w, use_w, f1, f2, hi, lo):  # pragma: no cover - compiled
    """Each of ``nb`` row blocks' exact total of ``q = to_fixed(w * D², s)`` as two limbs ``hi``, ``lo`` (nb,).

    The integers of :func:`mpikmeans.exact.to_fixed` (``f1 f2 = 2**s`` scales
    exactly, :func:`mpikmeans.exact.scale_factors`) and :func:`mpikmeans.exact.limb_sums`,
    on the backend's threads: a k-means++ draw reads the totals and one block
    (:class:`mpikmeans.exact.BlockFixed`) instead of prefix sums over every row.
    """
    n = d2.shape[0]
    nb = hi.shape[0]
    for b in prange(nb):
        h = 0
        lw = 0
        for i in range(n * b // nb, n * (b + 1) // nb):
            a, z = fixed_limbs(d2[i] * w[i] if use_w else d2[i], f1, f2)
            h += a
            lw += z
        hi[b] = h
        lo[b] = lw


#: the screen's break-even: it pays while the pairs computed exactly stay below about
#: ``0.04 log2(m / 8)`` of a pass's (2-core Xeon, two threads, exact against screened ms a pass:
#: m = 16, 5 % exact 27.5 / 27.2, 11 % 21 / 22; m = 32, 3 % 21 / 15.5, 16 % 20 / 23; m = 100, 5 %
#: 17 / 12, 20 % 17 / 19; m = 257, 13 % 30 / 18, 41 % 30 / 39); at most this share
SCREEN_MAX_SHARE = 0.25
#: fewest attributes for which the screen pays (below, a row's exact distances cost about what its
#: estimates and their checks do)
SCREEN_MIN_M = 16


def screen_below(m: int) -> float:
    """The share of a pass's (row, candidate) pairs computed exactly below which screening rows of ``m`` values pays."""
    return 0.0 if m < SCREEN_MIN_M else min(SCREEN_MAX_SHARE, 0.04 * float(np.log2(m / 8)))


class SeedingRows:
    """What :func:`potentials_pass` keeps across one seeding's passes: the rows in float32, and when to screen.

    Parameters
    ----------
    spare_bytes : int or None
        Memory this rank may spend on a float32 copy of its rows (``n m 4``
        bytes); without enough, each screened pass converts its tiles again.
    """

    def __init__(self, spare_bytes: int | None):
        self.spare_bytes = spare_bytes
        self.near_share = None
        self.shift = None
        self.ys = None
        self.yy = None

    def screen_next(self, m: int) -> bool:
        """Whether the next pass screens: enough attributes, and few pairs near enough to need exact distances."""
        return self.near_share is not None and self.near_share < screen_below(m)

    def record(self, near: int, pairs: int) -> None:
        """The last pass's pairs computed exactly (or captured), of ``pairs``."""
        self.near_share = near / max(1, pairs)

    def rows(self, x: np.ndarray, cands: np.ndarray) -> tuple:
        """``(shift, ys, yy, resident)`` for a screened pass over ``x`` (n, m).

        The shift is the first screened pass's candidates' mean (near the data's
        middle, so ``|y|²`` and the bound stay small), kept for the seeding so
        that the float32 rows, when kept, serve every pass.
        """
        if self.shift is None:
            self.shift = np.ascontiguousarray(cands.mean(axis=0))
            n, m = x.shape
            if self.spare_bytes is not None and n * m * 4 <= self.spare_bytes:
                self.ys = np.empty((n, m), dtype=np.float32)
                self.yy = np.empty(n, dtype=np.float32)
                shifted_rows(x, self.shift, self.ys, self.yy)
        if self.ys is None:
            return self.shift, np.zeros((1, x.shape[1]), dtype=np.float32), np.zeros(1, dtype=np.float32), False
        return self.shift, self.ys, self.yy, True
