"""Tests for the initialisations of :mod:`mpikmeans.kmeans`: k-means++ and k-means||
across ranks, the exact D² sampler under them, and restarts.

- the sampler maps every target to the right row, exactly, at any split;
- k-means++ is scikit-learn's greedy algorithm: fed the same random numbers it
  picks the very same 50 centres, and its SSE after Lloyd matches
  scikit-learn's ``KMeans(init="k-means++", n_init=1)`` (k-means|| too, within 2%),
  far below ``range`` and ``sample``;
- both give bit-identical centres for 1..4 ranks (threads), with or without
  a backend, with weights;
- restarts keep the lowest SSE, the same whatever the ranks.
"""

from __future__ import annotations

import logging
import math
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from threadcomm import Serialised, run_ranks  # noqa: E402

from mpikmeans.backends.cpu import CPUBackend  # noqa: E402
from mpikmeans.comm import SerialComm  # noqa: E402
from mpikmeans.errors import UsageError  # noqa: E402
from mpikmeans.gen import GenSpec, blob_centres, generate_block  # noqa: E402
from mpikmeans.kmeans import (  # noqa: E402
    best_restart,
    draw_rows,
    fixed_scale,
    global_extent,
    init_kmeans_parallel,
    init_kmeanspp,
    init_range,
    init_sample,
    limb_sums,
    limbs_to_int,
    lloyd,
    restart_seeds,
    row_uniforms,
    run_restarts,
    to_fixed,
)

# =========================================================================== helpers

def bounds(n, ranks, rank, layout="even"):
    """Rows [lo, hi) of ``rank``: even, or uneven with rank 1 empty."""
    if layout == "even" or ranks == 1:
        return n * rank // ranks, n * (rank + 1) // ranks
    cuts = [0, n // 7, n // 7] + [n // 7 + (n - n // 7) * r // (ranks - 2) for r in range(1, ranks - 1)]
    cuts[-1] = n
    return cuts[rank], cuts[rank + 1]


def on_ranks(ranks, x, fn, layout="even", weights=None):
    """``fn(comm, x_local, row_offset, w_local)`` on ``ranks`` threads."""
    def body(comm):
        lo, hi = bounds(len(x), ranks, comm.rank, layout)
        return fn(comm, x[lo:hi], lo, None if weights is None else weights[lo:hi])
    return run_ranks(ranks, body)


def blobs(m, spread, n=20_000, k=50, seed=1):
    """Gaussian blobs from mpikmeans.gen (the rows gen-data would write), in memory."""
    spec = GenSpec(n=n, m=m, k=k, seed=seed, spread=spread, decimals=6)
    ticks, _ = generate_block(spec, 0, blob_centres(spec))
    return ticks / 1e6


@pytest.fixture(scope="module")
def overlapping():
    """50 blobs in 8-d whose nearest pairs touch: seeding decides the SSE."""
    return blobs(8, 1.0)


@pytest.fixture(scope="module")
def separated():
    """50 well-separated blobs in 10-d (nearest centres 50 spreads apart)."""
    return blobs(10, 0.2, seed=2)


def sse_after_lloyd(x, centres, backend):
    backend.load(x)
    return lloyd(SerialComm(), backend, x, 0, centres, max_iter=300).inertia


# =========================================================================== exact sampling

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
    from mpikmeans.kmeans import _candidate_potential, _local_total, _scale_factors

    rng = np.random.default_rng(1)
    d2 = rng.exponential(size=2000) * magnitude
    dist = rng.exponential(size=2000) * magnitude
    w = rng.integers(0, 3, size=2000) * 0.7
    for weights in (None, w):
        v = np.minimum(d2, dist) if weights is None else np.minimum(d2, dist) * weights
        vmax = max(float((d2 if weights is None else d2 * weights).max()), float(v.max()))
        s = fixed_scale(vmax)
        f1, f2 = _scale_factors(s)
        hi, lo, vm = _candidate_potential(d2, dist, w, weights is not None, f1, f2)
        assert limbs_to_int(hi, lo) == _local_total(to_fixed(v, s))
        assert vm == v.max()


def test_row_uniforms_do_not_depend_on_the_split():
    n = 3 * (1 << 16) + 123
    whole = row_uniforms((9, 2, 1), 0, n)
    assert whole.min() >= 0 and whole.max() < 1 and abs(whole.mean() - 0.5) < 0.01
    for cuts in ([0, 5, 70000, 70001, 150000, n], [0, 0, n]):
        parts = [row_uniforms((9, 2, 1), a, b - a) for a, b in zip(cuts, cuts[1:])]
        assert np.concatenate(parts).tobytes() == whole.tobytes()
    assert not np.array_equal(row_uniforms((9, 2, 2), 0, 100), whole[:100])


# =========================================================================== k-means++ is scikit-learn's

class Replay(np.random.RandomState):
    """A RandomState that hands scikit-learn the random numbers our k-means++
    draws, in the same order: the first row, then per centre the candidates'
    uniforms (our 53-bit integers / 2**53)."""

    def __init__(self, seed):
        super().__init__(0)
        self.g = np.random.default_rng(seed)

    def choice(self, n, *args, **kwargs):
        return int(self.g.integers(n))

    def uniform(self, low=0.0, high=1.0, size=None):
        return self.g.integers(0, 1 << 53, size=size, dtype=np.int64) / float(1 << 53)


def test_kmeanspp_is_scikit_learns_greedy_kmeanspp(overlapping):
    from sklearn.cluster import kmeans_plusplus

    x = overlapping
    for seed in range(20):
        ours = init_kmeanspp(SerialComm(), 50, x, 0, len(x), seed)
        ref, _ = kmeans_plusplus(x, 50, random_state=Replay(seed))
        assert ours.tobytes() == ref.tobytes(), f"seed {seed}"


# =========================================================================== quality

def _mean_sse(x, seeds, make, backend):
    return float(np.mean([sse_after_lloyd(x, make(seed), backend) for seed in seeds]))


def _quality(x, seeds, methods=("k-means++", "k-means||", "sample", "range")):
    """Mean SSE after Lloyd over ``seeds`` per method, divided by scikit-learn's."""
    from sklearn.cluster import KMeans

    backend = CPUBackend(threads=2)
    backend.load(x)
    n = len(x)
    mins, maxs = global_extent(SerialComm(), x)
    make = {
        "k-means++": lambda s: init_kmeanspp(SerialComm(), 50, x, 0, n, s, backend=backend),
        "k-means||": lambda s: init_kmeans_parallel(SerialComm(), 50, x, 0, n, s, backend=backend),
        "sample": lambda s: init_sample(SerialComm(), 50, x, 0, n, s),
        "range": lambda s: init_range(50, mins, maxs, s),
    }
    sklearn = float(np.mean([KMeans(50, init="k-means++", n_init=1, random_state=s).fit(x).inertia_ for s in seeds]))
    logging.disable(logging.WARNING)  # range leaves empty clusters: expected here
    try:
        return {name: _mean_sse(x, seeds, make[name], backend) / sklearn for name in methods}
    finally:
        logging.disable(logging.NOTSET)


@pytest.mark.slow
def test_sse_matches_scikit_learn_and_beats_range_and_sample(separated):
    # the claim, over 20 seeds, on 50 well-separated clusters
    ratio = _quality(separated, range(20))
    print("mean SSE / scikit-learn's:", {k: round(v, 4) for k, v in ratio.items()})
    assert abs(ratio["k-means++"] - 1) <= 0.01
    assert abs(ratio["k-means||"] - 1) <= 0.02
    assert ratio["sample"] >= 5 and ratio["range"] >= 5


@pytest.mark.slow
def test_sse_not_worse_than_scikit_learn_on_overlapping_blobs(overlapping):
    # where seeding decides the local optimum, the 20-seed means have a ~2%
    # standard error; the test above shows the same algorithm, so here only
    # "not worse" is asserted (k-means|| is an approximation of k-means++)
    ratio = _quality(overlapping, range(20), ("k-means++", "k-means||"))
    print("mean SSE / scikit-learn's:", {k: round(v, 4) for k, v in ratio.items()})
    assert ratio["k-means++"] <= 1.01
    assert ratio["k-means||"] <= 1.02


# =========================================================================== rank independence

@pytest.mark.parametrize("method", ["k-means++", "k-means||"])
@pytest.mark.parametrize("seed", [0, 5])
def test_centres_independent_of_ranks_and_backend(overlapping, method, seed):
    x = overlapping[:6000]
    fn = init_kmeanspp if method == "k-means++" else init_kmeans_parallel

    ref = fn(SerialComm(), 50, x, 0, len(x), seed)  # serial kernel, no backend
    assert ref.shape == (50, 8) and len({r.tobytes() for r in ref}) == 50
    cpu = CPUBackend(threads=2)  # the production path: fused multi-threaded kernels
    cpu.load(x)
    assert fn(SerialComm(), 50, x, 0, len(x), seed, backend=cpu).tobytes() == ref.tobytes()
    if method == "k-means++":  # centres are rows of the data
        assert all((x == c).all(axis=1).any() for c in ref)
    for ranks, layout in ((1, "even"), (2, "even"), (3, "uneven"), (4, "even"), (4, "uneven")):
        out = on_ranks(ranks, x, lambda comm, xl, off, _: fn(comm, 50, xl, off, len(x), seed, backend=Serialised(xl)),
                       layout)
        for c in out:
            assert c.tobytes() == ref.tobytes(), f"{ranks} ranks ({layout})"
    assert not np.array_equal(fn(SerialComm(), 50, x, 0, len(x), seed + 1), ref)


@pytest.mark.parametrize("method", ["k-means++", "k-means||"])
def test_weighted_init_independent_of_ranks(method):
    rng = np.random.default_rng(4)
    x = blobs(4, 1.0, n=3000, k=10, seed=4)
    w = rng.integers(0, 4, size=len(x)).astype(np.float64) * 0.37  # non-integer totals; a quarter weigh 0
    fn = init_kmeanspp if method == "k-means++" else init_kmeans_parallel
    ref = fn(SerialComm(), 10, x, 0, len(x), 3, weights=w)
    for ranks, layout in ((2, "even"), (4, "uneven")):
        for c in on_ranks(ranks, x, lambda comm, xl, off, wl: fn(comm, 10, xl, off, len(x), 3, weights=wl,
                                                                 backend=Serialised(xl, wl)), layout, weights=w):
            assert c.tobytes() == ref.tobytes(), f"{ranks} ranks"
    if method == "k-means++":  # a row that weighs nothing is never a centre
        for c in ref:
            assert (w[(x == c).all(axis=1)] > 0).any()


def test_weighted_first_centre_follows_the_weights():
    x = np.arange(4.0)[:, None]
    w = np.array([0.0, 1.0, 0.0, 3.0])
    firsts = [init_kmeanspp(SerialComm(), 1, x, 0, 4, s, weights=w)[0, 0] for s in range(400)]
    counts = {v: firsts.count(v) for v in set(firsts)}
    assert set(counts) == {1.0, 3.0}
    assert 0.65 < counts[3.0] / 400 < 0.85  # 3/4 expected


# =========================================================================== edge cases

def test_fewer_distinct_rows_than_k(caplog):
    x = np.repeat(np.array([[0.0, 0.0], [1.0, 0.0], [0.0, 5.0]]), 20, axis=0)
    with caplog.at_level(logging.WARNING, logger="mpikmeans"):
        c = init_kmeanspp(SerialComm(), 5, x, 0, len(x), 0)
    assert {tuple(r) for r in c} == {(0.0, 0.0), (1.0, 0.0), (0.0, 5.0)}  # all three, then duplicates
    assert "distinct" in caplog.text
    # k-means|| falls back to k-means++ (and so gives the same centres)
    assert init_kmeans_parallel(SerialComm(), 5, x, 0, len(x), 0).tobytes() == c.tobytes()
    # exactly as many distinct rows as k: each one is a centre
    c3 = init_kmeans_parallel(SerialComm(), 3, x, 0, len(x), 1)
    assert {tuple(r) for r in c3} == {(0.0, 0.0), (1.0, 0.0), (0.0, 5.0)}


def test_k_more_than_n():
    x = np.zeros((3, 2))
    for fn in (init_kmeanspp, init_kmeans_parallel):
        with pytest.raises(UsageError, match="-k 4"):
            fn(SerialComm(), 4, x, 0, 3, 0)


def test_k_equals_one_and_n():
    x = blobs(3, 1.0, n=40, k=4)
    assert init_kmeanspp(SerialComm(), 1, x, 0, 40, 0).shape == (1, 3)
    assert init_kmeans_parallel(SerialComm(), 1, x, 0, 40, 0).shape == (1, 3)
    every = init_kmeanspp(SerialComm(), 40, x, 0, 40, 0)
    assert sorted(map(tuple, every)) == sorted(map(tuple, x))  # each row once


# =========================================================================== restarts

def test_restart_seeds():
    s5 = restart_seeds(42, 5)
    assert s5[0] == 42 and len(set(s5)) == 5 and all(0 <= s < 2**63 for s in s5)
    assert restart_seeds(42, 2) == s5[:2]  # more restarts only add seeds
    assert restart_seeds(43, 3) != s5[:3]
    with pytest.raises(UsageError):
        restart_seeds(1, 0)


def test_best_restart_treats_rounding_as_a_tie():
    assert best_restart([5.0, 4.0, 4.5]) == 1
    assert best_restart([4.0, 4.0 * (1 + 1e-12), 4.0 * (1 - 1e-12)]) == 0  # same partition: the earliest
    assert best_restart([float("nan"), 3.0, 2.0]) == 2
    assert best_restart([float("nan")]) == 0


def test_run_restarts_keeps_the_lowest_and_each_restart_is_a_fresh_run(overlapping):
    x = overlapping[:5000]
    n = len(x)
    backend = CPUBackend(threads=2)
    backend.load(x)
    out = run_restarts(SerialComm(), backend, x, 0, n, 20, init="k-means++", seed=3, n_init=4)
    seeds = restart_seeds(3, 4)
    assert [r["seed"] for r in out.restarts] == seeds
    singles = []
    for s in seeds:
        b = CPUBackend(threads=2)
        b.load(x)
        singles.append(lloyd(SerialComm(), b, x, 0, init_kmeanspp(SerialComm(), 20, x, 0, n, s)))
    for r, single in zip(out.restarts, singles):  # each restart = a fresh single run with its seed
        assert r["inertia"] == single.inertia and r["iterations"] == single.iterations
    assert out.best_index == best_restart([s.inertia for s in singles])
    assert out.best.centres.tobytes() == singles[out.best_index].centres.tobytes()
    assert np.array_equal(out.best.labels, singles[out.best_index].labels)
    assert len({r["inertia"] for r in out.restarts}) > 1  # the restarts did differ


def test_run_restarts_independent_of_ranks(overlapping):
    x = overlapping[:4000]

    def fn(comm, xl, off, _):
        return run_restarts(comm, Serialised(xl), xl, off, len(x), 12, init="k-means||", seed=8, n_init=3)

    ref = on_ranks(1, x, fn)[0]
    for out in on_ranks(3, x, fn, "uneven"):
        assert out.best_index == ref.best_index
        assert np.allclose(out.best.centres, ref.best.centres, rtol=1e-12, atol=0)
    assert np.array_equal(np.concatenate([o.best.labels for o in on_ranks(3, x, fn, "uneven")]), ref.best.labels)


def test_run_restarts_refuses_restarts_without_randomness():
    x = np.zeros((4, 2))
    with pytest.raises(UsageError, match="n-init"):
        run_restarts(SerialComm(), None, x, 0, 4, 2, init=np.zeros((2, 2)), n_init=2)
