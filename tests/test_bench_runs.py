"""mpikmeans bench runs: whole runs end to end, the figures taken from summary.json, the caches, the K sweep."""

from __future__ import annotations

import json
import os
import stat

import pytest

from conftest import run_cli

from mpikmeans.bench import runs
from mpikmeans.errors import UsageError

NO_GPU = {"NUMBA_ENABLE_CUDASIM": None, "CUDA_VISIBLE_DEVICES": ""}
# a hang guard: each end-to-end test is several launches, and the first after a change of the kernels'
# sources compiles them
pytestmark = pytest.mark.timeout(1200)


# -- the figures of one run -------------------------------------------------------------------


def test_iteration_figures_find_the_slowest_and_the_median():
    history = [{"iteration": 1, "seconds": 0.010, "changed": 900},
               {"iteration": 2, "seconds": 0.400, "changed": 300, "relocated": 12},
               {"iteration": 3, "seconds": 0.020, "changed": 4}, {"iteration": 4, "seconds": 0.030, "changed": 0}]
    f = runs.iteration_figures(history)
    assert f["iteration_slowest"] == 2 and f["iteration_slowest_s"] == 0.4 and f["iteration_slowest_changed"] == 300
    assert f["iteration_slowest_relocated"] == 12
    assert runs.iteration_figures(history[2:])["iteration_slowest_relocated"] == 0
    assert f["iteration_median_s"] == pytest.approx(0.025)
    assert f["slowest_over_median"] == pytest.approx(16.0)
    assert set(runs.iteration_figures([]).values()) == {None}


def test_run_figures_take_every_phase_and_the_reported_compile():
    summary = {"timings": {"launch_s": 0.5, "startup_s": 0.3, "read_s": 0.2, "setup_s": 1.5, "init_s": 0.1,
                           "compute_s": 0.4, "write_s": 0.05, "total_s": 2.55, "per_iteration_s": 0.1,
                           "setup_parts": {"kernels_s": 1.4}, "compile_s": 1.3},
               "background_compile_s": {"cpu-step": 2.0, "parse": 1.0}, "iterations": 4, "converged": True,
               "stop_reason": "labels stable", "inertia": 12.5, "backend": "cpu", "dtype": "float64", "devices": [],
               "threads_per_rank": 2, "ranks": 1, "history": [{"iteration": 1, "seconds": 0.1, "changed": 5}]}
    f = runs.run_figures(summary, 3.25)
    assert f["wall_s"] == 3.25 and list(f["timings"]) == list(runs.PHASES)
    assert f["timings"]["setup_s"] == 1.5 and f["setup_parts"] == {"kernels_s": 1.4}
    assert f["compile_reported_s"] == 1.3 and f["background_compile_s"] == 3.0
    assert (f["iterations"], f["inertia"], f["iteration_slowest"]) == (4, 12.5, 1)
    del summary["timings"]["compile_s"], summary["timings"]["launch_s"]
    summary["compile_s"] = 0.0
    f = runs.run_figures(summary, 3.0)
    assert f["compile_reported_s"] == 0.0 and f["timings"]["launch_s"] is None
    assert runs.reported_compile({"timings": {}}) is None


def _row(cache, setup, reported=None, **cell):
    base = {"shape": "A", "backend_asked": "cpu", "dtype_asked": "float64", "init": "sample", "cache": cache,
            "compile_reported_s": reported, "timings": {"setup_s": setup}}
    return {**base, **cell}


def test_compile_seconds_from_the_summary_else_empty_minus_warm():
    rows = [_row("empty", 9.0), _row("warm", 0.25), _row("empty", 5.0, init="k-means++"),
            _row("warm", 0.5, reported=0.0, init="k-means++"), _row("empty", 7.0, shape="E"),
            _row("warm", 0.1, error="x")]
    runs.fill_compile(rows)
    assert rows[0]["compile_s"] == pytest.approx(8.75) and "minus" in rows[0]["compile_source"]
    assert rows[1]["compile_s"] is None and rows[1]["compile_source"] == "not reported"
    assert rows[3]["compile_s"] == 0.0 and rows[3]["compile_source"] == "summary.json"
    assert rows[2]["compile_s"] == pytest.approx(4.5)  # its own cell's warm run, not another init's
    assert rows[4]["compile_s"] is None  # no warm run of that shape
    assert "compile_s" not in rows[5]


def test_shapes_scale_but_keep_rows_for_their_k():
    assert runs.parse_shape("a") == ("A", 5_000_000, 100, 50)
    assert runs.parse_shape("20000x8x4") == ("20000x8x4", 20000, 8, 4)
    for bad in ("F", "10x2", "10x2x20", "1x0x1"):
        with pytest.raises(UsageError):
            runs.parse_shape(bad)
    assert runs.scaled_rows(5_000_000, 50, 0.001) == 5000
    assert runs.scaled_rows(300_000, 1000, 0.001) == 4000  # 300 rows would not hold K = 1000
    assert runs.scaled_rows(100, 2, 1.0) == 100


def test_backends_follow_the_machine():
    assert runs.resolve_backends((), 0) == ("cpu",)
    assert runs.resolve_backends((), 2) == ("gpu", "cpu")
    assert runs.resolve_backends(("cpu",), 1) == ("cpu",)
    with pytest.raises(UsageError, match="lists no GPU"):
        runs.resolve_backends(("gpu", "cpu"), 0)


def test_the_command_is_the_one_a_user_types():
    args = runs.run_command_args("d.npy", 7, "sample", "float32", "gpu", 3, "out", ("--max-iter", "9"))
    assert args == ["run", "d.npy", "-k", 7, "--init", "sample", "--seed", 3, "--backend", "gpu", "--dtype",
                    "float32", "-o", "out", "--overwrite", "-q", "--max-iter", "9"]
    assert runs.run_command_args("d.npy", 7, None, None, None, None, "out") == \
        ["run", "d.npy", "-k", 7, "-o", "out", "--overwrite", "-q"]
    assert runs.typed_command(0, ["run", "d", "-k", 2]) == "mpikmeans run d -k 2"
    assert runs.typed_command(4, ["run", "d"]) == "mpirun -np 4 mpikmeans run d"


def test_sweep_sklearn_points_and_estimate():
    ks = list(range(2, 65))
    pts = runs.sweep_points(ks, 5)
    assert pts[0] == 2 and pts[-1] == 64 and len(pts) == 5 and pts == sorted(set(pts))
    assert runs.sweep_points(ks[:3], 5) == ks[:3] and runs.sweep_points(ks, 0) == []
    est = runs.sklearn_sweep_estimate([2, 3, 4, 5], {2: {"fit_s": 1.0}, 5: {"fit_s": 4.0}, 4: {"error": "x"}})
    assert est["total_fit_s"] == pytest.approx(1 + 2 + 3 + 4) and est["extrapolated"]
    assert est["measured_k"] == [2, 5] and "estimated from 2 fits" in est["how"]
    est = runs.sklearn_sweep_estimate([2, 3], {2: {"fit_s": 1.0}, 3: {"fit_s": 2.0}})
    assert est["total_fit_s"] == 3.0 and not est["extrapolated"] and "every K" in est["how"]
    assert runs.sklearn_sweep_estimate([2], {})["total_fit_s"] is None


# -- end to end ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def quick(tmp_path_factory):
    """One quick matrix: two tiny shapes, both initialisations, the CPU, the warm cache (about 30 s on 2 cores)."""
    d = tmp_path_factory.mktemp("runs")
    out = d / "quick.json"
    r = run_cli(["bench", "runs", "--quick", "--no-warmup", "--data-dir", d / "data", "-o", out], env=NO_GPU,
                timeout=900)
    return d, out, r


def test_quick_matrix_runs_every_cell(quick):
    d, out, r = quick
    assert r.code == 0, r.err + r.out
    doc = json.loads(out.read_text())
    for key in ("bench", "command", "date", "commit", "machine", "settings", "shapes", "rows"):
        assert key in doc, key
    assert doc["bench"] == "runs" and doc["command"].startswith("mpikmeans bench runs --quick")
    assert doc["errors"] == 0 and doc["settings"]["backends"] == ["cpu"]
    assert [(row["shape"], row["init"], row["cache"]) for row in doc["rows"]] == [
        ("A", "k-means++", "warm"), ("A", "sample", "warm"), ("E", "k-means++", "warm"), ("E", "sample", "warm")]
    assert (doc["shapes"]["A"]["n"], doc["shapes"]["A"]["m"], doc["shapes"]["A"]["k"]) == (5000, 100, 50)
    assert (doc["shapes"]["E"]["n"], doc["shapes"]["E"]["k"]) == (2000, 7)
    for row in doc["rows"]:
        t = row["timings"]
        assert row["backend"] == "cpu" and row["dtype"] == "float64" and row["iterations"] >= 1
        for phase in ("startup_s", "read_s", "setup_s", "init_s", "compute_s", "write_s", "total_s"):
            assert t[phase] is not None and t[phase] >= 0, phase
        assert t["total_s"] <= row["wall_s"]  # the whole command holds the run
        assert 0 < row["iteration_median_s"] <= row["iteration_slowest_s"]
        assert 1 <= row["iteration_slowest"] <= row["iterations"]
        assert row["command"].startswith(f"mpikmeans run {doc['shapes'][row['shape']]['data']} -k {row['k']} "
                                         f"--init {row['init']} --seed 1 --backend cpu --dtype float64")
    assert os.path.exists(doc["shapes"]["A"]["data"]) and doc["shapes"]["A"]["data"].startswith(str(d / "data"))
    assert not os.path.exists(doc["shapes"]["A"]["data"][:-4] + ".arff")  # converted, then removed


def test_quick_matrix_times_scikit_learn_from_the_same_rows(quick):
    _, out, _ = quick
    doc = json.loads(out.read_text())
    for name, shape in doc["shapes"].items():
        default, same = shape["sklearn"]["default"], shape["sklearn"]["same_init_sample"]
        assert default["fit_s"] > 0 and default["iterations"] >= 1 and default["threads"] == os.cpu_count()
        assert same["fit_s"] > 0
        row = next(r for r in doc["rows"] if r["shape"] == name and r["init"] == "sample")
        # the rows of --init sample, Lloyd to stable labels: scikit-learn's answer
        assert row["inertia_rel_diff_sklearn_same_init"] < 1e-9
        assert row["iterations_sklearn_same_init"] == row["iterations"]


def test_quick_matrix_writes_its_table(quick):
    _, out, r = quick
    table = out.with_suffix(".txt").read_text().splitlines()
    assert table[0] == "$ " + json.loads(out.read_text())["command"]
    assert any(line.startswith("A     cpu     float64 sample    warm") for line in table), table
    assert any("scikit-learn KMeans(50).fit" in line for line in table)
    assert f"wrote {out}" in r.out


def test_runs_result_is_plotted(quick, tmp_path):
    _, out, _ = quick
    copy = tmp_path / "r.json"
    copy.write_text(out.read_text())
    r = run_cli(["bench", "plot", copy])
    assert r.code == 0, r.err
    assert (tmp_path / "r.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "A cpu float64 sample warm" in (tmp_path / "r.svg").read_text()


def test_each_cache_is_the_one_asked_for(tmp_path):
    """Empty-cache runs each get a new MPIKMEANS_CACHE_DIR (and no NUMBA_CACHE_DIR of this environment), warm runs
    the --cache-dir, after one warmup there.  A launcher that records each command's cache and then runs it on this
    environment's (warm) cache shows what every command was given, without compiling everything."""
    log = tmp_path / "launches.log"
    fake = tmp_path / "launcher"
    fake.write_text(f'#!/bin/sh\necho "${{MPIKMEANS_CACHE_DIR:-none}}|${{NUMBA_CACHE_DIR:-none}}|$*" >> {log}\n'
                    'shift 2\nunset MPIKMEANS_CACHE_DIR\nexec "$@"\n')
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    warm = tmp_path / "warm-cache"
    out = tmp_path / "c.json"
    r = run_cli(["bench", "runs", "--shapes", "2000x3x4", "--inits", "sample,k-means++", "--caches", "empty,warm",
                 "--np", 1, "--launcher", fake, "--cache-dir", warm, "--no-sklearn", "--data-dir", tmp_path / "d",
                 "-o", out], env={**NO_GPU, "NUMBA_CACHE_DIR": str(tmp_path / "theirs")}, timeout=900)
    assert r.code == 0, r.err + r.out
    lines = [line.split("|") for line in log.read_text().splitlines()]
    tool = [(cache, numba, cmd.split(" -m mpikmeans ")[1].split()[0]) for cache, numba, cmd in lines]
    assert [t[2] for t in tool] == ["warmup", "gen-data", "convert", "run", "run", "run", "run"]
    assert tool[0][:2] == (str(warm), "none")  # the warm-up fills the warm cache
    run_caches = [t[0] for t in tool[3:]]
    empty = [c for c in run_caches if c != str(warm)]
    assert len(empty) == 2 and all(os.path.basename(c) == "cache-empty" for c in empty)
    assert run_caches.count(str(warm)) == 2 and all(t[1] == "none" for t in tool[3:])
    assert not any(os.path.exists(c) for c in empty)  # each empty cache is removed after its run
    doc = json.loads(out.read_text())
    assert [row["cache"] for row in doc["rows"]] == ["empty", "warm", "empty", "warm"]
    assert doc["warmup"]["ran"] and doc["warmup"]["cache_files_before"] == 0
    assert doc["rows"][0]["command"].startswith("mpirun -np 1 mpikmeans run ")
    for row in doc["rows"]:
        assert row["compile_source"] in ("set-up on the empty cache minus on the warm one", "summary.json",
                                         "not reported")
        if row["cache"] == "empty" and row["compile_source"].startswith("set-up"):
            assert row["compile_s"] >= 0


def test_k_sweep_in_one_job_then_one_run_per_k(tmp_path):
    out = tmp_path / "s.json"
    r = run_cli(["bench", "runs", "--quick", "--no-warmup", "--sweep", "2:4", "--sweep-sklearn", 2,
                 "--data-dir", tmp_path / "d", "-o", out], env=NO_GPU, timeout=900)
    assert r.code == 0, r.err + r.out
    doc = json.loads(out.read_text())
    assert doc["bench"] == "runs-sweep" and doc["errors"] == 0
    assert [row["k"] for row in doc["rows"]] == [2, 3, 4]
    assert (doc["shape"]["n"], doc["shape"]["m"], doc["shape"]["k"]) == (5000, 100, 50)
    for row in doc["rows"]:
        assert row["command"].startswith(f"mpikmeans run {doc['shape']['data']} -k {row['k']} --backend cpu")
        assert "--init" not in row["command"]  # the tool's defaults
    assert doc["total_wall_s"] == pytest.approx(sum(row["wall_s"] for row in doc["rows"]))
    assert doc["total_run_s"] == pytest.approx(sum(row["timings"]["total_s"] for row in doc["rows"]))
    one = doc["one_job"]
    assert one["command"].startswith(f"mpikmeans run {doc['shape']['data']} -k 2:4 --backend cpu")
    assert sorted(one["per_k"]) == ["2", "3", "4"] and one["first"]["timings"]["read_s"] is not None
    # the same K, the same seeds: the same iterations as the separate runs
    assert [one["per_k"][str(r["k"])]["iterations"] for r in doc["rows"]] == [r["iterations"] for r in doc["rows"]]
    assert one["phase_sums"]["total_s"] == pytest.approx(sum(v["total_s"] for v in one["per_k"].values()))
    assert "in one job" in r.out and one["wall_s"] > 0
    sk = doc["sklearn"]
    assert sorted(int(k) for k in sk["fits"]) == [2, 4] and sk["extrapolated"]
    assert "estimated from 2 fits" in r.out and "interpolated" in r.out
    plot = run_cli(["bench", "plot", out])
    assert plot.code == 0, plot.err
    assert (tmp_path / "s.png").exists()


def test_a_failed_run_is_kept_and_the_exit_is_1(tmp_path):
    out = tmp_path / "f.json"
    r = run_cli(["bench", "runs", "--quick", "--no-warmup", "--no-sklearn", "--shapes", "E", "--inits", "sample",
                 "--run-args", "--tol -1", "--data-dir", tmp_path / "d", "-o", out], env=NO_GPU, timeout=600)
    assert r.code == 1 and "Traceback" not in r.err + r.out
    assert "1 run(s) failed" in r.err
    doc = json.loads(out.read_text())
    assert doc["errors"] == 1 and "--tol" in doc["rows"][0]["error"]
    assert "FAILED" in out.with_suffix(".txt").read_text()


@pytest.mark.parametrize("args, needle", [
    (["--sweep", "5:2"], "K0:K1"),
    (["--sweep", "x"], "K0:K1"),
    (["--shapes", "10x2x20"], "K at most the rows"),
    (["--shapes", "Z"], "give one of A, B, C, D, E"),
    (["--caches", "cold"], "choose among empty, warm"),
    (["--inits", "kmeans"], "choose among"),
    (["--backends", "tpu"], "choose among cpu, gpu"),
    (["--backends", "gpu"], "lists no GPU"),
    (["--scale", "0"], "--scale"),
    (["--run-args", "'unclosed"], "--run-args"),
])
def test_bad_options_exit_2(args, needle, tmp_path):
    r = run_cli(["bench", "runs", "-o", tmp_path / "x.json", *args], env=NO_GPU)
    assert r.code == 2, (r.out, r.err)
    assert needle in r.err and "Traceback" not in r.err
    assert not (tmp_path / "x.json").exists()


def test_a_failed_warmup_is_recorded_and_the_runs_go_on(tmp_path):
    out = tmp_path / "w.json"
    r = run_cli(["bench", "runs", "--quick", "--no-sklearn", "--shapes", "E", "--inits", "sample",
                 "--warmup-args", "--no-such-option", "--data-dir", tmp_path / "d", "-o", out], env=NO_GPU, timeout=600)
    assert r.code == 1 and "Traceback" not in r.err + r.out
    assert "warm-up FAILED" in r.out and "1 run(s) failed" in r.err
    doc = json.loads(out.read_text())
    assert not doc["warmup"]["ran"] and "--no-such-option" in doc["warmup"]["error"]
    assert doc["errors"] == 1 and [("error" in row) for row in doc["rows"]] == [False]
    assert "`mpikmeans warmup --no-such-option` FAILED" in out.with_suffix(".txt").read_text()
