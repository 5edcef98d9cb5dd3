"""The time-to-solution case's two paths, held without a clock: the ARFF, and the ``.npy`` convert makes.

The issue's case (the CPU backend, every run with defaults, under ``mpirun -np 2``) at a size that
runs in seconds.  How fast each path is, against scikit-learn and against each other, is measured
by the benchmarks (``mpikmeans bench``; figures in BENCHMARKS.md and bench/results/), never
asserted here: a test that fails on a slow minute is a broken test.  What a slow minute cannot
change is held here: ``convert --report`` writes the figures a benchmark reads, and a job from the
``.npy`` is the job from the ARFF, bit for bit.
"""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

from conftest import run_cli

pytestmark = pytest.mark.slow

N, M, K = 20_000, 20, 8


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    d = tmp_path_factory.mktemp("tts")
    arff, npy = d / "d.arff", d / "d.npy"
    r = run_cli(["gen-data", arff, "-n", N, "-m", M, "-k", K, "--seed", 1, "-q"], np=2, timeout=300)
    assert r.code == 0, r.err
    r = run_cli(["convert", arff, npy, "--report", d / "convert.json", "-q"], np=2, timeout=300)
    assert r.code == 0, r.err
    out = {"dir": d, "arff": arff, "npy": npy, "report": json.loads((d / "convert.json").read_text())}
    for name, data in (("from_arff", arff), ("from_npy", npy)):
        r = run_cli(["run", data, "-k", K, "--backend", "cpu", "-o", d / name, "-q"], np=2, timeout=300)
        assert r.code == 0, r.err
        out[name] = d / name
    return out


def test_convert_reports_the_figures_a_benchmark_reads(job):
    rep = job["report"]
    assert (rep["n"], rep["m"], rep["ranks"]) == (N, M, 2)
    assert rep["source_bytes"] == os.path.getsize(job["arff"])
    assert rep["target_bytes"] == os.path.getsize(job["npy"])
    assert all(rep[key] >= 0 for key in ("convert_s", "startup_s", "read_s", "write_s")), rep
    # one measurement's parts: the read and the write happen inside the convert
    assert rep["convert_s"] >= rep["read_s"] + rep["write_s"], rep


def test_the_job_from_the_npy_is_the_job_from_the_arff(job):
    a, b = job["from_arff"], job["from_npy"]
    sa, sb = (json.loads((p / "summary.json").read_text()) for p in (a, b))
    assert sa["n"] == sb["n"] == N and sa["converged"] and sb["converged"]
    assert (sa["inertia"], sa["iterations"], sa["sizes"]) == (sb["inertia"], sb["iterations"], sb["sizes"])
    assert (a / "centers.csv").read_bytes() == (b / "centers.csv").read_bytes()
    assert np.array_equal(np.loadtxt(a / "labels.txt", dtype=int), np.loadtxt(b / "labels.txt", dtype=int))
