"""The CPU step and assignment passes: Hamerly's bounds first, the nearest-centre search only where they fail.

Once the centres settle, most rows keep their centre from one iteration to
the next, and a search over all K centres finds what was known.  Each row
keeps a lower bound ``l`` on its distance to every centre other than its own
(Hamerly, "Making k-means even faster", SDM 2010).  When the centres move by
``delta_j``, the triangle inequality gives ``l - max_{j != a} delta_j`` as the
new bound; a row whose exact distance ``d`` to its own centre ``a`` is still
below it keeps ``a`` without any other distance computed.  The others are
searched by the step's plan (the certified float32 screen of :mod:`.certified`,
or the exact kernels of :mod:`.tiles`), which also gives them a new bound.

Nothing here changes a bit of the result.  Every quantity is a rigorous bound
on the real (exact) distances, with the float64 rounding of each computed
distance, move and bound folded into a relative margin ``eps`` (a few hundred
units in the last place at the most), and a row passes only when its computed
distance is strictly below every other centre's computed distance:

* a computed squared distance is within ``(m + 3) u`` of the exact one
  (``u = 2^-53``; m non-negative terms, one rounding per operation), so with
  ``eps = 4 (m + 4) u`` the test ``d (1 + eps)^2 < (l (1 - eps))^2`` implies
  ``fl(d_a) < fl(d_j)`` for every other centre ``j``: the exact kernels' label,
  ties included (a tie never passes);
* bounds are kept in ``[_LOWER_MIN, _LOWER_MAX]`` (below: no test; above:
  lowered), so squares stay normal numbers and finite;
* a move is ``sqrt(sum of squared differences) (1 + eps)`` plus the most that
  attributes below float64's normal range can add; a move that is not finite
  makes every bound fail.

The distance to the row's centre is the one the sums need anyway (the SSE is
the sum of exact distances), so a kept row costs ``m`` operations instead of
the search's ``k m``.  The labels, distances, sums, counts and SSE are those of
the exact kernels (:func:`mpikmeans.backends.cpu.tiles._lloyd_pass`), for any
thread count, with or without bounds.
"""

from __future__ import annotations

import numpy as np

from ...jit import njit, prange
from .certified import gap_bound, is_certified, screen_search
from .tiles import _GROUP, _PAD, _four_chains, _nth, _prefetch_row, exact_search, label_dists

#: float64 unit roundoff
_U64 = 2.0 ** -53
#: bounds below this are not tested (their squares would leave float64's normal range)
_LOWER_MIN = 1.0e-140
#: bounds are lowered to this (their squares stay finite); any lower bound may be lowered
_LOWER_MAX = 1.0e150
#: the most that one attribute whose difference is below 2^-500 adds to a move (its square underflows)
_SUBNORMAL_MOVE = 2.0 ** -500


@njit(cache=True)
def bound_eps_c(m):  # pragma: no cover - compiled
    """The relative margin of every bound for rows of ``m`` attributes: ``4 (m + 4) u``."""
    return 4.0 * (m + 4) * _U64


def bound_eps(m: int) -> float:
    """:func:`bound_eps_c` from Python."""
    return float(bound_eps_c(int(m)))


def centre_moves(old: np.ndarray, new: np.ndarray) -> tuple:
    """Upper bounds on how far each centre moved: the largest, its centre, and the second largest.

    Parameters
    ----------
    old, new : ndarray, shape (k, m), float64

    Returns
    -------
    first : float
        The largest move (``inf`` when any move is not finite).
    which : int
        Its centre.
    second : float
        The largest move of the other centres (0 when K = 1).
    """
    k, m = new.shape
    eps = bound_eps(m)
    with np.errstate(over="ignore", invalid="ignore"):
        diff = new - old
        moves = np.sqrt(np.einsum("ij,ij->i", diff, diff)) * (1.0 + eps) + np.sqrt(m) * _SUBNORMAL_MOVE
    moves[~np.isfinite(moves)] = np.inf
    which = int(np.argmax(moves))
    first = float(moves[which])
    second = float(np.delete(moves, which).max()) if k > 1 else 0.0
    return first, which, second


@njit(cache=True, forceinline=True)
def _keep(x, t0, rt, cen, labels, lower, first, which, second, eps, lab, dt, low, rows):  # pragma: no cover
    """The rows of the tile ``t0 .. t0+rt-1`` that keep their centre; the others listed in ``rows``.

    A kept row ``r`` gets its label ``lab[r]``, its exact squared distance
    ``dt[r]`` and its new bound ``low[r]``; the others are ``rows[:f]``
    (tile-relative).  Returns ``f``.

    The four distances computed side by side are those of rows a quarter of
    the tile apart: each of the four walks through memory in order, which the
    hardware prefetchers follow (four neighbouring rows side by side cost 2.8
    times as much from memory: 2 10^5 x 100 on one Zen 4 core, 27.6 against
    9.8 ms).
    """
    k = cen.shape[0]
    up = (1.0 + eps) * (1.0 + eps)
    h = (rt + 3) // 4
    f = 0
    for q in range(h):
        ra = q
        rb = min(q + h, rt - 1)
        rc = min(q + 2 * h, rt - 1)
        rd = min(q + 3 * h, rt - 1)
        # a label out of range (none yet, or a centre dropped) computes with centre 0 and fails below
        ca = labels[t0 + ra] if 0 <= labels[t0 + ra] < k else 0
        cb = labels[t0 + rb] if 0 <= labels[t0 + rb] < k else 0
        cc = labels[t0 + rc] if 0 <= labels[t0 + rc] < k else 0
        cd = labels[t0 + rd] if 0 <= labels[t0 + rd] < k else 0
        d4 = _four_chains(x[t0 + ra], x[t0 + rb], x[t0 + rc], x[t0 + rd], cen[ca], cen[cb], cen[cc], cen[cd])
        for g in range(4):
            r = q + g * h
            if r >= rt:
                break
            a = labels[t0 + r]
            d = _nth(d4, g)
            bound = lower[t0 + r] - (second if a == which else first)
            margin = bound * (1.0 - eps)
            if 0 <= a < k and bound > _LOWER_MIN and d * up < margin * margin:
                lab[r] = a
                dt[r] = d
                low[r] = margin
            else:
                rows[f] = r
                f += 1
    return f


@njit(cache=True, forceinline=True)
def _lower_from(d, gap, eps):  # pragma: no cover - compiled
    """``sqrt(d (1 - eps) + gap) (1 - eps)`` clipped to the bounds' range (0 where nothing is bounded)."""
    v = d * (1.0 - eps) + gap
    if not v > 0.0:  # NaN too
        return 0.0
    return min(np.sqrt(v) * (1.0 - eps), _LOWER_MAX)


@njit(cache=True, forceinline=True)
def _search(x, t0, rows, f, cen, screen, shift, zt, cc, zlim, tolf, eps, sbuf, ebuf, lab, dt, low):  # pragma: no cover
    """Labels, exact squared distances and new bounds of rows ``t0 + rows[q]``, ``q < f``, by the plan.

    ``screen``: the certified float32 screen (a certified row's bound from its
    float32 gap; a row computed exactly gets no bound); else the exact kernels
    (the bound from the exact second-nearest distance).  Returns how many rows
    took the screen's exact path.
    """
    exact = 0
    if screen:
        ys, est_flat, yy, b1, b2, i1 = sbuf
        exact = screen_search(x, t0, rows, f, cen, shift, zt, cc, zlim, tolf, ys, est_flat, yy, b1, b2, i1)
        for q in range(f):
            lab[rows[q]] = i1[q]
        label_dists(x, t0, rows, f, cen, lab, dt)
        for q in range(f):
            # a row computed exactly was a near tie: no bound (it is searched again next step)
            certain = is_certified(b1[q], b2[q], yy[q], zlim, tolf)
            low[rows[q]] = _lower_from(dt[rows[q]], gap_bound(b1[q], b2[q], yy[q], zlim, tolf), eps) if certain else 0.0
    else:
        xt, acc, best_d, best, second_d = ebuf
        exact_search(x, t0, rows, f, cen, xt, acc, best_d, best, second_d)
        for q in range(f):
            r = rows[q]
            lab[r] = best[q]
            dt[r] = best_d[q]
            low[r] = _lower_from(second_d[q], 0.0, eps)
    return exact


@njit(cache=True, forceinline=True)
def _sum_rows(x, t0, rt, lab, dt, labels, weights, use_weights, sums, counts, sse, ahead):  # pragma: no cover
    """Add the tile's rows, in increasing index (the exact kernels' order), to their clusters' sums
    and counts, and their weighted squared distances ``dt`` to ``sse``; store the labels ``lab``.
    Returns the new ``sse`` (one running sum over the block's rows, as the exact kernels add it) and
    how many labels changed.  Asks for the rows ``ahead`` rows on meanwhile (the next tile's)."""
    m = x.shape[1]
    changed = 0
    for r in range(rt):
        i = t0 + r
        _prefetch_row(x, i + ahead)
        bi = lab[r]
        if labels[i] != bi:
            changed += 1
            labels[i] = bi
        row = x[i]
        acc = sums[bi]
        if use_weights:
            w = weights[i]
            counts[bi] += w
            for j in range(m):
                acc[j] += w * row[j]
            sse += w * dt[r]
        else:
            # w = 1: w * v is v, the same sums as the weighted form without its multiplies
            counts[bi] += 1.0
            for j in range(m):
                acc[j] += row[j]
            sse += dt[r]
    return sse, changed


@njit(cache=True, forceinline=True)
def _buffers(screen, tile, k, m):  # pragma: no cover - compiled
    """One thread's scratch: the plan's search buffers (the other plan's left empty) and the tile's
    labels, distances, bounds and searched rows."""
    ts = tile if screen else 0
    te = 0 if screen else tile
    sbuf = (np.zeros((ts, m), dtype=np.float32), np.zeros(k * ts, dtype=np.float32), np.empty(ts, dtype=np.float32),
            np.empty(ts, dtype=np.float32), np.empty(ts, dtype=np.float32), np.empty(ts, dtype=np.int32))
    ebuf = (np.zeros((m, te + _PAD)), np.empty((_GROUP, te)), np.empty(te), np.empty(te, dtype=np.int64), np.empty(te))
    tbuf = (np.empty(tile, dtype=np.int32), np.empty(tile), np.empty(tile), np.empty(tile, dtype=np.int64))
    return sbuf, ebuf, tbuf


@njit(cache=True, forceinline=True)
def _tile(x, t0, rt, cen, labels, lower, use_bounds, moves, plan, eps, sbuf, ebuf, tbuf):  # pragma: no cover
    """The tile's labels, exact distances and new bounds (in ``tbuf``): kept by the bounds, else searched.
    Returns (rows searched, rows the screen computed exactly)."""
    lab, dt, low, rows = tbuf
    if use_bounds:
        f = _keep(x, t0, rt, cen, labels, lower, moves[0], moves[1], moves[2], eps, lab, dt, low, rows)
    else:
        f = rt
        for r in range(rt):
            rows[r] = r
    exact = 0
    if f:
        screen, shift, zt, cc, zlim, tolf = plan
        exact = _search(x, t0, rows, f, cen, screen, shift, zt, cc, zlim, tolf, eps, sbuf, ebuf, lab, dt, low)
    return f, exact


@njit(parallel=True, cache=True)
def step_pass(x, cen, plan, tile, labels, lower, use_bounds, moves, weights, use_weights, part_sums, part_counts,
              part_sse, part_changed, part_searched, part_exact):  # pragma: no cover - compiled
    """A Lloyd step: labels (kept by the bounds, else searched by the plan), then sums, counts, SSE.

    Parameters
    ----------
    x : ndarray, shape (n, m), float64
    cen : ndarray, shape (k, m), float64
    plan : tuple
        ``(screen, shift, zt, cc, zlim, tolf)``: search with the float32 screen
        (:func:`mpikmeans.backends.cpu.certified.centre_data`'s values) or, with
        ``screen`` False, with the exact kernels.
    tile : int
        Rows per tile (the plan's).
    labels : ndarray, shape (n,), int32
        In: the last step's labels (-1: none); out: this step's.
    lower : ndarray, shape (n,), float64
        In: the last step's bounds; out: this step's (read only with ``use_bounds``).
    use_bounds : bool
        The last step's labels and bounds hold for centres ``moves`` away.
    moves : tuple
        :func:`centre_moves`' ``(first, which, second)``.
    weights : ndarray, shape (n,) or (0,), float64
    use_weights : bool
    part_sums, part_counts, part_sse, part_changed, part_searched, part_exact : ndarray
        Out, one entry per row block (``part_sums.shape[0]`` blocks): sums
        (nb, k, m), counts (nb, k), SSE, labels changed, rows searched, rows
        the screen computed exactly.

    Notes
    -----
    Block ``b`` of ``nb`` (rows ``n b / nb`` to ``n (b + 1) / nb``) is summed in
    row order, as :func:`mpikmeans.backends.cpu.tiles._lloyd_pass` sums it: the
    same bits for any thread count.
    """
    n, m = x.shape
    k = cen.shape[0]
    nb = part_sums.shape[0]
    eps = bound_eps_c(m)
    for b in prange(nb):
        sbuf, ebuf, tbuf = _buffers(plan[0], tile, k, m)
        lab, dt, low, _ = tbuf
        lo = n * b // nb
        hi = n * (b + 1) // nb
        sums = part_sums[b]
        counts = part_counts[b]
        sums[:, :] = 0.0
        counts[:] = 0.0
        sse = 0.0
        changed = 0
        searched = 0
        exact = 0
        for t0 in range(lo, hi, tile):
            rt = min(tile, hi - t0)
            f, e = _tile(x, t0, rt, cen, labels, lower, use_bounds, moves, plan, eps, sbuf, ebuf, tbuf)
            searched += f
            exact += e
            for r in range(rt):
                lower[t0 + r] = low[r]
            sse, moved = _sum_rows(x, t0, rt, lab, dt, labels, weights, use_weights, sums, counts, sse, tile)
            changed += moved
        part_sse[b] = sse
        part_changed[b] = changed
        part_searched[b] = searched
        part_exact[b] = exact


@njit(parallel=True, cache=True)
def assign_pass(x, cen, plan, tile, labels, lower, use_bounds, moves, out_labels, out_dist2):  # pragma: no cover
    """Nearest centre and exact squared distance of every row (:func:`step_pass`'s labels and distances),
    without changing ``labels`` or ``lower``; returns how many rows were searched."""
    n, m = x.shape
    k = cen.shape[0]
    nb = min(n, 256)
    eps = bound_eps_c(m)
    searched = np.zeros(nb, dtype=np.int64)
    for b in prange(nb):
        sbuf, ebuf, tbuf = _buffers(plan[0], tile, k, m)
        lab, dt, _, _ = tbuf
        hi = n * (b + 1) // nb
        for t0 in range(n * b // nb, hi, tile):
            rt = min(tile, hi - t0)
            f, _ = _tile(x, t0, rt, cen, labels, lower, use_bounds, moves, plan, eps, sbuf, ebuf, tbuf)
            searched[b] += f
            for r in range(rt):
                _prefetch_row(x, t0 + r + tile)
                out_labels[t0 + r] = lab[r]
                out_dist2[t0 + r] = dt[r]
    return searched.sum()
