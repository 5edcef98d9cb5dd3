"""Tests for ``mpikmeans predict`` (:mod:`mpikmeans.predict`, :mod:`mpikmeans.cli.predict`): a run's model
applied to the run's own file gives the run's labels, to the row, at -np 1 and 3; the extra outputs;
every mismatch between a data file and a model, and every bad model file, with its exit code; the
output directory's rules."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

sys.path.insert(0, str(Path(__file__).resolve().parent))
from conftest import HANG_GUARD_S, Result, _env, mpirun_path, needs_gpu, run_cli  # noqa: E402
from test_model import COLOURS, NOMINAL_ARFF, fit_like_run, gaps_fill, write_gaps, write_mixed  # noqa: E402

from mpikmeans.bench.harness import MPI_START_FAILURE  # noqa: E402
from mpikmeans.cli.predict import predict  # noqa: E402
from mpikmeans.comm import SerialComm  # noqa: E402
from mpikmeans.config import build_config  # noqa: E402
from mpikmeans.model import load_model, save_model  # noqa: E402
from mpikmeans.nominal import ONE  # noqa: E402
from mpikmeans.predict import assignment_backend, default_prediction_dir  # noqa: E402
from mpikmeans.startup import read_input  # noqa: E402
from mpikmeans.scores import all_dist2  # noqa: E402

#: ``mpikmeans predict ...`` through the command group (the command registers itself when its module is imported)
_PROGRAM = "import mpikmeans.cli.predict; from mpikmeans.cli import entry; entry()"


def predict_cli(args: list, np: int | None = None, timeout: float = 4 * HANG_GUARD_S) -> Result:
    """Run ``mpikmeans predict ARGS`` in a new process, under ``mpirun -np NP`` when given (as conftest.run_cli)."""
    cmd = [sys.executable, "-c", _PROGRAM, "predict"] + [str(a) for a in args]
    if np is not None:
        mpirun = mpirun_path()
        if mpirun is None:
            pytest.skip("mpirun not found")
        cmd = [mpirun, "-np", str(np), "--oversubscribe", "--bind-to", "none"] + cmd
    for attempt in range(2):
        t0 = time.monotonic()
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=_env(), start_new_session=True)
        # Open MPI's runtime failing to start ran none of the tool: launched once more, as run_cli does
        if np is None or MPI_START_FAILURE not in p.stderr or attempt:
            break
    return Result(p.returncode, p.stdout, p.stderr, time.monotonic() - t0)


@pytest.fixture
def cli(monkeypatch):
    """The click command in this process (a job of one); the logger it sets up is put back afterwards."""
    logger = logging.getLogger("mpikmeans")
    saved = (list(logger.handlers), logger.level, logger.propagate)
    monkeypatch.setenv("MPIKMEANS_NO_MPI", "1")

    def invoke(args: list):
        return CliRunner().invoke(predict, [str(a) for a in args])

    yield invoke
    logger.handlers[:], logger.level, logger.propagate = saved


@pytest.fixture(scope="module")
def trained(blobs, tmp_path_factory):
    """``mpirun -np 3 mpikmeans run blobs -k 8 --normalize zscore`` and its model (fitted as the run fits it)."""
    d = tmp_path_factory.mktemp("trained")
    r = run_cli(["run", blobs, "-k", 8, "--normalize", "zscore", "--seed", 5, "--backend", "cpu", "-o", d / "run",
                 "-q"], np=3, timeout=4 * HANG_GUARD_S)
    assert r.code == 0, r.err
    model, labels, _ = fit_like_run(blobs, k=8, normalize="zscore", seed=5)
    # the model is the run's: the same centres (centers.csv, repr precision) and labels
    run_centres = np.loadtxt(d / "run" / "centers.csv", delimiter=",", skiprows=1)
    assert run_centres.tobytes() == model.centres.tobytes()
    assert np.array_equal(np.loadtxt(d / "run" / "labels.txt", dtype=np.int64), labels)
    save_model(str(d / "model.json"), model)
    return d / "model.json", d / "run"


@pytest.mark.mpi
@pytest.mark.parametrize("backend", ["cpu", pytest.param("gpu", marks=[pytest.mark.gpu, needs_gpu])])
@pytest.mark.parametrize("np_", [1, 3])
def test_predict_on_the_training_file_gives_the_runs_labels(blobs, trained, tmp_path, np_, backend):
    model, run = trained
    gpu = ["--share-gpus"] if backend == "gpu" else []
    r = predict_cli([model, blobs, "-o", tmp_path / "p", "-q", "--backend", backend, *gpu], np=np_)
    assert r.code == 0, r.err
    assert (tmp_path / "p" / "labels.txt").read_bytes() == (run / "labels.txt").read_bytes()
    mine, theirs = (json.loads((d / "summary.json").read_text()) for d in (tmp_path / "p", run))
    assert mine["command"] == "predict" and mine["ranks"] == np_ and mine["n"] == theirs["n"]
    assert mine["backend"] == backend
    assert mine["sizes"] == theirs["sizes"]
    assert mine["inertia"] == pytest.approx(theirs["inertia"], rel=1e-12)
    assert mine["inertia_units"] == "scaled (zscore)" and set(mine["timings"]) >= {"read_s", "assign_s", "total_s"}


@pytest.mark.mpi
def test_nominal_missing_and_write_arff_give_the_runs_files(tmp_path):
    data = write_mixed(tmp_path / "mixed.arff", rows=300, seed=4)
    settings = ["-k", 3, "--nominal", "weka", "--normalize", "minmax", "--missing", "drop", "--ignore", "id"]
    r = run_cli(["run", data, *settings, "--seed", 2, "--write-arff", "-o", tmp_path / "run", "-q"], np=1,
                timeout=4 * HANG_GUARD_S)
    assert r.code == 0, r.err
    model, _, local = fit_like_run(data, k=3, nominal="weka", normalize="minmax", missing="drop", ignore="id", seed=2)
    save_model(str(tmp_path / "model.json"), model)
    r = predict_cli([tmp_path / "model.json", data, "--write-arff", "--distances", "-o", tmp_path / "p"], np=3)
    assert r.code == 0, r.err
    assert "dropped for a missing value" in r.out
    labels = (tmp_path / "p" / "labels.txt").read_bytes()
    assert labels == (tmp_path / "run" / "labels.txt").read_bytes() and b"-1\n" in labels
    assert (tmp_path / "p" / "clustered.arff").read_bytes() == (tmp_path / "run" / "clustered.arff").read_bytes()
    dist = np.loadtxt(tmp_path / "p" / "distances.txt")
    lab = np.loadtxt(tmp_path / "p" / "labels.txt", dtype=np.int64)
    assert np.array_equal(np.isnan(dist), lab == -1) and len(dist) == local.input_rows


def test_distances_and_transform(blobs, trained, tmp_path, cli):
    model, run = trained
    r = cli([model, blobs, "--transform", "-o", tmp_path / "t", "-q"])
    assert r.exit_code == 0, r.output
    table = np.load(tmp_path / "t" / "transform.npy")
    labels = np.loadtxt(run / "labels.txt", dtype=np.int64)
    assert table.shape == (len(labels), 8) and np.array_equal(table.argmin(axis=1), labels)
    r = cli([model, blobs, "--distances", "-o", tmp_path / "d", "-q"])
    assert r.exit_code == 0, r.output
    dist = np.loadtxt(tmp_path / "d" / "distances.txt")
    assert dist.tobytes() == table.min(axis=1).tobytes()  # both sqrt of the backends' own d^2
    m = load_model(str(model))
    x = m.scaler.transform(read_input(SerialComm(), str(blobs), build_config({}, {"k": 8}), 1).x)
    assert table.tobytes() == np.sqrt(all_dist2(x, m.centres_scaled)).tobytes()
    r = cli([model, blobs, "--distances", "--transform", "-o", tmp_path / "both"])
    assert r.exit_code == 2 and "choose one" in r.output and not (tmp_path / "both").exists()


@pytest.fixture(scope="module")
def mixed_model(tmp_path_factory):
    d = tmp_path_factory.mktemp("mixed_model")
    data = write_mixed(d / "mixed.arff", rows=120, seed=1, missing=False)
    model = fit_like_run(data, k=3, nominal="weka", ignore="id")[0]
    save_model(str(d / "M.json"), model)
    return d / "M.json", model


@pytest.mark.parametrize("case, header, words", [
    ("missing attribute", NOMINAL_ARFF.replace("@attribute b real\n", ""), "no attribute 'b'"),
    ("other order", NOMINAL_ARFF.replace("@attribute a numeric\n@attribute colour {red,green,blue}\n",
                                         "@attribute colour {red,green,blue}\n@attribute a numeric\n"),
     "attribute 'colour' comes where the model"),
    ("numeric vs nominal", NOMINAL_ARFF.replace("@attribute a numeric", "@attribute a {x,y}"),
     "attribute 'a' is nominal, numeric in the model"),
    ("unknown category", NOMINAL_ARFF.replace("{red,green,blue}", "{red,green,blue,purple}"),
     "attribute 'colour': category 'purple' is not one of the model"),
])
def test_each_mismatch_exits_3_with_one_line_naming_both_files(mixed_model, tmp_path, cli, case, header, words):
    model, _ = mixed_model
    rows = {"missing attribute": "1,0.5,red,'n'\n", "other order": "1,red,0.5,1.0,'n'\n",
            "numeric vs nominal": "1,x,red,1.0,'n'\n"}.get(case, "1,0.5,red,1.0,'n'\n")
    data = tmp_path / "new.arff"
    data.write_text(header + rows)
    r = cli([model, data, "-o", tmp_path / "out"])
    lines = [line for line in r.stderr.splitlines() if line.strip()]
    assert r.exit_code == 3, r.output
    assert len(lines) == 1 and words in lines[0] and str(data) in lines[0] and str(model) in lines[0], r.stderr
    assert "Traceback" not in r.output and not (tmp_path / "out").exists()


@pytest.mark.parametrize("case, code, words", [
    ("wrong version", 2, "format version 2"),
    ("not a model", 2, "not an mpikmeans model"),
    ("missing key", 3, "no 'scaling'"),
    ("malformed fill", 3, "'missing.fill' has shape (1,)"),
])
def test_a_bad_model_file_exits_with_its_code(mixed_model, tmp_path, cli, case, code, words):
    _, model = mixed_model
    path = tmp_path / "bad.json"
    doc = json.loads(model.to_json())
    if case == "wrong version":
        doc["format_version"] = 2
    elif case == "missing key":
        del doc["scaling"]
    elif case == "malformed fill":
        doc["missing"] = {"policy": "mean", "fill": [1.0]}
    path.write_text(json.dumps(doc) if case != "not a model" else "k,centres\n3,1.0\n")
    data = write_mixed(tmp_path / "new.arff", rows=30)
    r = cli([path, data, "-o", tmp_path / "out"])
    assert r.exit_code == code and words in r.stderr and str(path) in r.stderr, r.output
    assert len(r.stderr.strip().splitlines()) == 1 and not (tmp_path / "out").exists()


@pytest.mark.mpi
def test_a_mismatch_under_mpirun_is_one_message_and_exit_3(mixed_model, tmp_path):
    model, _ = mixed_model
    data = tmp_path / "new.arff"
    data.write_text(NOMINAL_ARFF.replace("{red,green,blue}", "{red,green,blue,purple}") + "1,0.5,red,1.0,'n'\n" * 50)
    r = predict_cli([model, data, "-o", tmp_path / "out"], np=3)
    assert r.code == 3, r.err
    assert r.err.count("category 'purple'") == 1 and "Traceback" not in r.err


def test_the_output_directory_is_never_mixed_or_written_over(mixed_model, tmp_path, cli):
    model, _ = mixed_model
    data = write_mixed(tmp_path / "new.arff", rows=60, missing=False)
    assert default_prediction_dir(str(data)) == str(tmp_path / "new.predict")
    r = cli([model, data, "--distances"])
    assert r.exit_code == 0, r.output
    out = tmp_path / "new.predict"
    assert sorted(p.name for p in out.iterdir()) == ["distances.txt", "labels.txt", "summary.json"]
    r = cli([model, data])
    assert r.exit_code == 2 and "already holds results" in r.stderr
    r = cli([model, data, "--overwrite"])  # replaced as a whole: no distances.txt of the last prediction
    assert r.exit_code == 0, r.output
    assert sorted(p.name for p in out.iterdir()) == ["labels.txt", "summary.json"]
    # never over its own input: a directory holding the model, or a stray file of predict's names
    r = cli([model, data, "-o", model.parent, "--overwrite"])
    assert r.exit_code == 2 and "holds the model" in r.stderr
    stray = tmp_path / "stray"
    stray.mkdir()
    (stray / "transform.npy").write_bytes(b"mine")
    r = cli([model, data, "-o", stray, "--overwrite"])
    assert r.exit_code == 2 and "transform.npy" in r.stderr and (stray / "transform.npy").read_bytes() == b"mine"


def test_a_npy_copy_is_predicted_as_its_text(blobs, trained, tmp_path, cli):
    model, run = trained
    r = run_cli(["convert", blobs, tmp_path / "b.npy"], timeout=4 * HANG_GUARD_S)
    assert r.code == 0, r.err
    r = cli([model, tmp_path / "b.npy", "-o", tmp_path / "p", "-q"])
    assert r.exit_code == 0, r.output
    assert (tmp_path / "p" / "labels.txt").read_bytes() == (run / "labels.txt").read_bytes()
    r = cli([model, tmp_path / "b.npy", "--write-arff", "-o", tmp_path / "q"])
    assert r.exit_code == 2 and "ARFF or CSV" in r.stderr


# ----------------------------------------------------------------------- --missing mean: the training means

@pytest.fixture(scope="module")
def mean_model(tmp_path_factory):
    """``mpikmeans run`` with --missing mean on a file with '?' everywhere: (model.json, the training fill)."""
    d = tmp_path_factory.mktemp("mean_model")
    data, a, b, colour = write_gaps(d / "train.arff", rows=600, seed=11)
    r = run_cli(["run", data, "-k", 3, "--nominal", "weka", "--missing", "mean", "--normalize", "zscore",
                 "--seed", 4, "-o", d / "run", "-q"], timeout=4 * HANG_GUARD_S)
    assert r.code == 0, r.err
    return d / "run" / "model.json", gaps_fill(a, b, colour)


def _by_hand(model, a, b, colour, fill):
    """Labels and distances of rows (a, b with NaN for '?', colour None for '?') filled with ``fill``, scaled with
    the model's scaling, against its centres: numpy alone."""
    cats = model.layout.values[1]
    x = np.zeros((len(a), 5))
    x[:, 0] = np.where(np.isnan(a), fill[0], a)
    x[:, 4] = np.where(np.isnan(b), fill[4], b)
    for i, c in enumerate(colour):
        if c is None:
            x[i, 1:4] = fill[1:4]
        else:
            x[i, 1 + cats.index(c)] = ONE
    z = model.scaler.transform(x)
    d2 = ((z[:, None, :] - model.centres_scaled[None, :, :]) ** 2).sum(axis=2)
    return d2.argmin(axis=1), np.sqrt(d2.min(axis=1))


@pytest.mark.mpi
@pytest.mark.parametrize("case", ["same header", "categories reordered, mode absent"])
def test_a_mean_model_fills_new_rows_with_the_training_means(mean_model, tmp_path, case):
    path, trained = mean_model
    model = load_model(str(path))
    fill = model.missing["fill"]
    np.testing.assert_allclose(fill, trained, rtol=1e-13, atol=0.0)
    mode = COLOURS[int(np.argmax(fill[1:4]))]
    # new rows mostly of the third group, with '?' elsewhere than the training file's: their own means are not
    # the training ones; with "mode absent" the header lists the categories in another order, without the mode
    colours = COLOURS if case == "same header" else tuple(c for c in reversed(COLOURS) if c != mode)
    data, a, b, colour = write_gaps(tmp_path / "new.arff", rows=300, seed=12, groups=(0.1, 0.2, 0.7),
                                    colours=colours, gap=0.2)
    assert abs(np.nanmean(a) - fill[0]) > 2.0  # the test tells the two fills apart
    r = predict_cli([path, data, "--distances", "-o", tmp_path / "p", "-q"], np=3)
    assert r.code == 0, r.err
    labels = np.loadtxt(tmp_path / "p" / "labels.txt", dtype=np.int64)
    dist = np.loadtxt(tmp_path / "p" / "distances.txt")
    expected, expected_dist = _by_hand(model, a, b, colour, fill)
    assert np.array_equal(labels, expected)
    np.testing.assert_allclose(dist, expected_dist, rtol=1e-9, atol=1e-12)
    summary = json.loads((tmp_path / "p" / "summary.json").read_text())
    assert summary["missing"]["policy"] == "mean" and summary["missing"]["count"] > 0
    # the new rows' own means would give other labels: the model's, not a refit, were applied
    own = [float(np.nanmean(a))] + list(fill[1:4]) + [float(np.nanmean(b))]
    assert not np.array_equal(_by_hand(model, a, b, colour, own)[0], labels)


def test_a_mean_model_without_fill_refuses_data_with_missing_values(mean_model, tmp_path, cli):
    path, _ = mean_model
    doc = json.loads(path.read_text())
    doc["missing"]["fill"] = None  # as an earlier mpikmeans wrote it
    old = tmp_path / "old.json"
    old.write_text(json.dumps(doc))
    data = write_gaps(tmp_path / "new.arff", rows=80, seed=3)[0]
    r = cli([old, data, "-o", tmp_path / "out"])
    lines = [line for line in r.stderr.splitlines() if line.strip()]
    assert r.exit_code == 3, r.output
    assert len(lines) == 1 and str(data) in lines[0] and str(old) in lines[0], r.stderr
    assert "missing value" in lines[0] and "missing.fill is null" in lines[0] and "fit the model again" in lines[0]
    assert "Traceback" not in r.output and not (tmp_path / "out").exists()
    # data without a '?' needs no fill: predicted as with the full model
    full = write_gaps(tmp_path / "full.arff", rows=80, seed=3, gap=0.0)[0]
    r = cli([old, full, "-o", tmp_path / "old_out", "-q"])
    assert r.exit_code == 0, r.output
    r = cli([path, full, "-o", tmp_path / "new_out", "-q"])
    assert r.exit_code == 0, r.output
    assert (tmp_path / "old_out" / "labels.txt").read_bytes() == (tmp_path / "new_out" / "labels.txt").read_bytes()


@pytest.mark.parametrize("requested, possible, rows, k, columns, itemsize, threads, expected", [
    ("cpu", True, 10**9, 1000, 100, 8, 1, "cpu"),      # asked: as asked, however large
    ("gpu", True, 10, 2, 2, 8, 64, "gpu"),
    ("auto", False, 10**9, 1000, 100, 8, 1, "cpu"),   # no GPU on the node
    ("auto", True, 5 * 10**6, 50, 100, 8, 16, "cpu"),  # the specification's example, 16 threads: the copy costs more
    ("auto", True, 5 * 10**6, 50, 100, 8, 2, "gpu"),   # the same on 2 threads: the arithmetic does
    ("auto", True, 3 * 10**5, 1000, 257, 8, 16, "gpu"),  # many centres
    ("auto", True, 1000, 1000, 257, 8, 16, "cpu"),     # too few rows to pay for the GPU's start
    ("auto", True, 10**7, 64, 100, 4, 16, "gpu"),      # float32 halves the copy
])
def test_the_prediction_backend_follows_its_table(requested, possible, rows, k, columns, itemsize, threads, expected):
    assert assignment_backend(requested, possible, rows, k, columns, itemsize, threads) == expected


def test_auto_predicts_on_the_cpu_where_the_copy_would_cost_more(blobs, trained, tmp_path, cli, monkeypatch):
    """A node with a GPU, a model of few centres: ``auto`` assigns on the CPU, and no GPU is started."""
    import mpikmeans.predict as predict_module

    asked = []
    real = predict_module.DevicePreparation

    def preparation(comm, cfg):
        asked.append(cfg.backend)
        return real(comm, cfg)

    monkeypatch.setattr(predict_module, "gpu_possible", lambda: True)
    monkeypatch.setattr(predict_module, "DevicePreparation", preparation)
    model, _ = trained
    r = cli([model, blobs, "-o", tmp_path / "p", "-q"])
    assert r.exit_code == 0, r.output
    assert asked == ["cpu"]  # the GPU's start is never begun
    summary = json.loads((tmp_path / "p" / "summary.json").read_text())
    assert summary["backend"] == "cpu"
