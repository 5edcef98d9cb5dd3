"""The whole tool under real ``mpirun`` at 1-4 ranks: rank-count independence,
parallel gen-data, scikit-learn parity, and errors that must end the job."""

from __future__ import annotations

import json

import numpy as np
import pytest

from conftest import HANG_GUARD_S, run_cli

pytestmark = pytest.mark.mpi

RANKS = (1, 2, 3, 4)


def _results(out_dir):
    centres = np.loadtxt(out_dir / "centers.csv", delimiter=",", skiprows=1, ndmin=2)
    labels = np.loadtxt(out_dir / "labels.txt", dtype=np.int64)
    summary = json.loads((out_dir / "summary.json").read_text())
    return centres, labels, summary


@pytest.mark.parametrize("init", ["sample", "range"])
def test_results_do_not_depend_on_rank_count(blobs, tmp_path, init):
    runs = {}
    for np_ in RANKS:
        out = tmp_path / f"np{np_}"
        r = run_cli(["run", blobs, "-k", 8, "--init", init, "--seed", 5, "-o", out], np=np_)
        assert r.code == 0, r.err
        runs[np_] = _results(out)
        assert runs[np_][2]["ranks"] == np_
        assert sum(runs[np_][2]["rows_per_rank"]) == 20000
        # the one-time start-up is reported apart from the reading, both timed
        timings = runs[np_][2]["timings"]
        assert timings["startup_s"] > 0 and timings["read_s"] > 0
        assert timings["total_s"] >= timings["startup_s"] + timings["read_s"]
    c1, l1, s1 = runs[1]
    for np_ in RANKS[1:]:
        c, lab, s = runs[np_]
        assert np.array_equal(lab, l1), f"labels differ at -np {np_}"
        np.testing.assert_allclose(c, c1, rtol=1e-12, atol=0)
        assert s["iterations"] == s1["iterations"]
        assert s["inertia"] == pytest.approx(s1["inertia"], rel=1e-12)
        assert s["sizes"] == s1["sizes"]


def test_matches_scikit_learn_lloyd(blobs, tmp_path):
    from sklearn.cluster import KMeans

    x = np.loadtxt(blobs, delimiter=",", comments=["@", "%"])
    rng = np.random.default_rng(11)
    init = x[rng.choice(len(x), 8, replace=False)] + rng.normal(scale=0.5, size=(8, x.shape[1]))
    init_file = tmp_path / "init.csv"
    np.savetxt(init_file, init, delimiter=",", fmt="%.17g")
    out = tmp_path / "out"
    r = run_cli(["run", blobs, "-k", 8, "--init", init_file, "-o", out], np=2)
    assert r.code == 0, r.err
    centres, labels, summary = _results(out)

    ref = KMeans(n_clusters=8, init=init, n_init=1, algorithm="lloyd", tol=0, max_iter=300).fit(x)
    np.testing.assert_allclose(centres, ref.cluster_centers_, rtol=1e-9, atol=0)
    assert np.array_equal(labels, ref.labels_)
    assert summary["iterations"] == ref.n_iter_
    assert summary["inertia"] == pytest.approx(ref.inertia_, rel=1e-9)
    assert summary["converged"] is True


def test_gen_data_is_byte_identical_for_any_rank_count(tmp_path):
    files = []
    for np_ in (1, 2, 3):
        path = tmp_path / f"g{np_}.arff"
        # 150,001 rows: several random-stream blocks, and not divisible by 3
        r = run_cli(["gen-data", path, "-n", 150001, "-m", 3, "-k", 4, "--seed", 9], np=np_)
        assert r.code == 0, r.err
        files.append(path.read_bytes())
    assert files[0] == files[1] == files[2]
    assert files[0].startswith(b"@relation")


def test_more_ranks_than_rows(tmp_path):
    path = tmp_path / "tiny.arff"
    path.write_text("@relation t\n@attribute a numeric\n@attribute b numeric\n@data\n0,0\n10,10\n0.5,0\n")
    out = tmp_path / "out"
    r = run_cli(["run", path, "-k", 2, "--init", "sample", "--seed", 1, "-o", out], np=4)
    assert r.code == 0, r.err
    centres, labels, summary = _results(out)
    assert summary["n"] == 3 and summary["ranks"] == 4
    assert labels[0] == labels[2] != labels[1]
    assert 0 in summary["rows_per_rank"]


def test_bad_row_in_last_rank_ends_job_with_line_number(tmp_path):
    rows = "\n".join(f"{i}.5,{i}.25,{-i}" for i in range(3000))
    lines = rows.split("\n")
    bad_index = 2900  # inside the last third of the data: the last of 3 ranks
    lines[bad_index] = "1.0,abc,2.0"
    path = tmp_path / "bad.arff"
    header = "@relation r\n@attribute x numeric\n@attribute y numeric\n@attribute z numeric\n@data\n"
    path.write_text(header + "\n".join(lines) + "\n")
    r = run_cli(["run", path, "-k", 3], np=3, timeout=60)
    assert r.code == 3, (r.out, r.err)
    assert r.seconds < HANG_GUARD_S, f"took {r.seconds:.1f} s"
    line_no = header.count("\n") + bad_index + 1
    assert f"{path}:{line_no}:" in r.err
    assert "'y'" in r.err and "'abc'" in r.err
    assert "Traceback" not in r.err
    assert r.err.count("mpikmeans: error") == 1  # reported once, by rank 0


def test_crash_on_one_rank_aborts_whole_job(blobs, tmp_path):
    """An unexpected exception on rank 1 only: MPI_Abort, not a hang."""
    import os

    os.environ["MPIKMEANS_FAULT"] = "1:iteration:raise"
    try:
        r = run_cli(["run", blobs, "-k", 8, "-o", tmp_path / "out"], np=3, timeout=60)
    finally:
        del os.environ["MPIKMEANS_FAULT"]
    assert r.code != 0
    assert r.seconds < HANG_GUARD_S, f"took {r.seconds:.1f} s"
    assert "internal error on rank 1" in r.err
    assert not (tmp_path / "out" / "summary.json").exists()


def test_info_lists_every_rank():
    r = run_cli(["info", "--json"], np=2)
    assert r.code == 0, r.err
    data = json.loads(r.out)
    assert [row["rank"] for row in data["ranks"]] == [0, 1]
    assert sorted(row["node_rank"] for row in data["ranks"]) == [0, 1]
    assert data["ranks"][0]["auto_backend"] in ("cpu", "gpu")


@pytest.mark.parametrize("np_, env", [(2, {}), (3, {}), (1, {"OMP_NUM_THREADS": "1"})])
def test_info_and_run_agree_on_threads(blobs, tmp_path, np_, env):
    # reading, the CPU backend's compute and info: one figure per rank, the rank's
    # share of the node's CPUs (ranks unbound on one node), lowered by OMP_NUM_THREADS
    from mpikmeans.cpus import cgroup_cpu_limit, cpus_per_rank, usable_cpus

    env = {"OMP_NUM_THREADS": None, "NUMBA_NUM_THREADS": None, **env}
    mine = usable_cpus()
    expected = cpus_per_rank(mine, [mine] * np_, np_, cgroup_cpu_limit())
    if env["OMP_NUM_THREADS"]:
        expected = min(expected, int(env["OMP_NUM_THREADS"]))
    out = tmp_path / "out"
    r = run_cli(["run", blobs, "-k", 8, "--max-iter", 2, "--backend", "cpu", "-o", out], np=np_, env=env)
    assert r.code == 0, r.err
    s = _results(out)[2]
    r = run_cli(["info", "--json"], np=np_, env=env)
    assert r.code == 0, r.err
    shown = [row["threads"] for row in json.loads(r.out)["ranks"]]
    assert shown == [expected] * np_
    assert s["threads_per_rank"] == s["read_threads_per_rank"] == expected
