"""mpikmeans bench run and plot (the specification's sweeps): quick sweeps end to end, the CSVs and plots, the data,
the errors; and the bench group's commands."""

from __future__ import annotations

import json
import os
import xml.etree.ElementTree as ET

import numpy as np
import pytest

from mpikmeans.bench import data as bench_data
from mpikmeans.bench import harness
from mpikmeans.bench import sweeps as bench
from mpikmeans.io.arff import read_arff
from mpikmeans.comm import SerialComm
from mpikmeans.io.gen import GenSpec, write_blobs

from conftest import mpirun_path, run_cli

# a hang guard: the quick sweeps are a few dozen launches, and a first one after a change of the kernels'
# sources compiles them (minutes on two busy cores)
pytestmark = [pytest.mark.mpi, pytest.mark.timeout(1200)]

#: Repeats of each point in the quick run (the rows must say so)
REPEATS = 2

SWEEP_FILES = {"procs": ["procs_compute", "procs_read"], "n": ["n"], "m": ["m"], "k": ["k"]}


@pytest.fixture(scope="module")
def quick(tmp_path_factory):
    """One quick run of every sweep (about a minute on two cores).

    Two repeats, not the default three: each repeat of a point is one more launch of mpirun and
    Python (1-2 s on two cores, most of it the launch; 8 such launches a repeat), and two runs
    still give a minimum, median and maximum to check the order of, and a count that shows the
    option reached every row.
    """
    if mpirun_path() is None:
        pytest.skip("mpirun not found")
    out = tmp_path_factory.mktemp("bench") / "quick"
    r = run_cli(["bench", "run", "--quick", "-o", out, "--iterations", 3, "--repeats", REPEATS], timeout=1100)
    assert r.code == 0, r.err + r.out
    return out, r


def test_quick_writes_every_csv_and_meta(quick):
    out, r = quick
    for name in bench.SWEEPS:
        assert (out / f"{name}.csv").exists(), name
    meta = json.loads((out / "meta.json").read_text())
    assert meta["mode"] == "quick"
    assert meta["command"].startswith("mpikmeans bench run --quick")
    assert meta["machine"]["cores"] == os.cpu_count()
    assert set(meta["sweeps"]) == set(bench.SWEEPS)
    # generated inputs and per-run outputs are not left behind
    assert not (out / "data").exists() and not (out / "runs").exists()
    assert "wrote procs.csv" in r.out


def test_quick_rows_are_sane(quick):
    out, _ = quick
    specs = {s.name: s for s in bench.presets("quick", os.cpu_count(), 0)}
    for name, spec in specs.items():
        rows = bench.read_csv(out / f"{name}.csv")
        assert rows, name
        for row in rows:
            assert list(row) == list(bench.COLUMNS)
            assert row["repeats"] == REPEATS
            assert 0 < row["ms_per_iter_min"] <= row["ms_per_iter"] <= row["ms_per_iter_max"]
            assert 1 <= row["iterations"] <= 3
            assert np.isfinite(row["inertia"]) and row["inertia"] > 0
            # the same data and centres and iterations as scikit-learn: the same SSE
            assert row["inertia_rel_diff_sklearn"] is not None and row["inertia_rel_diff_sklearn"] < 1e-9
        tools = {r["series"] for r in rows}
        assert tools == {"mpikmeans cpu", "scikit-learn"}  # no GPU here
        x = "ranks" if name == "procs" else spec.param
        expected = spec.cpu_ranks if name == "procs" else spec.values
        for series in tools:
            assert sorted(r[x] for r in rows if r["series"] == series) == sorted(expected), (name, series)
        for r in rows:
            if r["tool"] == "mpikmeans":
                assert 0 < r["read_s_min"] <= r["read_s"] <= r["read_s_max"]
                assert r["read_MB_per_s"] > 0
                if name == "procs":
                    assert r["threads"] == 1  # one core per rank in the process sweep
            else:
                assert r["read_s"] is None


def test_quick_plots_are_drawn(quick):
    out, r = quick
    for stems in SWEEP_FILES.values():
        for stem in stems:
            png = out / f"{stem}.png"
            assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
            assert png.stat().st_size > 20_000
            svg = ET.parse(out / f"{stem}.svg").getroot()
            assert svg.tag.endswith("svg")
            text = (out / f"{stem}.svg").read_text()
            # text stays text: the caption (machine, command), the axes and the series
            assert "mpikmeans bench run --quick" in text and "cores, no GPU" in text
            assert "scikit-learn" in text or stem == "procs_read"
            assert "ideal" in text or stem not in ("procs_compute", "procs_read")
    assert "plots: procs_compute.png" in r.out


def test_plot_redraws_from_csvs(quick, tmp_path):
    out, _ = quick
    copy = tmp_path / "copy"
    copy.mkdir()
    for f in out.iterdir():
        if f.suffix in (".csv", ".json"):
            (copy / f.name).write_bytes(f.read_bytes())
    r = run_cli(["bench", "plot", copy])
    assert r.code == 0, r.err
    assert (copy / "k.png").exists() and (copy / "procs_read.svg").exists()


def test_blobs_npy_equals_the_generated_arff(tmp_path):
    # the n/m/k sweeps skip text: their .npy must hold exactly what gen-data's file parses to
    spec = GenSpec(n=70_000, m=3, k=5, seed=4, spread=2.0, decimals=6)
    arff = str(tmp_path / "g.arff")
    write_blobs(spec, arff, SerialComm())
    npy = str(tmp_path / "g.npy")
    bench_data.write_blobs_npy(spec, npy, workers=3)
    parsed = read_arff(arff, SerialComm()).x
    assert np.array_equal(np.load(npy), parsed)


def test_initial_centres_are_distinct_rows(tmp_path):
    x = np.arange(60, dtype=np.float64).reshape(20, 3)
    np.save(tmp_path / "x.npy", x)
    csv_path, npy_path = bench_data.initial_centres(str(tmp_path / "x.npy"), 4, 0, str(tmp_path / "c"))
    c = np.load(npy_path)
    assert c.shape == (4, 3) and len({tuple(r) for r in c}) == 4
    assert all(any((row == x).all(axis=1)) for row in c)
    assert open(csv_path).readline().strip() == "X1,X2,X3"


def test_csv_round_trip(tmp_path):
    row = {c: None for c in bench.COLUMNS}
    row.update(sweep="n", series="mpikmeans gpu", tool="mpikmeans", backend="gpu", ranks=1, threads=16, n=10, m=2,
               k=3, dtype="float32", iterations=5, repeats=3, ms_per_iter=0.1 + 0.2, ms_per_iter_min=0.25,
               ms_per_iter_max=0.5, inertia=1e300, devices="NVIDIA H100, 80GB")
    bench.write_csv([row], str(tmp_path / "n.csv"))
    assert bench.read_csv(str(tmp_path / "n.csv")) == [row]


def test_presets_follow_the_machine():
    quick = {s.name: s for s in bench.presets("quick", 2, 0)}
    assert quick["procs"].cpu_ranks == [1, 2] and quick["procs"].gpu_ranks == []
    full = {s.name: s for s in bench.presets("full", 64, 4)}
    assert full["procs"].cpu_ranks == [1, 2, 4, 8, 16] and full["procs"].gpu_ranks == [1, 2, 3, 4]
    assert (full["procs"].n, full["procs"].m, full["procs"].k) == (500_000, 100, 50)
    assert {s.name for s in bench.presets("full", 16, 1)} == set(bench.SWEEPS)


def test_count_gpus_reads_nvidia_smi_and_visible_devices(monkeypatch, tmp_path):
    fake = tmp_path / "nvidia-smi"
    fake.write_text("#!/bin/sh\nfor i in 0 1 2 3; do echo \"GPU $i: NVIDIA H200 (UUID: GPU-$i)\"; done\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.delenv("NUMBA_ENABLE_CUDASIM", raising=False)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert harness.count_gpus() == 4
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,2")
    assert harness.count_gpus() == 2
    monkeypatch.setenv("NUMBA_ENABLE_CUDASIM", "1")  # the simulator is no GPU to benchmark
    assert harness.count_gpus() == 0


def test_unknown_sweep_is_a_usage_error(tmp_path):
    r = run_cli(["bench", "run", "--quick", "--sweeps", "procs,x", "-o", tmp_path / "o"])
    assert r.code == 2
    assert "unknown sweep(s) x" in r.err and "Traceback" not in r.err


def test_failing_launcher_is_reported(tmp_path):
    r = run_cli(["bench", "run", "--quick", "--sweeps", "n", "--no-references", "--launcher", "false",
                 "-o", tmp_path / "o"], timeout=120)
    assert r.code == 1
    assert "mpikmeans bench: error: bench: exit 1 from: false -np 1" in r.err
    assert "Traceback" not in r.err


def test_plot_of_an_empty_directory_is_a_usage_error(tmp_path):
    r = run_cli(["bench", "plot", tmp_path])
    assert r.code == 2
    assert "no benchmark results there" in r.err and "Traceback" not in r.err


def test_bench_help_lists_its_commands():
    """What a user measures their cluster with, and nothing else: the sweeps, their plots, whole runs."""
    r = run_cli(["bench", "--help"])
    assert r.code == 0
    commands = [line.split()[0] for line in r.out.split("Commands:")[1].splitlines() if line.startswith("  ")]
    assert commands == ["plot", "run", "runs"], r.out
    for gone in ("fullstep", "gpu", "step", "tts", "parity"):
        assert run_cli(["bench", gone, "--help"]).code == 2
