"""k-means++'s screened passes (mpikmeans/backends/cpu/seeding.py): the exact pass's bits, and when they run.

The screen only decides which distances are computed exactly, so every test
compares a screened pass with the unscreened one, bit for bit: the fixed-point
potentials, the largest values and the lowered D² -- on data where the float32
estimates are decisive, on ties, duplicated rows, huge values past float32 and
weights; through the backend, whole seedings equal scikit-learn's path through
the serial kernel, at 1-3 simulated ranks.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).parent))

from rankhelpers import blobs, on_ranks  # noqa: E402
from threadcomm import Serialised, _backend_lock as _lock  # noqa: E402

from mpikmeans.backends.cpu import CPUBackend  # noqa: E402
from mpikmeans.backends.cpu.certified import screen_rows  # noqa: E402
from mpikmeans.backends.cpu.seeding import (  # noqa: E402
    SCREEN_MIN_M,
    SeedingRows,
    candidate_data,
    screen_below,
    potentials_pass,
    shifted_rows,
)
from mpikmeans.backends.cpu.tiles import _tile_rows  # noqa: E402
from mpikmeans.comm import SerialComm  # noqa: E402
from mpikmeans.exact import fixed_scale, limbs_to_int, scale_factors  # noqa: E402
from mpikmeans.fixedsums import Scales  # noqa: E402
from mpikmeans.init import init_kmeanspp  # noqa: E402


def _pass(x, cands, d2, w=None, screen=True, resident=True, tile=None):
    """One pass; returns (potentials' limbs summed, largest values, lowered D², pairs counted)."""
    n, m = x.shape
    t = len(cands)
    nb = min(n, 256)
    hi = np.full((nb, t), 7, dtype=np.int64)  # the pass must set what it sums into
    lo = np.full((nb, t), 7, dtype=np.int64)
    vmax = np.full((nb, t), 7.0)
    near = np.empty(nb, dtype=np.int64)
    dists = np.full((t, n), np.nan)
    f1, f2 = scale_factors(fixed_scale(float(np.nanmax(np.where(np.isfinite(d2), d2, 0))) or 1.0))
    shift = cands.mean(axis=0)
    ys = np.empty((n, m), dtype=np.float32)
    yy = np.empty(n, dtype=np.float32)
    shifted_rows(x, shift, ys, yy)
    zm, cc, zlim, tolf = candidate_data(cands, shift)
    potentials_pass(x, screen, ys, yy, resident, shift, cands, zm, cc, zlim, tolf, d2,
                    w if w is not None else d2[:0], w is not None, f1, f2, tile or screen_rows(t, m), _tile_rows(m),
                    dists, hi, lo, vmax, near)
    return hi.sum(axis=0), lo.sum(axis=0), vmax.max(axis=0), np.minimum(d2, dists), int(near.sum())


def _same(a, b):
    for u, v in zip(a[:4], b[:4]):
        assert u.tobytes() == v.tobytes()


def _d2(x, centres):
    d = np.full(len(x), np.inf)
    with np.errstate(over="ignore"):  # rows past float64's square root: D² = inf
        for c in centres:
            d = np.minimum(d, ((x - c) ** 2).sum(axis=1))
    return d


@pytest.mark.parametrize("resident", [True, False])
@pytest.mark.parametrize("chosen", [1, 4, 30])
def test_screened_pass_gives_the_exact_pass_bits(resident, chosen):
    x = blobs(24, 0.8, n=5000, k=40, seed=3)
    rng = np.random.default_rng(chosen)
    d2 = _d2(x, x[rng.choice(len(x), chosen, replace=False)])
    cands = x[rng.choice(len(x), 6, replace=False)]
    exact = _pass(x, cands, d2, screen=False)
    screened = _pass(x, cands, d2, resident=resident)
    _same(exact, screened)
    # the screen is decisive on such data: after 30 centres few pairs need the exact distance
    if chosen == 30:
        assert screened[4] < 0.15 * 6 * len(x)
    # without a screen, `near` counts the captured pairs: those are always among the screened-in ones
    assert exact[4] <= screened[4] or screened[4] * 3 > 6 * len(x)


def test_screened_pass_on_ties_duplicates_and_weights():
    x = blobs(12, 1.0, n=3000, k=20, seed=5)
    x[100:200] = x[100]  # duplicated rows
    rng = np.random.default_rng(2)
    centres = x[rng.choice(len(x), 10, replace=False)]
    d2 = _d2(x, centres)
    # candidates: a row already a centre (its distances equal D² there: ties), one a hair from
    # another centre (distances a few float32 roundings either side of D²), duplicates, others
    near = centres[1] * (1 + 1e-7 * rng.standard_normal(centres.shape[1]))
    cands = np.vstack([centres[0], near, x[100], x[100], x[rng.choice(len(x), 3)]])
    w = rng.integers(0, 5, size=len(x)) * 0.37
    for weights in (None, w):
        _same(_pass(x, cands, d2, weights, screen=False), _pass(x, cands, d2, weights))
        _same(_pass(x, cands, d2, weights, screen=False), _pass(x, cands, d2, weights, resident=False, tile=16))


def test_screened_pass_where_float32_cannot_tell():
    """Values past float32's range and rows far from every candidate with a huge D² take the exact path."""
    x = blobs(10, 1.0, n=2000, k=10, seed=7)
    x[:50] *= 1e25  # |y|^2 beyond the overflow guard: exact
    x[50:60, 3] = 1e200  # float32 inf
    rng = np.random.default_rng(1)
    d2 = _d2(x, x[rng.choice(len(x), 5, replace=False)])
    cands = x[rng.choice(np.arange(100, len(x)), 4, replace=False)]
    exact = _pass(x, cands, d2, screen=False)
    screened = _pass(x, cands, d2)
    _same(exact, screened)
    # a candidate past float32 too: every row exact
    cands[0, 0] = 1e300
    _same(_pass(x, cands, d2, screen=False), _pass(x, cands, d2))


def test_rows_in_float32_kept_only_where_memory_allows():
    x = np.random.default_rng(0).normal(size=(100, 10))
    cands = x[:3]
    kept = SeedingRows(spare_bytes=100 * 10 * 4)
    shift, ys, yy, resident = kept.rows(x, cands)
    assert resident and ys.shape == (100, 10) and ys.dtype == np.float32
    assert np.array_equal(ys, (x - shift).astype(np.float32))
    np.testing.assert_allclose(yy, (ys.astype(np.float64) ** 2).sum(axis=1), rtol=1e-5)
    assert kept.rows(x, x[5:8])[0] is shift  # one shift for the whole seeding
    for spare in (100 * 10 * 4 - 1, None):
        shift, ys, yy, resident = SeedingRows(spare).rows(x, cands)
        assert not resident and ys.shape[0] == 1


def test_when_passes_screen():
    rows = SeedingRows(None)
    assert not rows.screen_next(100)  # no pass yet: the first one computes and counts
    rows.record(300, 1000)
    assert not rows.screen_next(100) and not rows.screen_next(2000)  # never above the largest share
    rows.record(100, 1000)
    assert rows.screen_next(100) and not rows.screen_next(16)  # the break-even share grows with M
    rows.record(30, 1000)
    assert rows.screen_next(16) and not rows.screen_next(SCREEN_MIN_M - 1)
    assert 0.0 == screen_below(SCREEN_MIN_M - 1) < screen_below(16) < screen_below(100) < screen_below(257)


@pytest.mark.parametrize("threads", [1, 2])
def test_seeding_screens_and_equals_the_serial_kernels(threads):
    x = blobs(32, 0.5, n=6000, k=30, seed=9)
    ref = init_kmeanspp(SerialComm(), 30, x, 0, len(x), 4)  # serial kernel, no backend
    for mode in (None, True, False):
        cpu = CPUBackend(threads=threads)
        cpu.load(x)
        cpu.seed_screen = mode
        assert init_kmeanspp(SerialComm(), 30, x, 0, len(x), 4, backend=cpu).tobytes() == ref.tobytes(), mode
        if mode is None:
            # by its end the seeding screened, on float32 rows it kept
            assert cpu._seeding.screen_next(32) and cpu._seeding.ys is not None
        cpu.step(ref, Scales.of(np.abs(x).max(axis=0)))
        assert cpu._seeding is None  # the float32 rows are let go when the iterations start


def test_weighted_seeding_screened_equals_unscreened():
    x = blobs(16, 0.7, n=4000, k=12, seed=2)
    w = np.random.default_rng(3).integers(0, 4, size=len(x)) * 0.37
    out = []
    for mode in (True, False):
        cpu = CPUBackend(threads=2)
        cpu.load(x, w)
        cpu.seed_screen = mode
        out.append(init_kmeanspp(SerialComm(), 12, x, 0, len(x), 1, weights=w, backend=cpu))
    assert out[0].tobytes() == out[1].tobytes()



class _WholeBackend(Serialised):
    """A rank's CPU backend whose seeding passes are its own (not the generic path), serialised across threads."""

    def dist2_to(self, centre):
        with _lock:
            return self.inner.dist2_to(centre)

    def lower_d2(self, d2, centre):
        with _lock:
            return self.inner.lower_d2(d2, centre)

    def potentials(self, d2, cands, weights, s):
        with _lock:
            self.inner.seed_screen = True
            return self.inner.potentials(d2, cands, weights, s)


@pytest.mark.parametrize("ranks", [1, 2, 3])
def test_screened_seeding_independent_of_ranks(ranks):
    x = blobs(20, 0.6, n=4000, k=16, seed=6)
    ref = init_kmeanspp(SerialComm(), 16, x, 0, len(x), 2)
    out = on_ranks(ranks, x, lambda comm, xl, off, _: init_kmeanspp(comm, 16, xl, off, len(x), 2,
                                                                    backend=_WholeBackend(xl)), "uneven")
    for c in out:
        assert c.tobytes() == ref.tobytes()


@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("n", [1, 7, 300, 5000])
def test_block_totals_draw_the_rows_a_full_prefix_sum_draws(weighted, n):
    """The backend's d2_fixed (threaded block totals, one block refined) against HostFixed over every row."""
    from mpikmeans.backends import RowDistances
    from mpikmeans.exact import HostFixed

    rng = np.random.default_rng(n)
    d2 = rng.exponential(size=n) * 10.0 ** rng.integers(-3, 3, size=n)
    d2[rng.random(n) < 0.2] = 0.0  # rows on a centre weigh nothing
    w = rng.integers(0, 4, size=n) * 0.37 if weighted else None
    s = fixed_scale(float((d2 if w is None else d2 * w).max()) or 1.0)
    cpu = CPUBackend(threads=2)
    cpu.load(np.zeros((n, 2)))
    ours = cpu.d2_fixed(d2, w, s)
    ref = RowDistances.d2_fixed(cpu, d2, w, s)
    assert isinstance(ref, HostFixed) and ours.total == ref.total
    if ref.total:
        targets = set(rng.integers(0, ref.total, size=200).tolist()) | {0, ref.total - 1}
        ends = [limbs_to_int(h, lo) for h, lo in zip(ours.hi_c, ours.lo_c)]
        targets |= {e for e in ends if e < ref.total} | {e - 1 for e in ends if 0 < e <= ref.total}
        for t in sorted(targets):
            assert ours.find(t) == ref.find(t), t


@pytest.mark.parametrize("weighted", [False, True])
def test_screened_pass_when_the_candidates_are_the_farthest_rows(weighted):
    """k-means++ draws in proportion to D²: candidates are often the rows of largest D², whose own
    pairs are listed for the exact distance; the largest value left must then come from the others."""
    x = blobs(24, 0.8, n=6000, k=40, seed=11)
    rng = np.random.default_rng(5)
    centres = x[rng.choice(len(x), 30, replace=False)]
    w = rng.integers(1, 4, size=len(x)) * 0.37 if weighted else None
    far = int(np.argmax(_d2(x, centres)))
    x[far - 1] = x[far]  # a tie for the largest D² beside the farthest row
    d2 = _d2(x, centres)
    v = d2 if w is None else d2 * w
    cands = x[np.argsort(v)[-5:]]
    exact = _pass(x, cands, d2, w, screen=False)
    screened = _pass(x, cands, d2, w)
    _same(exact, screened)
    assert screened[4] < 0.3 * 5 * len(x)  # the screen decided most pairs
