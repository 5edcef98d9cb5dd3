"""Tests for :mod:`mpikmeans.init`: every initialisation gives the same centres
across ranks (simulated with threads), and k-means++ is scikit-learn's.

- ``range`` and ``sample`` are bit-identical for 1..5 ranks, inside the data;
- k-means++ is scikit-learn's greedy algorithm: fed the same random numbers it
  picks the very same 50 centres, and its SSE after Lloyd matches
  scikit-learn's ``KMeans(init="k-means++", n_init=1)`` (k-means|| too, within 2%),
  far below ``range`` and ``sample``;
- both give bit-identical centres for 1..4 ranks (threads), with or without
  a backend, with weights.
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from rankhelpers import blobs, on_ranks, split  # noqa: E402
from threadcomm import Serialised, run_ranks  # noqa: E402

from mpikmeans.backends.cpu import CPUBackend  # noqa: E402
from mpikmeans.comm import SerialComm  # noqa: E402
from mpikmeans.errors import InputError, UsageError  # noqa: E402
from mpikmeans.init import (  # noqa: E402
    check_centres,
    gather_rows,
    global_extent,
    init_kmeans_parallel,
    init_kmeanspp,
    init_range,
    init_sample,
    row_uniforms,
    sample_indices,
)
from mpikmeans.io.arff import read_arff  # noqa: E402
from mpikmeans.lloyd import lloyd  # noqa: E402


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


# =========================================================================== range, sample (the specification's)

@pytest.mark.parametrize("seed", [0, 7])
def test_init_range_independent_of_ranks(small_file, small_x, seed):
    def body(comm):
        local = read_arff(str(small_file), comm)
        return init_range(6, local.mins, local.maxs, seed)

    ref = None
    for ranks in range(1, 6):
        for c in run_ranks(ranks, body):
            ref = c if ref is None else ref
            assert c.tobytes() == ref.tobytes(), f"{ranks} ranks"
    assert ref.shape == (6, 3)
    lo, hi = small_x.min(axis=0), small_x.max(axis=0)
    assert np.all(ref >= lo) and np.all(ref <= hi)
    # spread over the box, not collapsed on a corner
    assert np.all(ref.max(axis=0) - ref.min(axis=0) > 0.2 * (hi - lo))
    other = init_range(6, lo, hi, seed + 1)
    assert not np.array_equal(other, ref)


@pytest.mark.parametrize("seed", [0, 3])
def test_init_sample_independent_of_ranks(small_file, small_x, seed):
    def body(comm):
        local = read_arff(str(small_file), comm)
        return init_sample(comm, 8, local.x, local.row_offset, local.n, seed)

    ref = None
    for ranks in range(1, 6):
        for c in run_ranks(ranks, body):
            ref = c if ref is None else ref
            assert c.tobytes() == ref.tobytes(), f"{ranks} ranks"
    idx = sample_indices(8, len(small_x), seed)
    assert len(set(idx.tolist())) == 8 and idx.min() >= 0 and idx.max() < len(small_x)
    assert ref.tobytes() == small_x[idx].tobytes()  # k rows of the data
    assert len({tuple(r) for r in ref}) == 8  # distinct
    assert not np.array_equal(sample_indices(8, len(small_x), seed + 1), idx)


def test_sample_all_rows_and_too_many():
    idx = sample_indices(10, 10, 4)
    assert sorted(idx.tolist()) == list(range(10))
    with pytest.raises(UsageError, match="-k 11"):
        sample_indices(11, 10, 0)
    x = np.arange(12.0).reshape(4, 3)

    def body(comm):
        xl, off = split(x, comm.size, comm.rank)
        return init_sample(comm, 5, xl, off, 4, 0)

    out = run_ranks(3, body, return_exceptions=True)
    assert all(isinstance(e, UsageError) for e in out)
    assert len({e.message for e in out}) == 1


@pytest.mark.parametrize("ranks", [1, 2, 3, 5])
def test_gather_rows(ranks):
    x = np.random.default_rng(1).standard_normal((11, 4))
    idx = np.array([10, 0, 5, 3, 9, 1])

    def body(comm):
        xl, off = split(x, ranks, comm.rank, empty_first=True)
        return gather_rows(comm, xl, off, idx)

    for got in run_ranks(ranks, body):
        assert got.tobytes() == x[idx].tobytes()


def test_check_centres():
    c = np.ones((3, 2))
    assert check_centres(c, 3, 2, "c.csv").shape == (3, 2)
    with pytest.raises(InputError, match="c.csv"):
        check_centres(c, 4, 2, "c.csv")
    with pytest.raises(InputError):
        check_centres(c, 3, 3, "c.csv")
    bad = c.copy()
    bad[1, 1] = np.nan
    with pytest.raises(InputError, match="finite"):
        check_centres(bad, 3, 2, "c.csv")


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


def test_row_uniforms_do_not_depend_on_the_split():
    n = 3 * (1 << 16) + 123
    whole = row_uniforms((9, 2, 1), 0, n)
    assert whole.min() >= 0 and whole.max() < 1 and abs(whole.mean() - 0.5) < 0.01
    for cuts in ([0, 5, 70000, 70001, 150000, n], [0, 0, n]):
        parts = [row_uniforms((9, 2, 1), a, b - a) for a, b in zip(cuts, cuts[1:])]
        assert np.concatenate(parts).tobytes() == whole.tobytes()
    assert not np.array_equal(row_uniforms((9, 2, 2), 0, 100), whole[:100])
