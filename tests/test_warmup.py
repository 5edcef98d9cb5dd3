"""``mpikmeans warmup`` (:mod:`mpikmeans.warmup`) and what it buys: after it, runs compile nothing.

Every kernel takes its shape as a run-time argument, so one warm-up compiles
everything any run needs.  With ``MPIKMEANS_CACHE_DIR`` a fresh directory,
``mpikmeans warmup --no-gpu`` marks the ``cpu`` part warm (``mpikmeans info``
and ``info --json`` say so); then CLI runs at several K and M (different
files), ``.npy`` input, two ranks and the GPU backend of both dtypes (under the
CUDA simulator, whose host-side kernels are the CPU's) compile nothing.  A run
on a cold cache compiles (so the count below can fail) and says so on stderr in
one line, once, on rank 0; a warm run says nothing.

How compiles are counted: each run's processes start through a small wrapper
(:data:`_COUNTING`) that registers a listener for Numba's ``numba:compile``
event and, at exit, writes the number of events into a file of its own.  Numba
fires that event only when it compiles (a kernel loaded from its disk cache
fires none), for every dispatcher, cached or not, and for the GPU kernels that
numba-cuda compiles; so the count is the run's compiles, not a timing.  The
wrapper then runs ``python -m mpikmeans`` unchanged (the package first, so
Numba's cache is moved as in any run).  Printing ``NUMBA_DEBUG_CACHE``'s "data
saved" lines would miss a kernel compiled without ``cache=True`` (it is never
saved); the event does not.  The background helpers a cold run starts
(``mpikmeans warmup --part``) are plain processes: their compiles are not the
run's and are not counted.

The cold warm-up and the cold run take one to three minutes each on 2 cores:
each is done once per session (fixtures), and every test here is ``slow``.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

import pytest

from conftest import HANG_GUARD_S, _env, mpirun_path, run_cli

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]

ROOT = Path(__file__).resolve().parents[1]
#: the notice a run that has to compile prints on stderr (startup.BackgroundCompile)
NOTICE = "compiling kernels for this machine, once"
#: a cold cache on the busy 2-core machine: the warm-up, or a run waiting for its helpers (2-4 minutes)
COLD_GUARD_S = 10 * 120

_COUNTING = textwrap.dedent(
    r"""
    import atexit, json, os, runpy, sys
    import mpikmeans  # noqa: F401  (moves Numba's cache first, as the CLI does)
    from numba.core import event

    class Compiles(event.Listener):
        n = 0
        def on_start(self, ev):
            pass
        def on_end(self, ev):
            Compiles.n += 1

    event.register("numba:compile", Compiles())

    def report():
        path = os.path.join(os.environ["MPIKMEANS_TEST_COMPILES"], f"{os.getpid()}.json")
        with open(path, "w") as f:
            json.dump({"compiles": Compiles.n, "rank": os.environ.get("OMPI_COMM_WORLD_RANK", "0")}, f)

    atexit.register(report)
    sys.argv = ["mpikmeans"] + sys.argv[1:]
    runpy.run_module("mpikmeans", run_name="__main__", alter_sys=True)
    """
)


@dataclass
class Counted:
    code: int
    out: str
    err: str
    compiles: dict  # rank -> compiles in that rank's process

    @property
    def notices(self) -> int:
        return sum(NOTICE in line for line in self.err.splitlines())


def counted_run(args: list, cache: Path, tmp: Path, np: int | None = None, env: dict | None = None,
                timeout: float = HANG_GUARD_S) -> Counted:
    """``mpikmeans ARGS`` (under ``mpirun -np NP`` when given) with the cache root ``cache``; each process's
    Numba compiles counted (see the module docstring)."""
    counts = Path(tmp) / f"compiles-{len(list(Path(tmp).glob('compiles-*')))}"
    counts.mkdir()
    full = _env()
    full.update({"MPIKMEANS_CACHE_DIR": str(cache), "MPIKMEANS_TEST_COMPILES": str(counts),
                 "PYTHONPATH": str(ROOT) + os.pathsep + full.get("PYTHONPATH", "")})
    full.pop("NUMBA_CACHE_DIR", None)
    full.update({k: str(v) for k, v in (env or {}).items()})
    cmd = [sys.executable, "-c", _COUNTING] + [str(a) for a in args]
    if np is not None:
        mpirun = mpirun_path()
        if mpirun is None:
            pytest.skip("mpirun not found")
        cmd = [mpirun, "-np", str(np), "--oversubscribe", "--bind-to", "none"] + cmd
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=full, cwd=tmp,
                           start_new_session=True)
    except subprocess.TimeoutExpired as exc:
        raise AssertionError(f"timed out after {timeout} s: {args}\n{exc.stdout}\n{exc.stderr}") from None
    compiles = {}
    for f in counts.iterdir():
        rec = json.loads(f.read_text())
        compiles[int(rec["rank"])] = rec["compiles"]
    return Counted(p.returncode, p.stdout, p.stderr, compiles)


# --------------------------------------------------------------------------------------------- fixtures

@pytest.fixture(scope="session")
def inputs(tmp_path_factory):
    """Three ARFF files of 400 rows (M = 2, 5, 9), a ``.npy`` of the M = 5 one, a 120-row file for the
    simulated GPU runs, and a centres file that leaves one cluster of the M = 2 data empty."""
    d = tmp_path_factory.mktemp("warmup-inputs")
    for m in (2, 5, 9):
        r = run_cli(["gen-data", d / f"m{m}.arff", "-n", 400, "-m", m, "-k", 4, "--seed", m, "-q"])
        assert r.code == 0, r.err
    r = run_cli(["gen-data", d / "small.arff", "-n", 120, "-m", 3, "-k", 3, "--seed", 1, "-q"])
    assert r.code == 0, r.err
    r = run_cli(["convert", d / "m5.arff", d / "m5.npy", "-q"])
    assert r.code == 0, r.err
    # three centres near the M = 2 data's blobs and one far from every row (its cluster is empty)
    (d / "far.csv").write_text("X1,X2\n6.4,-8.0\n-5.5,-6.4\n1.9,4.6\n1000.0,1000.0\n")
    return d


@pytest.fixture(scope="session")
def warm_cache(tmp_path_factory):
    """A fresh cache root, cold as ``info`` says, then warmed by ``mpikmeans warmup --no-gpu``."""
    cache = tmp_path_factory.mktemp("warm-cache")
    env = {"MPIKMEANS_CACHE_DIR": cache, "NUMBA_CACHE_DIR": None}
    before = run_cli(["info", "--json"], env=env)
    assert before.code == 0, before.err
    r = run_cli(["warmup", "--no-gpu"], env=env, timeout=COLD_GUARD_S)
    return {"cache": cache, "before": before, "warmup": r}


@pytest.fixture(scope="session")
def cold_run(tmp_path_factory, inputs):
    """One run on an empty cache root, one rank, its compiles counted; and the next run in that cache."""
    cache = tmp_path_factory.mktemp("cold-cache")
    tmp = tmp_path_factory.mktemp("cold-run")
    first = counted_run(["run", inputs / "m5.arff", "-k", 7, "-o", tmp / "a"], cache, tmp, timeout=COLD_GUARD_S)
    second = counted_run(["run", inputs / "m5.arff", "-k", 7, "-o", tmp / "b"], cache, tmp, timeout=COLD_GUARD_S)
    return {"cache": cache, "first": first, "second": second, "dir": tmp}


def _parts(cache: Path) -> dict:
    r = run_cli(["info", "--json"], env={"MPIKMEANS_CACHE_DIR": cache, "NUMBA_CACHE_DIR": None})
    assert r.code == 0, r.err
    return json.loads(r.out)["cache"]["parts"]


# --------------------------------------------------------------------------------------------- the warm-up

def test_warmup_marks_the_cpu_part_warm(warm_cache):
    before = json.loads(warm_cache["before"].out)["cache"]
    assert before["root"] == str(warm_cache["cache"])
    assert before["parts"] == {"cpu": "cold", "gpu-float64": "cold", "gpu-float32": "cold"}
    r = warm_cache["warmup"]
    assert r.code == 0, r.out + r.err
    assert "cpu: compiled in" in r.out and f"cache: {warm_cache['cache']}" in r.out, r.out
    assert "gpu" not in r.out  # --no-gpu: the GPU parts are not compiled
    assert _parts(warm_cache["cache"]) == {"cpu": "warm", "gpu-float64": "cold", "gpu-float32": "cold"}
    info = run_cli(["info"], env={"MPIKMEANS_CACHE_DIR": warm_cache["cache"], "NUMBA_CACHE_DIR": None})
    assert info.code == 0, info.err
    line = next(ln for ln in info.out.splitlines() if ln.startswith("kernel cache:"))
    assert "cpu warm" in line and "mpikmeans warmup compiles them" not in line, line
    assert (warm_cache["cache"] / "warm").is_dir() and not list((warm_cache["cache"] / "warm").glob("*.tmp-*"))


#: runs after the warm-up: other K, other M (other files), .npy input, another initialisation, two ranks,
#: and the GPU backend of both dtypes under the simulator (its host-side kernels are the CPU's)
WARM_RUNS = {
    "k2_m2": (["m2.arff", "-k", 2], None, {}),
    "k7_m5": (["m5.arff", "-k", 7], None, {}),
    "k33_m9": (["m9.arff", "-k", 33], None, {}),
    "k5_npy": (["m5.npy", "-k", 5, "--init", "k-means||"], None, {}),
    "k7_m9_np2": (["m9.arff", "-k", 7], 2, {}),
    "k3_gpu_float64_sim": (["small.arff", "-k", 3, "--backend", "gpu"], None, {"NUMBA_ENABLE_CUDASIM": "1"}),
    "k4_gpu_float32_sim": (["small.arff", "-k", 4, "--backend", "gpu", "--dtype", "float32"], None,
                           {"NUMBA_ENABLE_CUDASIM": "1"}),
}


@pytest.mark.parametrize("case", sorted(WARM_RUNS))
def test_runs_after_warmup_compile_nothing(warm_cache, inputs, tmp_path, case):
    assert warm_cache["warmup"].code == 0, "the warm-up failed: " + warm_cache["warmup"].out[-2000:]
    args, np_, env = WARM_RUNS[case]
    r = counted_run(["run", inputs / args[0], *args[1:], "-o", tmp_path / "out"], warm_cache["cache"], tmp_path,
                    np=np_, env=env, timeout=10 * 60)
    assert r.code == 0, r.err
    assert sorted(r.compiles) == list(range(np_ or 1)), r.compiles  # every rank reported
    assert all(n == 0 for n in r.compiles.values()), (r.compiles, r.err[-2000:])
    assert r.notices == 0, r.err


def test_a_run_that_relocates_an_empty_cluster_compiles_nothing_after_warmup(warm_cache, inputs, tmp_path):
    """An empty cluster moved to the farthest row (the default policy) after the warm-up: no compile either."""
    assert warm_cache["warmup"].code == 0, "the warm-up failed: " + warm_cache["warmup"].out[-2000:]
    r = counted_run(["run", inputs / "m2.arff", "-k", 4, "--init", inputs / "far.csv", "-o", tmp_path / "out"],
                    warm_cache["cache"], tmp_path)
    assert r.code == 0, r.err
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["empty_relocations"] == 1, summary["empty_relocations"]
    assert r.compiles == {0: 0}, r.compiles


# --------------------------------------------------------------------------------------------- cold caches

def test_a_cold_run_compiles_and_says_so_once(cold_run):
    first = cold_run["first"]
    assert first.code == 0, first.err
    assert first.compiles[0] > 0  # the count sees compiles: the zeros above can fail
    assert first.notices == 1, first.err
    line = next(ln for ln in first.err.splitlines() if NOTICE in ln)
    assert "mpikmeans warmup" in line and "cpu" in line, line


@pytest.mark.parametrize("name, code, message", [("missing.arff", 3, "cannot read"),
                                                 ("empty.arff", 3, "the file is empty"),
                                                 ("pipe", 2, "not a regular file")])
def test_an_input_that_cannot_be_read_fails_before_anything_compiles(tmp_path, name, code, message):
    """On an empty cache, a run whose input is missing, empty or a FIFO ends with its message and exit code at
    once: nothing compiled in its process, no compiling notice, no helper started (a reader's kernels would take
    tens of seconds there before the error)."""
    (tmp_path / "empty.arff").write_bytes(b"")
    os.mkfifo(tmp_path / "pipe")
    cache = tmp_path / "cache"
    cache.mkdir()
    r = counted_run(["run", tmp_path / name, "-k", 3, "-o", tmp_path / "out"], cache, tmp_path)
    assert r.code == code, r.err
    assert message in r.err and name in r.err, r.err
    assert r.compiles == {0: 0} and r.notices == 0, (r.compiles, r.err)
    assert not (tmp_path / "out").exists()


def test_a_cold_runs_helpers_leave_the_cache_warm(cold_run):
    """The helpers a cold run starts compile the part into the shared cache and mark it: the next run
    neither compiles nor says anything."""
    assert _parts(cold_run["cache"])["cpu"] == "warm"
    second = cold_run["second"]
    assert second.code == 0, second.err
    assert second.notices == 0, second.err
    assert second.compiles == {0: 0}, second.compiles


def test_summary_json_reports_what_a_run_compiled(cold_run):
    """timings.kernels_compiled and compile_s: what the run's own process compiled (the benchmarks read them)."""
    first = json.loads((cold_run["dir"] / "a" / "summary.json").read_text())["timings"]
    second = json.loads((cold_run["dir"] / "b" / "summary.json").read_text())["timings"]
    assert first["kernels_compiled"] > 0 and first["compile_s"] > 0, first
    assert second["kernels_compiled"] == 0 and second["compile_s"] == 0, second


@pytest.mark.mpi
@pytest.mark.parametrize("ranks", [1, 2])
def test_a_run_with_a_cold_part_says_so_once_on_rank_0(warm_cache, inputs, tmp_path, ranks):
    """The warm cache with its markers removed: the run says it compiles, once, whatever the rank count."""
    assert warm_cache["warmup"].code == 0, "the warm-up failed: " + warm_cache["warmup"].out[-2000:]
    cache = tmp_path / "cache"
    shutil.copytree(warm_cache["cache"], cache)
    shutil.rmtree(cache / "warm")
    assert _parts(cache)["cpu"] == "cold"
    r = counted_run(["run", inputs / "m5.arff", "-k", 3, "-o", tmp_path / "out"], cache, tmp_path, np=ranks,
                    timeout=COLD_GUARD_S)
    assert r.code == 0, r.err
    assert r.notices == 1, r.err
    assert sorted(r.compiles) == list(range(ranks))


# -- the cpu part's pieces (unit level: no compiling) ------------------------------------------------------------------


def _pieces_that_sleep(monkeypatch, tmp_path, seconds):
    """The pieces' command replaced by a process that sleeps ``seconds`` and leaves a file named after it; the
    part's own work (the files, convert, the jobs) replaced by records of when it ran."""
    from mpikmeans import warmup as W

    started, done = [], []
    monkeypatch.setattr(W, "warmup_command", lambda piece: started.append(piece) or [
        sys.executable, "-c", f"import time, pathlib; time.sleep({seconds}); pathlib.Path(r'{tmp_path}', '{piece}').touch()"])
    monkeypatch.setattr(W, "prepare", lambda comm: None)
    monkeypatch.setattr(W, "write_blobs", lambda spec, path, comm: Path(path).touch())
    monkeypatch.setattr(W, "convert", lambda comm, src, dst, threads=1: done.append(("convert", _finished(tmp_path))))
    monkeypatch.setattr(W, "_job", lambda data, out, **kw: done.append(("job", _finished(tmp_path))))
    return W, started, done


def _finished(tmp_path):
    return sorted(p.name for p in Path(tmp_path).iterdir() if p.name.startswith("cpu-"))


def test_the_cpu_part_starts_its_pieces_and_runs_its_jobs_once_they_are_done(monkeypatch, tmp_path):
    W, started, done = _pieces_that_sleep(monkeypatch, tmp_path / "marks", 1.0)
    (tmp_path / "marks").mkdir()
    W._warm_cpu(str(tmp_path), threads=1)
    assert started == ["cpu-lloyd", "cpu-host"]
    assert done[0] == ("convert", [])  # the parser's work beside the pieces, not after them
    jobs = [finished for what, finished in done if what == "job"]
    assert jobs and all(finished == ["cpu-host", "cpu-lloyd"] for finished in jobs)


def test_a_stuck_piece_is_stopped_and_the_part_goes_on(monkeypatch, tmp_path):
    W, started, done = _pieces_that_sleep(monkeypatch, tmp_path / "marks", 120)
    (tmp_path / "marks").mkdir()
    monkeypatch.setattr(W, "PIECE_TIMEOUT_S", 0.5)
    W._warm_cpu(str(tmp_path), threads=1)
    assert [what for what, _ in done].count("job") >= 5 and _finished(tmp_path / "marks") == []


def test_a_piece_marks_nothing_warm(monkeypatch, tmp_path):
    from mpikmeans import warmup as W
    from mpikmeans.cache import is_warm

    monkeypatch.setenv("MPIKMEANS_CACHE_DIR", str(tmp_path / "cache"))
    ran = []
    monkeypatch.setattr(W, "_warm_lloyd", lambda threads: ran.append("lloyd"))
    monkeypatch.setattr(W, "_warm_host", lambda threads: ran.append("host"))
    for piece in W.CPU_HELPERS:
        W.warm_part(piece)
    assert ran == ["lloyd", "host"] and not any(is_warm(p) for p in W.PARTS)
    with pytest.raises(ValueError, match="unknown warm-up part"):
        W.warm_part("cpu-other")


def test_a_failing_cpu_part_stops_its_pieces(monkeypatch, tmp_path):
    W, started, done = _pieces_that_sleep(monkeypatch, tmp_path / "marks", 120)
    (tmp_path / "marks").mkdir()
    procs = []
    start = W._start_pieces
    monkeypatch.setattr(W, "_start_pieces", lambda pieces: procs.extend(start(pieces)) or procs)

    def broken(comm, src, dst, threads=1):
        raise OSError("disk full")

    monkeypatch.setattr(W, "convert", broken)
    with pytest.raises(OSError, match="disk full"):
        W._warm_cpu(str(tmp_path), threads=1)
    assert len(procs) == 2 and all(p.poll() is not None for p in procs)
