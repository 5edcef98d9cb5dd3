"""The benchmarks' common ground: the result format and its index, the harness, the scripts beside the package
(bench/parity.py, bench/fullstep.py, scripts/device_gpu.sh), and the rule that they use public interfaces only."""

from __future__ import annotations

import ast
import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import _env, mpirun_path, run_cli

from mpikmeans.bench import harness
from mpikmeans.errors import RunError, UsageError

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "bench" / "results"
SWEEP_DIRS = [REPO / "bench" / "h100", REPO / "bench" / "h200x2"]
INDEX = RESULTS / "INDEX.md"

needs_mpirun = pytest.mark.skipif(mpirun_path() is None, reason="mpirun not found")


def _script(name: str):
    spec = importlib.util.spec_from_file_location(f"bench_{name}", REPO / "bench" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _run_script(name: str, *args, env=None, timeout=600):
    return subprocess.run([sys.executable, str(REPO / "bench" / f"{name}.py"), *[str(a) for a in args]],
                          capture_output=True, text=True, env={**_env(), **(env or {})}, timeout=timeout)


# -- the result format and the index ---------------------------------------------------------


def test_result_document_round_trip(tmp_path, monkeypatch):
    monkeypatch.setenv("MPIKMEANS_COMMIT", "abc123")
    doc = harness.result_document("runs", "mpikmeans bench runs -o r.json", {"scale": 1.0},
                                  {"rows": [], "date": "old", "commit": "old"})
    assert list(doc)[:6] == ["bench", "command", "date", "commit", "machine", "settings"]
    assert doc["commit"] == "abc123" and doc["date"] != "old" and doc["machine"]["cores"] == os.cpu_count()
    path = harness.write_result(str(tmp_path / "sub" / "r.json"), doc)
    assert harness.read_result(path) == doc


def test_commit_is_git_head_here(monkeypatch):
    monkeypatch.delenv("MPIKMEANS_COMMIT", raising=False)
    commit = harness.code_commit()
    if not (REPO / ".git").exists():
        pytest.skip("not a git checkout")
    assert re.fullmatch(r"[0-9a-f]{12}(\+dirty)?", commit), commit


def _index_rows() -> list:
    rows = []
    for line in INDEX.read_text().splitlines():
        if line.startswith("| `"):
            cells = [c.strip() for c in line.strip("|").split("|")]
            rows.append(cells)
    return rows


def test_index_lists_every_result_and_nothing_else():
    """bench/results keeps the latest result of each benchmark per machine, each in INDEX.md with its
    benchmark, machine, date, commit and command; the sweep folders the README shows are indexed too."""
    files = {p.relative_to(RESULTS).as_posix() for p in RESULTS.rglob("*") if p.is_file() and p.name != "INDEX.md"}
    files |= {os.path.relpath(p, RESULTS) for d in SWEEP_DIRS for p in d.iterdir() if p.is_file()}
    rows = _index_rows()
    named = set()
    for cells in rows:
        assert len(cells) == 6, cells  # file, benchmark, machine, date, commit, command
        assert all(cells), cells
        named.update(re.findall(r"`([^`]+)`", cells[0]))
    assert named == files, (sorted(files - named), sorted(named - files))


@pytest.mark.parametrize("path", sorted(RESULTS.glob("*.json")) + [d / "meta.json" for d in SWEEP_DIRS],
                         ids=lambda p: p.name)
def test_committed_results_stay_readable(path):
    doc = harness.read_result(str(path))
    assert doc["bench"] in ("run", "runs", "runs-sweep", "step", "fullstep", "parity"), path.name
    assert isinstance(doc["machine"], dict) and doc.get("command")


def test_read_result_errors(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(UsageError, match="not a JSON result file"):
        harness.read_result(str(bad))
    with pytest.raises(UsageError, match="cannot read"):
        harness.read_result(str(tmp_path / "missing.json"))


# -- the harness -----------------------------------------------------------------------------


def test_stats():
    assert harness.stats([3.0, 1.0, 2.0]) == {"median": 2.0, "min": 1.0, "max": 3.0}


def test_run_command_reports_failures():
    with pytest.raises(RunError, match="exit 3 from: sh -c exit 3"):
        harness.run_command(["sh", "-c", "exit 3"], 10)
    with pytest.raises(RunError, match="no result within 1 s"):
        harness.run_command(["sleep", "5"], 1)
    with pytest.raises(RunError, match="cannot start"):
        harness.run_command(["/nonexistent/launcher"], 10)
    assert harness.run_command(["echo", "hi"], 10).stdout == "hi\n"


def test_launch_environment_adds_and_removes(monkeypatch):
    monkeypatch.setenv("MPIKMEANS_TEST_GONE", "1")
    ran = harness.Launch(["unused"]).with_env(MPIKMEANS_TEST_SET="2", MPIKMEANS_TEST_GONE=None)
    out = ran.python("-c", "import os; print(os.environ.get('MPIKMEANS_TEST_SET'), "
                           "os.environ.get('MPIKMEANS_TEST_GONE'))").stdout
    assert out.split() == ["2", "None"]
    # alone, no launcher is looked up (a machine without mpirun runs `mpikmeans` itself)
    assert "Usage" in harness.Launch([]).tool(0, "--help").stdout


@needs_mpirun
def test_gen_data_report_on_two_ranks(tmp_path):
    out, report = tmp_path / "g.arff", tmp_path / "g.json"
    r = run_cli(["gen-data", out, "-n", 500, "-m", 2, "-k", 2, "--report", report, "-q"], np=2, timeout=120)
    assert r.code == 0, r.err
    figures = json.loads(report.read_text())
    assert figures["ranks"] == 2 and figures["bytes"] == out.stat().st_size
    assert figures["write_s"] >= 0 and figures["startup_s"] > 0


# -- the scripts beside the package ----------------------------------------------------------


def test_fullstep_on_the_cpu_backend(tmp_path):
    """Without a GPU the script times the CPU backend's step through the same public interface."""
    out = tmp_path / "fs.json"
    r = _run_script("fullstep", "--backend", "cpu", "--shapes", "3000x4x3,2000x9x5", "--dtypes", "float64",
                    "--iters", 4, "--out", out)
    assert r.returncode == 0, r.stderr + r.stdout
    doc = harness.read_result(str(out))
    assert doc["bench"] == "fullstep" and doc["command"].startswith("python bench/fullstep.py --backend cpu")
    assert [(row["n"], row["m"], row["k"]) for row in doc["rows"]] == [(3000, 4, 3), (2000, 9, 5)]
    for row in doc["rows"]:
        assert row["steps"] == 4 and len(row["changed"]) == 4 and row["timed_by"] == "wall clock"
        assert 0 < row["step_ms_min"] <= row["step_ms"] <= row["step_ms_max"] and row["first_step_s"] > 0
        assert row["changed"][0] > 0  # the centres move as in a run: labels change
    assert "3000x4x3 3000x4 K=3 float64: step" in r.stdout


def test_fullstep_runs_time_every_iteration_against_the_full_step(tmp_path):
    """``--runs``: a whole Lloyd run per shape through ``mpikmeans.KMeans``, each iteration's time and changed
    rows, the slowest against the median full step (every row summed)."""
    out = tmp_path / "fs.json"
    r = _run_script("fullstep", "--backend", "cpu", "--shapes", "3000x4x3", "--dtypes", "float64", "--iters", 5,
                    "--runs", "--out", out)
    assert r.returncode == 0, r.stderr + r.stdout
    (row,) = harness.read_result(str(out))["rows"]
    assert 1 <= len(row["run_iter_ms"]) <= 5 and len(row["run_changed"]) == len(row["run_iter_ms"])
    assert row["run_changed"][0] == 3000 and row["full_step_wall_ms"] > 0
    assert row["run_max_iter_ms"] == max(row["run_iter_ms"]) >= row["run_median_iter_ms"] > 0
    assert row["run_max_over_full"] == row["run_max_iter_ms"] / row["full_step_wall_ms"]
    assert "run: " in r.stdout and "x the full step" in r.stdout


def test_fullstep_bad_shape_exits_2(tmp_path):
    r = _run_script("fullstep", "--shapes", "Q", "--out", tmp_path / "x.json", timeout=120)
    assert r.returncode == 2 and "A-E or NxMxK" in r.stderr


@needs_mpirun
@pytest.mark.mpi
@pytest.mark.slow  # the three runs under mpirun and the CUDA simulator: 30-90 s on two cores
def test_parity_under_the_simulator(tmp_path):
    res = tmp_path / "p"
    r = _run_script("parity", res, "--np", 2, "-n", 300, "-m", 2, "-k", 2, "--run-args=--share-gpus",
                    "--timeout", 120, env={"NUMBA_ENABLE_CUDASIM": "1"}, timeout=300)
    assert r.returncode == 0, r.stderr + r.stdout
    assert r.stdout.count(": OK") == 2
    doc = harness.read_result(str(res / "parity.json"))
    assert doc["bench"] == "parity" and doc["ok"] and doc["ranks"] == 2
    # the comparer alone, on the same runs and then on a changed label
    r = _run_script("parity", res, "--compare-only", timeout=120)
    assert r.returncode == 0 and r.stdout.count(": OK") == 2, r.stderr
    labels = res / "gpu_float64" / "labels.txt"
    lines = labels.read_text().splitlines()
    lines[0] = str(1 - int(lines[0]))
    labels.write_text("\n".join(lines) + "\n")
    r = _run_script("parity", res, "--compare-only", timeout=120)
    assert r.returncode == 1 and "labels identical False" in r.stdout and "MISMATCH" in r.stdout


def test_parity_of_cpu_runs_is_a_mismatch(tmp_path, small_file):
    # the same labels, but the "GPU" runs are the CPU backend's: not a parity result
    parity = _script("parity")
    for backend, dtype in parity.RUNS:
        r = run_cli(["run", small_file, "-k", 5, "--seed", 5, "--backend", "cpu", "-o",
                     tmp_path / f"{backend}_{dtype}", "-q"])
        assert r.code == 0, r.err
    verdict = parity.compare(str(tmp_path))
    assert not verdict["ok"]
    for g in verdict["gpu"].values():
        assert g["labels_identical"] and g["centres_max_rel_diff"] == 0 and g["backend"] == "cpu" and not g["ok"]


def test_parity_errors(tmp_path):
    r = _run_script("parity", tmp_path / "none", "--compare-only", timeout=120)
    assert r.returncode == 2 and "not three finished runs" in r.stderr and "Traceback" not in r.stderr
    r = _run_script("parity", tmp_path, "-n", 2, "-k", 3, timeout=120)
    assert r.returncode == 2 and "-k at most -n" in r.stderr


def test_device_script_runs_the_benchmarks_that_exist():
    tracked = subprocess.run(["git", "-C", str(REPO), "ls-files", "scripts"], capture_output=True, text=True)
    names = (sorted(Path(p).name for p in tracked.stdout.split()) if tracked.returncode == 0 and tracked.stdout
             else sorted(p.name for p in (REPO / "scripts").iterdir()))
    assert names == ["device_gpu.sh", "same_outputs.py", "start_local_slurm.sh"]
    text = (REPO / "scripts" / "device_gpu.sh").read_text()
    commands = set(re.findall(r"python3 -m mpikmeans bench (\w+)", text))
    assert commands == {"runs", "run"}, commands
    scripts = set(re.findall(r"python3 bench/(\w+)\.py", text))
    assert scripts == {"fullstep", "parity", "step"}, scripts
    assert all((REPO / "bench" / f"{s}.py").exists() for s in scripts)
    assert "mpikmeans.bench." not in text and "bench/experiments" not in text


# -- public interfaces only ------------------------------------------------------------------


def _bench_sources() -> list:
    return (sorted((REPO / "mpikmeans" / "bench").glob("*.py")) + [REPO / "mpikmeans" / "cli" / "bench.py"]
            + sorted((REPO / "bench").rglob("*.py")))


def test_bench_tooling_uses_public_interfaces_only():
    """No benchmark imports a backend's modules or any private name of the package, nor patches one: the
    backends change under them, and what a benchmark measures is what users run."""
    bad = []
    for path in _bench_sources():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                module = ("." * node.level) + (node.module or "")
                names = [a.name for a in node.names]
                if re.match(r"(mpikmeans|\.+)\.?backends\.", module) or \
                        (module.endswith("backends") and any(n not in ("make_backend", "cuda_simulator_requested")
                                                             for n in names)):
                    bad.append(f"{path.name}:{node.lineno} from {module} import {', '.join(names)}")
                private = [n for n in names if n.startswith("_") and not n.endswith("__")]
                if (module.startswith("mpikmeans") or module.startswith(".")) and private:
                    bad.append(f"{path.name}:{node.lineno} private name from {module}")
            elif isinstance(node, ast.Import):
                for a in node.names:
                    if a.name.startswith("mpikmeans.backends."):
                        bad.append(f"{path.name}:{node.lineno} import {a.name}")
            elif isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__"):
                if isinstance(node.value, ast.Name) and node.value.id in ("be", "backend", "cpu", "gpu"):
                    bad.append(f"{path.name}:{node.lineno} .{node.attr}")
        text = path.read_text(encoding="utf-8")
        if "monkeypatch" in text or re.search(r"setattr\((backend|be|mpikmeans)", text):
            bad.append(f"{path.name}: patches the package")
    assert not bad, bad
    assert not (REPO / "bench" / "experiments").exists()
