"""The command line in one process: output contract, exit codes, messages."""

from __future__ import annotations

import json
import os
import re
import shutil

import numpy as np
import pytest

from conftest import HANG_GUARD_S, run_cli

from mpikmeans.cpus import process_threads

CORES = len(os.sched_getaffinity(0))

SUMMARY_KEYS = {"k", "n", "m", "attributes", "iterations", "converged", "stop_reason", "inertia", "sizes",
                "ranks", "backend", "devices", "dtype", "init", "seed", "timings", "bytes_read", "version"}
TIMING_KEYS = {"read_s", "init_s", "compute_s", "write_s", "total_s", "per_iteration_s"}

HEADER = "@relation t\n@attribute a numeric\n@attribute 'b c' real\n@attribute d INTEGER\n@data\n"


@pytest.fixture
def small(tmp_path):
    rng = np.random.default_rng(0)
    centres = np.array([[0, 0, 0], [10, 10, 10], [-10, 5, 0]], dtype=float)
    x = centres[rng.integers(0, 3, 300)] + rng.normal(scale=0.3, size=(300, 3))
    path = tmp_path / "small.arff"
    path.write_text(HEADER + "\n".join(",".join(repr(float(v)) for v in row) for row in x) + "\n")
    return path, x


def test_output_contract(small, tmp_path):
    path, x = small
    out = tmp_path / "res"
    r = run_cli(["run", path, "-k", 3, "--seed", 2, "-o", out, "--backend", "cpu"])
    assert r.code == 0, r.err
    summary = json.loads((out / "summary.json").read_text())
    assert SUMMARY_KEYS <= summary.keys()
    assert TIMING_KEYS <= summary["timings"].keys()
    # the reader's one-time start-up (Numba, cached kernels) is timed apart from read_s
    assert summary["timings"]["startup_s"] > 0
    assert summary["read_threads_per_rank"] >= 1
    assert summary["n"] == 300 and summary["m"] == 3 and summary["k"] == 3
    assert summary["attributes"] == ["a", "b c", "d"]
    assert summary["backend"] == "cpu" and summary["ranks"] == 1
    assert sum(summary["sizes"]) == 300
    assert summary["bytes_read"] == path.stat().st_size - len(HEADER)
    lines = (out / "centers.csv").read_text().splitlines()
    assert lines[0] == "a,b c,d" and len(lines) == 4
    centres = np.array([[float(v) for v in line.split(",")] for line in lines[1:]])
    labels = np.loadtxt(out / "labels.txt", dtype=int)
    assert labels.shape == (300,)
    # every centre is the mean of its rows, written at repr precision
    for c in range(3):
        np.testing.assert_allclose(centres[c], x[labels == c].mean(axis=0), rtol=1e-12)
    assert summary["inertia"] == pytest.approx(((x - centres[labels]) ** 2).sum(), rel=1e-12)
    # the human summary on stdout
    assert "converged after" in r.out and "SSE" in r.out and "cluster sizes" in r.out
    assert "read" in r.out and "ms/iteration" in r.out
    # the start-up is shown next to the read time, as summary.json has it
    t = summary["timings"]
    assert f"read {t['read_s']:.3f} s (" in r.out
    assert f"start-up {t['startup_s']:.3f} s), backend set-up" in r.out
    # and before it, the process's own start (imports, MPI, options), not part of total_s
    assert 0 < t["launch_s"] < HANG_GUARD_S and f"launch {t['launch_s']:.3f} s, read" in r.out
    assert not list(out.glob(".*tmp*"))


def test_default_output_dir_and_verbose(small):
    path, _ = small
    r = run_cli(["run", path, "-k", 3, "-v"])
    assert r.code == 0, r.err
    assert (path.parent / "small.mpikmeans" / "summary.json").exists()
    # -v's progress lines are a log, on stderr: stdout holds the results alone
    assert "iter    1" in r.err and "max shift" in r.err and "iter " not in r.out


def test_quiet_prints_nothing(small, tmp_path):
    path, _ = small
    r = run_cli(["run", path, "-k", 3, "-q", "-o", tmp_path / "q"])
    assert r.code == 0 and r.out == ""


def test_config_file_layers(small, tmp_path):
    path, _ = small
    cfg = tmp_path / "c.yaml"
    cfg.write_text("k: 2\nmax-iter: 1\ninit: range\nseed: 4\n")
    out = tmp_path / "o"
    r = run_cli(["run", path, "--config", cfg, "--max-iter", 3, "-o", out])
    assert r.code == 0, r.err
    s = json.loads((out / "summary.json").read_text())
    assert s["k"] == 2 and s["init"] == "range" and s["seed"] == 4 and s["max_iter"] == 3


def test_init_file_and_tol(small, tmp_path):
    path, x = small
    init = tmp_path / "init.csv"
    init.write_text("a,b c,d\n1,1,1\n9,9,9\n-9,4,1\n")
    out = tmp_path / "o"
    r = run_cli(["run", path, "-k", 3, "--init", init, "--tol", 1e3, "-o", out])
    assert r.code == 0, r.err
    s = json.loads((out / "summary.json").read_text())
    assert s["iterations"] == 1 and s["stop_reason"] == "centre shift <= tol" and s["converged"]


@pytest.mark.parametrize("args, needle", [
    (["-k", 0], "-k"),
    ([], "number of clusters is required"),
    (["-k", 3, "--max-iter", 0], "--max-iter"),
    (["-k", 3, "--tol", -1], "--tol"),
    (["-k", 3, "--init", "nosuchmethod"], "--init"),
    (["-k", 3, "--backend", "tpu"], "tpu"),
    (["-k", 400], "more than the 300 rows"),
])
def test_usage_errors_exit_2(small, args, needle):
    path, _ = small
    r = run_cli(["run", path] + args)
    assert r.code == 2, (r.out, r.err)
    assert needle in r.err
    assert "Traceback" not in r.err


def test_unknown_config_key_exits_2(small, tmp_path):
    path, _ = small
    cfg = tmp_path / "c.yaml"
    cfg.write_text("k: 2\nmax_iters: 5\n")
    r = run_cli(["run", path, "--config", cfg])
    assert r.code == 2 and "unknown key 'max_iters'" in r.err


def test_init_file_of_wrong_shape_exits_2(small, tmp_path):
    path, _ = small
    init = tmp_path / "init.csv"
    init.write_text("1,1\n2,2\n3,3\n")
    r = run_cli(["run", path, "-k", 3, "--init", init])
    assert r.code == 2 and "expected k x m = 3 x 3" in r.err


@pytest.mark.parametrize("body, line, needle", [
    ("1,2,3\n4,5\n", 7, "row has 2 values, expected 3"),
    ("1,2,3\n4,5,6,7\n", 7, "more than 3 values"),
    ("1,2,3\n4,x5,6\n", 7, "attribute 'b c': 'x5' is not a number"),
    ("1,2,3\n%c\n\n4,5,1e999\n", 9, "attribute 'd': '1e999' is out of the float64 range"),
    ("1,,3\n", 6, "attribute 'b c': empty value"),
])
def test_bad_data_exits_3_with_file_line_attribute(tmp_path, body, line, needle):
    path = tmp_path / "bad.arff"
    path.write_text(HEADER + body)
    r = run_cli(["run", path, "-k", 1])
    assert r.code == 3, (r.out, r.err)
    assert f"{path}:{line}:" in r.err and needle in r.err
    assert "Traceback" not in r.err


def test_missing_file_and_bad_header_exit_3(tmp_path):
    r = run_cli(["run", tmp_path / "nope.arff", "-k", 2])
    assert r.code == 3 and "nope.arff" in r.err
    bad = tmp_path / "h.arff"
    bad.write_text("@relation r\n@attribute a numeric\n@atribute b numeric\n@data\n1,2\n")
    r = run_cli(["run", bad, "-k", 1])
    assert r.code == 3 and f"{bad}:3:" in r.err


def test_gpu_backend_without_gpu_is_a_clear_runtime_error(small, tmp_path, monkeypatch):
    path, _ = small
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    monkeypatch.delenv("NUMBA_ENABLE_CUDASIM", raising=False)
    r = run_cli(["run", path, "-k", 3, "--backend", "gpu", "-o", tmp_path / "g"])
    assert r.code == 1, (r.out, r.err)
    assert "GPU" in r.err and "Traceback" not in r.err


def test_gen_data_usage(tmp_path):
    r = run_cli(["gen-data", tmp_path / "g.arff", "-n", 10, "-m", 2])
    assert r.code == 2 and "-k" in r.err
    r = run_cli(["gen-data", tmp_path / "g.arff", "-n", 10, "-m", 2, "-k", 2, "--spread", 1e9])
    assert r.code == 2 and "spread" in r.err
    r = run_cli(["gen-data", tmp_path / "nodir" / "g.arff", "-n", 10, "-m", 2, "-k", 2])
    assert r.code == 1 and "cannot write" in r.err


def _threads_of_run_and_info(path, out, args=(), env=None, prefix=None):
    """(threads, read threads) of a CPU run, and the threads ``info`` shows, with the same environment."""
    r = run_cli(["run", path, "-k", 3, "--max-iter", 2, "--backend", "cpu", "-o", out, "--overwrite",
                 *args], env=env, prefix=prefix)
    assert r.code == 0, r.err
    s = json.loads((out / "summary.json").read_text())
    assert f"backend cpu ({s['threads_per_rank']} thread" in r.out
    r = run_cli(["info", "--json"], env=env, prefix=prefix)
    assert r.code == 0, r.err
    ranks = json.loads(r.out)["ranks"]
    assert len(ranks) == 1
    return s["threads_per_rank"], s["read_threads_per_rank"], ranks[0]["threads"]


NO_THREAD_VARS = {"OMP_NUM_THREADS": None, "NUMBA_NUM_THREADS": None}


@pytest.mark.parametrize("env, prefix, expected", [
    (NO_THREAD_VARS, None, "process"),
    ({**NO_THREAD_VARS, "OMP_NUM_THREADS": "1"}, None, 1),
    pytest.param(NO_THREAD_VARS, ["taskset", "-c", "0"], 1,
                 marks=pytest.mark.skipif(shutil.which("taskset") is None, reason="taskset not found")),
])
def test_run_and_info_agree_on_threads(small, tmp_path, monkeypatch, env, prefix, expected):
    # one decision for reading, the CPU backend's compute and what info shows
    path, _ = small
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.delenv("NUMBA_NUM_THREADS", raising=False)
    if expected == "process":
        expected = process_threads()
    assert _threads_of_run_and_info(path, tmp_path / "o", env=env, prefix=prefix) == (expected,) * 3


def test_threads_option_overrides_omp_num_threads(small, tmp_path):
    path, _ = small
    compute, read, _ = _threads_of_run_and_info(path, tmp_path / "o", ["--threads", 2],
                                                env={**NO_THREAD_VARS, "OMP_NUM_THREADS": "1"})
    assert compute == read == min(2, CORES)


def test_gen_data_reports_start_up_apart(tmp_path):
    r = run_cli(["gen-data", tmp_path / "g.arff", "-n", 1000, "-m", 3, "-k", 2])
    assert r.code == 0, r.err
    found = re.search(r" in ([0-9.]+) s \(([0-9]+) MB/s, 1 rank, start-up ([0-9.]+) s\)$", r.out.strip())
    assert found, r.out
    write, startup = float(found.group(1)), float(found.group(3))
    assert startup > 0 and write >= 0
    r = run_cli(["gen-data", tmp_path / "q.arff", "-n", 10, "-m", 2, "-k", 2, "-q"])
    assert r.code == 0 and r.out == ""


def test_gen_data_report_is_json(tmp_path):
    # benchmarks read gen-data's figures from --report, not from its printed line
    out, report = tmp_path / "g.arff", tmp_path / "g.json"
    r = run_cli(["gen-data", out, "-n", 1000, "-m", 3, "-k", 2, "--seed", 4, "--report", report, "-q"])
    assert r.code == 0 and r.out == "", r.err
    figures = json.loads(report.read_text())
    assert figures["bytes"] == out.stat().st_size
    assert figures["ranks"] == 1 and (figures["n"], figures["m"], figures["k"], figures["seed"]) == (1000, 3, 2, 4)
    assert figures["write_s"] >= 0 and figures["startup_s"] > 0
    r = run_cli(["gen-data", out, "-n", 10, "-m", 2, "-k", 2, "--overwrite", "--report", tmp_path / "nodir" / "r.json"])
    assert r.code == 1 and "cannot write" in r.err and "Traceback" not in r.err


def test_help_works_without_starting_mpi():
    r = run_cli(["--help"])
    assert r.code == 0 and "gen-data" in r.out and "run" in r.out
