"""The CPU step and assignment passes: bounds first, the nearest-centre search only where they fail.

Once the centres settle, most rows keep their centre from one iteration to
the next, and a search over all K centres finds what was known.  Each row
keeps a lower bound ``l`` on its distance to every centre other than its own
(Hamerly, "Making k-means even faster", SDM 2010).  When the centres move by
``delta_j``, the triangle inequality gives ``l - max_{j != a} delta_j`` as the
new bound; and a row nearer its centre ``a`` than half the distance from ``a``
to the nearest other centre is nearer ``a`` than any other (Elkan, ICML 2003).
A row whose exact distance ``d`` to its own centre is below the larger of the
two keeps ``a`` without any other distance computed.  The others are searched
by the step's plan (the certified float32 screen of :mod:`.certified`, or the
exact kernels of :mod:`.tiles`), which also gives them a new bound.

Nothing here changes a bit of the result.  Every quantity is a rigorous bound
on the real (exact) distances, with the float64 rounding of each computed
distance, move, gap and bound folded into a relative margin ``eps`` (a few
hundred units in the last place at the most), and a row passes only when its
computed distance is strictly below every other centre's computed distance:

* a computed squared distance is within ``(m + 3) u`` of the exact one
  (``u = 2^-53``; m non-negative terms, one rounding per operation), so with
  ``eps = 4 (m + 4) u`` the test ``d (1 + eps)^2 < (l (1 - eps))^2`` implies
  ``fl(d_a) < fl(d_j)`` for every other centre ``j``: the exact kernels' label,
  ties included (a tie never passes);
* a bound is tested only above ``LOWER_MIN`` (squares stay normal numbers)
  and kept below ``_LOWER_MAX`` (squares stay finite);
* a move is ``sqrt(sum of squared differences) (1 + eps)`` plus the most that
  attributes below float64's normal range can add; a move that is not finite
  makes every bound of the other labels fail.  The gaps between centres come
  from a matrix product less a bound on its rounding (:func:`half_gaps`).

The distance to the row's centre is the one the SSE needs anyway (the sum of
exact distances), so a kept row costs ``m`` operations instead of the search's
``k m``.  Rows go a chunk at a time (about 256 KB, in L2): the chunk's rows are
tested, and the ones not kept are searched a full tile at a time.  The labels
and distances are those of searching every row with the exact kernels, for any
thread count, with or without bounds; the sums are added afterwards, in fixed
point (:mod:`mpikmeans.fixedsums`).
"""

from __future__ import annotations

import numpy as np

from ...jit import njit, prange
from .certified import gap_bound, is_certified, screen_search
from .tiles import _GROUP, _PAD, _four_chains, _nth, _prefetch_row, exact_search, label_dists, nearest_two

#: float64 unit roundoff
_U64 = 2.0 ** -53
#: bounds below this are not tested (their squares would leave float64's normal range)
LOWER_MIN = 1.0e-140
#: bounds are lowered to this (their squares stay finite); any lower bound may be lowered
_LOWER_MAX = 1.0e150
#: entries of one block of :func:`half_gaps`' centre-to-centre products
_GAP_BLOCK = 1 << 21
#: the most that one attribute whose difference is below 2^-500 adds to a move (its square underflows)
_SUBNORMAL_MOVE = 2.0 ** -500


@njit(cache=True)
def bound_eps_c(m):  # pragma: no cover - compiled
    """The relative margin of every bound for rows of ``m`` attributes: ``4 (m + 4) u``."""
    return 4.0 * (m + 4) * _U64


def bound_eps(m: int) -> float:
    """:func:`bound_eps_c` from Python."""
    return float(bound_eps_c(int(m)))


def move_margins(m: int) -> tuple:
    """``(eps, floor)`` of the upper bound ``sqrt(s) (1 + eps) + floor`` on a centre's move over ``m``
    attributes (``s`` the float64 sum of squared differences, any order; ``floor``: what attributes
    below the normal range add), for :func:`centre_moves` and the GPU's moves kernel."""
    return bound_eps(m), float(np.sqrt(m)) * _SUBNORMAL_MOVE


def centre_moves(old: np.ndarray, new: np.ndarray) -> np.ndarray:
    """Upper bounds on how far each centre moved.

    Parameters
    ----------
    old, new : ndarray, shape (k, m), float64

    Returns
    -------
    ndarray, shape (k,), float64
        ``sqrt(sum of squared differences) (1 + eps) + floor`` (:func:`move_margins`);
        ``inf`` where that is not finite.
    """
    k, m = new.shape
    out = np.empty(k)
    moves = _moves_threads if k * m >= _MOVES_THREADS_MIN else _moves_one
    eps, floor = move_margins(m)
    moves(np.ascontiguousarray(old, np.float64), np.ascontiguousarray(new, np.float64), eps, floor, out)
    return out


#: K x M from which the centres' moves are summed on the rank's threads (each centre's sum on one
#: thread in attribute order: the same bits); one thread took 0.23-0.4 ms a step at K x M = 257,000
_MOVES_THREADS_MIN = 1 << 15


@njit(inline="always")
def _moves(old, new, eps, floor, out):  # pragma: no cover - compiled
    """:func:`centre_moves` into ``out`` in one pass (no K x M temporaries: 2.6e5 centre values a step
    on the GPU path's shapes)."""
    k, m = new.shape
    for i in prange(k):
        s = 0.0
        for j in range(m):
            d = new[i, j] - old[i, j]
            s += d * d
        v = np.sqrt(s) * (1.0 + eps) + floor
        out[i] = v if np.isfinite(v) else np.inf


@njit(cache=True)
def _moves_one(old, new, eps, floor, out):  # pragma: no cover - compiled
    _moves(old, new, eps, floor, out)


@njit(cache=True, parallel=True)
def _moves_threads(old, new, eps, floor, out):  # pragma: no cover - compiled
    _moves(old, new, eps, floor, out)


def half_gaps(centres: np.ndarray) -> np.ndarray:
    """Lower bounds on half the distance from each centre to its nearest other centre, less ``LOWER_MIN``.

    A row nearer its own centre ``a`` than ``half_gaps[a]`` is nearer it than
    any other (Elkan, "Using the triangle inequality to accelerate k-means",
    ICML 2003, lemma 1): ``|x - c_j| >= |c_a - c_j| - |x - c_a| > |x - c_a|``.
    The distances between centres come from one matrix product, ``|z_a|^2 +
    |z_b|^2 - 2 z_a.z_b`` on centres shifted by their mean, less a rigorous
    bound on its rounding in any order of the additions, ``4 (m + 10) u
    (|z_a|^2 + |z_b|^2)`` (the product's ``(m + 1) u`` per norm, the norms', the
    shift's, and margin); where that leaves nothing, the bound is 0.

    Parameters
    ----------
    centres : ndarray, shape (k, m), float64

    Returns
    -------
    ndarray, shape (k,), float64
        ``_LOWER_MAX`` for K = 1 (no other centre).
    """
    k, m = centres.shape
    if k == 1:
        return np.full(1, _LOWER_MAX)
    nearest = np.empty(k)
    step = max(1, _GAP_BLOCK // k)  # centres per block of the K x K products: memory stays small at any K
    with np.errstate(over="ignore", invalid="ignore"):
        z = centres - centres.mean(axis=0)
        norms = np.einsum("ij,ij->i", z, z)
        for a in range(0, k, step):
            b = min(k, a + step)
            pair = norms[a:b, None] + norms[None, :]
            d2 = pair - 2.0 * (z[a:b] @ z.T) - 4.0 * (m + 10) * _U64 * pair
            d2[np.arange(b - a), np.arange(a, b)] = np.inf
            nearest[a:b] = d2.min(axis=1)
        half = 0.5 * np.sqrt(np.where(nearest > 0.0, nearest, 0.0)) * (1.0 - bound_eps(m)) - LOWER_MIN
    half[~np.isfinite(half) | (half < 0.0)] = 0.0
    return np.minimum(half, _LOWER_MAX)


def bound_drops(moves: np.ndarray) -> np.ndarray:
    """How much the bound of a row of each label drops: the largest move of the other centres, plus
    ``LOWER_MIN`` (a bound must stay above it to be tested: squares of normal numbers).

    Parameters
    ----------
    moves : ndarray, shape (k,), float64
        :func:`centre_moves`.

    Returns
    -------
    ndarray, shape (k,), float64
    """
    k = len(moves)
    if k == 1:
        return np.full(1, LOWER_MIN)
    which = int(np.argmax(moves))
    second = float(np.delete(moves, which).max())
    drops = np.full(k, float(moves[which]) + LOWER_MIN)
    drops[which] = second + LOWER_MIN
    return drops


#: rows of more attributes than this are tested four quarter-tiles apart, shorter ones four neighbours at a time
_SPREAD_M = 32


@njit(cache=True, forceinline=True)
def _margins(labels, lower, drops, halves, eps, c0, rc, mg):  # pragma: no cover - compiled
    """``mg[r]``: the margin row ``c0 + r`` must beat to keep its centre, for ``r < rc``.

    The larger of its last bound lowered by ``drops[a]`` (the largest move of
    the centres other than its own ``a``, and ``LOWER_MIN``) and ``halves[a]``
    (:func:`half_gaps`), times ``1 - eps``; 0 when both are below 0.  A row kept
    by it (``d (1 + eps)^2 < mg^2``) is nearer ``a`` than every other centre:
    the first bounds the others' distances; by the second, they exceed
    ``2 halves[a] - sqrt(d) > halves[a]``.  So the margin is also the row's next
    bound.  The labels are the last step's, each a centre of this one (the
    backend uses bounds only then), so they index ``drops`` unchecked.  No
    branch: the loop runs in vectors (a quarter of the test's cost when each
    row worked out its own, 10^6 x 16 on one Zen 4 core).
    """
    down = 1.0 - eps
    for r in range(rc):
        a = labels[c0 + r]
        v = lower[c0 + r] - drops[a]
        h = halves[a]
        v = v if v > h else h
        mg[r] = (v if v > 0.0 else 0.0) * down


@njit(cache=True, forceinline=True)
def _keep(x, t0, rt, cen, labels, lower, update, mg, eps, lab, dt, rows):  # pragma: no cover - compiled
    """The rows of the tile ``t0 .. t0+rt-1`` that keep their centre (margins ``mg``, :func:`_margins`);
    the others listed in ``rows``.

    A kept row ``r`` gets its label ``lab[r]`` and its exact squared distance
    ``dt[r]`` (and, with ``update``, its new bound in ``lower``); the others are
    ``rows[:f]`` (tile-relative).  Returns ``f``.

    Four distances are computed side by side, for four rows none of which has
    margin 0 (those cost no distance).  Rows of more than ``_SPREAD_M``
    attributes are taken a quarter of the tile apart, so that each of the four
    walks through memory in order, which the hardware prefetchers follow
    (2 10^5 x 100 on one Zen 4 core: 9.8 ms a pass, against 27.6 for four
    neighbouring rows); shorter rows four neighbours at a time (10^6 x 16:
    4.3 against 7.5 ms).
    """
    up = (1.0 + eps) * (1.0 + eps)
    h = (rt + 3) // 4
    spread = x.shape[1] > _SPREAD_M
    gs = h if spread else 1
    f = 0
    for q in range(h):
        ra = q if spread else 4 * q
        rb = min(ra + gs, rt - 1)
        rc = min(ra + 2 * gs, rt - 1)
        rd = min(ra + 3 * gs, rt - 1)
        if mg[ra] > 0.0 or mg[rb] > 0.0 or mg[rc] > 0.0 or mg[rd] > 0.0:
            d4 = _four_chains(x[t0 + ra], x[t0 + rb], x[t0 + rc], x[t0 + rd], cen[labels[t0 + ra]],
                              cen[labels[t0 + rb]], cen[labels[t0 + rc]], cen[labels[t0 + rd]])
        else:
            d4 = (np.inf, np.inf, np.inf, np.inf)
        for g in range(4):
            r = ra + g * gs
            if r >= rt:
                break
            d = _nth(d4, g)
            if d * up < mg[r] * mg[r]:
                lab[r] = labels[t0 + r]
                dt[r] = d
                if update:
                    lower[t0 + r] = mg[r]
            else:
                rows[f] = r
                f += 1
    return f


@njit(cache=True, forceinline=True)
def _lower_from(v, eps):  # pragma: no cover - compiled
    """``sqrt(v) (1 - eps)`` for a lower bound ``v`` on a squared distance, clipped to the bounds' range
    (0 where ``v`` bounds nothing, NaN included).  No branch: a loop of these runs in vectors."""
    v = v if v > 0.0 else 0.0
    return min(np.sqrt(v) * (1.0 - eps), _LOWER_MAX)


@njit(cache=True, forceinline=True)
def _search(x, t0, rows, f, cen, plan, eps, sbuf, ebuf, lab, dt, lower, update):  # pragma: no cover - compiled
    """Labels and exact squared distances of rows ``t0 + rows[q]``, ``q < f``, by the plan (and, with
    ``update``, their new bounds in ``lower``).

    ``plan[0]``: the certified float32 screen (a certified row's bound from its
    float32 gap; a row computed exactly, a near tie, gets none and is searched
    again next step); else the exact kernels (the bound from the exact
    second-nearest distance).  Returns how many rows took the screen's exact path.
    """
    screen, shift, zt, cc, zlim, tolf = plan
    exact = 0
    if screen:
        ys, est_flat, yy, b1, b2, i1, v = sbuf
        exact = screen_search(x, t0, rows, f, cen, shift, zt, cc, zlim, tolf, ys, est_flat, yy, b1, b2, i1)
        for q in range(f):
            lab[rows[q]] = i1[q]
        label_dists(x, t0, rows, f, cen, lab, dt)
        if update:
            for q in range(f):
                certain = is_certified(b1[q], b2[q], yy[q], zlim, tolf)
                gap = gap_bound(b1[q], b2[q], yy[q], zlim, tolf)
                v[q] = dt[rows[q]] * (1.0 - eps) + gap if certain else 0.0
            for q in range(f):
                v[q] = _lower_from(v[q], eps)
            for q in range(f):
                lower[t0 + rows[q]] = v[q]
    else:
        xt, acc, best_d, best, second_d = ebuf
        exact_search(x, t0, rows, f, cen, xt, acc, best_d, best, second_d)
        for q in range(f):
            lab[rows[q]] = best[q]
            dt[rows[q]] = best_d[q]
        if update:
            for q in range(f):
                second_d[q] = _lower_from(second_d[q] * (1.0 - eps), eps)
            for q in range(f):
                lower[t0 + rows[q]] = second_d[q]
    return exact


#: bytes of rows one pass of the bounds tests covers (a chunk of rows, in L2 while its searched rows are gathered)
_CHUNK_BYTES = 1 << 18


@njit(cache=True)
def chunk_rows(tile, m):  # pragma: no cover - compiled
    """Rows per chunk: whole search tiles, about ``_CHUNK_BYTES`` of rows, at least one tile.

    The bounds test a chunk and its searched rows are gathered into full tiles
    (a search of a few rows costs nearly what a full tile does) while the
    chunk's rows are still in the cache.
    """
    return max(1, _CHUNK_BYTES // (8 * m * tile)) * tile


@njit(cache=True, forceinline=True)
def _buffers(screen, tile, chunk, k, m):  # pragma: no cover - compiled
    """One thread's scratch: the plan's search buffers for a tile (the other plan's left empty) and the
    chunk's labels, distances, searched rows and margins."""
    ts = tile if screen else 0
    te = 0 if screen else tile
    sbuf = (np.zeros((ts, m), dtype=np.float32), np.zeros(k * ts, dtype=np.float32), np.empty(ts, dtype=np.float32),
            np.empty(ts, dtype=np.float32), np.empty(ts, dtype=np.float32), np.empty(ts, dtype=np.int32),
            np.empty(ts))
    ebuf = (np.zeros((m, te + _PAD)), np.empty((_GROUP, te)), np.empty(te), np.empty(te, dtype=np.int64), np.empty(te))
    tbuf = (np.empty(chunk, dtype=np.int32), np.empty(chunk), np.empty(chunk, dtype=np.int64), np.empty(chunk))
    return sbuf, ebuf, tbuf


@njit(cache=True, forceinline=True)
def _chunk(x, c0, rc, cen, labels, lower, update, use_bounds, mg, plan, tile, eps, sbuf, ebuf,
           tbuf):  # pragma: no cover - compiled
    """The labels and exact distances of rows ``c0 .. c0+rc-1`` (in ``tbuf``; with ``update``, the new
    bounds in ``lower``): kept by their margins ``mg`` (with ``use_bounds``), else searched, ``tile``
    rows at a time.  Returns (rows searched, rows the screen computed exactly)."""
    lab, dt, rows, _ = tbuf
    if use_bounds:
        f = _keep(x, c0, rc, cen, labels, lower, update, mg, eps, lab, dt, rows)
    else:
        f = rc
        for r in range(rc):
            rows[r] = r
    exact = 0
    for s0 in range(0, f, tile):
        exact += _search(x, c0, rows[s0:], min(tile, f - s0), cen, plan, eps, sbuf, ebuf, lab, dt, lower, update)
    return f, exact


@njit(parallel=True, cache=True)
def step_pass(x, cen, plan, tile, labels, lower, use_bounds, drops, halves, out_labels, out_dist2, part_changed,
              part_searched, part_exact):  # pragma: no cover - compiled
    """A Lloyd step's assignment: labels (kept by the bounds, else searched by the plan) and exact distances.

    Parameters
    ----------
    x : ndarray, shape (n, m), float64
    cen : ndarray, shape (k, m), float64
    plan : tuple
        ``(screen, shift, zt, cc, zlim, tolf)``: search with the float32 screen
        (:func:`mpikmeans.backends.cpu.certified.centre_data`'s values) or, with
        ``screen`` False, with the exact kernels.
    tile : int
        Rows per search tile (the plan's).
    labels : ndarray, shape (n,), int32
        The last step's labels (-1: none); read only.
    lower : ndarray, shape (n,), float64
        In: the last step's bounds (read only with ``use_bounds``); out: this step's.
    use_bounds : bool
        The last step's labels (every one a centre of ``cen``) and bounds hold
        for centres that moved by less than ``drops`` says.
    drops : ndarray, shape (k,), float64
        :func:`bound_drops` of the centres' moves since the last step.
    halves : ndarray, shape (k,), float64
        :func:`half_gaps` of ``cen``.
    out_labels : ndarray, shape (n,), int32
        Out: this step's labels.
    out_dist2 : ndarray, shape (n,), float64
        Out: each row's exact squared distance to its centre.
    part_changed, part_searched, part_exact : ndarray, shape (nb,), int64
        Out, one entry per row block: labels changed, rows searched, rows the
        screen computed exactly.
    """
    nb = part_changed.shape[0]
    for b in prange(nb):
        _step_block(x, cen, plan, tile, labels, lower, use_bounds, drops, halves, out_labels, out_dist2, part_changed,
                    part_searched, part_exact, b)


@njit(cache=True)
def _step_block(x, cen, plan, tile, labels, lower, use_bounds, drops, halves, out_labels, out_dist2, part_changed,
                part_searched, part_exact, b):  # pragma: no cover - compiled
    """Row block ``b`` of :func:`step_pass`.

    A function of its own, called from the ``prange`` loop rather than written
    in it: Numba compiles a parallel loop's body less well.
    """
    n, m = x.shape
    k = cen.shape[0]
    nb = part_changed.shape[0]
    eps = bound_eps_c(m)
    chunk = chunk_rows(tile, m) if use_bounds else tile  # without bounds every row is searched: no batches to gather
    sbuf, ebuf, tbuf = _buffers(plan[0], tile, chunk, k, m)
    lab, dt, _, mg = tbuf
    lo = n * b // nb
    hi = n * (b + 1) // nb
    changed = 0
    searched = 0
    exact = 0
    for c0 in range(lo, hi, chunk):
        rc = min(chunk, hi - c0)
        if use_bounds:
            _margins(labels, lower, drops, halves, eps, c0, rc, mg)
        f, e = _chunk(x, c0, rc, cen, labels, lower, True, use_bounds, mg, plan, tile, eps, sbuf, ebuf, tbuf)
        searched += f
        exact += e
        for r in range(rc):
            i = c0 + r
            _prefetch_row(x, i + chunk)
            changed += labels[i] != lab[r]
            out_labels[i] = lab[r]
            out_dist2[i] = dt[r]
    part_changed[b] = changed
    part_searched[b] = searched
    part_exact[b] = exact


@njit(parallel=True, cache=True)
def assign_pass(x, cen, plan, tile, labels, lower, use_bounds, drops, halves, out_labels,
                out_dist2):  # pragma: no cover - compiled
    """Nearest centre and exact squared distance of every row (:func:`step_pass`'s labels and distances),
    without changing ``labels`` or ``lower``; returns how many rows were searched."""
    nb = min(x.shape[0], 256)
    searched = np.zeros(nb, dtype=np.int64)
    for b in prange(nb):
        searched[b] = _assign_block(x, cen, plan, tile, labels, lower, use_bounds, drops, halves, out_labels,
                                    out_dist2, b, nb)
    return searched.sum()


@njit(cache=True)
def _assign_block(x, cen, plan, tile, labels, lower, use_bounds, drops, halves, out_labels, out_dist2, b,
                  nb):  # pragma: no cover - compiled
    """Row block ``b`` of ``nb`` of :func:`assign_pass` (its own function, as :func:`_step_block`); returns
    how many of its rows were searched."""
    n, m = x.shape
    k = cen.shape[0]
    eps = bound_eps_c(m)
    chunk = chunk_rows(tile, m) if use_bounds else tile
    sbuf, ebuf, tbuf = _buffers(plan[0], tile, chunk, k, m)
    lab, dt, _, mg = tbuf
    hi = n * (b + 1) // nb
    searched = 0
    for c0 in range(n * b // nb, hi, chunk):
        rc = min(chunk, hi - c0)
        if use_bounds:
            _margins(labels, lower, drops, halves, eps, c0, rc, mg)
        f, _ = _chunk(x, c0, rc, cen, labels, lower, False, use_bounds, mg, plan, tile, eps, sbuf, ebuf, tbuf)
        searched += f
        for r in range(rc):
            _prefetch_row(x, c0 + r + chunk)
            out_labels[c0 + r] = lab[r]
            out_dist2[c0 + r] = dt[r]
    return searched
