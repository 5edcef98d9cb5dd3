"""bench/step.py (the CPU step against scikit-learn and oneDAL): a tiny measurement, its rounds, its errors."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import _env

SCRIPT = Path(__file__).resolve().parents[1] / "bench" / "step.py"


def _run(*args, timeout=600):
    return subprocess.run([sys.executable, str(SCRIPT), *[str(a) for a in args]], capture_output=True, text=True,
                          env=_env(), timeout=timeout)


def _module():
    spec = importlib.util.spec_from_file_location("bench_step", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_tiny_step_against_scikit_learn(tmp_path):
    out = tmp_path / "step.json"
    r = _run("--shapes", "3000x5x4", "--threads", "1", "--iterations", 4, "--repeats", 1,
             "--tools", "mpikmeans,sklearn,sklearnex", "--out", out)
    assert r.returncode == 0, r.stderr + r.stdout
    doc = json.loads(out.read_text())
    assert doc["bench"] == "step" and doc["settings"]["iterations"] == 4 and doc["commit"]
    assert doc["command"].startswith("python bench/step.py --shapes 3000x5x4")
    points = {p["tool"]: p for p in doc["points"]}
    assert set(points) == {"mpikmeans", "sklearn", "sklearnex"}
    me, sk, ex = points["mpikmeans"], points["sklearn"], points["sklearnex"]
    for p in (me, sk):
        assert (p["rows"], p["attrs"], p["k"], p["threads"]) == (3000, 5, 4, 1)
        assert p["sse"] > 0 and len(p["labels_sha1"]) == 40
        # tiny data: the difference of two fits may be below the timer's noise, and then says so
        assert p["ms_per_iteration"] > 0 or "below the timing noise" in p["note"]
    # the same initial centres, whole Lloyd iterations: scikit-learn's answer
    assert me["iterations"] == sk["iterations"]
    assert me["sse"] == pytest.approx(sk["sse"], rel=1e-9)
    assert me["same_labels_as_sklearn"] is True
    # oneDAL is optional: measured where installed, else a row that says why
    assert ("ms_per_iteration" in ex) != ("error" in ex)
    if "error" in ex:
        assert "not installed" in ex["error"] and "skipped" in r.stdout
    assert any(line.startswith("3000x5 K=4") for line in r.stdout.splitlines()), r.stdout


def test_rounds_take_turns_and_keep_the_median(tmp_path):
    out = tmp_path / "step.json"
    r = _run("--shapes", "2000x4x3", "--threads", "1", "--iterations", 3, "--repeats", 1, "--rounds", 3,
             "--tools", "mpikmeans,sklearn", "--out", out)
    assert r.returncode == 0, r.stderr + r.stdout
    for p in json.loads(out.read_text())["points"]:
        assert len(p["rounds_ms"]) == 3
        assert p["ms_per_iteration"] == sorted(p["rounds_ms"])[1]  # the median round


def test_median_round():
    median_round = _module()._median_round
    rounds = [{"ms_per_iteration": 3.0, "n": 1}, {"error": "x"}, {"ms_per_iteration": 1.0, "n": 2},
              {"ms_per_iteration": 2.0, "n": 3}]
    out = median_round(rounds)
    assert out["n"] == 3 and out["rounds_ms"] == [3.0, None, 1.0, 2.0]
    assert median_round([{"error": "not installed"}]) == {"error": "not installed"}
    assert "rounds_ms" not in median_round([{"ms_per_iteration": 1.0}])


@pytest.mark.parametrize("args", [
    ["--shapes", "100x2"], ["--shapes", "ax2x3"], ["--shapes", "100x0x3"], ["--shapes", "10x2x20"],
    ["--threads", "two"], ["--threads", "0"], ["--tools", "mpikmeans,weka"], ["--iterations", "1"], ["--repeats", "0"],
])
def test_bad_options_exit_2(args, tmp_path):
    r = _run("--out", tmp_path / "s.json", *args, timeout=120)
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert "error:" in r.stderr and "Traceback" not in r.stderr
    assert not (tmp_path / "s.json").exists()
