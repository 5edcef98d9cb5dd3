"""Tests for :mod:`mpikmeans.exact`: fixed-point sums are exact, and the D² sampler
built on them maps every target to the right row, exactly, at any split of the
rows over (simulated) ranks."""

from __future__ import annotations

import itertools
import math
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from rankhelpers import on_ranks  # noqa: E402

from mpikmeans.exact import (  # noqa: E402
    BlockFixed,
    HostFixed,
    draw_rows,
    fixed_potential,
    fixed_scale,
    limb_sums,
    limbs_to_int,
    local_total,
    scale_factors,
    to_fixed,
)


def _target_r53(t, total):
    # the smallest r with (r * total) >> 53 == t
    return -((-t << 53) // total)


@pytest.mark.parametrize("ranks,layout", [(1, "even"), (2, "even"), (3, "uneven"), (4, "uneven")])
def test_draw_rows_maps_every_target_to_its_row(ranks, layout):
    q = np.array([0, 3, 0, 1, 5, 2, 0, 0, 4, 1, 0, 2], dtype=np.int64)
    x = np.arange(len(q) * 2, dtype=np.float64).reshape(-1, 2)
    total = int(q.sum())
    ends = np.cumsum(q)
    targets = list(range(total))
    expected = [int(np.searchsorted(ends, t, side="right")) for t in targets]
    r53 = [_target_r53(t, total) for t in targets]
    assert all((r * total) >> 53 == t for r, t in zip(r53, targets))

    out = on_ranks(ranks, x, lambda comm, xl, off, _: draw_rows(comm, xl, off, q[off:off + len(xl)], r53), layout)
    for idx, rows in out:
        assert idx.tolist() == expected
        assert rows.tobytes() == x[expected].tobytes()
        assert not set(idx.tolist()) & set(np.flatnonzero(q == 0).tolist())  # weight 0: never drawn


def test_draw_rows_exact_beyond_int64():
    # 5000 rows of ~2**53 each: the totals (~2**65) overflow int64; prefix sums
    # must still be exact, so the boundary targets land on the right rows
    rng = np.random.default_rng(3)
    q = rng.integers(2**52, 2**53, size=5000, dtype=np.int64)
    x = np.arange(5000, dtype=np.float64)[:, None]
    exact = list(np.cumsum([int(v) for v in q.tolist()], dtype=object))
    total = exact[-1]
    assert total > 2**63
    picks = [0, 1, 2499, 2500, 4998, 4999]
    r53 = []
    for i in picks:
        # the first and the last 53-bit draw that land in row i (a draw moves
        # the target by total / 2**53 ~ 4096, far less than a row's ~2**52)
        start = exact[i - 1] if i else 0
        r53 += [_target_r53(start, total), ((exact[i] - 1) << 53) // total]
        assert ((r53[-2] - 1) * total) >> 53 < start <= (r53[-2] * total) >> 53
        assert ((r53[-1] * total) >> 53) < exact[i] <= ((r53[-1] + 1) * total) >> 53
    for ranks in (1, 3):
        for idx, _ in on_ranks(ranks, x, lambda comm, xl, off, _: draw_rows(comm, xl, off, q[off:off + len(xl)], r53)):
            assert idx.tolist() == [i for i in picks for _ in (0, 1)]


@pytest.mark.parametrize("nb", [1, 3, 7, 64, 500])
def test_prefix_searches_find_every_rows_first_and_last_target(nb):
    # values near 2**53 (each limb sum carries many times), rows of weight 0 and whole blocks of them:
    # the host's search and the blocks' search (totals, then one block's values) against Python ints
    rng = np.random.default_rng(nb)
    q = rng.integers(2**52, 2**53 + 1, size=500, dtype=np.int64)
    q[rng.random(len(q)) < 0.2] = 0
    q[100:180] = 0
    n = len(q)
    ends = list(itertools.accumulate(int(v) for v in q))
    blocks = [q[n * b // nb:n * (b + 1) // nb] for b in range(nb)]
    hi, lo = np.array([limb_sums(block) for block in blocks], dtype=np.int64).T
    searches = [HostFixed(q), BlockFixed(lambda a, z: q[a:z].astype(np.float64), 0, n, nb, hi, lo)]
    for fixed in searches:
        assert fixed.total == ends[-1]
    for i in np.flatnonzero(q):
        for t in (ends[i - 1] if i else 0, ends[i] - 1):
            assert [fixed.find(t) for fixed in searches] == [i, i]


def test_fixed_point_sums_are_exact():
    rng = np.random.default_rng(0)
    v = rng.standard_normal((1000, 3)) * np.array([1.0, 1e-300, 1e300])
    vmax = np.abs(v).max(axis=0)
    s = np.array([fixed_scale(a) for a in vmax])
    q = to_fixed(v, s[None, :])
    assert np.abs(q).max() <= 2**53 and np.abs(q).max(axis=0).min() >= 2**52
    hi, lo = limb_sums(q, axis=0)
    for j in range(3):
        assert limbs_to_int(hi[j], lo[j]) == sum(int(a) for a in q[:, j].tolist())
        # the largest magnitude keeps all of its bits
        assert math.ldexp(float(np.abs(q[:, j]).max()), -int(s[j])) == vmax[j]
    assert fixed_scale(0.0) == 0


@pytest.mark.parametrize("magnitude", [1.0, 1e-300, 1e300, 5e-324])
def test_fused_candidate_potential_equals_the_numpy_path(magnitude):
    rng = np.random.default_rng(1)
    d2 = rng.exponential(size=2000) * magnitude
    dist = rng.exponential(size=2000) * magnitude
    w = rng.integers(0, 3, size=2000) * 0.7
    for weights in (None, w):
        v = np.minimum(d2, dist) if weights is None else np.minimum(d2, dist) * weights
        vmax = max(float((d2 if weights is None else d2 * weights).max()), float(v.max()))
        s = fixed_scale(vmax)
        f1, f2 = scale_factors(s)
        hi, lo, vm = fixed_potential(d2, dist, w, weights is not None, f1, f2)
        assert limbs_to_int(hi, lo) == local_total(to_fixed(v, s))
        assert vm == v.max()
