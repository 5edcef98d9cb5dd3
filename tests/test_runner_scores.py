"""Tests for what every ``mpikmeans run`` adds after the fit (:mod:`mpikmeans.runner`): the quality scores in
summary.json (equal to scikit-learn's on the same labels, and to :mod:`mpikmeans.scores`; the same at -np 1
and 3; ``--scores none`` leaves them out), model.json beside centers.csv (``mpikmeans predict`` on the
training file gives labels.txt exactly, at -np 1 and 3), and ``--init model.json`` (a run goes on from a
model; a data file that does not match it is one line naming both files, exit 3)."""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

sys.path.insert(0, str(Path(__file__).resolve().parent))
from conftest import HANG_GUARD_S, run_cli  # noqa: E402

from mpikmeans.cli.run import run  # noqa: E402
from mpikmeans.comm import SerialComm  # noqa: E402
from mpikmeans.config import build_config  # noqa: E402
from mpikmeans.startup import read_input  # noqa: E402
from mpikmeans.scores import quality_scores, sample_indices  # noqa: E402


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """A 2,500 x 3 file of 4 blobs."""
    path = tmp_path_factory.mktemp("scores") / "d.arff"
    r = run_cli(["gen-data", path, "-n", 2500, "-m", 3, "-k", 4, "--seed", 7, "-q"])
    assert r.code == 0, r.err
    return path


@pytest.fixture(scope="module")
def rows(data):
    """The file's rows as a run reads them."""
    return read_input(SerialComm(), str(data), build_config({}, {"k": 2}), 1).x.copy()


@pytest.fixture(scope="module")
def runs(data, tmp_path_factory):
    """``run -k 4 --seed 2 --score-sample 700`` at -np 1 and 3."""
    d = tmp_path_factory.mktemp("runs")
    for np_ in (1, 3):
        r = run_cli(["run", data, "-k", 4, "--seed", 2, "--score-sample", 700, "-o", d / f"np{np_}", "-q"], np=np_,
                    timeout=4 * HANG_GUARD_S)
        assert r.code == 0, r.err
    return d


@pytest.fixture
def cli(monkeypatch):
    """``mpikmeans run`` in this process (a job of one); the logger it sets up is put back afterwards."""
    logger = logging.getLogger("mpikmeans")
    saved = (list(logger.handlers), logger.level, logger.propagate)
    monkeypatch.setenv("MPIKMEANS_NO_MPI", "1")
    yield lambda args: CliRunner().invoke(run, [str(a) for a in args])
    logger.handlers[:], logger.level, logger.propagate = saved


@pytest.mark.mpi
def test_summary_holds_the_scores_of_scikit_learn_and_of_scores_py(runs, rows):
    from sklearn.metrics import calinski_harabasz_score, davies_bouldin_score, silhouette_score

    one, three = (json.loads((runs / f"np{n}" / "summary.json").read_text()) for n in (1, 3))
    assert one["scores"] == three["scores"]  # the same bits at any rank count
    s = one["scores"]
    labels = np.loadtxt(runs / "np1" / "labels.txt", dtype=np.int64)
    assert s["calinski_harabasz"] == pytest.approx(calinski_harabasz_score(rows, labels), rel=1e-9)
    assert s["davies_bouldin"] == pytest.approx(davies_bouldin_score(rows, labels), rel=1e-9)
    idx = sample_indices(len(rows), 700, one["seed"])
    assert s["silhouette_sample_size"] == 700
    assert s["silhouette_sample"] == pytest.approx(silhouette_score(rows[idx], labels[idx]), rel=1e-9)
    mine = quality_scores(SerialComm(), rows, labels, 4, sample_size=700, seed=one["seed"])
    for name in ("calinski_harabasz", "davies_bouldin", "silhouette_sqeuclidean", "silhouette_sample"):
        assert s[name] == pytest.approx(mine[name], rel=1e-12), name
    assert one["timings"]["scores_s"] >= 0
    model = json.loads((runs / "np1" / "model.json").read_text())
    assert model["scores"]["calinski_harabasz"] == s["calinski_harabasz"]


def test_scores_none_leaves_them_out(data, tmp_path, cli):
    r = cli([data, "-k", 3, "--scores", "none", "-o", tmp_path / "out", "-q"])
    assert r.exit_code == 0, r.output
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert "scores" not in summary and summary["timings"]["scores_s"] == 0.0
    assert "scores" not in json.loads((tmp_path / "out" / "model.json").read_text())


@pytest.mark.parametrize("option, value, words", [("--scores", "some", "'some' is not one of"),
                                                  ("--score-sample", "-1", "expected an integer >= 0")])
def test_bad_score_options_exit_2(data, tmp_path, cli, option, value, words):
    r = cli([data, "-k", 3, option, value, "-o", tmp_path / "out"])
    assert r.exit_code == 2 and words in r.output, r.output


@pytest.mark.mpi
@pytest.mark.parametrize("np_", [1, 3])
def test_predict_with_the_runs_model_gives_its_labels(data, runs, tmp_path, np_):
    run_dir = runs / "np3"
    assert sorted(p.name for p in run_dir.iterdir()) == ["centers.csv", "labels.txt", "model.json", "summary.json"]
    r = run_cli(["predict", run_dir / "model.json", data, "-o", tmp_path / "p", "-q"], np=np_,
                timeout=4 * HANG_GUARD_S)
    assert r.code == 0, r.err
    assert (tmp_path / "p" / "labels.txt").read_bytes() == (run_dir / "labels.txt").read_bytes()


def test_the_results_line_names_model_json(data, tmp_path, cli):
    r = cli([data, "-k", 2, "-o", tmp_path / "out"])
    assert r.exit_code == 0 and "(centers.csv, labels.txt, model.json, summary.json)" in r.output, r.output
    # a second run without --overwrite is refused and leaves model.json as it was
    before = (tmp_path / "out" / "model.json").read_bytes()
    r = cli([data, "-k", 3, "-o", tmp_path / "out"])
    assert r.exit_code == 2 and "already holds results" in r.output
    assert (tmp_path / "out" / "model.json").read_bytes() == before


def test_init_from_a_model_goes_on_from_its_centres(data, runs, tmp_path, cli):
    model = runs / "np1" / "model.json"
    # a converged model's centres: the run starts there and ends at once with the same labels
    r = cli([data, "--init", model, "-o", tmp_path / "out", "-q"])  # -k left out: the model's
    assert r.exit_code == 0, r.output
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["k"] == 4 and summary["iterations"] <= 2 and summary["init"] == str(model)
    assert (tmp_path / "out" / "labels.txt").read_bytes() == (runs / "np1" / "labels.txt").read_bytes()
    r = cli([data, "-k", 3, "--init", model, "-o", tmp_path / "k3"])
    assert r.exit_code == 2 and "the model has 4 centres, and -k is 3" in r.output, r.output


def test_init_from_a_model_of_other_attributes_exits_3(runs, tmp_path, cli):
    other = tmp_path / "other.arff"
    other.write_text("@relation o\n@attribute X1 numeric\n@attribute Y numeric\n@attribute X3 numeric\n@data\n"
                     + "".join(f"{i},{i % 7},{i % 3}\n" for i in range(40)))
    model = runs / "np1" / "model.json"
    r = cli([other, "--init", model, "-o", tmp_path / "out", "-q"])
    assert r.exit_code == 3, r.output
    lines = [line for line in r.output.splitlines() if line.strip()]
    assert len(lines) == 1 and str(other) in lines[0] and str(model) in lines[0] and "'Y'" in lines[0], r.output
    assert not (tmp_path / "out").exists()
