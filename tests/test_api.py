"""Tests for :mod:`mpikmeans.api`: ``from mpikmeans import KMeans`` with
scikit-learn's shape; the same result as the library functions it wraps
(scaler, initialisation, :func:`lloyd`) and as scikit-learn from the same
start; per-rank ``labels_`` under a communicator; ``import mpikmeans`` stays cheap."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from threadcomm import Serialised, run_ranks  # noqa: E402

from mpikmeans.backends.cpu import CPUBackend  # noqa: E402
from mpikmeans.comm import SerialComm  # noqa: E402
from mpikmeans.errors import UsageError  # noqa: E402
from mpikmeans.io.gen import GenSpec, blob_centres, generate_block  # noqa: E402
from mpikmeans.init import init_kmeans_parallel, init_kmeanspp  # noqa: E402
from mpikmeans.lloyd import lloyd  # noqa: E402
from mpikmeans.restarts import restart_seeds  # noqa: E402
from mpikmeans.scaling import fit_scaler  # noqa: E402


@pytest.fixture(scope="module")
def x():
    """8 blobs in 5-d, attributes on different scales (so scaling matters)."""
    spec = GenSpec(n=6000, m=5, k=8, seed=7, spread=1.5, decimals=6)
    ticks, _ = generate_block(spec, 0, blob_centres(spec))
    return ticks / 1e6 * np.array([1.0, 10.0, 0.1, 100.0, 1.0]) + np.array([0.0, 50.0, -3.0, 0.0, 1e3])


def test_import_is_cheap_and_exports_kmeans():
    code = ("import sys, mpikmeans; "
            "assert 'numba' not in sys.modules and 'mpi4py' not in sys.modules, 'heavy import'; "
            "assert 'KMeans' in dir(mpikmeans); "
            "from mpikmeans import KMeans; import mpikmeans.api; assert KMeans is mpikmeans.api.KMeans; "
            "assert 'mpi4py' not in sys.modules")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    import mpikmeans

    with pytest.raises(AttributeError):
        mpikmeans.NoSuchThing  # noqa: B018


@pytest.mark.parametrize("normalize", ["none", "minmax", "zscore"])
@pytest.mark.parametrize("init", ["k-means++", "k-means||"])
def test_same_result_as_the_library_functions(x, normalize, init):
    from mpikmeans import KMeans

    km = KMeans(n_clusters=8, init=init, random_state=4, normalize=normalize).fit(x)

    scaler = fit_scaler(SerialComm(), x, normalize)
    z = scaler.transform(x)
    fn = init_kmeanspp if init == "k-means++" else init_kmeans_parallel
    c0 = fn(SerialComm(), 8, z, 0, len(z), 4)
    backend = CPUBackend()
    backend.load(z)
    ref = lloyd(SerialComm(), backend, z, 0, c0, max_iter=300, tol=0.0)

    assert km.scaled_centers_.tobytes() == ref.centres.tobytes()
    assert km.cluster_centers_.tobytes() == scaler.inverse(ref.centres).tobytes()
    assert np.array_equal(km.labels_, ref.labels)
    assert km.inertia_ == ref.inertia and km.n_iter_ == ref.iterations
    assert km.converged_ and km.stop_reason_ == ref.stop_reason
    assert km.n_features_in_ == 5 and km.n_samples_ == len(x)
    # the scikit-learn attributes
    assert km.cluster_centers_.shape == (8, 5) and km.labels_.shape == (len(x),)
    assert isinstance(km.inertia_, float) and isinstance(km.n_iter_, int)
    # centres in data units: the means of their rows
    for j in range(8):
        np.testing.assert_allclose(km.cluster_centers_[j], x[km.labels_ == j].mean(axis=0), rtol=1e-11)


def test_predict_and_fit_predict(x):
    from mpikmeans import KMeans

    km = KMeans(n_clusters=8, normalize="minmax", random_state=1)
    labels = km.fit_predict(x)
    assert np.array_equal(labels, km.labels_)
    assert np.array_equal(km.predict(x), km.labels_)  # the same arithmetic as during fit
    assert km.predict(x[:10]).dtype == np.int32
    # predict measures in the scaled space: nearest scaled centre
    z = km.scaler_.transform(x[:50])
    d = ((z[:, None, :] - km.scaled_centers_[None]) ** 2).sum(axis=2)
    assert np.array_equal(km.predict(x[:50]), d.argmin(axis=1))
    assert km.transform(x[:50]).shape == (50, 8)
    np.testing.assert_allclose(km.transform(x[:50]) ** 2, d, rtol=1e-9, atol=1e-12)
    assert km.score(x) == pytest.approx(-km.inertia_, rel=1e-12)


@pytest.mark.parametrize("weighted", [False, True])
def test_matches_scikit_learn_from_the_same_start(x, weighted):
    from sklearn.cluster import KMeans as SKKMeans

    from mpikmeans import KMeans

    c0 = x[np.random.default_rng(2).choice(len(x), 8, replace=False)]
    w = np.random.default_rng(3).uniform(0.1, 4.0, len(x)) if weighted else None
    ours = KMeans(n_clusters=8, init=c0, backend="cpu").fit(x, sample_weight=w)
    ref = SKKMeans(n_clusters=8, init=c0, n_init=1, algorithm="lloyd", tol=0, max_iter=300).fit(x, sample_weight=w)
    assert np.array_equal(ours.labels_, ref.labels_)
    np.testing.assert_allclose(ours.cluster_centers_, ref.cluster_centers_, rtol=1e-9)
    assert ours.inertia_ == pytest.approx(ref.inertia_, rel=1e-9)
    assert ours.n_iter_ == ref.n_iter_


def test_init_array_is_given_in_data_units(x):
    from mpikmeans import KMeans

    c0 = x[:8].copy()
    km = KMeans(n_clusters=8, init=c0, normalize="zscore").fit(x)
    scaler = fit_scaler(SerialComm(), x, "zscore")
    z = scaler.transform(x)
    backend = CPUBackend()
    backend.load(z)
    ref = lloyd(SerialComm(), backend, z, 0, scaler.transform(c0))
    assert km.scaled_centers_.tobytes() == ref.centres.tobytes()
    with pytest.raises(UsageError, match="n-init"):
        KMeans(n_clusters=8, init=c0, n_init=3).fit(x)


def test_restarts_keep_the_lowest_sse(x):
    from mpikmeans import KMeans

    km = KMeans(n_clusters=8, n_init=5, random_state=9, normalize="minmax").fit(x)
    assert [r["seed"] for r in km.restarts_] == restart_seeds(9, 5)
    sses = [r["inertia"] for r in km.restarts_]
    assert km.inertia_ == sses[km.best_restart_] and km.inertia_ <= min(sses) * (1 + 1e-9)
    one = KMeans(n_clusters=8, n_init=1, random_state=9, normalize="minmax").fit(x)
    assert one.inertia_ == sses[0]  # restart 0 is the plain run with the seed
    assert km.inertia_ <= one.inertia_


def test_sample_weight_equals_repeated_rows(x):
    from mpikmeans import KMeans

    xs = x[:600]
    w = np.random.default_rng(5).integers(1, 4, size=len(xs))
    c0 = xs[:6]
    a = KMeans(n_clusters=6, init=c0).fit(xs, sample_weight=w.astype(float))
    b = KMeans(n_clusters=6, init=c0).fit(np.repeat(xs, w, axis=0))
    np.testing.assert_allclose(a.cluster_centers_, b.cluster_centers_, rtol=1e-12)
    assert a.inertia_ == pytest.approx(b.inertia_, rel=1e-12)
    assert np.array_equal(np.repeat(a.labels_, w), b.labels_)
    # and weights take part in the seeding: a weight-0 row is never a k-means++ centre
    w0 = np.zeros(len(xs))
    w0[::3] = 1.0
    km = KMeans(n_clusters=6, random_state=0).fit(xs, sample_weight=w0)
    assert len(km.labels_) == len(xs)


@pytest.mark.parametrize("init", ["k-means++", "k-means||"])
def test_under_a_communicator_each_rank_gets_its_rows_labels(x, init):
    from mpikmeans import KMeans

    one = KMeans(n_clusters=8, init=init, random_state=3, normalize="zscore", n_init=2).fit(x)
    cuts = [0, 1000, 1000, 4500, len(x)]  # rank 1 holds no rows

    def body(comm):
        xl = x[cuts[comm.rank]:cuts[comm.rank + 1]]
        km = KMeans(n_clusters=8, init=init, random_state=3, normalize="zscore", n_init=2, comm=comm,
                    backend=Serialised())
        return km.fit(xl), km.predict(xl)

    out = run_ranks(4, body)
    for rank, (km, predicted) in enumerate(out):
        assert len(km.labels_) == cuts[rank + 1] - cuts[rank]
        assert np.array_equal(predicted, km.labels_)
        assert km.n_samples_ == len(x) and km.best_restart_ == one.best_restart_
        # exact sums: the same bits as the one-rank fit
        assert km.cluster_centers_.tobytes() == one.cluster_centers_.tobytes()
        assert km.inertia_ == one.inertia_ and km.n_iter_ == one.n_iter_
    assert np.array_equal(np.concatenate([km.labels_ for km, _ in out]), one.labels_)


def test_parameters_and_errors(x):
    from sklearn.base import clone

    from mpikmeans import KMeans

    km = KMeans(n_clusters=3, normalize="minmax")
    assert km.get_params()["normalize"] == "minmax"
    assert km.set_params(n_clusters=4).n_clusters == 4
    twin = clone(km)
    assert twin.get_params() == km.get_params() and twin is not km
    with pytest.raises(ValueError):
        km.set_params(colour="red")
    with pytest.raises(UsageError, match="not fitted"):
        KMeans().predict(x)
    with pytest.raises(UsageError, match="normalize"):
        KMeans(normalize="l2").fit(x)
    with pytest.raises(UsageError, match="init"):
        KMeans(init="random").fit(x)
    with pytest.raises(UsageError, match="more than"):
        KMeans(n_clusters=11).fit(x[:10])
    with pytest.raises(UsageError, match="NaN"):
        KMeans(n_clusters=2).fit(np.array([[0.0], [np.nan], [1.0]]))
    with pytest.raises(UsageError, match="2-D"):
        KMeans(n_clusters=2).fit(np.arange(5.0))
    seeded = KMeans(n_clusters=2, random_state=None).fit(x[:100])
    assert isinstance(seeded.seed_, int) and seeded.seed_ >= 0


def test_default_threads_are_the_runs(x, monkeypatch):
    # fit and predict take mpikmeans run's default (comm.default_threads: the rank's
    # share of its node's CPUs, lowered by OMP_NUM_THREADS); threads= overrides it
    import mpikmeans.api as api
    from mpikmeans import KMeans

    asked = []
    real = api.make_backend

    def recording(name, **options):
        asked.append(options.get("threads"))
        return real(name, **options)

    monkeypatch.setattr(api, "make_backend", recording)
    monkeypatch.delenv("NUMBA_NUM_THREADS", raising=False)
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    km = KMeans(n_clusters=3, random_state=0, max_iter=3).fit(x)
    km.predict(x[:5])
    assert asked == [1, 1]
    monkeypatch.delenv("OMP_NUM_THREADS")
    comm = SerialComm()
    comm.cpus_per_rank = 1  # e.g. two ranks sharing a 2-CPU node
    km = KMeans(n_clusters=3, random_state=0, max_iter=3, comm=comm).fit(x)
    km.predict(x[:5])
    assert asked[2:] == [1, 1]
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    KMeans(n_clusters=3, random_state=0, max_iter=3, threads=2).fit(x).predict(x[:5])
    assert asked[4:] == [2, 2]
