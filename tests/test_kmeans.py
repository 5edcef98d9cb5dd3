"""Tests for :mod:`mpikmeans.kmeans`: initial centres and the Lloyd loop give the
same answer for any number of ranks (simulated with threads), stop for the
stated reason, handle empty clusters without NaNs, and agree with
scikit-learn's ``KMeans(algorithm="lloyd")`` started from the same centres.

The first section checks the thread communicator the other tests rely on."""

from __future__ import annotations

import sys
import time
import warnings
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from threadcomm import (  # noqa: E402
    Aborted,
    CollectiveMismatch,
    CollectiveTimeout,
    Serialised,
    run_ranks,
)

from mpikmeans.arff import read_arff  # noqa: E402
from mpikmeans.comm import Comm, SerialComm  # noqa: E402
from mpikmeans.errors import InputError, RunError, UsageError  # noqa: E402
from mpikmeans.gen import GenSpec, write_blobs  # noqa: E402
from mpikmeans.kmeans import (  # noqa: E402
    STOP_MAX_ITER,
    STOP_TOL,
    STOP_UNCHANGED,
    check_centres,
    gather_rows,
    init_range,
    init_sample,
    lloyd,
    sample_indices,
)


# =========================================================================== ThreadComm

def test_threadcomm_has_the_communicator_interface():
    def body(comm):
        for name in ("rank", "size", "node_rank", "node_size", "host", "is_mpi"):
            assert hasattr(comm, name), name
        for name in ("allreduce", "allgather", "bcast", "barrier", "agree", "library", "abort"):
            assert callable(getattr(comm, name)), name
            assert callable(getattr(SerialComm, name))
        return comm.rank, comm.size, comm.node_rank, comm.node_size

    assert run_ranks(3, body) == [(r, 3, r, 3) for r in range(3)]


def test_threadcomm_collectives():
    def body(comm):
        r = comm.rank
        # rank order: ((1 + 1e16) - 1e16) == 0, while (1e16 - 1e16) + 1 would be 1
        s = comm.allreduce(np.array([[1.0, 1e16, -1e16][r]]), "sum")
        mn = comm.allreduce(np.array([r, -r], dtype=np.int64), "min")
        mx = comm.allreduce(np.array([r, -r], dtype=np.int64), "max")
        mine = {"rank": r, "list": [r]}
        got = comm.allgather(mine)
        got[r]["list"].append("mutated")  # a copy: must not leak to other ranks
        b = comm.bcast({"from": r} if r == 2 else None, root=2)
        comm.barrier()
        return s, mn, mx, got, b, mine

    for r, (s, mn, mx, got, b, mine) in enumerate(run_ranks(3, body)):
        assert s.tolist() == [0.0]
        assert mn.dtype == np.int64 and mn.tolist() == [0, -2] and mx.tolist() == [2, 0]
        assert [g["rank"] for g in got] == [0, 1, 2]
        assert mine == {"rank": r, "list": [r]}
        assert b == {"from": 2}


@pytest.mark.parametrize("ranks", [1, 2, 4])
def test_threadcomm_agree_matches_comm_agree(ranks):
    plans = [
        {},  # nobody fails
        {1: (RunError("disk full on 1"), 0.0)},
        {0: (InputError("line 9"), 9.0), 3: (InputError("line 4"), 4.0)},
        {1: (UsageError("b"), 5.0), 2: (RunError("a"), 5.0)},  # equal keys: lower rank
    ]

    def outcome(fn):
        try:
            fn()
        except Exception as exc:  # noqa: BLE001
            return type(exc), exc.message, exc.collective
        return None

    def body(comm):
        results = []
        for plan in plans:
            err, key = plan.get(comm.rank, (None, 0.0))
            mine = outcome(lambda: comm.agree(None if err is None else type(err)(err.message), key))
            fake = SimpleNamespace(rank=comm.rank, _comm=SimpleNamespace(allgather=comm.allgather))
            ref = outcome(lambda: Comm.agree(fake, None if err is None else type(err)(err.message), key))
            results.append((mine, ref))
        return results

    for rank_results in run_ranks(ranks, body):
        for (mine, ref), plan in zip(rank_results, plans):
            assert mine == ref
            active = {r: v for r, v in plan.items() if r < ranks}
            if not active:
                assert mine is None
            else:
                assert mine[2] is True


def test_threadcomm_failures_do_not_hang():
    def one_rank_raises(comm):
        if comm.rank == 1:
            raise KeyError("boom")
        comm.barrier()

    t0 = time.monotonic()
    with pytest.raises(KeyError):
        run_ranks(3, one_rank_raises)

    def finishes_early(comm):
        if comm.rank != 0:
            comm.barrier()

    with pytest.raises(CollectiveMismatch):
        run_ranks(3, finishes_early)

    def aborts(comm):
        if comm.rank == 2:
            comm.abort(3)
        comm.allgather(1)

    with pytest.raises(Aborted) as info:
        run_ranks(3, aborts)
    assert info.value.code == 3
    assert time.monotonic() - t0 < 10

    def slow(comm):
        if comm.rank == 0:
            time.sleep(1.0)
        comm.barrier()

    with pytest.raises(CollectiveTimeout):
        run_ranks(2, slow, timeout=0.2)


def test_threadcomm_return_exceptions():
    def body(comm):
        if comm.rank == 1:
            raise ValueError("one")
        return comm.rank

    out = run_ranks(2, body, return_exceptions=True)
    assert out[0] == 0 and isinstance(out[1], ValueError)


# =========================================================================== helpers

def split(x, ranks, rank, empty_first=False):
    """Consecutive slices of ``x``; optionally rank 0 gets none."""
    n = len(x)
    if empty_first and ranks > 1:
        lo = 0 if rank == 0 else n * (rank - 1) // (ranks - 1)
        hi = 0 if rank == 0 else n * rank // (ranks - 1)
    else:
        lo, hi = n * rank // ranks, n * (rank + 1) // ranks
    return x[lo:hi], lo


def run_lloyd_rows(x, ranks, centres, empty_first=False, **kw):
    """Lloyd on rows split over ``ranks`` threads; returns the per-rank results."""
    def body(comm):
        xl, off = split(x, ranks, comm.rank, empty_first)
        return lloyd(comm, Serialised(xl), xl, off, centres, **kw)
    return run_ranks(ranks, body)


def rel(a, b):
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    return np.abs(a - b).max(initial=0.0) / max(np.abs(b).max(initial=0.0), 1e-300)


def labels_of(results):
    return np.concatenate([r.labels for r in results])


@pytest.fixture(scope="module")
def small_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("km") / "small.arff"
    run_ranks(1, lambda comm: write_blobs(GenSpec(n=600, m=3, k=5, seed=1, spread=1.0, decimals=6), str(path), comm))
    return path


@pytest.fixture(scope="module")
def small_x(small_file):
    return run_ranks(1, lambda comm: read_arff(str(small_file), comm))[0].x


# =========================================================================== init

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

    runs = {ranks: run_ranks(ranks, body) for ranks in range(1, 5)}
    ref = runs[1][0]
    assert ref.converged and ref.iterations > 1
    for ranks, results in runs.items():
        assert np.array_equal(labels_of(results), ref.labels), f"{ranks} ranks"
        for r in results:  # every rank has the same global results
            assert rel(r.centres, ref.centres) <= 1e-12
            assert r.iterations == ref.iterations
            assert r.stop_reason == ref.stop_reason and r.converged == ref.converged
            assert abs(r.inertia - ref.inertia) <= 1e-12 * ref.inertia
            assert np.array_equal(r.sizes, ref.sizes)
            assert [h["changed"] for h in r.history] == [h["changed"] for h in ref.history]
        assert sum(len(r.labels) for r in results) == 600


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
    sses = [h["sse"] for h in res.history]
    assert all(b <= a * (1 + 1e-12) for a, b in zip(sses, sses[1:]))  # Lloyd never increases the SSE


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
