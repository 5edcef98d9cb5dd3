"""Tests for :mod:`mpikmeans.scores`: Calinski–Harabasz and Davies–Bouldin equal scikit-learn's,
the sampled silhouette scikit-learn's on the same rows, the squared-Euclidean silhouette a
brute-force O(N^2) computation; every score the same bits at any number of ranks, in-process
(threads as ranks) and under mpirun."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from sklearn.metrics import calinski_harabasz_score, davies_bouldin_score, silhouette_score

sys.path.insert(0, str(Path(__file__).resolve().parent))
from conftest import HANG_GUARD_S, _env, mpirun_path, needs_gpu, run_cli, run_simulated  # noqa: E402
from threadcomm import run_ranks  # noqa: E402

from mpikmeans.backends.cpu import CPUBackend  # noqa: E402
from mpikmeans.comm import SerialComm  # noqa: E402
from mpikmeans.scores import SCORE_NAMES, all_dist2, quality_scores, sample_indices, sampled_silhouette  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def _blobs(n: int, m: int, k: int, seed: int, spread: float = 1.0, offset: float = 50.0):
    """Rows around k centres far from the origin (so a sum of |x|^2 would cancel), labels of the nearest centre."""
    rng = np.random.default_rng(seed)
    c = rng.uniform(-6, 6, (k, m)) + offset
    x = c[rng.integers(0, k, n)] + rng.normal(0, spread, (n, m))
    labels = ((x[:, None, :] - c[None]) ** 2).sum(axis=2).argmin(axis=1).astype(np.int32)
    return x, labels, c


@pytest.fixture(scope="module")
def data():
    return _blobs(2400, 6, 7, seed=11)


def _split(n: int, size: int) -> list:
    """Uneven consecutive slices: rank 1 of 3 holds no rows (the collectives must still meet)."""
    if size == 3:
        return [(0, n // 3), (n // 3, n // 3), (n // 3, n)]
    return [(n * r // size, n * (r + 1) // size) for r in range(size)]


def _scores_on(size: int, x, labels, k, weights=None, centres=None, **kw) -> list:
    cuts = _split(len(x), size)

    def body(comm):
        lo, hi = cuts[comm.rank]
        return quality_scores(comm, x[lo:hi], labels[lo:hi], k, weights=None if weights is None else weights[lo:hi],
                              centres=centres, **kw)

    return run_ranks(size, body)


def _same(a: dict, b: dict) -> None:
    for key in a:
        if key != "seconds":
            assert a[key] == b[key], (key, a[key], b[key])


@pytest.mark.parametrize("size", [1, 3])
def test_calinski_harabasz_and_davies_bouldin_equal_scikit_learn(data, size):
    x, labels, c = data
    out = _scores_on(size, x, labels, len(c), centres=c, sample_size=0)[0]
    assert out["calinski_harabasz"] == pytest.approx(calinski_harabasz_score(x, labels), rel=1e-9)
    assert out["davies_bouldin"] == pytest.approx(davies_bouldin_score(x, labels), rel=1e-9)
    # any labels, not only a good clustering's: random ones, with an empty cluster (label 3 unused)
    rnd = np.random.default_rng(2).choice([0, 1, 2, 4], size=len(x)).astype(np.int32)
    out = _scores_on(size, x, rnd, 5, sample_size=0)[0]
    assert out["clusters_scored"] == 4
    assert out["calinski_harabasz"] == pytest.approx(calinski_harabasz_score(x, rnd), rel=1e-9)
    assert out["davies_bouldin"] == pytest.approx(davies_bouldin_score(x, rnd), rel=1e-9)


def test_sampled_silhouette_equals_scikit_learn_on_the_sample_rows(data):
    x, labels, c = data
    out = _scores_on(3, x, labels, len(c), sample_size=500, seed=4)[0]
    idx = sample_indices(len(x), 500, 4)
    assert len(idx) == 500 == out["silhouette_sample_size"] and out["silhouette_sample_seed"] == 4
    assert np.array_equal(idx, np.sort(np.random.default_rng(4).choice(len(x), 500, replace=False)))
    assert out["silhouette_sample"] == pytest.approx(silhouette_score(x[idx], labels[idx]), rel=1e-9)
    # the whole set when the sample asks for more rows than there are; singletons score 0
    small = np.vstack([x[:60], [[1e3] * x.shape[1]]])
    lab = np.append(labels[:60], 9).astype(np.int32)
    assert sampled_silhouette(small, lab) == pytest.approx(silhouette_score(small, lab), rel=1e-9)
    assert sampled_silhouette(small[:5], np.zeros(5, dtype=np.int32)) is None  # one label: scikit-learn refuses


def _brute_squared_silhouette(x, labels, w):
    """Spark's weighted squared-Euclidean silhouette, by its definition: every pair of rows."""
    d = ((x[:, None, :] - x[None]) ** 2).sum(axis=2)
    s = np.zeros(len(x))
    present = [a for a in np.unique(labels)]
    for i in range(len(x)):
        own = labels == labels[i]
        mass = w[own].sum()
        if mass == w[i]:
            continue
        a = (w[own] * d[i, own]).sum() / (mass - w[i])
        b = min((w[labels == q] * d[i, labels == q]).sum() / w[labels == q].sum() for q in present if q != labels[i])
        s[i] = (b - a) / max(a, b)
    return float((w * s).sum() / w.sum())


@pytest.mark.parametrize("weighted", [False, True])
def test_squared_silhouette_equals_brute_force(weighted):
    x, labels, c = _blobs(300, 4, 5, seed=3, spread=2.5)
    labels[7] = 5  # a cluster of one row: its silhouette is 0
    w = np.random.default_rng(8).uniform(0.2, 3.0, len(x)) if weighted else np.ones(len(x))
    out = _scores_on(2, x, labels, 6, weights=w if weighted else None, sample_size=0)[0]
    assert out["silhouette_sqeuclidean"] == pytest.approx(_brute_squared_silhouette(x, labels, w), rel=1e-9)
    assert out["per_cluster"]["silhouette_sqeuclidean"][5] == 0.0


def test_integer_weights_are_repeated_rows(data):
    x, labels, c = data
    x, labels = x[:900], labels[:900]
    w = np.random.default_rng(6).integers(1, 4, len(x)).astype(np.float64)
    out = _scores_on(3, x, labels, len(c), weights=w, sample_size=0)[0]
    assert out["weighted"]
    xr, lr = np.repeat(x, w.astype(int), axis=0), np.repeat(labels, w.astype(int))
    assert out["calinski_harabasz"] == pytest.approx(calinski_harabasz_score(xr, lr), rel=1e-9)
    assert out["davies_bouldin"] == pytest.approx(davies_bouldin_score(xr, lr), rel=1e-9)


def test_every_score_is_the_same_bits_at_1_2_3_ranks(data):
    x, labels, c = data
    w = np.random.default_rng(1).uniform(0.5, 2.0, len(x))
    for weights in (None, w):
        runs = [_scores_on(size, x, labels, len(c), weights=weights, centres=c, sample_size=700, seed=9)
                for size in (1, 2, 3)]
        one = runs[0][0]
        assert all(one[name] is not None for name in SCORE_NAMES)
        for per_rank in runs:
            for out in per_rank:
                _same(one, out)


def test_centres_change_only_rounding(data):
    # the reference point of the spreads is a numerical aid: the origin gives the same scores to rounding
    x, labels, c = data
    near = _scores_on(1, x, labels, len(c), centres=c, sample_size=0)[0]
    far = _scores_on(1, x, labels, len(c), sample_size=0)[0]
    for name in ("calinski_harabasz", "davies_bouldin", "silhouette_sqeuclidean"):
        assert far[name] == pytest.approx(near[name], rel=1e-9)


def test_undefined_scores_and_the_none_switch(data):
    x, labels, c = data
    one = quality_scores(SerialComm(), x, np.zeros(len(x), dtype=np.int32), 3)
    assert all(one[name] is None for name in SCORE_NAMES) and "fewer than 2" in one["undefined"]
    none = quality_scores(SerialComm(), x, labels, len(c), scores="none")
    assert all(none[name] is None for name in SCORE_NAMES) and "none" in none["undefined"]
    # a row left out (-1) counts nowhere
    cut = labels.copy()
    cut[:100] = -1
    out = quality_scores(SerialComm(), x, cut, len(c), sample_size=0)
    assert out["rows"] == len(x) - 100
    assert out["calinski_harabasz"] == pytest.approx(calinski_harabasz_score(x[100:], labels[100:]), rel=1e-9)
    # as many clusters as rows: scikit-learn's rule makes CH and DB undefined
    tiny = quality_scores(SerialComm(), x[:3], np.arange(3, dtype=np.int32), 3, sample_size=0)
    assert tiny["calinski_harabasz"] is None and tiny["davies_bouldin"] is None and "as many" in tiny["undefined"]
    with pytest.raises(ValueError, match="outside"):
        quality_scores(SerialComm(), x, labels + 1, len(c))
    with pytest.raises(ValueError, match="scores"):
        quality_scores(SerialComm(), x, labels, len(c), scores="some")
    json.dumps(out)  # summary.json takes it as it is


def test_all_dist2_gives_the_backends_distances_to_the_bit(data):
    x, _, c = data
    backend = CPUBackend(threads=1)
    backend.load(np.ascontiguousarray(x))
    labels, d2 = backend.assign(c)
    table = all_dist2(x, c)
    assert np.array_equal(table.argmin(axis=1), labels)
    assert table[np.arange(len(x)), labels].tobytes() == d2.tobytes()


_SCRIPT = textwrap.dedent("""
    import json, sys
    import numpy as np
    from mpikmeans.comm import world
    from mpikmeans.io.arff import read_arff
    from mpikmeans.scores import quality_scores
    comm = world()
    local = read_arff(sys.argv[1], comm)
    labels = np.load(sys.argv[2])[local.row_offset:local.row_offset + len(local.x)].astype(np.int32)
    out = quality_scores(comm, local.x, labels, int(sys.argv[3]), sample_size=600, seed=2)
    if comm.rank == 0:
        out.pop("seconds")
        print(json.dumps(out))
""")


@pytest.mark.mpi
def test_scores_under_mpirun_are_the_same_at_1_2_3_ranks_and_scikit_learns(blobs, tmp_path):
    mpirun = mpirun_path()
    if mpirun is None:
        pytest.skip("mpirun not found")
    r = run_cli(["convert", blobs, tmp_path / "b.npy"], timeout=4 * HANG_GUARD_S)
    assert r.code == 0, r.err
    x = np.load(tmp_path / "b.npy")
    rng = np.random.default_rng(5)
    labels = ((x[:, None, :] - x[rng.choice(len(x), 8, replace=False)][None]) ** 2).sum(axis=2).argmin(axis=1)
    np.save(tmp_path / "labels.npy", labels)
    script = tmp_path / "scores.py"
    script.write_text(_SCRIPT)
    outs = {}
    for size in (1, 2, 3):
        p = subprocess.run([mpirun, "-np", str(size), "--oversubscribe", "--bind-to", "none", sys.executable,
                            str(script), str(blobs), str(tmp_path / "labels.npy"), "8"],
                           capture_output=True, text=True, env=_env(), cwd=ROOT, timeout=6 * HANG_GUARD_S)
        assert p.returncode == 0, p.stderr[-3000:]
        outs[size] = json.loads(p.stdout.strip().splitlines()[-1])
    assert outs[1] == outs[2] == outs[3]
    assert outs[3]["calinski_harabasz"] == pytest.approx(calinski_harabasz_score(x, labels), rel=1e-9)
    assert outs[3]["davies_bouldin"] == pytest.approx(davies_bouldin_score(x, labels), rel=1e-9)
    idx = sample_indices(len(x), 600, 2)
    assert outs[3]["silhouette_sample"] == pytest.approx(silhouette_score(x[idx], labels[idx]), rel=1e-9)


_DEVICE_PROGRAM = textwrap.dedent("""
    import json, os
    import numpy as np
    from mpikmeans.backends.gpu import GPUBackend
    from mpikmeans.comm import SerialComm
    from mpikmeans.scores import quality_scores

    # this interpreter's share of the cases (conftest.run_simulated runs the parts side by side)
    PART, PARTS = (int(v) for v in os.environ.get("SIM_PART", "0/1").split("/"))
    out = {}
    for q, (case, (n, m, k, weighted)) in enumerate({"plain": (700, 5, 6, False), "weighted": (650, 3, 3, True),
                                                     "many means": (500, 2, 11, False),
                                                     "wide": (260, 19, 4, False)}.items()):
        rng = np.random.default_rng(4 + q)
        if q % PARTS != PART:
            continue
        c = rng.uniform(-5, 5, (k, m)) + 30.0
        labels = rng.integers(0, k, n).astype(np.int32)
        labels[labels == 1] = 0             # cluster 1 empty
        labels[7] = 1 if k > 3 else labels[7]  # ... but for one row: alone in its cluster
        x = c[labels] + rng.normal(0, 1.5, (n, m))
        w = rng.uniform(0.2, 3.0, n) if weighted else None
        be = GPUBackend(dtype="float64")
        be.load(x, w)
        rows = be.score_rows(labels, k)
        assert rows is not None
        # "wide": every row sampled, its pairs measured in three batches (PAIR_BYTES under the simulator)
        kw = dict(weights=w, centres=c, sample_size=n if case == "wide" else 90, seed=case == "plain")
        dev = quality_scores(SerialComm(), x, labels, k, rows=rows, **kw)
        host = quality_scores(SerialComm(), x, labels, k, **kw)
        be.close()
        f32 = GPUBackend(dtype="float32")
        f32.load(x, w)
        rows32 = f32.score_rows(labels, k)
        # the scores read the rows the run clustered (float64), whatever the step's storage
        d32 = quality_scores(SerialComm(), x, labels, k, rows=rows32, **kw) if rows32 is not None else {}
        again = f32.score_rows(labels, k)  # the next K of a sweep: the same float64 copy
        full = GPUBackend(dtype="float32")
        full.load(x, w)
        full.limits.free_memory = lambda: 0  # no room for the float64 copy: the host's passes
        streamed = GPUBackend(dtype="float64", chunk_rows=200)
        streamed.load(x, w)
        out[case] = {"same": {key: dev[key] == host[key] for key in host if key != "seconds"},
                     "same float32": {key: d32.get(key) == host[key] for key in host if key != "seconds"},
                     "float32 copy kept": again is not None and again.x is rows32.x,
                     "dev": {key: dev[key] for key in ("calinski_harabasz", "silhouette_sqeuclidean",
                                                       "silhouette_sample")},
                     "full passes": full.score_rows(labels, k) is not None,
                     "streamed passes": streamed.score_rows(labels, k) is not None}
    print(json.dumps(out))
""")


@pytest.mark.parametrize("device", ["simulator", pytest.param("gpu", marks=[pytest.mark.gpu, needs_gpu])])
def test_the_gpus_passes_give_the_hosts_scores_to_the_bit(device):
    """The scores' two passes on a GPU backend's resident float64 rows (its sums kernel, the distances to the
    reference points, the silhouette in tiles of rows by means (two tiles of means in "many means", two slices
    of attributes in "wide") and its per-cluster sums, the sampled silhouette's pairs in batches and their sums)
    are the host passes' integers and bits: every score and per-cluster value equal, weighted or not, with an
    empty cluster and a row alone in its own; a float32 run's passes read a float64 copy of its rows (made once,
    kept for the next K) and give the same bits; streamed rows, or a device with no room for the copy, leave the
    passes to the host."""
    if device == "simulator":
        pytest.importorskip("numba.cuda")
        got = run_simulated(_DEVICE_PROGRAM, timeout=HANG_GUARD_S * 4, parts=2)
    else:
        r = subprocess.run([sys.executable, "-c", _DEVICE_PROGRAM], cwd=ROOT, capture_output=True, text=True,
                           timeout=HANG_GUARD_S * 4)
        assert r.returncode == 0, r.stderr[-3000:]
        got = json.loads(r.stdout.strip().splitlines()[-1])
    assert set(got) == {"plain", "weighted", "many means", "wide"}
    for case, res in got.items():
        assert all(res["same"].values()), (case, res["same"])
        assert None not in res["dev"].values(), case
        assert all(res["same float32"].values()), (case, res["same float32"])
        assert res["float32 copy kept"], case
        assert not res["full passes"] and not res["streamed passes"], case
