"""The names a user chooses among (mpikmeans/choices.py): each one is a working choice of the module that
implements it, and parsing the command line with them imports no numba."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from mpikmeans.backends import make_backend
from mpikmeans.choices import BACKEND_NAMES, DTYPES, INIT_METHODS, NORMALIZE_METHODS, SCORE_CHOICES
from mpikmeans.comm import SerialComm
from mpikmeans.init import initial_centres
from mpikmeans.scaling import fit_scaler
from mpikmeans.scores import quality_scores

from conftest import HANG_GUARD_S

ROOT = Path(__file__).resolve().parents[1]

X = np.random.default_rng(0).normal(size=(60, 3))


@pytest.mark.parametrize("name", [b for b in BACKEND_NAMES if b != "gpu"])
def test_each_backend_name_makes_a_backend(name):
    backend = make_backend(name)
    backend.load(X)
    labels, _ = backend.assign(X[:4].copy())
    assert labels.shape == (60,)
    backend.close()


def test_an_unknown_backend_name_is_refused():
    with pytest.raises(ValueError, match="expected one of auto, cpu, gpu"):
        make_backend("tpu")


@pytest.mark.parametrize("method", INIT_METHODS)
def test_each_init_method_gives_k_centres(method):
    backend = make_backend("cpu")
    backend.load(X)
    centres = initial_centres(SerialComm(), method, 4, X, 0, len(X), 1, backend=backend)
    assert centres.shape == (4, 3)


@pytest.mark.parametrize("method", NORMALIZE_METHODS)
def test_each_normalize_method_fits_a_scaler(method):
    scaler = fit_scaler(SerialComm(), X, method)
    assert scaler.method == method


@pytest.mark.parametrize("choice", SCORE_CHOICES)
def test_each_score_choice_is_accepted(choice):
    labels = (np.arange(60) % 3).astype(np.int32)
    out = quality_scores(SerialComm(), X, labels, 3, scores=choice, sample_size=20)
    assert (out["calinski_harabasz"] is None) == (choice == "none")


def test_dtypes_are_the_storage_types():
    assert DTYPES == ("float64", "float32")


_PARSE = """
import json, sys
from click.testing import CliRunner
from mpikmeans.cli import main
args = json.loads(sys.argv[1])
r = CliRunner().invoke(main, args)
print(json.dumps([r.exit_code, sorted(m for m in ("numba", "numpy") if m in sys.modules)]))
"""


@pytest.mark.parametrize("args, code, imported", [
    (["--help"], 0, []), (["run", "--help"], 0, []), (["predict", "--help"], 0, []),
    (["bench", "runs", "--help"], 0, []), (["template", "pbs"], 0, []),
    (["run", "data.arff", "-k", "3", "--backend", "tpu"], 2, []),
    (["run", "data.arff"], 2, ["numpy"]),  # no K: the job's communicator (numpy's buffers) is up, the run's modules not
])
def test_parsing_the_command_line_imports_no_numba(args, code, imported):
    """``--help``, a template and the usage errors of a run answer without numba's import (about 0.3 s of each)."""
    p = subprocess.run([sys.executable, "-c", _PARSE, json.dumps(args)], capture_output=True, text=True, cwd=ROOT,
                       timeout=HANG_GUARD_S)
    assert p.returncode == 0, p.stderr[-3000:]
    assert json.loads(p.stdout.strip().splitlines()[-1]) == [code, imported]
