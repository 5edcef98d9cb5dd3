"""Issue 40 item 5: centres, SSE and labels are the same bits at any number of ranks.

The real tool under ``mpirun -np 1, 2, 3, 4, 7`` on three small data sets: well-separated blobs;
clusters that start empty and take the farthest points; and ``--normalize zscore`` with instance
weights and a nominal attribute under ``--nominal weka``.  centers.csv (``repr`` precision: every
bit) and labels.txt must be byte for byte those of one rank, and summary.json's SSE, per-cluster
SSE and every iteration's SSE equal.  The CPU backend runs everywhere; the GPU backend (ranks sharing
the machine's GPUs, ``--share-gpus``) only where a real GPU answers: there its float64 results must
also be the CPU's, bit for bit (float32 storage: the same bits at every rank count).
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from conftest import needs_gpu, run_cli

pytestmark = pytest.mark.mpi

RANKS = (1, 2, 3, 4, 7)


def _arff(path, names, rows, nominal=None, weights=None):
    """An ARFF file of float rows written with ``repr`` (every bit), optionally a nominal last
    attribute ``nominal = (values, per-row index)`` and Weka instance weights ``{w}``."""
    with open(path, "w") as f:
        f.write("@relation r\n")
        for name in names:
            f.write(f"@attribute {name} numeric\n")
        if nominal is not None:
            f.write("@attribute colour {" + ",".join(nominal[0]) + "}\n")
        f.write("@data\n")
        for i, row in enumerate(rows):
            cells = [repr(float(v)) for v in row]
            if nominal is not None:
                cells.append(nominal[0][nominal[1][i]])
            line = ",".join(cells)
            if weights is not None:
                line += ",{" + repr(float(weights[i])) + "}"
            f.write(line + "\n")


def _blobs(tmp_path):
    """2,100 rows of 5 well-separated blobs in 4-d, values with full mantissas: float64 sums of them
    in another order differ in their last bits."""
    rng = np.random.default_rng(40)
    centres = rng.uniform(-50, 50, (5, 4))
    x = centres[rng.integers(0, 5, 2100)] + rng.normal(size=(2100, 4)) * np.array([1.0, 0.3, 2.0, 0.7])
    path = tmp_path / "blobs.arff"
    _arff(path, ["a", "b", "c", "d"], x)
    return path, ["-k", 5, "--init", "k-means++", "--seed", 2]


def _empty(tmp_path):
    """Four tight blobs, two far rows, and initial centres of which two have no row: both are moved to
    the rows farthest from their centres (scikit-learn's rule)."""
    rng = np.random.default_rng(41)
    blobs = np.array([[0.0, 0.0, 0.0], [10.0, 0.0, 0.0], [0.0, 10.0, 0.0], [0.0, 0.0, 10.0]])
    x = blobs[rng.integers(0, 4, 2100)] + rng.normal(scale=0.7, size=(2100, 3))
    x[17] = [40.0, 40.0, 40.0]
    x[1500] = [-35.0, 30.0, 0.5]
    path = tmp_path / "empty.arff"
    _arff(path, ["a", "b", "c"], x)
    init = np.array([[0.2, 0.1, 0.0], [9.5, 0.3, 0.0], [0.0, 5.0, 5.0], [-80.0, -80.0, -80.0],
                     [-90.0, 80.0, -80.0]])
    csv = tmp_path / "init.csv"
    np.savetxt(csv, init, delimiter=",", header="a,b,c", comments="")
    return path, ["-k", 5, "--init", csv, "--empty-cluster", "farthest"]


def _mixed(tmp_path):
    """Attributes on scales from 1e-3 to 1e4 (z-scored), a nominal attribute (Weka's 0/1 distance,
    the mode as centroid) and instance weights with many bits."""
    rng = np.random.default_rng(42)
    n = 2100
    group = rng.integers(0, 4, n)
    centres = rng.uniform(-3, 3, (4, 3))
    x = (centres[group] + rng.normal(size=(n, 3)) * 0.4) * np.array([1e-3, 1.0, 1e4]) + np.array([0.0, 7.0, -2e4])
    colours = np.where(rng.random(n) < 0.8, group % 3, rng.integers(0, 3, n))
    w = rng.uniform(0.05, 4.0, n)
    path = tmp_path / "mixed.arff"
    _arff(path, ["p", "q", "r"], x, nominal=(["red", "green", "blue"], colours), weights=w)
    return path, ["-k", 4, "--normalize", "zscore", "--nominal", "weka", "--seed", 5]


CASES = {"blobs": _blobs, "empty-clusters": _empty, "zscore-weights-nominal": _mixed}


def _results(out):
    summary = json.loads((out / "summary.json").read_text())
    return {
        "centers.csv": (out / "centers.csv").read_text(),
        "labels.txt": (out / "labels.txt").read_bytes(),
        "inertia": summary["inertia"],
        "cluster_sse": summary["cluster_sse"],
        "history sse": [h["sse"] for h in summary["history"]],
        "sizes": summary["sizes"],
        "iterations": summary["iterations"],
    }, summary


def _run(data, args, backend, ranks, out):
    backend, _, dtype = backend.partition("-")
    extra = ["--share-gpus"] if backend == "gpu" else []
    extra += ["--dtype", dtype] if dtype else []
    r = run_cli(["run", data, *args, "--backend", backend, *extra, "-o", out, "-q"], np=ranks, timeout=300)
    assert r.code == 0, f"{backend} -np {ranks}: {r.err}"


@pytest.mark.parametrize("backend", ["cpu"] + [pytest.param(b, marks=[pytest.mark.gpu, needs_gpu])
                                               for b in ("gpu", "gpu-float32")])
@pytest.mark.parametrize("case", list(CASES))
def test_item05_results_identical_at_any_rank_count(tmp_path, case, backend):
    data, args = CASES[case](tmp_path)
    runs = {}
    for ranks in RANKS:
        out = tmp_path / f"np{ranks}"
        _run(data, args, backend, ranks, out)
        runs[ranks], summary = _results(out)
        assert summary["ranks"] == ranks
        if case == "empty-clusters":
            assert summary["clusters_reseeded"] >= 2, "the data set must empty clusters"
    ref = runs[1]
    assert len(ref["labels.txt"].split()) == 2100 and len(ref["history sse"]) == ref["iterations"] > 1
    differ = {ranks: [key for key in ref if res[key] != ref[key]] for ranks, res in runs.items()}
    assert not any(differ.values()), f"{case}: differs from -np 1: " + "; ".join(
        f"-np {ranks}: {', '.join(keys)}" for ranks, keys in differ.items() if keys)
    if backend == "gpu":
        _run(data, args, "cpu", 1, tmp_path / "cpu")
        cpu, _ = _results(tmp_path / "cpu")
        assert not [key for key in ref if cpu[key] != ref[key]], f"{case}: the GPU's results are not the CPU's"
