"""mpikmeans bench cpu, read, gpu, mpi-gpu, regs and parity: tiny runs, the result format, the errors."""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path

import pytest

from conftest import mpirun_path, run_cli

from mpikmeans.bench import harness, mpigpu, parity
from mpikmeans.errors import RunError, UsageError

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "bench" / "results"
COMMON = {"bench", "command", "date", "machine", "settings"}
NO_GPU = {"NUMBA_ENABLE_CUDASIM": None, "CUDA_VISIBLE_DEVICES": ""}

needs_mpirun = pytest.mark.skipif(mpirun_path() is None, reason="mpirun not found")


def _clean_error(r, code: int, *needles: str) -> None:
    assert r.code == code, (r.code, r.out, r.err)
    assert "Traceback" not in r.err + r.out
    for needle in needles:
        assert needle in r.err, (needle, r.err)


# -- the result format ----------------------------------------------------------------------


def test_result_document_round_trip(tmp_path):
    doc = harness.result_document("cpu", "mpikmeans bench cpu --rows 10", {"rows": 10},
                                  {"rows": 10, "machine": "old host", "date": "old", "points": []})
    assert list(doc)[:5] == ["bench", "command", "date", "machine", "settings"]
    assert doc["machine"]["cores"] == os.cpu_count() and doc["date"] != "old"
    assert doc["rows"] == 10 and doc["points"] == []
    path = harness.write_result(str(tmp_path / "sub" / "r.json"), doc)
    assert harness.read_result(path) == doc


@pytest.mark.parametrize("path", sorted(RESULTS.glob("*.json")) + [REPO / "bench" / "h100" / "meta.json"],
                         ids=lambda p: p.name)
def test_committed_results_stay_readable(path):
    doc = harness.read_result(str(path))
    assert doc["bench"] in ("gpu", "cpu", "read", "mpi-gpu", "parity", "run", "compile", "tts", "step",
                            "fullstep", "experiment"), path.name
    assert isinstance(doc["machine"], dict)


def test_read_result_errors(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(UsageError, match="not a JSON result file"):
        harness.read_result(str(bad))
    with pytest.raises(UsageError, match="cannot read"):
        harness.read_result(str(tmp_path / "missing.json"))


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


# -- gen-data --report under mpirun -----------------------------------------------------------


@needs_mpirun
def test_gen_data_report_on_two_ranks(tmp_path):
    out, report = tmp_path / "g.arff", tmp_path / "g.json"
    r = run_cli(["gen-data", out, "-n", 500, "-m", 2, "-k", 2, "--report", report, "-q"], np=2, timeout=120)
    assert r.code == 0, r.err
    figures = json.loads(report.read_text())
    assert figures["ranks"] == 2 and figures["bytes"] == out.stat().st_size
    assert figures["write_s"] >= 0 and figures["startup_s"] > 0


# -- bench cpu and bench read on tiny data ----------------------------------------------------


@needs_mpirun
@pytest.mark.mpi
@pytest.mark.slow  # a benchmark end to end: 30-90 s of mpirun launches on two cores
def test_bench_cpu_on_one_and_two_ranks(tmp_path):
    out = tmp_path / "cpu.json"
    r = run_cli(["bench", "cpu", "--rows", 3000, "--attrs", 3, "-k", 2, "--ranks", 1, 2, "--repeats", 1,
                 "--iterations", 2, "--references", "--json", out, "--timeout", 120], timeout=300)
    assert r.code == 0, r.err + r.out
    doc = harness.read_result(str(out))
    assert COMMON <= set(doc) and doc["bench"] == "cpu"
    assert doc["command"].startswith("mpikmeans bench cpu --rows 3000")
    assert doc["settings"]["ranks"] == [1, 2] and doc["settings"]["references"] is True
    assert doc["rows"] == 3000 and doc["file_bytes"] > 0
    points = {(p["what"], p["ranks"]) for p in doc["points"]}
    assert {("gen-data", 1), ("gen-data", 2), ("run", 1), ("run", 2), ("numpy.loadtxt", 1)} <= points
    for p in doc["points"]:
        if p["what"] == "run":
            assert p["read_s"] > 0 and p["startup_s"] > 0 and p["ms_per_iteration"] > 0
        if p["what"] == "gen-data":
            assert p["median_s"] >= 0 and p["fixed_s"] >= 0 and p["MB_per_s"] > 0
    assert "MB/s/rank" in r.out and f"wrote {out}" in r.out


@contextlib.contextmanager
def _cache_shared_with(alias: Path):
    """Numba's cache of this package's kernels, also for the same sources imported as ``alias``.

    Numba files a kernel's cache entries in a directory named after its source file's directory
    (``alias/io`` and ``REPO/mpikmeans/io`` get two) and checks each entry against that file's
    content (older Numba: its size and mtime, which a symlink shares): so the baseline, this
    package behind a symlink, compiled every kernel afresh in its warm-up, about 60 s of the
    test's 97 on two cores.  Here each of its directories is a link to the one the session's
    warm-up filled, for the time of the test: the entries there are valid for the baseline, whose
    sources are the same files.  What the benchmark does is unchanged: the baseline is still
    warmed up and measured, and a kernel missing from the cache is compiled as before (into the
    shared directory).
    """
    from numba.core import caching

    # where both versions' runs put Numba's cache: mpikmeans.cache.configure (run by the import
    # of mpikmeans above) chose it for this process, and its children choose the same
    root = os.environ.get("NUMBA_CACHE_DIR")
    # older Numba (the project allows 0.59) names it with an underscore
    locator = getattr(caching, "UserProvidedCacheLocator", None) or caching._UserProvidedCacheLocator
    links = []
    if root:
        package = REPO / "mpikmeans"
        for src_dir, dirs, _ in os.walk(package):
            dirs[:] = [d for d in dirs if d != "__pycache__"]
            rel = os.path.relpath(src_dir, package)
            theirs, ours = (os.path.join(root, locator.get_suitable_cache_subpath(os.path.join(d, rel, "k.py")))
                            for d in (package, alias))
            if os.path.isdir(theirs) and not os.path.lexists(ours):
                os.symlink(theirs, ours)
                links.append(ours)
    try:
        yield links
    finally:  # no links named after a deleted temporary directory are left in the user's cache
        for link in links:
            os.unlink(link)


@needs_mpirun
@pytest.mark.mpi
@pytest.mark.slow  # a benchmark end to end: 30-90 s of mpirun launches on two cores
def test_bench_read_against_a_baseline(tmp_path):
    # the baseline is this package again, behind a symlink: another directory on PYTHONPATH (so the
    # interleaving and the byte comparison run)
    base = tmp_path / "base"
    base.mkdir()
    (base / "mpikmeans").symlink_to(REPO / "mpikmeans")
    out = tmp_path / "read.json"
    with _cache_shared_with(base / "mpikmeans"):
        r = run_cli(["bench", "read", "--rows", 3000, "--attrs", 3, "-k", 2, "--ranks", 1, 2, "--threads", 1,
                     "--repeats", 1, "--baseline", base, "--json", out, "--timeout", 120], timeout=400)
    assert r.code == 0, r.err + r.out
    doc = harness.read_result(str(out))
    assert doc["bench"] == "read" and doc["packages"]["baseline"] == str(base / "mpikmeans")
    assert doc["same_bytes"] == [True, True]
    assert {(g["version"], g["ranks"]) for g in doc["gen"]} == {(v, n) for v in ("baseline", "current") for n in (1, 2)}
    assert all(g["write_s"] is not None and g["bytes"] == doc["file_bytes"] for g in doc["gen"])
    assert {(x["version"], x["ranks"], x["threads"]) for x in doc["read"]} == {
        (v, n, 1) for v in ("baseline", "current") for n in (1, 2)}
    assert {p["version"] for p in doc["phases"]} == {"baseline", "current"}
    for p in doc["phases"]:
        assert p["total_s"] > 0 and {"parse", "read_file", "other"} <= set(p["parts_s"])
    assert "gen   ranks=2:  baseline" in r.out


def test_bench_read_usage_errors(tmp_path):
    r = run_cli(["bench", "read", "--baseline", tmp_path / "nothing"])
    _clean_error(r, 2, "no mpikmeans package in that directory")
    r = run_cli(["bench", "read", "--baseline", REPO, "--rows", 100, "-k", 2], timeout=120)
    _clean_error(r, 2, "the versions import the same package")
    r = run_cli(["bench", "read", "--threads", "0"])
    _clean_error(r, 2, "--threads")


@pytest.mark.parametrize("args, code, needle", [
    (["--ranks", "0"], 2, "counts of at least 1"),
    (["--ranks", "x"], 2, "whole numbers"),
    (["--rows", "10", "-k", "20"], 2, "k=20 is more than the 10 rows"),
    (["--rows", "100", "--ranks", "1", "--repeats", "1", "--launcher", "false"], 1, "bench: exit 1 from: false"),
])
def test_bench_cpu_errors(args, code, needle, tmp_path):
    r = run_cli(["bench", "cpu", "--json", tmp_path / "c.json", *args], timeout=120)
    _clean_error(r, code, needle)


# -- bench gpu and mpi-gpu: options, and a clear error without a GPU ---------------------------


@pytest.mark.parametrize("args, needle", [
    (["--cases", "Z"], "unknown case 'Z'"),
    (["--cases", "10x2"], "unknown case '10x2'"),
    (["--dtype", "float16"], "dtype float16"),
    (["--variants", "{bad"], "--variants is not JSON"),
    (["--variants", "[1, 2]"], "list of tune dicts"),
    (["--repeats", "0"], "--repeats"),
])
def test_bench_gpu_bad_options_exit_2(args, needle):
    _clean_error(run_cli(["bench", "gpu", *args]), 2, needle)


def test_bench_gpu_without_a_gpu_is_a_clear_error(tmp_path):
    r = run_cli(["bench", "gpu", "--cases", "1000x2x2", "--out", tmp_path / "g.json"], env=NO_GPU)
    _clean_error(r, 1, "bench gpu needs")
    assert not (tmp_path / "g.json").exists()


@pytest.mark.parametrize("args, needle", [
    (["--cases", "Z"], "case 'Z'"),
    (["--cases", "10x2x20"], "case '10x2x20'"),
    (["--dtype", "float16"], "--dtype 'float16'"),
    (["--iters", "1"], "--iters must be at least 2"),
    (["--stream", "1000x2x2"], "--stream needs --chunk-rows"),
    (["--stream", "1000x2x2", "--chunk-rows", "1000"], "--stream needs --chunk-rows"),
    (["--cases", "", "--stream", ""], "nothing to measure"),
    (["--compare", "{split"], "--compare is not JSON"),
    (["--compare", '{"split": false}'], "--compare must be a JSON list of objects"),
])
def test_bench_fullstep_bad_options_exit_2(args, needle):
    _clean_error(run_cli(["bench", "fullstep", *args]), 2, needle)


def test_bench_fullstep_without_a_gpu_is_a_clear_error(tmp_path):
    r = run_cli(["bench", "fullstep", "--cases", "1000x2x2", "--out", tmp_path / "f.json"], env=NO_GPU)
    _clean_error(r, 1, "bench fullstep needs")
    assert not (tmp_path / "f.json").exists()


def test_bench_fullstep_floors_verdicts_and_table():
    from mpikmeans.bench import fullstep as F

    assert F.parse_case("D", F.CASES) == ("D", (300_000, 257, 1000))
    assert F.parse_case("2e6x3x7", F.CASES) == ("2e6x3x7", (2_000_000, 3, 7))
    fl = F._floors(5_000_000, 100, 50, "float32", bw=2.0e12, rate=50e12)
    assert fl["floor_mem_ms"] == pytest.approx(1.0) and fl["floor_fma_ms"] == pytest.approx(1.0)
    row = {"case": "A", "dtype": "float32", "full_ms": 2.0, "torch_ms": 10.0, **fl}
    v = F._verdict(row)
    assert v["x_floor"] == pytest.approx(2.0) and v["floor_met"] and v["vs_torch"] == pytest.approx(5.0)
    assert v["torch_met"] and v["target_ms"] == 1.5 and not v["target_met"]
    row.update(v)
    nan = float("nan")
    row["policy"] = {"full_median_ms": 2.0, "delta_median_ms": nan}
    doc = {"device": "X", "copy_bandwidth_Bps": 2e12, "fp32_source": "datasheet", "results": [row],
           "stream": [{"case": "1e6x2x2", "dtype": "float64", "full_ms": 5.0, "of_h2d": 0.7}]}
    lines = F.fullstep_table(doc)
    assert "1.5: NO" in lines[2] and lines[-1].endswith("70 % of pinned host-to-device (NO >= 80 %)")


def test_bench_gpu_help_keeps_the_scripts_options():
    r = run_cli(["bench", "gpu", "--help"])
    for option in ("--cases", "--dtype", "--repeats", "--iters", "--variants", "--no-torch", "--lloyd",
                   "--host-breakdown", "--noise", "--start-rows", "--device", "--seed", "--out"):
        assert option in r.out, option


@pytest.mark.parametrize("np_", [None, 2])
def test_bench_mpi_gpu_without_a_gpu_is_a_clear_error(tmp_path, np_):
    r = run_cli(["bench", "mpi-gpu", "--n", 1000, "--out", tmp_path / "m.json"], np=np_, env=NO_GPU, timeout=120)
    assert r.code == 1, (r.out, r.err)
    assert "bench mpi-gpu needs" in r.err and "Traceback" not in r.err
    assert not (tmp_path / "m.json").exists()


def test_bench_mpi_gpu_bad_options_exit_2():
    _clean_error(run_cli(["bench", "mpi-gpu", "--dtype", "float16"]), 2, "--dtype float16")
    _clean_error(run_cli(["bench", "mpi-gpu", "--k", "0"]), 2, "at least 1")


def test_bench_mpi_gpu_compares_the_committed_runs():
    # the H200x2 runs of GPU_NOTES.md (v5): 7.18 -> 3.76 ms, 1.91x, centres within 1.8e-16
    np1, np2 = (RESULTS / f"mpi_gpu_H200x2_2026-11-22_v5_np{n}.json" for n in (1, 2))
    r = run_cli(["bench", "mpi-gpu", "--compare", np1, np2])
    assert r.code == 0, r.err
    assert "label checksums equal: True" in r.out and "speed-up 1.91x" in r.out
    verdict = mpigpu.compare(harness.read_result(str(np1)), harness.read_result(str(np2)))
    assert verdict["ok"] and verdict["centres_max_rel_diff"] < 1e-15


def test_bench_mpi_gpu_compare_refuses_other_files(tmp_path):
    other = tmp_path / "o.json"
    other.write_text(json.dumps({"bench": "cpu", "points": []}))
    _clean_error(run_cli(["bench", "mpi-gpu", "--compare", other, other]), 2, "not an mpi-gpu result")


def test_bench_mpi_gpu_compare_finds_a_difference(tmp_path):
    a = json.loads((RESULTS / "mpi_gpu_H200x2_2026-11-22_v5_np1.json").read_text())
    b = dict(a, centres=[[v * (1 + 1e-6) for v in row] for row in a["centres"]])
    pa, pb = tmp_path / "a.json", tmp_path / "b.json"
    pa.write_text(json.dumps(a))
    pb.write_text(json.dumps(b))
    r = run_cli(["bench", "mpi-gpu", "--compare", pa, pb])
    assert r.code == 1 and "centres max rel diff 1.00e-06" in r.out


# -- bench regs ---------------------------------------------------------------------------------


def test_bench_regs_counts_registers_or_says_what_is_missing():
    r = run_cli(["bench", "regs", "50", "100", "float32"], env={"NUMBA_ENABLE_CUDASIM": None}, timeout=300)
    if r.code == 1 and "bench regs needs" in r.err:
        assert "Traceback" not in r.err
        pytest.skip(f"no ptxas/libnvvm/NVRTC here: {r.err.strip()}")
    assert r.code == 0, r.err
    assert "plan: mode 3, R 2, TC 52" in r.out and "registers" in r.out


@pytest.mark.parametrize("args, code, needle", [
    (["0", "100", "float32"], 2, "Invalid value for 'K'"),
    (["50", "100", "float16"], 2, "float16"),
    (["50", "100", "float32", "{bad"], 2, "TUNE is not JSON"),
    (["50", "100", "float32", "[]"], 2, "TUNE must be a JSON object"),
    (["50", "100", "float32", "{}", "sideways"], 2, "sideways"),
])
def test_bench_regs_bad_input(args, code, needle):
    _clean_error(run_cli(["bench", "regs", *args]), code, needle)


def test_bench_regs_refuses_the_simulator():
    r = run_cli(["bench", "regs", "50", "100", "float32"], env={"NUMBA_ENABLE_CUDASIM": "1"})
    _clean_error(r, 1, "unset NUMBA_ENABLE_CUDASIM")


# -- bench parity -------------------------------------------------------------------------------


@needs_mpirun
@pytest.mark.mpi
@pytest.mark.slow  # a benchmark end to end: 30-90 s of mpirun launches on two cores
def test_bench_parity_under_the_simulator(tmp_path):
    res = tmp_path / "p"
    r = run_cli(["bench", "parity", res, "--np", 2, "-n", 300, "-m", 2, "-k", 2, "--share-gpus",
                 "--data", tmp_path / "p.arff", "--timeout", 120], env={"NUMBA_ENABLE_CUDASIM": "1"}, timeout=300)
    assert r.code == 0, r.err + r.out
    assert r.out.count(": OK") == 2
    doc = harness.read_result(str(res / "parity.json"))
    assert doc["bench"] == "parity" and doc["ok"] and doc["ranks"] == 2 and doc["settings"]["run_args"] == ["--share-gpus"]
    for dtype in ("float64", "float32"):
        g = doc["gpu"][dtype]
        assert g["labels_identical"] and g["sizes_equal"] and g["backend"] == "gpu"
        assert g["centres_max_rel_diff"] <= parity.TOLERANCE[dtype]

    # the comparer alone, on the same runs and then on a changed label
    r = run_cli(["bench", "parity", res, "--compare-only"])
    assert r.code == 0 and r.out.count(": OK") == 2, r.err
    labels = res / "gpu_float64" / "labels.txt"
    lines = labels.read_text().splitlines()
    lines[0] = str(1 - int(lines[0]))
    labels.write_text("\n".join(lines) + "\n")
    r = run_cli(["bench", "parity", res, "--compare-only"])
    _clean_error(r, 1, "the GPU runs differ")
    assert "gpu float64 vs cpu float64: labels identical False" in r.out and "MISMATCH" in r.out
    assert not harness.read_result(str(res / "parity.json"))["ok"]


def test_bench_parity_compare_of_cpu_runs_is_a_mismatch(tmp_path, small_file):
    # runs made with the CPU backend: the same labels, but not the GPU backend, so not a parity result
    res = tmp_path / "p"
    for backend, dtype in parity.RUNS:
        r = run_cli(["run", small_file, "-k", 5, "--seed", 5, "--backend", "cpu", "-o",
                     parity.run_dir(str(res), backend, dtype), "-q"])
        assert r.code == 0, r.err
    verdict = parity.compare_runs(str(res), 1)
    assert not verdict["ok"]
    for g in verdict["gpu"].values():
        assert g["labels_identical"] and g["centres_max_rel_diff"] == 0 and g["sizes_equal"]
        assert g["backend"] == "cpu" and not g["ok"]


def test_bench_parity_errors(tmp_path):
    _clean_error(run_cli(["bench", "parity", tmp_path / "none", "--compare-only"]), 2, "not a finished run")
    _clean_error(run_cli(["bench", "parity", tmp_path, "--run-args", "'unclosed"]), 2, "--run-args")
    _clean_error(run_cli(["bench", "parity", tmp_path, "-n", 2, "-k", 3]), 2, "-k 3 is more than the 2 rows")


def test_scripts_keep_only_device_orchestration():
    assert sorted(p.name for p in (REPO / "scripts").iterdir()) == ["device_gpu.sh", "start_local_slurm.sh"]
    text = (REPO / "scripts" / "device_gpu.sh").read_text()
    assert "python3 -m mpikmeans bench gpu" in text and "python3 -m mpikmeans bench cpu" in text
    assert "NCU_KERNEL=${NCU_KERNEL:-km_fused}" in text and "regex:$NCU_KERNEL" in text  # the fused kernel by default
    assert "scripts/bench_" not in text
