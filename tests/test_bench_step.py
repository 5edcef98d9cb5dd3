"""mpikmeans bench step: a tiny measurement end to end, the result file, the option errors."""

from __future__ import annotations

import json

import pytest

from conftest import run_cli

from mpikmeans.bench.step import thread_env


def test_tiny_step_against_scikit_learn(tmp_path):
    out = tmp_path / "step.json"
    r = run_cli(["bench", "step", "--shapes", "3000x5x4", "--threads", "1", "--iterations", 4, "--repeats", 1,
                 "--tools", "mpikmeans,sklearn,sklearnex", "--json", out], timeout=600)
    assert r.code == 0, r.err + r.out
    assert "Traceback" not in r.err + r.out
    doc = json.loads(out.read_text())
    assert doc["bench"] == "step" and doc["iterations"] == 4 and doc["repeats"] == 1
    points = {p["tool"]: p for p in doc["points"]}
    assert set(points) == {"mpikmeans", "sklearn", "sklearnex"}
    me, sk, ex = points["mpikmeans"], points["sklearn"], points["sklearnex"]
    for p in (me, sk):
        assert (p["rows"], p["attrs"], p["k"], p["threads"]) == (3000, 5, 4, 1)
        assert p["sse"] > 0 and len(p["labels_sha1"]) == 40 and p["fit_s"] > 0
        # tiny data: the difference of two fits may be below the timer's noise, and then says so
        assert p["ms_per_iteration"] > 0 or "below the timing noise" in p["note"]
    # the same initial centres, whole Lloyd iterations: scikit-learn's answer
    assert me["iterations"] == sk["iterations"]
    assert me["sse"] == pytest.approx(sk["sse"], rel=1e-9)
    assert me["same_labels_as_sklearn"] is True
    assert me["ratio_to_sklearn"] == pytest.approx(me["ms_per_iteration"] / sk["ms_per_iteration"])
    # oneDAL is an optional extra: measured where installed, else a row that says why
    assert ("ms_per_iteration" in ex) != ("error" in ex)
    if "error" in ex:
        assert "not installed" in ex["error"] and "skipped" in r.out
        assert "ratio_to_sklearnex" not in me
    table = r.out.splitlines()
    assert any(line.startswith("3000x5 K=4") for line in table), r.out
    assert f"wrote {out}" in r.out


def test_worker_prints_one_json_line(tmp_path):
    import numpy as np

    rng = np.random.default_rng(0)
    x = rng.normal(size=(500, 3))
    np.save(tmp_path / "x.npy", x)
    np.save(tmp_path / "c.npy", x[:3])
    r = run_cli(["bench", "step-worker", "mpikmeans", "--data", tmp_path / "x.npy", "--init", tmp_path / "c.npy",
                 "--iterations", 3, "--repeats", 1], timeout=300)
    assert r.code == 0, r.err
    doc = json.loads(r.out.strip().splitlines()[-1])
    assert doc["iterations"] <= 3 and doc["sse"] > 0 and "ms_per_iteration" in doc


def test_thread_env_sizes_every_pool():
    env = thread_env(3)
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "NUMBA_NUM_THREADS"):
        assert env[var] == "3"


@pytest.mark.parametrize("args, needle", [
    (["--shapes", "100x2"], "ROWSxATTRSxK"),
    (["--shapes", "ax2x3"], "ROWSxATTRSxK"),
    (["--shapes", "100x0x3"], "ROWSxATTRSxK"),
    (["--shapes", "10x2x20"], "K=20 is more than the 10 rows"),
    (["--threads", "-1"], "thread counts"),
    (["--threads", "two"], "thread counts"),
    (["--tools", "mpikmeans,weka"], "choose among mpikmeans, mpikmeans-full, sklearn, sklearn-elkan, sklearnex"),
    (["--iterations", "1"], "--iterations"),
    (["--repeats", "0"], "--repeats"),
])
def test_bad_options_exit_2(args, needle, tmp_path):
    r = run_cli(["bench", "step", "--json", tmp_path / "s.json", *args])
    assert r.code == 2, (r.out, r.err)
    assert needle in r.err and "Traceback" not in r.err
    assert not (tmp_path / "s.json").exists()
