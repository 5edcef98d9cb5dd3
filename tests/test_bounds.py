"""Tests for :mod:`mpikmeans.backends.cpu.bounds`: steps that skip rows by their bounds give the exact
labels, distances and sums, step after step, whatever the centres do between steps: those of a
plain NumPy search and of the same backend searching every row (``bounds=False``)."""

from fractions import Fraction

import numpy as np
import pytest

from mpikmeans.backends.cpu import CPUBackend
from mpikmeans.backends.cpu import bounds as B
from mpikmeans.fixedsums import Scales, cluster_sums, decode, sum_rows


def _nearest(x, cen):
    """Labels (ties to the lowest index) and squared distances summed in attribute order, one rounding
    per operation: the exact kernels' numbers, with NumPy."""
    d = np.zeros((len(x), len(cen)))
    for j in range(x.shape[1]):
        t = x[:, j, None] - cen[None, :, j]
        d = d + t * t
    labels = d.argmin(axis=1).astype(np.int32)
    return labels, d[np.arange(len(x)), labels]


def _scales(x, w=None):
    return Scales.of(np.abs(x).max(axis=0), 1.0 if w is None else float(w.max()))


def _exact_step(x, cen, labels, scales, w=None):
    """The exact step from ``labels`` (updated in place): the sums' and the SSE's limbs of the exact
    labels, and how many labels changed."""
    k = len(cen)
    new, d2 = _nearest(x, cen)
    changed = int((new != labels).sum())
    labels[:] = new
    sums = np.zeros((k, x.shape[1] + 1, 4), dtype=np.int64)
    sum_rows(x, w, new, None, scales, sums, 1)
    return sums, cluster_sums(new, d2, w, k, scales.sse_exponent(cen)), changed


def _means(r, scales, cen):
    """The next centres from a step's sums (an empty cluster keeps its centre)."""
    values = decode(r.sums, scales.columns)
    sums, counts = values[:, :-1], values[:, -1]
    good = counts > 0
    cen = cen.copy()
    cen[good] = sums[good] / counts[good, None]
    return cen


def _blobs(n, m, k, seed, spread=1.0, offset=0.0):
    rng = np.random.default_rng(seed)
    true = rng.uniform(-10, 10, (k, m)) + offset
    x = true[rng.integers(0, k, n)] + rng.normal(size=(n, m)) * spread
    return x, x[rng.choice(n, k, replace=False)].copy()


def _lloyd_against_exact(x, cen, steps, w=None, threads=2, move=None):
    """Run ``steps`` steps of a backend with bounds and of one without (each centre update by ``move``
    or the means) and check each against the exact step; returns the rows searched per step."""
    be = CPUBackend(threads=threads)
    be.load(x, w)
    every = CPUBackend(threads=threads, bounds=False)
    every.load(x, w)
    sc = _scales(x, w)
    lab = np.full(len(x), -1, np.int32)
    searched = []
    for it in range(steps):
        r = be.step(cen, sc)
        sums, sse, changed = _exact_step(x, cen, lab, sc, w)
        assert np.array_equal(r.sums, sums), f"step {it}: sums differ"
        assert np.array_equal(r.sse, sse) and r.changed == changed, f"step {it}: SSE or changed differ"
        assert np.array_equal(be._labels, lab), f"step {it}: labels differ"
        assert r.searched == be.rows_searched
        searched.append(be.rows_searched)
        r_sums, r_sse = r.sums.copy(), r.sse.copy()
        s = every.step(cen, sc)
        assert s.sums.tobytes() == r_sums.tobytes() and s.sse.tobytes() == r_sse.tobytes()
        assert s.changed == changed and every.rows_searched == len(x)
        labels, d2 = be.assign(cen)
        la, da = _nearest(x, cen)
        assert np.array_equal(labels, la) and d2.tobytes() == da.tobytes(), f"step {it}: assign differs"
        cen = move(it, cen) if move is not None else _means(r, sc, cen)
    return searched


@pytest.mark.parametrize("n,m,k", [(4000, 7, 3), (5000, 16, 8), (3000, 33, 13), (2500, 100, 50), (2000, 3, 1),
                                   (1500, 257, 9), (3001, 2, 40)])
def test_bounded_steps_are_the_exact_kernels_step_after_step(n, m, k):
    x, cen = _blobs(n, m, k, n + m + k)
    searched = _lloyd_against_exact(x, cen, 10)
    assert searched[0] == n  # no bounds before the first step
    if k > 1:
        assert searched[-1] < n // 2, "the bounds kept fewer than half the rows after ten steps"


def test_bounds_hold_with_weights_and_an_offset():
    x, cen = _blobs(3000, 12, 6, 1, offset=1e5)
    w = np.random.default_rng(1).random(len(x)) * 3
    _lloyd_against_exact(x, cen, 8, w=w)


@pytest.mark.parametrize("scale", [1e-150, 1e-30, 1e18, 1e140])
def test_bounds_at_extreme_magnitudes(scale):
    x, cen = _blobs(2000, 5, 7, 2)
    _lloyd_against_exact(x * scale, cen * scale, 6)


def test_ties_never_pass_the_bounds():
    # integer rows and two identical centres that do not move: every row nearest to them is a tie,
    # which only the search decides (the lower index)
    rng = np.random.default_rng(3)
    x = rng.integers(0, 3, size=(3000, 4)).astype(float)
    cen = np.array([[1, 1, 1, 1], [1, 1, 1, 1], [0, 1, 2, 1], [2, 2, 0, 0.0]])
    _lloyd_against_exact(x, cen, 4, move=lambda it, c: c)
    be = CPUBackend(threads=1)
    be.load(x)
    for _ in range(3):
        be.step(cen, _scales(x))
        assert not (be._labels == 1).any(), "a tie went to the higher of two equal centres"


def test_centres_that_jump_between_steps():
    # centres replaced by unrelated ones, swapped, one moved far away, then back: the bounds must
    # notice every move (a relocated empty cluster, another run of the same backend)
    x, cen = _blobs(4000, 10, 12, 4)
    rng = np.random.default_rng(4)
    plans = [lambda c: c[::-1].copy(), lambda c: x[rng.choice(len(x), len(c), replace=False)].copy(),
             lambda c: np.vstack([c[:1] + 1e3, c[1:]]), lambda c: c + 1e-12, lambda c: c]
    _lloyd_against_exact(x, cen, 10, move=lambda it, c: plans[it % len(plans)](c))


def test_centre_count_changes_and_forgotten_labels():
    x, cen = _blobs(3000, 6, 10, 5)
    sc = _scales(x)
    be = CPUBackend(threads=2)
    be.load(x)
    lab = np.full(len(x), -1, np.int32)
    for c in (cen, cen, cen[:7], cen[:7]):
        r = be.step(c, sc)
        sums, sse, changed = _exact_step(x, c, lab, sc)
        assert np.array_equal(r.sums, sums) and np.array_equal(r.sse, sse) and r.changed == changed
    assert be.rows_searched == 0  # the same centres twice: nothing searched
    be.forget_labels()
    lab[:] = -1
    r = be.step(cen[:7], sc)
    assert be.rows_searched == len(x) and r.changed == len(x)
    assert np.array_equal(r.sums, _exact_step(x, cen[:7], lab, sc)[0])


def test_assign_leaves_the_steps_labels_and_bounds_alone():
    x, cen = _blobs(3000, 8, 6, 6)
    sc = _scales(x)
    be = CPUBackend(threads=2)
    be.load(x)
    first = be.step(cen, sc)
    kept = first.sums.copy(), first.sse.copy()
    before = be._labels.copy(), be._lower.copy()
    other = cen + np.random.default_rng(6).normal(size=cen.shape)
    labels, d2 = be.assign(other)
    la, da = _nearest(x, other)
    assert np.array_equal(labels, la) and d2.tobytes() == da.tobytes()
    assert np.array_equal(be._labels, before[0]) and np.array_equal(be._lower, before[1])
    r = be.step(cen, sc)
    assert r.changed == 0 and be.rows_searched == 0
    assert r.sums.tobytes() == kept[0].tobytes() and r.sse.tobytes() == kept[1].tobytes()


@pytest.mark.parametrize("threads", [1, 2])
def test_without_bounds_every_row_is_searched_and_the_bits_are_the_same(threads):
    x, cen = _blobs(5000, 20, 10, 7)
    sc = _scales(x)
    out = []
    for bounds in (True, False):
        be = CPUBackend(threads=threads, bounds=bounds)
        be.load(x)
        c = cen
        steps = []
        for _ in range(6):
            r = be.step(c, sc)
            labels, d2 = be.assign(c)
            steps.append((r.sums.tobytes(), r.sse.tobytes(), r.changed, labels.tobytes(), d2.tobytes(),
                          be.rows_searched))
            c = _means(r, sc, c)
        out.append(steps)
    assert [s[:5] for s in out[0]] == [s[:5] for s in out[1]]
    assert all(s[5] == len(x) for s in out[1])
    assert sum(s[5] for s in out[0]) < sum(s[5] for s in out[1])


def test_centre_moves_and_bound_drops():
    old = np.zeros((3, 2))
    new = np.array([[3.0, 4.0], [0.0, 1.0], [0.0, 0.0]])
    moves = B.centre_moves(old, new)
    assert 5.0 <= moves[0] <= 5.0 * (1 + 1e-12) and 1.0 <= moves[1] <= 1.0 * (1 + 1e-12) and moves[2] > 0
    drops = B.bound_drops(moves)
    # a row of centre 0 loses the largest move of the others (centre 1's); the others lose centre 0's
    assert drops[0] == moves[1] + B.LOWER_MIN and drops[1] == drops[2] == moves[0] + B.LOWER_MIN
    assert B.bound_drops(moves[:1])[0] == B.LOWER_MIN  # K = 1: no other centre
    moves = B.centre_moves(old, np.array([[np.inf, 0.0], [0.0, 1.0], [0.0, 0.0]]))
    assert np.isinf(moves[0]) and np.isinf(B.bound_drops(moves)[1])
    still = B.centre_moves(old, old)
    assert (0.0 < still).all() and (still < 1e-140).all()  # below float64's normal range: never exactly 0
    tiny = np.full((1, 4), 1e-200)
    assert B.centre_moves(np.zeros((1, 4)), tiny)[0] >= 2e-200  # squares underflow; the move is still bounded


def test_centre_moves_threaded_form_is_bit_identical():
    """From _MOVES_THREADS_MIN values the centres' moves are summed on the threads, each centre's in
    attribute order: the same bits as one thread."""
    r = np.random.default_rng(3)
    old = r.normal(size=(1000, 40))
    new = old + r.normal(size=old.shape) * 1e-3
    assert old.size >= B._MOVES_THREADS_MIN
    one = np.empty(len(old))
    B._moves_one(old, new, *B.move_margins(40), one)
    assert np.array_equal(B.centre_moves(old, new), one)


def test_bound_eps_covers_the_rounding_of_long_rows():
    # the computed distance of m equal terms against the exact one, for the largest error it can have
    for m in (1, 16, 257, 4096):
        assert B.bound_eps(m) >= (m + 3) * 2.0 ** -53


@pytest.mark.parametrize("offset,spread", [(0.0, 1.0), (1e6, 1.0), (1e3, 1e-7), (0.0, 1e-160)])
def test_half_gaps_never_exceed_half_the_true_gap(offset, spread):
    rng = np.random.default_rng(11)
    cen = offset + rng.normal(size=(40, 9)) * spread
    cen[7] = cen[3]  # two equal centres: no gap at all
    half = B.half_gaps(cen)
    exact = np.array([[sum((Fraction(float(p)) - Fraction(float(q))) ** 2 for p, q in zip(a, b)) for b in cen]
                      for a in cen])
    for a in range(len(cen)):
        nearest = min(exact[a, b] for b in range(len(cen)) if b != a)
        assert Fraction(float(half[a])) ** 2 * 4 <= nearest
    assert half[3] == half[7] == 0.0
    if spread == 1.0 and offset == 0.0:
        assert (np.delete(half, [3, 7]) > 0).all()  # well apart: every other centre has a useful gap
    assert B.half_gaps(cen[:1])[0] == B._LOWER_MAX  # K = 1


def test_half_gaps_keep_rows_that_the_moves_left_no_bound():
    # every row's own bound gone (as after far moves of the other centres): rows nearer their centre than
    # half its gap to the next one are still kept, and nothing changes
    x, cen = _blobs(6000, 8, 6, 12, spread=0.5)
    sc = _scales(x)
    be = CPUBackend(threads=2)
    be.load(x)
    r = be.step(cen, sc)
    centres = _means(r, sc, cen)
    be.step(centres, sc)
    labels = be._labels.copy()
    be._lower[:] = 0.0
    r = be.step(centres, sc)
    assert r.changed == 0 and np.array_equal(be._labels, labels)
    assert be.rows_searched < len(x) // 2
    # and the bounds they leave are lower bounds: the next steps are still the exact ones
    lab = labels.copy()
    for shift in (0.3, -0.2):
        moved = centres + shift
        r = be.step(moved, sc)
        sums, sse, changed = _exact_step(x, moved, lab, sc)
        assert np.array_equal(r.sums, sums) and np.array_equal(r.sse, sse) and r.changed == changed
        assert np.array_equal(be._labels, lab)


def test_half_gaps_in_blocks(monkeypatch):
    # the products' rounding may differ by block (the bounds only decide which rows are searched)
    cen = np.random.default_rng(13).normal(size=(50, 6))
    whole = B.half_gaps(cen)
    monkeypatch.setattr(B, "_GAP_BLOCK", 7 * 50)  # blocks of 7 centres, the last one short
    blocks = B.half_gaps(cen)
    assert np.allclose(blocks, whole, rtol=1e-12, atol=0)
    true = np.sqrt(((cen[:, None] - cen[None]) ** 2).sum(axis=2) + np.diag(np.full(50, np.inf))).min(axis=1) / 2
    assert (blocks <= true).all()
