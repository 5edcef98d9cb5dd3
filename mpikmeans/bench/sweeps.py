"""Benchmark sweeps through the real tool (the specification's §5.7 and appendix 3).

Every point runs ``mpikmeans run`` under the MPI launcher, as a user would, and
reads the timings from its ``summary.json``: ``read_s`` and ``per_iteration_s``
(the Lloyd loop's wall time over its iterations, Allreduce included, JIT and data
upload excluded).  Each point is repeated; the median and the spread are kept.
The tools a user would pick instead run on the same data in the same run
(:mod:`mpikmeans.bench.references`): scikit-learn for the CPU series, the PyTorch
GEMM form for the GPU series.

Sweeps:

``procs``
    time against MPI processes on one ARFF file: CPU ranks with one thread each
    (against scikit-learn given as many threads), GPU ranks with one GPU each
    (against PyTorch on one GPU).  Read time and compute time come from the same
    runs.
``n``, ``m``, ``k``
    time against rows, attributes, clusters: one CPU rank using every core against
    scikit-learn on every core, one GPU rank against PyTorch, on binary inputs
    (``.npy``) so that generating and parsing text does not dominate.

All series of a point start from the same centres (K rows of the data, written to
a file and given with ``--init``) and run the same number of iterations with
``tol=0``; the tool runs with ``--empty-cluster farthest``, scikit-learn's policy.
Results go to one CSV per sweep plus ``meta.json`` (the common result format of
:mod:`mpikmeans.bench.harness`); :mod:`mpikmeans.bench.plots` draws them.
"""

from __future__ import annotations

import csv
import json
import os
import shutil
import time
from dataclasses import asdict, dataclass, field

import numpy as np

from ..errors import RunError, UsageError
from ..io.gen import GenSpec
from ..io.output import write_atomic
from .data import gen_arff, initial_centres, write_blobs_npy
from .harness import Launch, Progress, count_gpus, machine_description, quiet, result_document, stats, write_result

SWEEPS = ("procs", "n", "m", "k")

#: Column order of every sweep's CSV.
COLUMNS = ("sweep", "series", "tool", "backend", "ranks", "threads", "n", "m", "k", "dtype", "iterations",
           "repeats", "ms_per_iter", "ms_per_iter_min", "ms_per_iter_max", "read_s", "read_s_min", "read_s_max",
           "read_MB_per_s", "inertia", "inertia_rel_diff_sklearn", "devices")


@dataclass
class SweepSpec:
    """One sweep: the parameter varied, its values, the fixed sizes, the rank counts.

    ``param`` is ``"ranks"`` for the process sweep, else ``"n"``, ``"m"`` or ``"k"``.
    """

    name: str
    param: str
    values: list
    n: int
    m: int
    k: int
    cpu_ranks: list = field(default_factory=list)
    gpu_ranks: list = field(default_factory=list)


@dataclass
class BenchSettings:
    """How every point of every sweep is run."""

    out_dir: str
    iterations: int = 5
    repeats: int = 3
    dtype: str = "float64"
    cpu: bool = True
    gpu: bool = True
    references: bool = True
    launcher: list = field(default_factory=list)
    timeout_s: float = 1800.0
    seed: int = 1
    keep_data: bool = False
    data_dir: str | None = None

    def launch(self) -> Launch:
        """How these settings start the tool."""
        return Launch(self.launcher, self.timeout_s)


def presets(mode: str, cores: int, gpus: int) -> list:
    """The sweeps of ``--quick`` (seconds, for CI) or the full mode (a GPU machine).

    Parameters
    ----------
    mode : {"quick", "full"}
    cores, gpus : int
        This machine's cores and GPUs; the process sweep goes up to them.

    Returns
    -------
    list of SweepSpec
    """
    def doubling(limit):
        out, p = [], 1
        while p <= limit:
            out.append(p)
            p *= 2
        return out

    if mode == "quick":
        # two points per sweep: each is a few launches of mpirun + Python + Numba's cache
        return [SweepSpec("procs", "ranks", [], 20_000, 8, 4, cpu_ranks=[1, 2], gpu_ranks=doubling(min(gpus, 2))),
                SweepSpec("n", "n", [4_000, 16_000], 0, 8, 4),
                SweepSpec("m", "m", [2, 16], 8_000, 0, 4),
                SweepSpec("k", "k", [2, 16], 8_000, 8, 0)]
    if mode != "full":
        raise UsageError(f"unknown bench mode {mode!r}")
    # appendix 3's example is N=5e6, M=100, K=50.  The process sweep's one-core points
    # (the tool and scikit-learn) would take minutes per iteration at that size, so it
    # runs at 5e5 rows; every run compiles its GPU kernels (seconds), so the size
    # sweeps keep to three points each
    return [SweepSpec("procs", "ranks", [], 500_000, 100, 50, cpu_ranks=doubling(min(cores, 16)),
                      gpu_ranks=list(range(1, gpus + 1))),
            SweepSpec("n", "n", [300_000, 1_000_000, 3_000_000], 0, 100, 50),
            SweepSpec("m", "m", [8, 32, 128], 1_000_000, 0, 50),
            SweepSpec("k", "k", [8, 64, 512], 1_000_000, 32, 0)]


def warm_up(launch: Launch, directory: str, backends: list) -> float:
    """Run gen-data and the tool once on a tiny input with each backend; the seconds it took.

    The first run of a fresh checkout compiles the parser's, the writer's and
    the backends' kernels (tens of seconds) and caches them on disk; this keeps
    that out of the first measured point.
    """
    t0 = time.perf_counter()
    os.makedirs(directory, exist_ok=True)
    arff = os.path.join(directory, "warm.arff")
    launch.mpi(1, "gen-data", arff, "-n", 2000, "-m", 3, "-k", 2, "-q")
    for backend in backends:
        launch.mpi(1, "run", arff, "-k", 2, "--max-iter", 2, "--backend", backend,
                   "-o", os.path.join(directory, backend), "--overwrite", "-q")
    return time.perf_counter() - t0


# -- one point ----------------------------------------------------------------------------


def run_tool(settings: BenchSettings, data: str, k: int, init_csv: str, backend: str, ranks: int,
             threads: int | None, out: str) -> dict:
    """``mpirun -np RANKS mpikmeans run DATA ...`` once; its ``summary.json``."""
    # scikit-learn moves an empty cluster to a far point: the same policy keeps the SSEs comparable
    args = ["run", data, "-k", k, "--init", init_csv, "--max-iter", settings.iterations, "--tol", 0,
            "--empty-cluster", "farthest", "--backend", backend, "-o", out, "--overwrite", "-q"]
    if backend == "gpu":
        args += ["--dtype", settings.dtype]
    if threads:
        args += ["--threads", threads]
    settings.launch().mpi(ranks, *args)
    with open(os.path.join(out, "summary.json")) as f:
        return json.load(f)


def run_reference(settings: BenchSettings, tool: str, data: str, init_npy: str, threads: int | None = None) -> dict:
    """One reference measurement in its own process (see :mod:`mpikmeans.bench.references`)."""
    args = ["bench", "reference", tool, "--data", data, "--init", init_npy, "--iterations", settings.iterations,
            "--repeats", settings.repeats, "--dtype", settings.dtype]
    env = {}
    if threads:
        env = {"OMP_NUM_THREADS": str(threads), "OPENBLAS_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}
    line = settings.launch().with_env(**env).alone(*args).stdout.strip().splitlines()[-1]
    return json.loads(line)


def _row(sweep: str, series: str, tool: str, backend: str, ranks: int, threads, n: int, m: int, k: int,
         dtype: str, iterations: int, per_iter: list, reads: list | None, nbytes: int, inertia: float,
         devices: str = "") -> dict:
    it = stats(per_iter)
    read = stats(reads) if reads else dict.fromkeys(("median", "min", "max"))
    return {"sweep": sweep, "series": series, "tool": tool, "backend": backend, "ranks": ranks,
            "threads": threads, "n": n, "m": m, "k": k, "dtype": dtype, "iterations": iterations,
            "repeats": len(per_iter), "ms_per_iter": 1e3 * it["median"],
            "ms_per_iter_min": 1e3 * it["min"], "ms_per_iter_max": 1e3 * it["max"],
            "read_s": read["median"], "read_s_min": read["min"], "read_s_max": read["max"],
            "read_MB_per_s": nbytes / 1e6 / read["median"] if read["median"] else None, "inertia": inertia,
            "inertia_rel_diff_sklearn": None, "devices": devices}


def measure_tool(settings: BenchSettings, sweep: str, data: str, nbytes: int, n: int, m: int, k: int,
                 init_csv: str, backend: str, ranks: int, threads: int | None) -> dict:
    """Repeat one configuration of the tool; its CSV row."""
    per_iter, reads, summary = [], [], None
    out = os.path.join(settings.out_dir, "runs", f"{sweep}_{backend}_np{ranks}_n{n}_m{m}_k{k}")
    for _ in range(settings.repeats):
        summary = run_tool(settings, data, k, init_csv, backend, ranks, threads, out)
        per_iter.append(summary["timings"]["per_iteration_s"])
        reads.append(summary["timings"]["read_s"])
    devices = "; ".join(sorted({d.get("name", "") if isinstance(d, dict) else str(d)
                                for d in summary.get("devices") or []}))
    series = f"mpikmeans {backend}"
    return _row(sweep, series, "mpikmeans", backend, ranks, summary.get("threads_per_rank"), n, m, k,
                summary["dtype"], summary["iterations"], per_iter, reads, nbytes, summary["inertia"], devices)


def measure_reference(settings: BenchSettings, sweep: str, tool: str, data_npy: str, init_npy: str,
                      n: int, m: int, k: int, threads: int | None) -> dict:
    """One reference (sklearn or torch) at one point; its CSV row."""
    r = run_reference(settings, tool, data_npy, init_npy, threads)
    if "error" in r:
        raise RunError(f"bench: {tool}: {r['error']}")
    if tool == "sklearn":
        return _row(sweep, "scikit-learn", "scikit-learn", "cpu", 1, r.get("threads") or threads, n, m, k,
                    "float64", r["iterations"], r["per_iteration_s_runs"], None, 0, r["inertia"])
    return _row(sweep, "PyTorch (cuBLAS)", "torch", "gpu", 1, None, n, m, k, settings.dtype, r["iterations"],
                r["per_iteration_s_runs"], None, 0, r["inertia"], r.get("device", ""))


# -- sweeps -------------------------------------------------------------------------------


def _point_sizes(spec: SweepSpec, value) -> tuple[int, int, int]:
    n, m, k = spec.n, spec.m, spec.k
    if spec.param == "n":
        n = value
    elif spec.param == "m":
        m = value
    elif spec.param == "k":
        k = value
    return int(n), int(m), int(k)


def _compare_inertia(rows: list) -> None:
    # same data, same centres, same iterations: the SSE must match scikit-learn's
    ref = {(r["n"], r["m"], r["k"]): r["inertia"] for r in rows if r["tool"] == "scikit-learn"}
    for r in rows:
        base = ref.get((r["n"], r["m"], r["k"]))
        if base:
            r["inertia_rel_diff_sklearn"] = abs(r["inertia"] - base) / abs(base)


def run_sweep(spec: SweepSpec, settings: BenchSettings, gpus: int, cores: int,
              progress: Progress = quiet) -> list:
    """Run one sweep; its rows (also written to ``OUT_DIR/NAME.csv``).

    Parameters
    ----------
    spec : SweepSpec
    settings : BenchSettings
    gpus, cores : int
        What this machine has (the GPU series are left out without a GPU).
    progress : callable
        Receives one line per measured point.

    Returns
    -------
    list of dict
        One row per (series, value), with the columns of :data:`COLUMNS`.
    """
    data_dir = settings.data_dir or os.path.join(settings.out_dir, "data")
    os.makedirs(data_dir, exist_ok=True)
    use_gpu = settings.gpu and gpus > 0
    rows = []

    def add(row):
        rows.append(row)
        extra = f", read {row['read_s']:.3f} s" if row["read_s"] is not None else ""
        progress(f"{spec.name}: {row['series']:<18} np={row['ranks']:<2} n={row['n']} m={row['m']} k={row['k']}: "
                 f"{row['ms_per_iter']:.2f} ms/iter{extra}")

    if spec.param == "ranks":
        base = os.path.join(data_dir, f"procs_n{spec.n}_m{spec.m}_k{spec.k}_s{settings.seed}")
        arff, npy = base + ".arff", base + ".npy"
        if not os.path.exists(arff):
            progress(f"{spec.name}: generating {arff}")
            gen_arff(settings.launch(), max(1, min(cores, 16)), arff, spec.n, spec.m, spec.k,
                     "--seed", settings.seed, "--decimals", 6)
        if not os.path.exists(npy):
            write_blobs_npy(GenSpec(spec.n, spec.m, spec.k, seed=settings.seed, decimals=6), npy)
        init_csv, init_npy = initial_centres(npy, spec.k, settings.seed, base + f".init{spec.k}")
        nbytes = os.path.getsize(arff)
        if settings.cpu:
            for p in spec.cpu_ranks:
                add(measure_tool(settings, spec.name, arff, nbytes, spec.n, spec.m, spec.k, init_csv, "cpu", p, 1))
                if settings.references:
                    row = measure_reference(settings, spec.name, "sklearn", npy, init_npy, spec.n, spec.m, spec.k, p)
                    row["ranks"] = p  # as many threads as the tool had cores
                    add(row)
        if use_gpu:
            for p in [g for g in spec.gpu_ranks if g <= gpus]:
                add(measure_tool(settings, spec.name, arff, nbytes, spec.n, spec.m, spec.k, init_csv, "gpu", p, None))
            if settings.references and spec.gpu_ranks:
                add(measure_reference(settings, spec.name, "torch", npy, init_npy, spec.n, spec.m, spec.k, None))
    else:
        big = None
        if spec.param == "n":  # one file of the most rows; smaller points are its prefixes
            big = os.path.join(data_dir, f"blobs_n{max(spec.values)}_m{spec.m}_k{spec.k}_s{settings.seed}.npy")
            if not os.path.exists(big):
                progress(f"{spec.name}: generating {big}")
                write_blobs_npy(GenSpec(max(spec.values), spec.m, spec.k, seed=settings.seed, decimals=6), big)
        for value in spec.values:
            n, m, k = _point_sizes(spec, value)
            true_k = 16 if spec.param == "k" else k  # the k sweep clusters one data set of 16 blobs
            data = os.path.join(data_dir, f"blobs_n{n}_m{m}_k{true_k}_s{settings.seed}.npy")
            if not os.path.exists(data):
                if big is not None:
                    src = np.load(big, mmap_mode="r")
                    np.save(data + ".part.npy", np.asarray(src[:n]))
                    os.replace(data + ".part.npy", data)
                else:
                    progress(f"{spec.name}: generating {data}")
                    write_blobs_npy(GenSpec(n, m, true_k, seed=settings.seed, decimals=6), data)
            init_csv, init_npy = initial_centres(data, k, settings.seed, data[:-4] + f".init{k}")
            nbytes = os.path.getsize(data)
            if settings.cpu:
                add(measure_tool(settings, spec.name, data, nbytes, n, m, k, init_csv, "cpu", 1, None))
                if settings.references:
                    add(measure_reference(settings, spec.name, "sklearn", data, init_npy, n, m, k, cores))
            if use_gpu:
                add(measure_tool(settings, spec.name, data, nbytes, n, m, k, init_csv, "gpu", 1, None))
                if settings.references:
                    add(measure_reference(settings, spec.name, "torch", data, init_npy, n, m, k, None))
    _compare_inertia(rows)
    write_csv(rows, os.path.join(settings.out_dir, f"{spec.name}.csv"))
    return rows


def write_csv(rows: list, path: str) -> None:
    """Rows of one sweep as CSV with the :data:`COLUMNS` header (atomic)."""
    lines = [",".join(COLUMNS)]
    for r in rows:
        cells = []
        for c in COLUMNS:
            v = r.get(c)
            cells.append("" if v is None else (repr(v) if isinstance(v, float) else str(v)))
        lines.append(",".join(_csv_cell(c) for c in cells))
    write_atomic(path, ("\n".join(lines) + "\n").encode())


def _csv_cell(text: str) -> str:
    return '"' + text.replace('"', '""') + '"' if ("," in text or '"' in text) else text


def read_csv(path: str) -> list:
    """Rows written by :func:`write_csv`, numbers converted back.

    Returns
    -------
    list of dict
    """
    ints = {"ranks", "threads", "n", "m", "k", "iterations", "repeats"}
    text = {"sweep", "series", "tool", "backend", "dtype", "devices"}
    rows = []
    with open(path, newline="") as f:
        for rec in csv.DictReader(f):
            row = {}
            for c, v in rec.items():
                if c in text:
                    row[c] = v
                elif v == "":
                    row[c] = None
                else:
                    row[c] = int(v) if c in ints else float(v)
            rows.append(row)
    return rows


def run_benchmarks(mode: str, sweeps: list, settings: BenchSettings, gpus: int | None = None,
                   cores: int | None = None, command: str = "",
                   progress: Progress = quiet) -> dict:
    """Run the chosen sweeps of a preset; write the CSVs and ``meta.json``.

    Parameters
    ----------
    mode : {"quick", "full"}
    sweeps : list of str
        Names from :data:`SWEEPS`.
    settings : BenchSettings
    gpus, cores : int, optional
        Default: what this machine has.
    command : str
        The command line, kept in ``meta.json`` so every figure says how to redo it.
    progress : callable

    Returns
    -------
    dict
        ``meta.json``'s content, with ``rows`` per sweep.
    """
    unknown = [s for s in sweeps if s not in SWEEPS]
    if unknown:
        raise UsageError(f"unknown sweep(s) {', '.join(unknown)}; choose from {', '.join(SWEEPS)}")
    cores = cores or os.cpu_count() or 1
    gpus = count_gpus() if gpus is None else gpus
    settings.launcher = settings.launch().mpirun()
    os.makedirs(settings.out_dir, exist_ok=True)
    meta = result_document("run", command, {k: v for k, v in asdict(settings).items()
                                            if k not in ("out_dir", "data_dir")},
                           {"mode": mode, "sweeps": {}}, machine_description(gpus))
    specs = {s.name: s for s in presets(mode, cores, gpus)}
    warm = os.path.join(settings.out_dir, "warm")
    meta["warm_up_s"] = warm_up(settings.launch(), warm,
                                (["cpu"] if settings.cpu else []) + (["gpu"] if settings.gpu and gpus else []))
    shutil.rmtree(warm, ignore_errors=True)
    progress(f"warm-up (Numba compiles, cached for the runs that follow): {meta['warm_up_s']:.1f} s")
    results = {}
    for name in sweeps:
        t0 = time.perf_counter()
        results[name] = run_sweep(specs[name], settings, gpus, cores, progress)
        meta["sweeps"][name] = {**asdict(specs[name]), "seconds": time.perf_counter() - t0}
        # after every sweep, so a run stopped by a time limit keeps what it finished
        write_result(os.path.join(settings.out_dir, "meta.json"), meta)
    if not settings.keep_data and settings.data_dir is None:
        shutil.rmtree(os.path.join(settings.out_dir, "data"), ignore_errors=True)
    shutil.rmtree(os.path.join(settings.out_dir, "runs"), ignore_errors=True)
    return {**meta, "rows": results}
