"""Tests for the K sweep (:mod:`mpikmeans.sweep`, ``mpikmeans run DATA -k 2:64``): the K specifications
(:func:`mpikmeans.config.parse_k`), the knee rule, each K's results identical to a single run with the
same seed at -np 1 and 3, sweep.csv and sweep.png, the output directory's rules, and a sweep stopped
mid-way (in a K's iterations, or between two K) and resumed giving the same sweep.csv."""

from __future__ import annotations

import csv
import json
import logging
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

sys.path.insert(0, str(Path(__file__).resolve().parent))
from conftest import HANG_GUARD_S, run_cli  # noqa: E402

from mpikmeans.cli.run import run  # noqa: E402
from mpikmeans.config import InvalidSetting, format_k, parse_k  # noqa: E402
from mpikmeans.interrupt import EXIT_CHECKPOINTED  # noqa: E402
from mpikmeans.sweep import best_by_score, kneedle  # noqa: E402

KS = (3, 4, 5)
SPEC = "3:5"


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """A 3,000 x 4 file of 5 blobs; clusters that take a few iterations at K = 3 and 4."""
    path = tmp_path_factory.mktemp("sweep") / "d.arff"
    r = run_cli(["gen-data", path, "-n", 3000, "-m", 4, "-k", 5, "--seed", 1, "-q"])
    assert r.code == 0, r.err
    return path


@pytest.fixture(scope="module")
def singles(data, tmp_path_factory):
    """``run -k K --seed 3`` for each K of the sweep, alone (-np 1)."""
    d = tmp_path_factory.mktemp("singles")
    for k in KS:
        r = run_cli(["run", data, "-k", k, "--seed", 3, "-o", d / f"k{k}", "-q"], timeout=4 * HANG_GUARD_S)
        assert r.code == 0, r.err
    return d


@pytest.fixture(scope="module")
def swept(data, tmp_path_factory):
    """The uninterrupted sweep at -np 3."""
    out = tmp_path_factory.mktemp("swept") / "out"
    r = run_cli(["run", data, "-k", SPEC, "--seed", 3, "-o", out], np=3, timeout=4 * HANG_GUARD_S)
    assert r.code == 0, r.err
    return out, r


def _table(path: Path) -> list:
    """sweep.csv without its seconds column."""
    with open(path) as f:
        rows = list(csv.reader(f))
    assert rows[0][-1] == "seconds"
    return [row[:-1] for row in rows]


# ----------------------------------------------------------------------- K specifications

@pytest.mark.parametrize("spec, expected", [
    (8, 8), ("8", 8), ("2:5", (2, 3, 4, 5)), ("2:8:2", (2, 4, 6, 8)), ("2:9:3", (2, 5, 8)),
    ("16,2,4,4", (2, 4, 16)), ([3, 2], (2, 3)), ("5:5", (5,)), (" 2 : 4 ", (2, 3, 4)),
])
def test_k_specs(spec, expected):
    assert parse_k(spec) == expected


@pytest.mark.parametrize("spec, why", [
    ("2:1", "its LAST 1 is below its FIRST 2"), ("a:b", "'a' is not an integer"), ("0", "expected an integer >= 1"),
    ("x", "expected an integer >= 1"), ("2:64:0", "its STEP 0 is below 1"), ("0,2", "0 is below 1"), ("1:2:3:4", "FIRST:LAST or FIRST:LAST:STEP"),
])
def test_bad_k_specs_are_refused(spec, why):
    with pytest.raises(InvalidSetting, match=why):
        parse_k(spec)


def test_format_k_writes_what_a_person_types():
    assert [format_k(k) for k in (8, (2, 3, 4), (2, 4, 6), (2, 4, 16), (3,))] == ["8", "2:4", "2:6:2", "2,4,16", "3"]


@pytest.fixture
def cli(monkeypatch):
    """``mpikmeans run`` in this process (a job of one); the logger it sets up is put back afterwards."""
    logger = logging.getLogger("mpikmeans")
    saved = (list(logger.handlers), logger.level, logger.propagate)
    monkeypatch.setenv("MPIKMEANS_NO_MPI", "1")
    yield lambda args: CliRunner().invoke(run, [str(a) for a in args])
    logger.handlers[:], logger.level, logger.propagate = saved


@pytest.mark.parametrize("spec, why", [("2:1", "its LAST 1 is below its FIRST 2"), ("a:b", "'a' is not an integer"),
                                       ("0", "expected an integer >= 1"),
                                       ("2:64:0", "its STEP 0 is below 1")])
def test_bad_k_specs_exit_2_with_one_line(data, tmp_path, cli, spec, why):
    r = cli([data, "-k", spec, "-o", tmp_path / "out"])
    assert r.exit_code == 2, r.output
    lines = [line for line in r.output.splitlines() if line.strip()]
    assert len(lines) == 1 and f"-k {spec}: expected" in lines[0] and why in lines[0], r.output
    assert "Traceback" not in r.output and not (tmp_path / "out").exists()


def test_a_sweep_needs_a_random_initialisation(data, tmp_path, cli):
    centres = tmp_path / "c.csv"
    centres.write_text("1,2,3,4\n5,6,7,8\n")
    r = cli([data, "-k", "2:3", "--init", centres, "-o", tmp_path / "out"])
    assert r.exit_code == 2 and "needs a random initialisation" in r.output, r.output


# ----------------------------------------------------------------------- the knee

def test_kneedle_finds_the_elbow_and_says_when_there_is_none():
    ks = [1, 2, 3, 4, 5, 6]
    assert kneedle(ks, [100.0, 40.0, 12.0, 10.0, 9.0, 8.5]) == 3
    assert kneedle(ks, [100.0, 60.0, 20.0, 18.0, 17.0, 16.0]) == 3
    assert kneedle([2, 3], [5.0, 1.0]) is None  # fewer than 3 K
    assert kneedle([2, 3, 4], [5.0, 5.0, 5.0]) is None  # flat
    assert kneedle([2, 3, 4], [10.0, 9.0, 1.0]) is None  # never below the chord (concave)


def test_each_score_names_its_own_best_k():
    """The largest Calinski-Harabasz and silhouettes, the smallest Davies-Bouldin; the smallest K on a tie;
    a score with no value at any K is left out."""
    columns = ["k", "sse", "iterations", "calinski_harabasz", "davies_bouldin", "silhouette_sqeuclidean",
               "silhouette_sample", "seconds"]
    rows = [[2, 9.0, 3, 10.0, 0.9, 0.5, None, 1.0],
            [3, 5.0, 3, 30.0, 0.4, 0.7, None, 1.0],
            [4, 4.0, 3, 30.0, 0.4, 0.6, None, 1.0],
            [5, 3.9, 3, 20.0, 0.6, 0.7, None, 1.0]]
    assert best_by_score(columns, rows) == {"calinski_harabasz": 3, "davies_bouldin": 3, "silhouette_sqeuclidean": 3}
    assert best_by_score(["k", "sse", "iterations", "seconds"], [r[:3] + [1.0] for r in rows]) == {}


# ----------------------------------------------------------------------- a sweep equals single runs

@pytest.mark.mpi
@pytest.mark.parametrize("np_", [1, 3])
def test_each_k_is_the_single_run_with_that_seed(data, singles, swept, tmp_path, np_):
    if np_ == 3:
        out, r = swept
    else:
        out = tmp_path / "out"
        r = run_cli(["run", data, "-k", SPEC, "--seed", 3, "-o", out], np=1, timeout=4 * HANG_GUARD_S)
        assert r.code == 0, r.err
    for k in KS:
        for name in ("labels.txt", "centers.csv"):
            assert (out / f"k{k}" / name).read_bytes() == (singles / f"k{k}" / name).read_bytes(), (k, name)
        summary = json.loads((out / f"k{k}" / "summary.json").read_text())
        alone = json.loads((singles / f"k{k}" / "summary.json").read_text())
        assert summary["k"] == k and summary["inertia"] == alone["inertia"] and summary["ranks"] == np_
        assert summary["scores"]["calinski_harabasz"] == alone["scores"]["calinski_harabasz"]
        assert (out / f"k{k}" / "model.json").exists()
    rows = list(csv.DictReader(open(out / "sweep.csv")))
    assert [int(row["k"]) for row in rows] == list(KS)
    assert list(rows[0]) == ["k", "sse", "iterations", "calinski_harabasz", "davies_bouldin",
                             "silhouette_sqeuclidean", "silhouette_sample", "seconds"]
    for row in rows:
        alone = json.loads((singles / f"k{row['k']}" / "summary.json").read_text())
        assert float(row["sse"]) == alone["inertia"] and int(row["iterations"]) == alone["iterations"]
        assert float(row["silhouette_sample"]) == alone["scores"]["silhouette_sample"]
    knee = kneedle(list(KS), [float(row["sse"]) for row in rows])
    assert (out / "sweep.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert f"suggested K = {knee} (Kneedle knee of SSE)" in r.out
    assert "best K by score: CH " in r.out and ", DB " in r.out
    assert not (out / "checkpoint.npz").exists()


def test_scores_none_leaves_the_score_columns_out(data, tmp_path, cli):
    r = cli([data, "-k", "2,3", "--scores", "none", "-o", tmp_path / "out"])
    assert r.exit_code == 0, r.output
    header = (tmp_path / "out" / "sweep.csv").read_text().splitlines()[0]
    assert header == "k,sse,iterations,seconds"
    assert "scores" not in json.loads((tmp_path / "out" / "k2" / "summary.json").read_text())
    assert "suggested K: none" in r.output  # two K have no knee


def test_a_sweep_never_writes_over_results(data, swept, tmp_path, cli):
    out, _ = swept
    before = (out / "sweep.csv").read_bytes()
    r = cli([data, "-k", SPEC, "--seed", 3, "-o", out])
    assert r.exit_code == 2 and "already holds a K sweep's results" in r.output, r.output
    assert (out / "sweep.csv").read_bytes() == before
    single = tmp_path / "single"
    assert cli([data, "-k", 2, "-o", single]).exit_code == 0
    r = cli([data, "-k", "2:3", "-o", single])
    assert r.exit_code == 2 and "holds the results of a single run" in r.output, r.output
    # a single run is not written into a sweep's directory either
    r = cli([data, "-k", 3, "-o", out])
    assert r.exit_code == 2 and "already holds results" in r.output, r.output


def test_overwrite_replaces_a_sweep_and_drops_its_other_k(data, tmp_path, cli):
    out = tmp_path / "out"
    assert cli([data, "-k", "2,3", "-o", out]).exit_code == 0
    r = cli([data, "-k", "3,4", "-o", out, "--overwrite"])
    assert r.exit_code == 0, r.output
    assert sorted(p.name for p in out.iterdir()) == ["k3", "k4", "sweep.csv", "sweep.png"]


# ----------------------------------------------------------------------- stopped and resumed

@pytest.mark.mpi
@pytest.mark.parametrize("fault, np_", [
    # rank 0 gets SIGTERM (a scheduler's) in the middle of the sweep's Lloyd iterations
    ("0:iteration:term:{mid}", 3),
    # ... or as the second K's results are written: they finish, the third K is not begun
    ("0:write:term:2", 1),
])
def test_a_stopped_sweep_resumes_to_the_same_table(data, swept, tmp_path, fault, np_):
    whole, _ = swept
    first = next(csv.DictReader(open(whole / "sweep.csv")))
    spec = fault.format(mid=int(first["iterations"]) + 2)
    out = tmp_path / "out"
    args = ["run", data, "-k", SPEC, "--seed", 3, "-o", out, "-q"]
    r = run_cli(args, np=np_, env={"MPIKMEANS_FAULT": spec}, timeout=4 * HANG_GUARD_S)
    assert r.code == EXIT_CHECKPOINTED, (r.code, r.err)
    assert "K sweep stopped by SIGTERM" in r.err and "--resume" in r.err, r.err
    assert (out / "k3" / "summary.json").exists() and not (out / "sweep.csv").exists()
    assert not (out / "k5" / "summary.json").exists()
    kept = (out / "k3" / "summary.json").read_bytes()
    r = run_cli(args + ["--resume", out / "checkpoint.npz"], np=np_, timeout=4 * HANG_GUARD_S)
    assert r.code == 0, r.err
    assert _table(out / "sweep.csv") == _table(whole / "sweep.csv")
    assert (out / "k3" / "summary.json").read_bytes() == kept  # a finished K is not fitted again
    for k in KS:
        assert (out / f"k{k}" / "labels.txt").read_bytes() == (whole / f"k{k}" / "labels.txt").read_bytes()
    assert not (out / "checkpoint.npz").exists()


def test_resume_refuses_a_kept_k_of_other_settings(data, tmp_path, cli):
    out = tmp_path / "out"
    r = cli([data, "-k", "2,3", "--seed", 1, "-o", out], )
    assert r.exit_code == 0, r.output
    # a checkpoint of K = 3 with seed 2: made by stopping that K's own run
    ckpt = tmp_path / "c.npz"
    r = run_cli(["run", data, "-k", 3, "--seed", 2, "-o", tmp_path / "one", "--checkpoint", ckpt,
                 "--checkpoint-every", 1, "-q"], timeout=4 * HANG_GUARD_S)
    assert r.code == 0 and ckpt.exists(), r.err
    r = cli([data, "-k", "2,3", "--seed", 2, "-o", out, "--resume", ckpt])
    assert r.exit_code == 2 and "was made with seed 1, this sweep has 2" in r.output, r.output
