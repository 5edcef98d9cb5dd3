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


def test_rounds_take_turns_and_keep_the_median(tmp_path):
    out = tmp_path / "step.json"
    r = run_cli(["bench", "step", "--shapes", "2000x4x3", "--threads", "1", "--iterations", 3, "--repeats", 1,
                 "--rounds", 3, "--tools", "mpikmeans,mpikmeans-full,sklearn", "--json", out], timeout=600)
    assert r.code == 0, r.err + r.out
    doc = json.loads(out.read_text())
    assert doc["rounds"] == 3
    points = {p["tool"]: p for p in doc["points"]}
    for p in points.values():
        assert len(p["rounds_ms"]) == 3
        assert p["ms_per_iteration"] == sorted(p["rounds_ms"])[1]  # the median round
    # with or without bounds: the same iterations, SSE and labels
    me, full = points["mpikmeans"], points["mpikmeans-full"]
    assert (me["iterations"], me["sse"], me["labels_sha1"]) == (full["iterations"], full["sse"], full["labels_sha1"])
    assert "the median of 3 rounds" in r.out


def test_median_round():
    from mpikmeans.bench.step import _median_round

    rounds = [{"ms_per_iteration": 3.0, "n": 1}, {"error": "x"}, {"ms_per_iteration": 1.0, "n": 2},
              {"ms_per_iteration": 2.0, "n": 3}]
    out = _median_round(rounds)
    assert out["n"] == 3 and out["rounds_ms"] == [3.0, None, 1.0, 2.0]
    assert _median_round([{"error": "not installed"}]) == {"error": "not installed"}
    assert "rounds_ms" not in _median_round([{"ms_per_iteration": 1.0}])


def test_library_version_of_a_checkout_without_metadata(monkeypatch):
    """Run from a checkout on PYTHONPATH (the lent GPU machines), mpikmeans has no package metadata: the
    result names the package's own version, not "unknown"; a missing other library stays "unknown"."""
    import importlib.metadata as md

    from mpikmeans import __version__
    from mpikmeans.bench import step

    def missing(name):
        raise md.PackageNotFoundError(name)

    monkeypatch.setattr(md, "version", missing)
    assert step._library_version("mpikmeans") == step._library_version("mpikmeans-full") == __version__
    assert step._library_version("sklearnex") == "unknown"
