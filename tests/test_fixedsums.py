"""Tests for :mod:`mpikmeans.fixedsums`: every value is encoded exactly as the floor of its scaled
value (checked against Python's fractions), sums of limbs are the same integers in any order and
any split into partial sums, equal totals decode to equal floats, the run's scales keep every
encoded value below ``2**VBITS``, and the host kernels add what a brute-force Python loop adds."""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest

from mpikmeans import fixedsums as F

VB = F.VBITS
UNIT = 1 << VB


# =========================================================================== references

def units(h: int, l_: int) -> int:
    """An encoded value ``(h, l)`` as one integer, in units of ``2**-(s + VBITS)``."""
    return (int(h) << VB) + int(l_)


def limb_value(limbs) -> int:
    """The integer four limbs stand for: ``a 2**76 + b 2**50 + c 2**26 + d`` (units of ``2**-(s + VBITS)``)."""
    a, b, c, d = (int(v) for v in limbs)
    return (a << (VB + F.LIMB)) + (b << VB) + (c << F.LIMB) + d


def split(h: int, l_: int) -> list:
    """The limbs of one encoded value, in Python integers (the module docstring's layout)."""
    return [h >> F.LIMB, h & F.LIMB_MASK, l_ >> F.LIMB, l_ & F.LIMB_MASK]


def scaled(v: float, s: int) -> Fraction:
    """``v 2**(s + VBITS)``, exactly."""
    return Fraction(v) * Fraction(2) ** (s + VB)


def encode_at(v: float, s: int) -> tuple:
    h, l_ = F.encode(v, *F.scale_factors(s))
    return int(h), int(l_)


def brute_sums(x, weights, labels, k, scales):
    """Per cluster and summed column, the limbs of ``sum(w x_j)`` and ``sum(w)``: a Python loop over
    the rows, each value's limbs from :func:`encode` and added as Python integers."""
    n, m = x.shape
    out = [[[0, 0, 0, 0] for _ in range(m + 1)] for _ in range(k)]
    for i in range(n):
        a = int(labels[i])
        if a < 0:
            continue
        w = None if weights is None else float(weights[i])
        for j in range(m + 1):
            v = float(x[i, j]) if j < m else 1.0
            if w is not None:
                v = w * v
            parts = split(*encode_at(v, int(scales.columns[j])))
            for q in range(4):
                out[a][j][q] += parts[q]
    return np.array(out, dtype=np.int64)


def some_values(rng, count):
    """Values over many magnitudes and both signs, with zeros, subnormals and exact powers of two."""
    mags = 10.0 ** rng.uniform(-310, 305, count)
    v = rng.choice([-1.0, 1.0], count) * mags * rng.uniform(0.5, 1.0, count)
    v[::17] = 0.0
    v[1::17] = -0.0
    v[2::17] = 5e-324
    v[3::17] = -5e-324
    v[4::17] = np.ldexp(1.0, rng.integers(-1070, 1020, len(v[4::17])))
    return v


# =========================================================================== encode

def test_encode_is_the_floor_of_the_scaled_value():
    """At the scale of its own magnitude (or of a larger bound), a value encodes as
    ``floor(v 2**(s + VBITS))``, exactly, for every magnitude float64 has."""
    rng = np.random.default_rng(0)
    values = some_values(rng, 4000)
    for i, v in enumerate(values.tolist()):
        # the value's own bound, or a bound up to 2**60 times larger (small t, down to 2**-10 units)
        bound = abs(v) * (1.0 if i % 3 == 0 else float(2.0 ** rng.uniform(0, 60)))
        bound = min(bound, 1.7e308)
        s = F.exponent_for(bound)
        h, l_ = encode_at(v, s)
        t = scaled(v, s)
        assert -(1 << VB) < h < (1 << VB), (v, s, h)
        assert 0 <= l_ <= UNIT
        got = units(h, l_)
        # within one unit always; the exact floor wherever t - floor(t) is exact in float64,
        # i.e. every value but a negative one below half a unit of h (t in (-1/2, 0))
        assert abs(got - t) < 1, (v, s)
        if v >= 0 or t <= -UNIT // 2:
            assert got == math.floor(t), (v, s)


def test_encode_at_the_bound_and_at_zero():
    for bound in (1.0, 3.0, 1e-300, 1e300, 5e-324, 1.7e308, 0.1, 123456.789):
        s = F.exponent_for(bound)
        for v in (bound, -bound, np.nextafter(bound, 0.0), 0.0, -0.0):
            h, l_ = encode_at(v, s)
            assert -(1 << VB) < h < (1 << VB)
            assert units(h, l_) == math.floor(scaled(v, s)), (bound, v)
        # the bound itself keeps all of its 53 bits: it is at least 2**49 units of h
        assert encode_at(bound, s)[0] >= 1 << (VB - 2)
    assert encode_at(0.0, 0) == (0, 0) and encode_at(-0.0, 123) == (0, 0)


def test_compiled_encode_is_the_python_source():
    rng = np.random.default_rng(1)
    for v in some_values(rng, 300).tolist():
        s = F.exponent_for(abs(v) * 3.0) if v else 7
        f1, f2 = F.scale_factors(s)
        assert tuple(int(q) for q in F.encode_py(v, f1, f2)) == encode_at(v, s)


@pytest.mark.parametrize("s", [-2000, -1074, -1023, -1000, -50, 0, 1, 49, 1000, 1023, 1074, 1100, 2000])
def test_scale_factors_multiply_to_the_power_of_two(s):
    f1, f2 = F.scale_factors(s)
    assert Fraction(f1) * Fraction(f2) == Fraction(2) ** s
    assert math.isfinite(f1) and math.isfinite(f2) and f1 > 0 and f2 > 0


def test_exponent_for():
    for bound in (1.0, 0.75, 1e-300, 1e300, 5e-324, 1.7e308, 3.0):
        s = F.exponent_for(bound)
        # the bound widened by the margin stays below 2**VBITS, within a factor of two
        assert Fraction(bound) * Fraction(F._BOUND_MARGIN) * Fraction(2) ** s < UNIT
        assert Fraction(bound) * Fraction(2) ** (s + 1) >= UNIT // 2
    assert F.exponent_for(0.0) == 0 and F.exponent_for(-0.0) == 0
    with pytest.raises(ValueError, match="finite"):
        F.exponent_for(float("inf"))


def test_exponent_for_the_largest_floats():
    bound = 1.7976931348623157e308
    s = F.exponent_for(bound)
    assert Fraction(bound) * Fraction(2) ** s < UNIT
    assert units(*encode_at(bound, s)) == math.floor(scaled(bound, s))


# =========================================================================== scales

@pytest.mark.parametrize("wmax", [1.0, 3.7, 1e-3, 2.0 ** 40])
def test_scales_keep_every_encoded_value_below_the_bound(wmax):
    """Rows within ``magnitudes`` and weights up to ``wmax``: every ``w x_j``, ``w`` and ``w d²`` encodes
    with ``|h| < 2**VBITS``, the extremes included (rows on the bound, the largest weight, the farthest
    centre)."""
    rng = np.random.default_rng(2)
    m = 6
    mags = np.array([1.0, 1e-200, 1e140, 3.0, 0.0, 1e5])
    sc = F.Scales.of(mags, wmax)
    assert sc.columns.shape == (m + 1,) and sc.factors.shape == (m + 1, 2) and sc.wmax == wmax
    for j in range(m + 1):
        bound = float(mags[j] * wmax) if j < m else wmax
        assert sc.columns[j] == F.exponent_for(bound)
        assert Fraction(float(sc.factors[j, 0])) * Fraction(float(sc.factors[j, 1])) == Fraction(2) ** int(sc.columns[j])
    assert np.array_equal(sc.magnitudes, mags)
    x = rng.uniform(-1, 1, (300, m)) * mags
    x[0], x[1] = mags, -mags  # on the bound
    w = rng.uniform(0, wmax, 300)
    w[:3] = wmax
    centres = rng.uniform(-2, 2, (5, m)) * mags
    centres[0] = -np.abs(centres).max(axis=0)  # the farthest a row can be from a centre: x = mags
    se = sc.sse_exponent(centres)
    for i in range(len(x)):
        for j in range(m + 1):
            v = w[i] * (x[i, j] if j < m else 1.0)
            h, _ = encode_at(float(v), int(sc.columns[j]))
            assert abs(h) < 1 << VB, (i, j)
        nearest = np.inf  # the SSE holds each row's distance to its nearest centre
        for c in centres:
            d2 = 0.0
            for j in range(m):
                t = x[i, j] - c[j]
                d2 += t * t
            nearest = min(nearest, d2)
        h, _ = encode_at(float(w[i] * nearest), se)
        assert 0 <= h < 1 << VB
    # the scale is the nearest centre's reach: the smallest of each centre's bound
    reach = mags + np.abs(centres)
    assert se == F.exponent_for(float((reach * reach).sum(axis=1).min()) * wmax)


def test_sse_exponent_without_centres_and_too_far():
    sc = F.Scales.of(np.array([2.0, 3.0]))
    assert sc.sse_exponent(np.zeros((0, 2))) == F.exponent_for(13.0)
    assert sc.sse_exponent(np.zeros((3, 2))) == F.exponent_for(13.0)
    with pytest.raises(ValueError, match="too far"):
        sc.sse_exponent(np.array([[1e200, 0.0]]))


# =========================================================================== decode

def test_decode_of_one_value_is_the_value():
    """One encoded value decodes to the nearest float64 on one side or the other of its fixed-point
    value, and to the value itself where the scale resolves it."""
    rng = np.random.default_rng(3)
    for v in some_values(rng, 2000).tolist():
        bound = abs(v) * float(2.0 ** rng.uniform(0, 40))
        s = F.exponent_for(min(bound, 1.7e308))
        h, l_ = encode_at(v, s)
        got = float(F.decode(np.array(split(h, l_), dtype=np.int64), s))
        exact = Fraction(units(h, l_)) / Fraction(2) ** (s + VB)
        assert _faithful(got, exact), (v, s)
        if Fraction(v) == exact:
            assert got == v, (v, s)


def _random_totals(rng, count, negative):
    """Integer totals over the whole range a run's limbs reach (up to about 2**90 units)."""
    out = []
    for _ in range(count):
        bits = int(rng.integers(0, 90))
        t = int(rng.integers(0, 1 << 62)) << max(0, bits - 62) >> max(0, 62 - bits)
        t += 1 << bits
        out.append(-t if negative else t)
    return out


def _limbs_of(total: int) -> np.ndarray:
    """One representation of ``total`` units as limbs: its two 50-bit integers split as one value's."""
    h, l_ = total >> VB, total & (UNIT - 1)
    return np.array(split(h, l_), dtype=np.int64)


def _faithful(got: float, exact: Fraction) -> bool:
    """``got`` is one of the two float64 next to ``exact`` (or ``exact`` itself)."""
    lo, hi = float(exact), float(exact)
    if Fraction(lo) > exact:
        lo = float(np.nextafter(lo, -np.inf))
    if Fraction(hi) < exact:
        hi = float(np.nextafter(hi, np.inf))
    return got in (lo, hi)


@pytest.mark.parametrize("s", [0, 49, -300, 1000])
def test_decode_is_faithful_for_positive_totals(s):
    rng = np.random.default_rng(4 + abs(s))
    for t in _random_totals(rng, 500, negative=False) + [0, 1, 5, (1 << 53) + 1, (1 << 76) - 1, 1 << 76]:
        got = float(F.decode(_limbs_of(t), s))
        exact = Fraction(t) / Fraction(2) ** (s + VB)
        assert _faithful(got, exact), (t, s)
        if t < 1 << 53:
            assert Fraction(got) == exact  # 53 bits: no rounding at all


@pytest.mark.parametrize("s", [0, 49])
def test_decode_is_faithful_for_negative_totals_of_2_76_units_and_more(s):
    rng = np.random.default_rng(5)
    for t in _random_totals(rng, 500, negative=True):
        if -t < 1 << (VB + F.LIMB):
            continue
        got = float(F.decode(_limbs_of(t), s))
        assert _faithful(got, Fraction(t) / Fraction(2) ** (s + VB)), (t, s)


def test_decode_is_faithful_for_small_negative_totals():
    for t in (-5, -1, -(1 << 30) - 1, -(1 << 60) - 3):
        got = float(F.decode(_limbs_of(t), 0))
        assert _faithful(got, Fraction(t, 1 << VB)), t


def test_decode_depends_on_the_integer_only():
    """Limbs that stand for the same integer (carries moved between them, as partial sums split after
    adding give) decode to the same bits, whatever their shape or exponent."""
    rng = np.random.default_rng(6)
    totals = _random_totals(rng, 300, False) + _random_totals(rng, 300, True) + [0, -1, 1]
    base = np.stack([_limbs_of(t) for t in totals])
    exps = rng.integers(-400, 400, len(totals))
    want = F.decode(base, exps)
    assert want.shape == (len(totals),) and want.dtype == np.float64
    moved = base.copy()
    carry = rng.integers(-1000, 1000, (len(totals), 3))
    moved[:, 0] += carry[:, 0]
    moved[:, 1] -= carry[:, 0] << F.LIMB
    moved[:, 1] += carry[:, 1]
    moved[:, 2] -= carry[:, 1] << (VB - F.LIMB)
    moved[:, 2] += carry[:, 2]
    moved[:, 3] -= carry[:, 2] << F.LIMB
    assert [limb_value(r) for r in moved] == totals and (moved != base).any()
    got = F.decode(moved, exps)
    assert got.tobytes() == want.tobytes()
    # one exponent for all, a (k, m + 1, 4) layout with an exponent per column: the same values
    grid = base[:600].reshape(20, 10, 3, 4)
    col = rng.integers(-100, 100, 3)
    per = F.decode(grid, col)
    assert per.shape == (20, 10, 3)
    assert per.tobytes() == F.decode(grid.reshape(-1, 4), np.tile(col, 200)).reshape(20, 10, 3).tobytes()
    assert F.decode(base, 7).tobytes() == F.decode(base, np.full(len(base), 7)).tobytes()


def test_row_limbs_are_each_value_encoded():
    """row_limbs: per column the limbs of ``encode(w x_j)`` (``x_j`` itself at w = 1), then those of ``w``;
    what sum_rows adds for that row, so the relocation of an empty cluster takes it out exactly."""
    sc = F.Scales.of(np.array([4.0, 1e-7, 30.0]), 2.5)
    row = np.array([-3.9, 5e-8, 29.0])
    for w in (1.0, 2.5, 0.3):
        got = F.row_limbs(row, w, sc)
        assert got.shape == (4, 4) and got.dtype == np.int64
        want = [split(*(int(v) for v in F.encode(w * x if w != 1.0 else x, *sc.factors[j])))
                for j, x in enumerate(list(row) + [1.0])]
        assert got.tolist() == want, w
        weighted = np.zeros((1, 4, 4), dtype=np.int64)
        F.sum_rows(row[None], np.array([w]), np.zeros(1, np.int32), None, sc, weighted, 1)
        assert got.tolist() == weighted[0].tolist()


# =========================================================================== host kernels

def _data(seed, n=400, m=5, k=6, weighted=True, unlabelled=True):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, m)) * 10.0 ** rng.integers(-5, 6, m) + rng.integers(-3, 3, (n, 1)) * 1e3
    x[::37] = 0.0
    w = rng.uniform(0.0, 4.0, n) if weighted else None
    if w is not None:
        w[::11] = 0.0
    labels = rng.integers(-1 if unlabelled else 0, k, n).astype(np.int32)
    sc = F.Scales.of(F.column_magnitudes(x), float(w.max()) if w is not None else 1.0)
    return rng, x, w, labels, sc


@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("threads", [1, 2])
def test_sum_rows_is_the_brute_force_sum(weighted, threads):
    _, x, w, labels, sc = _data(7, weighted=weighted)
    k = 6
    out = np.zeros((k, x.shape[1] + 1, 4), dtype=np.int64)
    F.sum_rows(x, w, labels, None, sc, out, threads)
    want = brute_sums(x, w, labels, k, sc)
    assert out.tolist() == want.tolist()
    # the counts' and sums' values: the rows' values, exactly, to within one unit a row
    for a in range(k):
        mine = labels == a
        for j in range(x.shape[1] + 1):
            v = (x[mine, j] if j < x.shape[1] else np.ones(mine.sum())) * (w[mine] if weighted else 1.0)
            exact = sum((scaled(float(u), int(sc.columns[j])) for u in v), Fraction(0))
            assert abs(limb_value(out[a, j]) - exact) < max(1, len(v))
    # added to what is there: twice the rows, twice the limbs
    F.sum_rows(x, w, labels, None, sc, out, threads)
    assert out.tolist() == (2 * want).tolist()


@pytest.mark.parametrize("weighted", [False, True])
def test_sum_rows_moves_changed_rows_between_clusters(weighted, monkeypatch):
    """Given the old labels, only the rows whose label changed move from their old cluster (-1: none)
    to their new one: the result is the full sum of the new labels, limb for limb, on either layout of
    the threads' partial sums (blocks of rows, or blocks of columns where K x M is large)."""
    rng, x, w, old, sc = _data(8, weighted=weighted)
    k = 6
    new = old.copy()
    move = rng.random(len(x)) < 0.3
    new[move] = rng.integers(-1, k, move.sum())
    assert (new != old).sum() > 50
    want = brute_sums(x, w, new, k, sc)
    for parts_bytes in (F._PARTS_BYTES, 0):  # 0: every task a block of columns
        monkeypatch.setattr(F, "_PARTS_BYTES", parts_bytes)
        for threads in (1, 2):
            totals = np.zeros((k, x.shape[1] + 1, 4), dtype=np.int64)
            F.sum_rows(x, w, old, None, sc, totals, threads)
            assert totals.tolist() == brute_sums(x, w, old, k, sc).tolist()
            F.sum_rows(x, w, new, old, sc, totals, threads)
            assert totals.tolist() == want.tolist(), (parts_bytes, threads)
            full = np.zeros_like(totals)
            F.sum_rows(x, w, new, None, sc, full, threads)
            assert full.tolist() == want.tolist()
            # moving them back restores the old sums
            F.sum_rows(x, w, old, new, sc, totals, threads)
            assert totals.tolist() == brute_sums(x, w, old, k, sc).tolist()


def test_sum_rows_in_any_order_and_any_split_gives_the_same_limbs():
    """Integers: the rows in another order, or split into parts summed apart (ranks) and then added,
    give the same limbs, not just the same total."""
    rng, x, w, labels, sc = _data(9, n=1000, unlabelled=False)
    k = 6
    whole = np.zeros((k, x.shape[1] + 1, 4), dtype=np.int64)
    F.sum_rows(x, w, labels, None, sc, whole, 2)
    perm = rng.permutation(len(x))
    shuffled = np.zeros_like(whole)
    F.sum_rows(x[perm], w[perm], labels[perm], None, sc, shuffled, 1)
    assert shuffled.tobytes() == whole.tobytes()
    for parts in (2, 3, 7):
        cuts = np.sort(rng.choice(np.arange(1, len(x)), parts - 1, replace=False))
        total = np.zeros_like(whole)
        for lo, hi in zip([0, *cuts], [*cuts, len(x)]):
            part = np.zeros_like(whole)
            F.sum_rows(x[lo:hi], w[lo:hi], labels[lo:hi], None, sc, part, 2)
            total += part
        assert total.tobytes() == whole.tobytes()
        # and so the decoded sums and counts are the same bits
        assert F.decode(total, sc.columns).tobytes() == F.decode(whole, sc.columns).tobytes()


def test_sum_rows_without_rows_and_one_column():
    sc = F.Scales.of(np.array([2.0]))
    out = np.zeros((3, 2, 4), dtype=np.int64)
    F.sum_rows(np.zeros((0, 1)), None, np.zeros(0, np.int32), None, sc, out, 2)
    assert not out.any()
    x = np.array([[1.5], [-2.0], [0.25]])
    F.sum_rows(x, None, np.array([2, 2, 0], np.int32), None, sc, out, 2)
    assert out.tolist() == brute_sums(x, None, [2, 2, 0], 3, sc).tolist()
    assert F.decode(out, sc.columns).tolist() == [[0.25, 1.0], [0.0, 0.0], [-0.5, 2.0]]


@pytest.mark.parametrize("weighted", [False, True])
def test_cluster_sums_is_the_brute_force_sum(weighted):
    rng, x, w, labels, _ = _data(10, n=700, weighted=weighted)
    k = 6
    values = (x ** 2).sum(axis=1)
    s = F.exponent_for(float((values * (w if weighted else 1.0)).max()))
    got = F.cluster_sums(labels, values, w, k, s)
    assert got.shape == (k, 4) and got.dtype == np.int64
    want = np.zeros((k, 4), dtype=object)
    for i in range(len(x)):
        if labels[i] >= 0:
            v = float(values[i] * w[i]) if weighted else float(values[i])
            want[labels[i]] += np.array(split(*encode_at(v, s)), dtype=object)
    assert got.tolist() == want.tolist()
    perm = rng.permutation(len(x))
    assert F.cluster_sums(labels[perm], values[perm], None if w is None else w[perm], k, s).tobytes() == got.tobytes()
    halves = (F.cluster_sums(labels[:300], values[:300], None if w is None else w[:300], k, s)
              + F.cluster_sums(labels[300:], values[300:], None if w is None else w[300:], k, s))
    assert halves.tobytes() == got.tobytes()
    assert not F.cluster_sums(np.zeros(0, np.int32), np.zeros(0), None, k, s).any()


def test_column_magnitudes():
    rng = np.random.default_rng(11)
    for n in (1, 5, 63, 64, 65, 1000):
        x = rng.standard_normal((n, 4)) * np.array([1.0, 1e-300, 1e300, 0.0])
        x[n // 2, 0] = -1e6  # the largest magnitude is a negative value
        got = F.column_magnitudes(x)
        assert got.dtype == np.float64 and got.tobytes() == np.abs(x).max(axis=0).tobytes()
        assert F.column_magnitudes(np.asfortranarray(x)).tobytes() == got.tobytes()
    assert F.column_magnitudes(np.zeros((0, 3))).tolist() == [0.0, 0.0, 0.0]
    assert F.column_magnitudes(np.array([[-0.0, 2.0]])).tolist() == [0.0, 2.0]
