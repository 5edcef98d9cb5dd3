"""Tests for :mod:`mpikmeans.lloyd`: the Lloyd loop gives the same bits for any
number of ranks (simulated with threads), stops for the stated reason, handles
empty clusters without NaNs, and agrees with scikit-learn's
``KMeans(algorithm="lloyd")`` started from the same centres."""

from __future__ import annotations

import sys
import warnings
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from rankhelpers import split  # noqa: E402
from threadcomm import Serialised, run_ranks  # noqa: E402

from mpikmeans.backends.cpu import CPUBackend  # noqa: E402
from mpikmeans.comm import SerialComm  # noqa: E402
from mpikmeans.init import init_range, init_sample, sample_indices  # noqa: E402
from mpikmeans.io.arff import read_arff  # noqa: E402
from mpikmeans.io.gen import GenSpec, write_blobs  # noqa: E402
from mpikmeans.fixedsums import _decode  # noqa: E402
from mpikmeans.lloyd import STOP_MAX_ITER, STOP_TOL, STOP_UNCHANGED, load_host_kernels, lloyd  # noqa: E402


# =========================================================================== helpers

def run_lloyd_rows(x, ranks, centres, empty_first=False, weights=None, backend=Serialised, **kw):
    """Lloyd on rows split over ``ranks`` threads; returns the per-rank results."""
    def body(comm):
        xl, off = split(x, ranks, comm.rank, empty_first)
        wl = None if weights is None else weights[off:off + len(xl)]
        return lloyd(comm, backend(xl, wl), xl, off, centres, weights=wl, **kw)
    return run_ranks(ranks, body)


def same_bits(a, b) -> bool:
    """Two results of :func:`lloyd` are the same bits: centres, SSE, sizes, per-cluster SSE and history."""
    keys = ("iteration", "sse", "shift", "changed")
    return (a.centres.tobytes() == b.centres.tobytes() and a.inertia == b.inertia
            and np.array_equal(a.sizes, b.sizes) and a.cluster_sse.tobytes() == b.cluster_sse.tobytes()
            and [[h[q] for q in keys] for h in a.history] == [[h[q] for q in keys] for h in b.history]
            and (a.iterations, a.stop_reason, a.relocated) == (b.iterations, b.stop_reason, b.relocated))


def rel(a, b):
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    return np.abs(a - b).max(initial=0.0) / max(np.abs(b).max(initial=0.0), 1e-300)


def labels_of(results):
    return np.concatenate([r.labels for r in results])


# =========================================================================== lloyd

@pytest.mark.parametrize("init", ["sample", "range"])
def test_lloyd_independent_of_ranks(small_file, init):
    def body(comm):
        local = read_arff(str(small_file), comm)
        if init == "sample":
            c0 = init_sample(comm, 5, local.x, local.row_offset, local.n, 2)
        else:
            c0 = init_range(5, local.mins, local.maxs, 2)
        return lloyd(comm, Serialised(local.x), local.x, local.row_offset, c0, max_iter=100)

    runs = {ranks: run_ranks(ranks, body) for ranks in (1, 2, 3, 4, 7)}
    ref = runs[1][0]
    assert ref.converged and ref.iterations > 1
    for ranks, results in runs.items():
        assert np.array_equal(labels_of(results), ref.labels), f"{ranks} ranks"
        for r in results:  # every rank has the same global results, bit for bit (exact sums)
            assert same_bits(r, ref), f"{ranks} ranks"
            assert r.converged == ref.converged
        assert sum(len(r.labels) for r in results) == 600


@pytest.mark.parametrize("empty_cluster", ["farthest", "keep", "drop"])
def test_weighted_runs_with_empty_clusters_are_the_same_bits_at_any_rank_count(empty_cluster):
    # weights with many bits, an outlier, a far centre that starts empty, rows split so that rank 0
    # has none: every rank count gives the one-rank run's bits
    x, c0 = two_blobs_and_an_outlier()
    rng = np.random.default_rng(3)
    x = x + rng.normal(size=x.shape) * 1e-3
    w = rng.uniform(0.1, 3.0, len(x))
    ref = run_lloyd_rows(x, 1, c0, weights=w, empty_cluster=empty_cluster)[0]
    assert ref.converged
    if empty_cluster == "farthest":
        assert ref.relocated == 1
    for ranks in (2, 3, 4, 7):
        results = run_lloyd_rows(x, ranks, c0, empty_first=True, weights=w, empty_cluster=empty_cluster)
        assert np.array_equal(labels_of(results), ref.labels), f"{ranks} ranks"
        for r in results:
            assert same_bits(r, ref), f"{ranks} ranks"


def test_lloyd_result_is_consistent(small_x):
    x = small_x
    c0 = x[sample_indices(5, len(x), 1)]
    res = run_lloyd_rows(x, 1, c0, max_iter=100)[0]
    assert res.stop_reason == STOP_UNCHANGED and res.converged
    # labels are the nearest final centres; centres are the means of their rows
    d = ((x[:, None, :] - res.centres[None]) ** 2).sum(axis=2)
    assert np.array_equal(res.labels, d.argmin(axis=1))
    for j in range(5):
        assert rel(res.centres[j], x[res.labels == j].mean(axis=0)) <= 1e-12
    assert res.sizes.tolist() == np.bincount(res.labels, minlength=5).tolist()
    assert abs(res.inertia - d.min(axis=1).sum()) <= 1e-12 * res.inertia
    # history: one entry per iteration; the first SSE is that of the initial centres
    assert [h["iteration"] for h in res.history] == list(range(1, res.iterations + 1))
    d0 = ((x[:, None, :] - c0[None]) ** 2).sum(axis=2).min(axis=1).sum()
    assert abs(res.history[0]["sse"] - d0) <= 1e-12 * d0
    assert res.history[0]["changed"] == len(x) and res.history[-1]["changed"] == 0
    assert res.history[-1]["shift"] == 0.0
    # the CPU backend counts the rows it searched: all of them first, then those its bounds did not keep
    assert res.history[0]["searched"] == len(x) and res.history[-1]["searched"] < len(x)
    sses = [h["sse"] for h in res.history]
    assert all(b <= a * (1 + 1e-12) for a, b in zip(sses, sses[1:]))  # Lloyd never increases the SSE


def test_the_loops_host_kernels_are_loaded_before_its_first_iteration(small_x):
    """load_host_kernels (a run's set-up) loads the one signature of the sums' decoding that every iteration
    calls: a run after it adds none (each would read Numba's cache, milliseconds, inside the first iteration)."""
    load_host_kernels()
    loaded = list(_decode.signatures)
    res = run_lloyd_rows(small_x, 1, small_x[sample_indices(5, len(small_x), 1)], max_iter=100)[0]
    assert res.iterations > 1
    assert list(_decode.signatures) == loaded and len(loaded) == 1


def test_shift_is_the_largest_euclidean_move(small_x):
    x = small_x
    c0 = x[sample_indices(4, len(x), 9)]
    res = run_lloyd_rows(x, 1, c0, max_iter=1)[0]
    labels = (((x[:, None, :] - c0[None]) ** 2).sum(axis=2)).argmin(axis=1)
    new = np.array([x[labels == j].mean(axis=0) for j in range(4)])
    expected = np.sqrt(((new - c0) ** 2).sum(axis=1)).max()
    assert abs(res.history[0]["shift"] - expected) <= 1e-12 * expected


def test_stop_reasons(small_x):
    x = small_x
    c0 = x[sample_indices(5, len(x), 4)]
    full = run_lloyd_rows(x, 1, c0, max_iter=300)[0]
    assert full.stop_reason == STOP_UNCHANGED and full.converged and full.iterations >= 3

    capped = run_lloyd_rows(x, 1, c0, max_iter=2)[0]
    assert capped.stop_reason == STOP_MAX_ITER and not capped.converged and capped.iterations == 2

    shifts = [h["shift"] for h in full.history]
    tol = (shifts[1] + shifts[2]) / 2 if shifts[1] > shifts[2] else shifts[1] * 1.0001
    by_tol = run_lloyd_rows(x, 1, c0, max_iter=300, tol=tol)[0]
    assert by_tol.stop_reason == STOP_TOL and by_tol.converged
    assert by_tol.iterations < full.iterations
    assert by_tol.history[-1]["shift"] <= tol
    assert all(h["shift"] > tol for h in by_tol.history[:-1])

    one = run_lloyd_rows(x, 1, c0, max_iter=300, tol=1e9)[0]
    assert one.stop_reason == STOP_TOL and one.iterations == 1

    # already converged centres: the first step labels every row (all "changed",
    # as in scikit-learn), the second changes none
    again = run_lloyd_rows(x, 2, full.centres, max_iter=300)
    assert again[0].iterations == 2 and again[0].stop_reason == STOP_UNCHANGED
    assert [h["changed"] for h in again[0].history] == [len(x), 0]
    assert rel(again[0].centres, full.centres) <= 1e-12


# =========================================================================== empty clusters

def two_blobs_and_an_outlier():
    rng = np.random.default_rng(0)
    a = rng.normal((0.0, 0.0), 0.5, size=(40, 2))
    b = rng.normal((10.0, 0.0), 0.5, size=(40, 2))
    x = np.vstack([a[:20], b[:20], [[10.0, 30.0]], a[20:], b[20:]])
    centres = np.array([[0.5, 0.5], [9.5, 0.5], [1000.0, 1000.0]])
    return x, centres


@pytest.mark.parametrize("ranks", [1, 2, 3, 4])
def test_empty_cluster_keep(ranks):
    x, c0 = two_blobs_and_an_outlier()
    res = run_lloyd_rows(x, ranks, c0, empty_first=True, empty_cluster="keep")
    two = run_lloyd_rows(x, 1, c0[:2], empty_cluster="keep")[0]
    for r in res:
        assert np.isfinite(r.centres).all()
        assert r.centres[2].tolist() == [1000.0, 1000.0]  # unchanged
        assert r.sizes[2] == 0 and r.relocated == 0
        assert r.converged
        assert rel(r.centres[:2], two.centres) <= 1e-12  # as if it were not there
    assert np.array_equal(labels_of(res), two.labels)


@pytest.mark.parametrize("far", [1e100, 1e200])
def test_a_far_empty_centre_leaves_the_sse_as_it_is(far):
    # a centre far from every row (an --init file's) keeps no row under "keep": the SSE, per cluster and
    # per iteration, is that of the run without it
    x, c0 = two_blobs_and_an_outlier()
    c0[2] = [far, -far]
    res = run_lloyd_rows(x, 2, c0, empty_cluster="keep")[0]
    two = run_lloyd_rows(x, 2, c0[:2], empty_cluster="keep")[0]
    assert res.centres[:2].tobytes() == two.centres.tobytes()
    assert res.inertia == two.inertia > 0 and res.cluster_sse[:2].tobytes() == two.cluster_sse.tobytes()
    assert [h["sse"] for h in res.history] == [h["sse"] for h in two.history]


@pytest.mark.parametrize("ranks", [1, 2, 3, 4])
def test_empty_cluster_farthest_first_move(ranks):
    x, c0 = two_blobs_and_an_outlier()
    for r in run_lloyd_rows(x, ranks, c0, empty_first=True, empty_cluster="farthest", max_iter=1):
        assert r.relocated == 1
        assert r.centres[2].tolist() == [10.0, 30.0]  # the point farthest from its centre
        # and the outlier left cluster 1's mean
        b = x[(x[:, 0] > 5) & (x[:, 1] < 5)]
        assert rel(r.centres[1], b.mean(axis=0)) <= 1e-12


def test_empty_cluster_farthest_matches_sklearn():
    from sklearn.cluster import KMeans

    x, c0 = two_blobs_and_an_outlier()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        km = KMeans(n_clusters=3, init=c0, n_init=1, algorithm="lloyd", tol=0, max_iter=300).fit(x)
    ref = None
    for ranks in (1, 2, 3, 4):
        res = run_lloyd_rows(x, ranks, c0, empty_first=True, empty_cluster="farthest")
        labels = labels_of(res)
        assert np.array_equal(labels, km.labels_), f"{ranks} ranks"
        for r in res:
            assert rel(r.centres, km.cluster_centers_) <= 1e-9
            assert r.iterations == km.n_iter_
            assert abs(r.inertia - km.inertia_) <= 1e-9 * km.inertia_
            assert r.sizes[2] == 1 and np.isfinite(r.centres).all()
        ref = labels if ref is None else ref
        assert np.array_equal(labels, ref)


def test_empty_cluster_farthest_nothing_to_gain():
    # every point sits on a centre: an empty cluster stays where it is
    x = np.array([[0.0, 0.0]] * 5 + [[4.0, 4.0]] * 5)
    c0 = np.array([[0.0, 0.0], [4.0, 4.0], [50.0, 50.0]])
    for r in run_lloyd_rows(x, 2, c0, empty_cluster="farthest"):
        assert r.centres.tolist() == c0.tolist() and np.isfinite(r.centres).all()
        assert r.relocated == 0 and r.converged


# =========================================================================== scikit-learn parity

@pytest.fixture(scope="module")
def blobs_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("km") / "blobs.arff"
    spec = GenSpec(n=20_000, m=10, k=8, seed=3, spread=1.0, decimals=10)
    run_ranks(2, lambda comm: write_blobs(GenSpec(**vars(spec)), str(path), comm))
    return path


@pytest.mark.parametrize("ranks", [1, 3])
def test_parity_with_sklearn(blobs_file, ranks):
    from sklearn.cluster import KMeans

    def body(comm):
        local = read_arff(str(blobs_file), comm)
        c0 = init_sample(comm, 8, local.x, local.row_offset, local.n, 5)
        res = lloyd(comm, Serialised(local.x), local.x, local.row_offset, c0, max_iter=300, tol=0.0)
        return local.x, c0, res

    out = run_ranks(ranks, body)
    x = np.concatenate([o[0] for o in out])
    c0 = out[0][1]
    assert x.shape == (20_000, 10)
    km = KMeans(n_clusters=8, init=c0, n_init=1, algorithm="lloyd", tol=0, max_iter=300).fit(x)
    labels = np.concatenate([o[2].labels for o in out])
    res = out[0][2]
    assert res.converged and res.stop_reason == STOP_UNCHANGED
    assert np.array_equal(labels, km.labels_)
    assert rel(res.centres, km.cluster_centers_) <= 1e-9
    assert np.all(np.abs(res.centres - km.cluster_centers_) <= 1e-9 * np.abs(km.cluster_centers_) + 1e-12)
    assert res.iterations == km.n_iter_
    assert abs(res.inertia - km.inertia_) <= 1e-9 * km.inertia_
    assert res.sizes.tolist() == np.bincount(km.labels_, minlength=8).tolist()


@pytest.mark.parametrize("weighted", [False, True])
def test_parity_with_sklearn_on_the_cpu_backend(blobs_file, weighted):
    """The CPU backend itself (its threads, bounds and screen), weighted or not: scikit-learn's labels,
    centres within 1e-9 relative, SSE and iterations."""
    from sklearn.cluster import KMeans

    local = run_ranks(1, lambda comm: read_arff(str(blobs_file), comm))[0]
    x = local.x
    w = np.random.default_rng(4).uniform(0.2, 5.0, len(x)) if weighted else None
    c0 = x[sample_indices(8, len(x), 6)]
    backend = CPUBackend(threads=2)
    backend.load(x, w)
    res = lloyd(SerialComm(), backend, x, 0, c0, max_iter=300, tol=0.0, weights=w)
    km = KMeans(n_clusters=8, init=c0, n_init=1, algorithm="lloyd", tol=0, max_iter=300).fit(x, sample_weight=w)
    assert res.converged and res.iterations == km.n_iter_
    assert np.array_equal(res.labels, km.labels_)
    assert np.all(np.abs(res.centres - km.cluster_centers_) <= 1e-9 * np.abs(km.cluster_centers_))
    assert abs(res.inertia - km.inertia_) <= 1e-9 * km.inertia_


# =========================================================================== limbs as integers

class _Resplit(Serialised):
    """The CPU backend with every sum's limbs written another way for the same integer (one unit of the
    top limb moved into the next): what a backend that adds a block's values before splitting them into
    limbs returns (:mod:`mpikmeans.fixedsums`; the GPU's accumulation does)."""

    def step(self, centres, scales):
        r = super().step(centres, scales)
        r.sums = r.sums.copy()
        r.sums[..., 0] -= 1
        r.sums[..., 1] += 1 << 26
        return r


def test_limbs_count_by_their_integer():
    x, c0 = two_blobs_and_an_outlier()
    w = np.random.default_rng(5).uniform(0.1, 3.0, len(x))
    plain = run_lloyd_rows(x, 2, c0, weights=w, empty_cluster="farthest")
    other = run_lloyd_rows(x, 2, c0, weights=w, empty_cluster="farthest", backend=_Resplit)
    assert plain[0].relocated == 1
    for a, b in zip(plain, other):
        assert same_bits(a, b)


# =========================================================================== the update's arithmetic

def _update_before(sums, counts, centres):
    """The update written plainly, with row selections: the bits the loop's update must give."""
    filled = counts > 0
    new = centres.copy()
    new[filled] = sums[filled] / counts[filled, None]
    return new, float(np.sqrt(((new - centres)[filled] ** 2).sum(axis=1)).max(initial=0.0))


@pytest.mark.parametrize("k,m,empty", [(1000, 257, 0), (7, 3, 2), (50, 100, 49), (1, 1, 0), (3, 5, 3)])
def test_update_is_the_same_bits_as_the_row_selections(k, m, empty):
    from mpikmeans.lloyd import _new_centres, _shift

    rng = np.random.default_rng(k + m + empty)
    sums = rng.standard_normal((k, m)) * 10.0 ** rng.integers(-3, 4, (k, 1))
    counts = rng.integers(1, 10_000, k).astype(np.float64)
    counts[rng.choice(k, empty, replace=False)] = 0.0
    sums[counts == 0] = 0.0
    centres = rng.standard_normal((k, m))
    want_new, want_shift = _update_before(sums, counts, centres)
    new, filled = _new_centres(sums, counts, centres, None, False)
    assert new.tobytes() == want_new.tobytes()
    assert filled.tolist() == (counts > 0).tolist()
    assert not np.shares_memory(new, centres) and not np.shares_memory(new, sums)
    assert _shift(new, centres) == want_shift
