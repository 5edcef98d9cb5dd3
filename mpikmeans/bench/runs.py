"""``mpikmeans bench runs``: whole runs as a user types them, phase by phase, beside scikit-learn.

Every measurement is one process, the command a user types::

    mpikmeans run DATA.npy -k K --init INIT --seed S --backend B --dtype D -o OUT --overwrite -q

(under ``mpirun -np P`` with ``np``), on data made once by ``mpikmeans gen-data``
and ``mpikmeans convert`` (:func:`mpikmeans.bench.data.gen_npy`).  Nothing of
the tool is imported to time it: each row comes from the run's ``summary.json``
(``timings``: start-up, read, set-up and its parts, init, compute, write,
total, per iteration; ``history``: each iteration's seconds and changed
labels) and the wall time of the whole command.

The matrix (:func:`run_matrix`) crosses shapes (:data:`SHAPES`, the
specification's example first), initialisations, data types, backends and two
states of the kernel caches:

``empty``
    ``MPIKMEANS_CACHE_DIR`` points at a new, empty directory for this run
    alone (removed afterwards): what the first run on a fresh machine pays.
``warm``
    Every run shares one cache (``cache_dir``, default the one ``mpikmeans``
    uses), prepared by one ``mpikmeans warmup`` (timed) before the first run:
    what a run pays after the machine's set-up.

Compile seconds come from ``summary.json`` where the run reports them
(``timings.compile_s`` or ``compile_s``); otherwise, for a run on an empty
cache, its set-up minus the set-up of the same run on the warm cache.
scikit-learn runs in its own process on the same ``.npy`` with every core:
``KMeans(n_clusters=K).fit(X)`` (its defaults) for each shape, and for
``--init sample`` also ``KMeans(init=X[rows], n_init=1, algorithm="lloyd",
tol=0)`` from the rows the tool's ``sample`` draws
(:func:`mpikmeans.init.sample_indices`), so both run Lloyd from one start.

The K sweep (:func:`run_sweep`): the whole range in one job (``mpikmeans run
DATA.npy -k K0:K1``: read and set up once), then one run per K, on the
specification's example from the ``.npy``, the tool's defaults otherwise, warm caches; scikit-learn's
default fit is timed at a few K and its total over the sweep interpolated
linearly in K between them (the result says at which K it was measured).
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import tempfile
import time
from dataclasses import asdict, dataclass, field

import numpy as np

from ..errors import RunError, UsageError
from ..init import sample_indices
from .data import gen_npy
from .harness import Launch, Progress, count_gpus, machine_description, quiet, result_document, write_result
from .tables import seconds, milliseconds

#: The issue's shapes, (rows, attributes, K), by name: A is the specification's example (appendix 3).
SHAPES = {"A": (5_000_000, 100, 50), "B": (10_000_000, 32, 1000), "C": (100_000_000, 8, 16),
          "D": (300_000, 257, 1000), "E": (2_000_000, 3, 7)}
#: The phases of ``summary.json``'s ``timings``, in the order a run goes through them (``launch_s``:
#: imports and MPI's start before the run, not in ``total_s``).
PHASES = ("launch_s", "startup_s", "read_s", "setup_s", "init_s", "compute_s", "scores_s", "write_s", "total_s",
          "per_iteration_s")
CACHES = ("empty", "warm")
#: ``--quick``: the scale, and the shapes and caches unless given
QUICK = {"scale": 0.001, "shapes": ("A", "E"), "caches": ("warm",)}

_SKLEARN = r"""
import json, sys, time
t0 = time.perf_counter()
import numpy as np
import sklearn
from sklearn.cluster import KMeans
t1 = time.perf_counter()
x = np.load(sys.argv[1])
t2 = time.perf_counter()
k = int(sys.argv[2])
if len(sys.argv) > 3:
    km = KMeans(n_clusters=k, init=x[np.load(sys.argv[3])], n_init=1, algorithm="lloyd", tol=0.0)
else:
    km = KMeans(n_clusters=k)
t3 = time.perf_counter()
km.fit(x)
t4 = time.perf_counter()
print(json.dumps({"import_s": t1 - t0, "load_s": t2 - t1, "fit_s": t4 - t3, "iterations": int(km.n_iter_),
                  "inertia": float(km.inertia_), "sklearn": sklearn.__version__}))
"""


@dataclass
class RunsSettings:
    """What ``bench runs`` runs (the command's options)."""

    shapes: tuple = tuple(SHAPES)
    scale: float = 1.0
    inits: tuple = ("k-means++", "sample")
    dtypes: tuple = ("float64", "float32")
    backends: tuple = ()  # (): the GPU where there is one, and the CPU
    caches: tuple = CACHES
    np: int = 0  # 0: each run alone, as `mpikmeans run`; P: under `mpirun -np P`
    seed: int = 1
    data_dir: str | None = None
    keep_arff: bool = False
    cache_dir: str | None = None
    warmup: bool = True
    warmup_args: tuple = ()
    sklearn: bool = True
    run_args: tuple = ()
    sweep: tuple | None = None  # (K0, K1)
    sweep_sklearn: int = 5
    sweep_separate: bool = True  # the sweep's one run per K besides its one job
    launcher: list = field(default_factory=list)
    timeout_s: float = 3600.0

    def launch(self) -> Launch:
        """How these settings start the tool."""
        return Launch(list(self.launcher), self.timeout_s)


# -- shapes and data -------------------------------------------------------------------------


def parse_shape(text: str) -> tuple:
    """A shape name of :data:`SHAPES` or ``NxMxK``: (name, rows, attributes, K)."""
    text = text.strip()
    if text.upper() in SHAPES:
        return (text.upper(), *SHAPES[text.upper()])
    try:
        n, m, k = (int(float(v)) for v in text.lower().split("x"))
    except ValueError:
        raise UsageError(f"shape {text!r}: give one of {', '.join(SHAPES)} or ROWSxATTRSxK (as 200000x16x8)") from None
    if min(n, m, k) < 1 or k > n:
        raise UsageError(f"shape {text!r}: rows, attributes and K at least 1, and K at most the rows")
    return (text, n, m, k)


def scaled_rows(n: int, k: int, scale: float) -> int:
    """``n * scale`` rows, but at least 4 K and 100 (a scaled shape keeps rows enough for its K)."""
    return max(int(round(n * scale)), 4 * k, 100)


def data_path(data_dir: str, n: int, m: int, blobs: int, seed: int) -> str:
    """The ``.npy`` of ``gen-data -n N -m M -k BLOBS --seed SEED`` in ``data_dir`` (its name holds them)."""
    return os.path.join(data_dir, f"gen_n{n}_m{m}_k{blobs}_s{seed}.npy")


def default_data_dir() -> str:
    """Where the inputs stay between calls: ``<temp>/mpikmeans-bench-data``."""
    return os.path.join(tempfile.gettempdir(), "mpikmeans-bench-data")


def _gen_ranks(launch: Launch) -> int:
    # gen-data and convert write in parallel under the launcher where there is one
    return min(os.cpu_count() or 1, 16) if launch.has_launcher() else 0


# -- one run ---------------------------------------------------------------------------------


def reported_compile(summary: dict) -> float | None:
    """The compile seconds a run reports in ``summary.json`` (``timings.compile_s``, else ``compile_s``), or None."""
    for value in ((summary.get("timings") or {}).get("compile_s"), summary.get("compile_s")):
        if isinstance(value, (int, float)):
            return float(value)
    return None


def iteration_figures(history: list) -> dict:
    """The median and the slowest iteration of a run's ``history``, and where the slowest was.

    Parameters
    ----------
    history : list of dict
        ``summary.json``'s ``history``: per iteration ``iteration`` (1-based),
        ``seconds``, ``changed``.

    Returns
    -------
    dict
        ``iteration_median_s``, ``iteration_slowest_s``, ``iteration_slowest``
        (its 1-based number), ``iteration_slowest_changed`` (labels it changed),
        ``iteration_slowest_relocated`` (empty clusters it moved), ``slowest_over_median``; all None for
        an empty history.
    """
    timed = [h for h in history if isinstance(h.get("seconds"), (int, float))]
    if not timed:
        return dict.fromkeys(("iteration_median_s", "iteration_slowest_s", "iteration_slowest",
                              "iteration_slowest_changed", "iteration_slowest_relocated", "slowest_over_median"))
    median = statistics.median(h["seconds"] for h in timed)
    slow = max(timed, key=lambda h: h["seconds"])
    return {"iteration_median_s": median, "iteration_slowest_s": slow["seconds"],
            "iteration_slowest": slow.get("iteration"), "iteration_slowest_changed": slow.get("changed"),
            "iteration_slowest_relocated": slow.get("relocated", 0),
            "slowest_over_median": slow["seconds"] / median if median > 0 else None}


def run_figures(summary: dict, wall_s: float) -> dict:
    """One row's figures from a run's ``summary.json`` and the wall time of its command.

    Returns
    -------
    dict
        ``wall_s``, ``timings`` (every phase of :data:`PHASES`, None where the
        run has none), ``setup_parts``, ``compile_reported_s``,
        ``background_compile_s`` (the seconds of a cold run's helper compiles,
        summed), ``iterations``, ``converged``, ``stop_reason``, ``inertia``,
        ``backend``, ``dtype``, ``devices``, ``threads_per_rank``, ``ranks``,
        and :func:`iteration_figures`.
    """
    timings = summary.get("timings") or {}
    background = summary.get("background_compile_s") or {}
    return {"wall_s": wall_s, "timings": {p: timings.get(p) for p in PHASES},
            "setup_parts": timings.get("setup_parts") or {}, "compile_reported_s": reported_compile(summary),
            "background_compile_s": float(sum(background.values())) if isinstance(background, dict) else None,
            **{key: summary.get(key) for key in ("iterations", "converged", "stop_reason", "inertia", "backend",
                                                 "dtype", "devices", "threads_per_rank", "ranks")},
            **iteration_figures(summary.get("history") or [])}


def run_command_args(npy: str, k: int, init: str | None, dtype: str | None, backend: str | None, seed: int | None,
                     out: str, run_args: tuple = ()) -> list:
    """The arguments of ``mpikmeans run`` for one measurement (None: the tool's default, not passed)."""
    args = ["run", npy, "-k", k]
    for flag, value in (("--init", init), ("--seed", seed), ("--backend", backend), ("--dtype", dtype)):
        if value is not None:
            args += [flag, value]
    return args + ["-o", out, "--overwrite", "-q", *run_args]


def measure_run(launch: Launch, ranks: int, args: list, out: str) -> dict:
    """Run ``mpikmeans ARGS`` once; :func:`run_figures` of it, or ``{"error": ...}`` where it failed."""
    try:
        ran = launch.tool(ranks, *args)
        with open(os.path.join(out, "summary.json")) as f:
            summary = json.load(f)
    except (RunError, OSError, ValueError) as exc:
        return {"error": str(getattr(exc, "message", None) or exc)}
    return run_figures(summary, ran.wall_s)


def measure_one_job(launch: Launch, ranks: int, args: list, out: str, ks: list) -> dict:
    """Run a K sweep in one job (``mpikmeans run DATA -k K0:K1``) once: its wall time and each K's phases.

    Returns
    -------
    dict
        ``wall_s`` (the whole command), ``first`` (the first K's :func:`run_figures`: the job's start-up,
        read and set-up are in its timings), ``per_k`` (K -> ``iterations`` and the phases of
        :data:`PHASES` that are a K's own: ``init_s``, ``compute_s``, ``scores_s``, ``write_s``,
        ``total_s``), ``phase_sums`` (those phases summed over the K); or ``{"error": ...}``.
    """
    try:
        ran = launch.tool(ranks, *args)
        summaries = {}
        for k in ks:
            with open(os.path.join(out, f"k{k}", "summary.json")) as f:
                summaries[k] = json.load(f)
    except (RunError, OSError, ValueError) as exc:
        return {"error": str(getattr(exc, "message", None) or exc)}
    own = ("init_s", "compute_s", "scores_s", "write_s", "total_s")
    per_k = {str(k): {"iterations": sm.get("iterations"),
                      **{p: (sm.get("timings") or {}).get(p) for p in own}} for k, sm in summaries.items()}
    sums = {p: float(sum(v[p] or 0.0 for v in per_k.values())) for p in own}
    return {"wall_s": ran.wall_s, "first": run_figures(summaries[ks[0]], ran.wall_s), "per_k": per_k,
            "phase_sums": sums}


def typed_command(ranks: int, args: list) -> str:
    """The command line as a user types it (``mpirun -np P mpikmeans ...`` or ``mpikmeans ...``)."""
    return ("" if not ranks else f"mpirun -np {ranks} ") + "mpikmeans " + " ".join(str(a) for a in args)


# -- scikit-learn ---------------------------------------------------------------------------


def sklearn_fit(launch: Launch, npy: str, k: int, init_rows: str | None = None) -> dict:
    """scikit-learn's fit on the ``.npy`` in its own process with every core; its figures or ``{"error": ...}``.

    Parameters
    ----------
    init_rows : str, optional
        A ``.npy`` of K row indices: ``KMeans(init=X[rows], n_init=1,
        algorithm="lloyd", tol=0)``; without it ``KMeans(n_clusters=K)``.

    Returns
    -------
    dict
        ``fit_s``, ``import_s``, ``load_s``, ``iterations``, ``inertia``,
        ``sklearn`` (its version), ``threads``, ``wall_s`` (the process).
    """
    cores = str(os.cpu_count() or 1)
    env = {v: cores for v in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")}
    try:
        ran = launch.with_env(**env).python("-c", _SKLEARN, npy, k, *([init_rows] if init_rows else []))
        return {**json.loads(ran.stdout.strip().splitlines()[-1]), "threads": int(cores), "wall_s": ran.wall_s}
    except (RunError, ValueError, IndexError) as exc:
        return {"error": str(getattr(exc, "message", None) or exc).splitlines()[-1]}


# -- caches ----------------------------------------------------------------------------------


def _cache_env(directory: str | None) -> dict:
    # a NUMBA_CACHE_DIR of this environment would keep Numba's kernels elsewhere than the cache asked for
    return {} if directory is None else {"MPIKMEANS_CACHE_DIR": directory, "NUMBA_CACHE_DIR": None}


def _files_under(directory: str | None) -> int | None:
    if directory is None or not os.path.isdir(directory):
        return None if directory is None else 0
    return sum(len(files) for _, _, files in os.walk(directory))


def warm_cache(s: RunsSettings, launch: Launch, progress: Progress) -> dict:
    """``mpikmeans warmup [WARMUP_ARGS]`` once on the warm runs' cache; its seconds (or why it did not run,
    or its ``error``: the runs go on, and the result counts it among its errors)."""
    before = _files_under(s.cache_dir)
    if not s.warmup:
        return {"ran": False, "cache_dir": s.cache_dir, "cache_files_before": before}
    args = ["warmup", *s.warmup_args]
    try:
        ran = launch.with_env(**_cache_env(s.cache_dir)).tool(s.np, *args)
    except RunError as exc:
        # the runs still measure what a user meets on that cache: they compile what they need
        progress(f"warm-up FAILED: {exc.message.splitlines()[-1]}")
        return {"ran": False, "command": typed_command(s.np, args), "error": exc.message, "cache_dir": s.cache_dir,
                "cache_files_before": before}
    progress(f"warm-up: {typed_command(s.np, args)}: {ran.wall_s:.1f} s"
             + (f" (cache {s.cache_dir} held {before} files before)" if s.cache_dir else ""))
    return {"ran": True, "command": typed_command(s.np, args), "seconds": ran.wall_s, "cache_dir": s.cache_dir,
            "cache_files_before": before}


def fill_compile(rows: list) -> None:
    """Set each row's ``compile_s`` and ``compile_source`` (see the module's notes), in place."""
    def cell(r):
        return (r["shape"], r["backend_asked"], r["dtype_asked"], r["init"])

    warm = {cell(r): r for r in rows if r["cache"] == "warm" and "error" not in r}
    for r in rows:
        if "error" in r:
            continue
        if r["compile_reported_s"] is not None:
            r["compile_s"], r["compile_source"] = r["compile_reported_s"], "summary.json"
        elif r["cache"] == "empty" and cell(r) in warm and r["timings"]["setup_s"] is not None \
                and warm[cell(r)]["timings"]["setup_s"] is not None:
            r["compile_s"] = max(0.0, r["timings"]["setup_s"] - warm[cell(r)]["timings"]["setup_s"])
            r["compile_source"] = "set-up on the empty cache minus on the warm one"
        else:
            r["compile_s"], r["compile_source"] = None, "not reported"


# -- the matrix ------------------------------------------------------------------------------


def resolve_backends(asked: tuple, gpus: int) -> tuple:
    """The backends to measure: ``asked``, or the GPU (where there is one) and the CPU.

    Raises
    ------
    UsageError
        The GPU is asked for where none is usable.
    """
    if not asked:
        return ("gpu", "cpu") if gpus else ("cpu",)
    if "gpu" in asked and not gpus:
        raise UsageError("bench runs: --backends gpu, but nvidia-smi lists no GPU here")
    return tuple(asked)


def check_settings(s: RunsSettings) -> None:
    """Raise :class:`UsageError` for settings that cannot run."""
    if not s.scale > 0:
        raise UsageError(f"bench runs: --scale {s.scale}: give a factor above 0")
    if s.np < 0:
        raise UsageError("bench runs: --np must be 0 (no launcher) or a rank count")
    bad = [c for c in s.caches if c not in CACHES]
    if bad or not s.caches:
        raise UsageError(f"bench runs: --caches {','.join(s.caches)}: choose among {', '.join(CACHES)}")
    if not (s.shapes and s.inits and s.dtypes):
        raise UsageError("bench runs: give at least one shape, init and dtype")
    for text in s.shapes:
        parse_shape(text)
    if s.sweep is not None:
        k0, k1 = s.sweep
        if not 1 <= k0 <= k1:
            raise UsageError(f"bench runs: --sweep {k0}:{k1}: give K0:K1 with 1 <= K0 <= K1")
        if s.sweep_sklearn < 0:
            raise UsageError("bench runs: --sweep-sklearn must be 0 or more")


def _prepare(s: RunsSettings, launch: Launch, name: str, n: int, m: int, k: int, progress: Progress) -> dict:
    data_dir = s.data_dir or default_data_dir()
    npy = data_path(data_dir, n, m, k, s.seed)
    t0 = time.perf_counter()
    made = gen_npy(launch, _gen_ranks(launch), npy, n, m, k, s.seed, s.keep_arff)
    if made["reused"]:
        progress(f"{name}: {n:,} x {m}, {k} blobs: {npy} (reused)")
    else:
        progress(f"{name}: {n:,} x {m}, {k} blobs: gen-data and convert to {npy}: {time.perf_counter() - t0:.1f} s")
    return {"name": name, "n": n, "m": m, "k": k, "data": npy, **made}


def run_matrix(s: RunsSettings, command: str = "", out: str | None = None, progress: Progress = quiet) -> dict:
    """Every run of the matrix; the result document (also written to ``out`` after every run).

    Parameters
    ----------
    s : RunsSettings
    command : str
        The command line, kept in the result.
    out : str, optional
        The result file, rewritten after every run so that a call stopped by a
        time limit keeps what it finished.
    progress : callable
        Receives one line per run.

    Returns
    -------
    dict
        The common result format (:func:`mpikmeans.bench.harness.result_document`)
        with ``shapes`` (per shape: sizes, data, its generation, scikit-learn's
        fits), ``warmup``, ``rows`` (one per run: its settings, ``command``,
        :func:`run_figures`, ``compile_s``; or ``error``) and ``errors`` (count).
    """
    check_settings(s)
    gpus = count_gpus()
    backends = resolve_backends(s.backends, gpus)
    launch = s.launch()
    doc = result_document("runs", command, {**asdict(s), "backends": list(backends)},
                          {"shapes": {}, "warmup": None, "rows": [], "errors": 0}, machine_description(gpus))
    work = tempfile.mkdtemp(prefix="mpikmeans-bench-runs-")

    def save():
        fill_compile(doc["rows"])
        doc["errors"] = sum("error" in r for r in doc["rows"]) + ("error" in (doc["warmup"] or {}))
        if out:
            write_result(out, doc)

    try:
        if "warm" in s.caches:
            doc["warmup"] = warm_cache(s, launch, progress)
        for text in s.shapes:
            name, n, m, k = parse_shape(text)
            n = scaled_rows(n, k, s.scale)
            shape = _prepare(s, launch, name, n, m, k, progress)
            doc["shapes"][name] = shape
            if s.sklearn:
                shape["sklearn"] = {"default": sklearn_fit(launch, shape["data"], k)}
                if "sample" in s.inits:
                    rows = os.path.join(work, f"sample_{name}.npy")
                    np.save(rows, sample_indices(k, n, s.seed))
                    shape["sklearn"]["same_init_sample"] = sklearn_fit(launch, shape["data"], k, rows)
                for what, fit in shape["sklearn"].items():
                    progress(f"{name}: scikit-learn {what}: " + (fit["error"] if "error" in fit else
                             f"fit {fit['fit_s']:.2f} s, {fit['iterations']} iterations"))
            for backend in backends:
                # the CPU backend computes in float64 whatever --dtype says: one dtype for it
                for dtype in (("float64",) if backend == "cpu" else s.dtypes):
                    for init in s.inits:
                        for cache in s.caches:
                            run_out = os.path.join(work, "out")
                            args = run_command_args(shape["data"], k, init, dtype, backend, s.seed, run_out,
                                                    s.run_args)
                            cache_dir = os.path.join(work, "cache-empty") if cache == "empty" else s.cache_dir
                            if cache == "empty":
                                shutil.rmtree(cache_dir, ignore_errors=True)
                            env = _cache_env(cache_dir)
                            row = {"shape": name, "n": n, "m": m, "k": k, "backend_asked": backend,
                                   "dtype_asked": dtype, "init": init, "cache": cache, "seed": s.seed,
                                   "command": typed_command(s.np, args),
                                   **measure_run(launch.with_env(**env), s.np, args, run_out)}
                            if cache == "empty":
                                shutil.rmtree(cache_dir, ignore_errors=True)
                            _compare_sklearn(row, shape.get("sklearn") or {})
                            doc["rows"].append(row)
                            save()
                            progress(_progress_line(row))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    save()
    return doc


def _compare_sklearn(row: dict, fits: dict) -> None:
    # from the same rows, float64 and converged alike, the two SSEs must agree to rounding
    same = fits.get("same_init_sample") or {}
    if row["init"] == "sample" and "error" not in row and "inertia" in same and row.get("inertia"):
        row["inertia_rel_diff_sklearn_same_init"] = abs(row["inertia"] - same["inertia"]) / abs(same["inertia"])
        row["iterations_sklearn_same_init"] = same["iterations"]


def _progress_line(r: dict) -> str:
    head = f"{r['shape']} {r['backend_asked']} {r['dtype_asked']} {r['init']} {r['cache']}: "
    if "error" in r:
        return head + "FAILED: " + r["error"].splitlines()[0]
    t = r["timings"]
    return (head + f"whole command {r['wall_s']:.2f} s, total {seconds(t['total_s'])} (setup "
            f"{seconds(t['setup_s'])}, init {seconds(t['init_s'])}, compute {seconds(t['compute_s'])} in "
            f"{r['iterations']} iterations), slowest iteration {milliseconds(r['iteration_slowest_s'])} ms "
            f"(#{r['iteration_slowest']}), median {milliseconds(r['iteration_median_s'])} ms")


# -- the K sweep -----------------------------------------------------------------------------


def sweep_points(ks: list, count: int) -> list:
    """``count`` K values spread evenly over ``ks`` (its ends included; all of them when ``count`` >= their number)."""
    if count <= 0:
        return []
    if count >= len(ks):
        return list(ks)
    picks = np.unique(np.round(np.linspace(0, len(ks) - 1, count)).astype(int))
    return [ks[i] for i in picks]


def sklearn_sweep_estimate(ks: list, fits: dict) -> dict:
    """scikit-learn's total over the sweep from fits at some K: measured where there, linear in K between.

    Parameters
    ----------
    ks : list of int
        Every K of the sweep.
    fits : dict
        K -> :func:`sklearn_fit`'s figures (entries with ``error`` are left out).

    Returns
    -------
    dict
        ``measured_k``, ``total_fit_s`` (None without a fit), ``extrapolated``
        (bool: some K not measured), ``how`` (a sentence saying so).
    """
    good = {k: f["fit_s"] for k, f in fits.items() if "fit_s" in f}
    if not good:
        return {"measured_k": [], "total_fit_s": None, "extrapolated": False, "how": "scikit-learn not measured"}
    xs = sorted(good)
    total = float(np.interp(ks, xs, [good[k] for k in xs]).sum())
    missing = [k for k in ks if k not in good]
    how = (f"measured at every K ({len(xs)} fits)" if not missing else
           f"estimated from {len(xs)} fits, at K = {', '.join(map(str, xs))}; the other {len(missing)} K "
           "interpolated linearly in K between them (held at the nearest fit outside them)")
    return {"measured_k": xs, "total_fit_s": total, "extrapolated": bool(missing), "how": how}


def run_sweep(s: RunsSettings, command: str = "", out: str | None = None, progress: Progress = quiet) -> dict:
    """One ``mpikmeans run`` per K of ``s.sweep`` on the specification's example (scaled); the result document.

    Each run is ``mpikmeans run DATA.npy -k K`` with the first of ``s.backends``
    (the GPU where there is one) and of ``s.dtypes``, the tool's defaults
    otherwise, on the warm cache after one ``mpikmeans warmup``.

    Returns
    -------
    dict
        The common result format with ``shape``, ``warmup``, ``rows`` (per K:
        ``k``, ``command``, :func:`run_figures`; or ``error``),
        ``total_wall_s`` and ``total_run_s`` (the runs' whole commands and
        their ``total_s``, summed), ``one_job`` (:func:`measure_one_job`), ``sklearn`` (``fits`` by K and
        :func:`sklearn_sweep_estimate`), ``errors``.
    """
    check_settings(s)
    gpus = count_gpus()
    backend = resolve_backends(s.backends, gpus)[0]
    dtype = s.dtypes[0]
    launch = s.launch()
    k0, k1 = s.sweep
    n, m, blobs = SHAPES["A"]
    n = scaled_rows(n, k1, s.scale)
    doc = result_document("runs-sweep", command, {**asdict(s), "backends": [backend]},
                          {"shape": None, "warmup": None, "rows": [], "errors": 0}, machine_description(gpus))
    work = tempfile.mkdtemp(prefix="mpikmeans-bench-sweep-")
    ks = list(range(k0, k1 + 1))

    def save():
        done = [r for r in doc["rows"] if "error" not in r]
        doc["errors"] = (len(doc["rows"]) - len(done) + ("error" in (doc["warmup"] or {}))
                         + ("error" in doc.get("one_job", {})))
        doc["total_wall_s"] = sum(r["wall_s"] for r in done)
        doc["total_run_s"] = sum(r["timings"]["total_s"] or 0.0 for r in done)
        if out:
            write_result(out, doc)

    try:
        doc["warmup"] = warm_cache(s, launch, progress)
        doc["shape"] = _prepare(s, launch, "A", n, m, blobs, progress)
        env = _cache_env(s.cache_dir)
        run_out = os.path.join(work, "sweep")
        args = run_command_args(doc["shape"]["data"], f"{k0}:{k1}", None, dtype, backend, None, run_out, s.run_args)
        doc["one_job"] = {"command": typed_command(s.np, args),
                          **measure_one_job(launch.with_env(**env), s.np, args, run_out, ks)}
        save()
        progress(f"K = {k0}..{k1} in one job: " + (f"FAILED: {doc['one_job']['error'].splitlines()[0]}"
                                                   if "error" in doc["one_job"] else
                                                   f"whole command {doc['one_job']['wall_s']:.2f} s"))
        for k in ks if s.sweep_separate else ():
            run_out = os.path.join(work, "out")
            args = run_command_args(doc["shape"]["data"], k, None, dtype, backend, None, run_out, s.run_args)
            row = {"k": k, "command": typed_command(s.np, args),
                   **measure_run(launch.with_env(**env), s.np, args, run_out)}
            row["compile_s"] = row.get("compile_reported_s")
            doc["rows"].append(row)
            save()
            progress(f"K = {k}: " + (f"FAILED: {row['error'].splitlines()[0]}" if "error" in row else
                     f"whole command {row['wall_s']:.2f} s (total {seconds(row['timings']['total_s'])}, setup "
                     f"{seconds(row['timings']['setup_s'])}, scores {seconds(row['timings']['scores_s'])}), "
                     f"{row['iterations']} iterations"))
        fits = {}
        if s.sklearn:
            for k in sweep_points(ks, s.sweep_sklearn):
                fits[k] = sklearn_fit(launch, doc["shape"]["data"], k)
                progress(f"K = {k}: scikit-learn KMeans({k}).fit: " + (fits[k]["error"] if "error" in fits[k]
                                                                       else f"{fits[k]['fit_s']:.2f} s"))
        doc["sklearn"] = {"fits": {str(k): f for k, f in fits.items()}, **sklearn_sweep_estimate(ks, fits)}
    finally:
        shutil.rmtree(work, ignore_errors=True)
    save()
    return doc
