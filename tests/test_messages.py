"""What the tool says, where and when (issue 40, items 11, 12 and 13's messages): results alone on
stdout, warnings and notices on stderr, errors naming the flag as typed or the file and key, no
plural slips, an --init header matched by name, a run's header before it starts, and a notice
before a long k-means++."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from conftest import HANG_GUARD_S, _env, run_cli

HEADER = "@relation t\n@attribute a numeric\n@attribute b numeric\n@attribute c numeric\n"


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    """300 rows of 3 blobs, a nominal attribute the default --nominal skip leaves out."""
    rng = np.random.default_rng(0)
    centres = np.array([[0, 0, 0], [10, 10, 10], [-10, 5, 0]], dtype=float)
    x = centres[rng.integers(0, 3, 300)] + rng.normal(scale=0.3, size=(300, 3))
    path = tmp_path_factory.mktemp("messages") / "small.arff"
    rows = "\n".join(",".join(repr(float(v)) for v in row) + f",{'yes' if i % 2 else 'no'}" for i, row in enumerate(x))
    path.write_text(HEADER + "@attribute flag {yes,no}\n@data\n" + rows + "\n")
    return path, x


# ------------------------------------------------------------------ item 12

def test_item12_warnings_go_to_stderr_results_to_stdout(small, tmp_path):
    path, _ = small
    r = run_cli(["run", path, "-k", 3, "-v", "-o", tmp_path / "o"])
    assert r.code == 0, r.err
    assert "not clustered" in r.err and "flag" in r.err
    assert "iter    1" in r.err
    assert "not clustered" not in r.out and "iter " not in r.out
    assert "converged after" in r.out and "Final cluster centroids" in r.out  # the results
    r = run_cli(["run", path, "-k", 3, "-v", "-o", tmp_path / "p"], np=3)
    assert r.code == 0, r.err
    assert "not clustered" in r.err and "not clustered" not in r.out


def test_item12_interrupted_run_prints_no_sse_nan(tmp_path):
    path = tmp_path / "overlapping.arff"  # many iterations: the signal comes before convergence
    assert run_cli(["gen-data", path, "-n", 6000, "-m", 4, "-k", 12, "--seed", 4, "--spread", 5, "-q"]).code == 0
    r = run_cli(["run", path, "-k", 8, "--init", "range", "-v", "-o", tmp_path / "o"],
                env={"MPIKMEANS_FAULT": "0:iteration:term:2"})
    assert r.code == 75, (r.out, r.err)
    assert "nan" not in (r.out + r.err).lower()
    assert "restart 1/1 (seed 0): stopped by a signal after 2 iterations" in r.err


def test_item12_errors_name_the_flag_as_typed(small):
    path, _ = small
    for args, shown in ((["-k", 0], "-k 0"), (["-k", 3, "--max-iter", 0], "--max-iter 0"),
                        (["-k", 3, "--n-init", 0], "--n-init 0"), (["-k", 3, "--threads", 0], "--threads 0")):
        r = run_cli(["run", path, *args])
        assert r.code == 2, (args, r.err)
        assert f"error: {shown}: expected" in r.err, r.err
    r = run_cli(["run", path, "-k", 0])
    assert "--k" not in r.err


def test_item12_plural_slips(tmp_path, small):
    path, _ = small
    init = tmp_path / "init.csv"
    init.write_text("a,b,c\n1,1,1\n9,9,9\n-9,4,1\n")
    r = run_cli(["run", path, "-k", 3, "--init", init, "--tol", 1e3, "-o", tmp_path / "o"])
    assert r.code == 0, r.err
    assert "after 1 iteration (" in r.out and "1 iterations" not in r.out
    same = tmp_path / "same.arff"
    same.write_text("@relation s\n@attribute a numeric\n@data\n" + "1\n" * 5)
    r = run_cli(["run", same, "-k", 3, "-o", tmp_path / "s"])
    assert r.code == 0, r.err
    assert "only 1 distinct row for k = 3" in r.err and "1 distinct rows" not in r.err, r.err
    assert r.err.count("distinct row for") == 1  # said once, not once per duplicated centre
    assert "5 rows x 1 attribute," in r.out


def test_item12_yaml_type_error_names_file_and_key(small, tmp_path):
    path, _ = small
    cfg = tmp_path / "x.yaml"
    cfg.write_text("seed: 1\nk: three\n")
    r = run_cli(["run", path, "--config", cfg])
    assert r.code == 2, r.err
    assert f"{cfg}: key k: expected an integer >= 1, got 'three' (line 2)" in r.err, r.err
    assert "--k" not in r.err
    cfg.write_text("k: 3\nmax-iter: -1\n")
    r = run_cli(["run", path, "--config", cfg])
    assert r.code == 2 and f"{cfg}: key max-iter: expected an integer >= 1, got -1" in r.err, r.err
    # a flag's value is named as a flag, even with a config file
    r = run_cli(["run", path, "--config", cfg, "--max-iter", 0])
    assert r.code == 2 and "--max-iter 0: expected" in r.err, r.err


@pytest.mark.parametrize("text, needle", [
    ("k: 3\nseed: 1\nk: 4\n", "key 'k' on line 3 is given twice: first on line 1"),
    ("k: 3\nmax-iter: 2\nmax_iter: 3\n", "key 'max_iter' on line 3 is given twice: first on line 2 (as 'max-iter')"),
])
def test_item12_duplicate_yaml_keys_are_an_error(small, tmp_path, text, needle):
    path, _ = small
    cfg = tmp_path / "dup.yaml"
    cfg.write_text(text)
    r = run_cli(["run", path, "--config", cfg, "-o", tmp_path / "o"])
    assert r.code == 2, (r.out, r.err)
    assert needle in r.err and str(cfg) in r.err, r.err
    assert not (tmp_path / "o").exists()


def test_item12_threads_above_the_pool_is_a_warning_saying_what_is_used(small, tmp_path):
    path, _ = small
    out = tmp_path / "o"
    r = run_cli(["run", path, "-k", 3, "--threads", 1000, "-o", out, "--backend", "cpu"])
    assert r.code == 0, r.err
    used = json.loads((out / "summary.json").read_text())["threads_per_rank"]
    assert f"--threads 1000: " in r.err and f"using {used}" in r.err, r.err
    assert "--threads" not in r.out


def test_item12_init_csv_header_is_matched_by_name(small, tmp_path):
    path, _ = small
    centres = np.array([[1.0, 1.5, 1.25], [9.0, 9.5, 9.25], [-9.0, 4.0, 1.0]])
    ordered, shuffled = tmp_path / "ordered.csv", tmp_path / "shuffled.csv"
    ordered.write_text("a,b,c\n" + "\n".join(",".join(repr(float(v)) for v in row) for row in centres) + "\n")
    shuffled.write_text("c,a,b\n" + "\n".join(",".join(repr(float(v)) for v in row[[2, 0, 1]]) for row in centres)
                        + "\n")
    results = {}
    for f in (ordered, shuffled):
        out = tmp_path / f.stem
        r = run_cli(["run", path, "-k", 3, "--init", f, "--max-iter", 1, "-o", out])
        assert r.code == 0, r.err
        results[f.stem] = (out / "centers.csv").read_bytes()
    assert results["ordered"] == results["shuffled"]
    for header, needle in (("a,b,x", "'x'"), ("a,b", "no column for 'c'"), ("a,a,b", "'a'")):
        bad = tmp_path / "bad.csv"
        width = len(header.split(","))
        bad.write_text(header + "\n" + "\n".join(",".join(["1"] * width) for _ in range(3)) + "\n")
        r = run_cli(["run", path, "-k", 3, "--init", bad, "-o", tmp_path / "bad"])
        assert r.code == 2, (header, r.err)
        assert "--init" in r.err and needle in r.err and "header" in r.err, r.err


# ------------------------------------------------------------------ item 13 (messages)

def test_item13_run_help_names_every_input_format():
    r = run_cli(["run", "--help"])
    assert r.code == 0
    text = " ".join(r.out.split())
    assert "ARFF" in text and "CSV" in text and ".npy" in text
    assert "data.npy.mpikmeans" in text  # where a .npy copy's results go by default
    r = run_cli(["--help"])
    assert "ARFF, CSV or .npy" in " ".join(r.out.split())


@pytest.mark.parametrize("backend", ["cpu", "auto"])
def test_item13_dry_run_says_gpu_only_with_one(small, backend):
    if backend == "auto" and os.path.exists("/dev/nvidiactl"):
        pytest.skip("this machine has NVIDIA devices: auto would use one")
    path, _ = small
    r = run_cli(["run", path, "-k", 3, "--dry-run", "--backend", backend], np=2)
    assert r.code == 0, r.err
    assert "GPU" not in r.out and "on the CPU" in r.out, r.out


def test_item13_internal_error_advice_fits_the_command(small, tmp_path):
    path, _ = small
    r = run_cli(["convert", path, tmp_path / "t.npy"], env={"MPIKMEANS_FAULT": "0:read:raise"})
    assert r.code == 1 and "internal error" in r.err, (r.out, r.err)
    assert "with -v" not in r.err and "MPIKMEANS_TRACEBACK=1" in r.err, r.err
    r = run_cli(["convert", path, tmp_path / "t.npy"], env={"MPIKMEANS_FAULT": "0:read:raise",
                                                           "MPIKMEANS_TRACEBACK": "1"})
    assert r.code == 1 and "Traceback" in r.err
    r = run_cli(["run", path, "-k", 3, "-o", tmp_path / "o"], env={"MPIKMEANS_FAULT": "0:read:raise"})
    assert r.code == 1 and "run with -v for the traceback" in r.err


# ------------------------------------------------------------------ item 11 (what comes before a long wait)

def _first_stderr_lines(cmd: list, until: str) -> list:
    p = subprocess.Popen([str(c) for c in cmd], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         env=_env(), start_new_session=True)
    lines, deadline = [], time.monotonic() + HANG_GUARD_S * 2
    try:
        for line in p.stderr:
            lines.append(line)
            if until in line or time.monotonic() > deadline:
                break
    finally:
        os.killpg(p.pid, signal.SIGKILL)
        p.communicate()
    return lines


def test_item11_header_line_comes_first(small, tmp_path):
    path, _ = small
    lines = _first_stderr_lines([sys.executable, "-m", "mpikmeans", "run", path, "-k", 3, "-v", "-o", tmp_path / "o"],
                                "iter    1")
    assert lines and lines[0].startswith("mpikmeans ") and "k = 3" in lines[0], lines
    assert str(tmp_path / "o") in lines[0] and "iter    1" in lines[-1], lines


def test_item11_long_kmeanspp_is_announced_before_it_starts(tmp_path):
    data = tmp_path / "wide.arff"
    r = run_cli(["gen-data", data, "-n", 100000, "-m", 10, "-k", 20, "-q"])
    assert r.code == 0, r.err
    lines = _first_stderr_lines([sys.executable, "-m", "mpikmeans", "run", data, "-k", 2000, "--threads", 1,
                                 "-o", tmp_path / "o"], "k-means++ with K = 2000")
    notice = [line for line in lines if "k-means++ with K = 2000" in line]
    assert notice and "1e5 rows x 10 columns: about" in notice[0], lines
    assert not (tmp_path / "o").exists()  # announced before the work, not after
