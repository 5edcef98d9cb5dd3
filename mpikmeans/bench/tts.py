"""Time to solution: what a user waits for between starting a job and its result files.

The specification's example (appendix 3: N = 5·10^6, M = 100, K = 50) by default,
through the real command with all defaults, as a user runs it:

1. ``gen-data`` writes the input (timed, not counted);
2. a **cold** run: an empty kernel cache (``MPIKMEANS_CACHE_DIR`` pointing at a new
   directory), so every CPU and GPU kernel is compiled (with ``cold=False`` it
   still runs, untimed, to fill the cache);
3. **warm** runs from the ARFF, the same cache (the median of ``repeats``);
4. ``convert`` to ``.npy``, then warm runs from the ``.npy``;
5. scikit-learn's default ``KMeans(K).fit(X)`` on the same cores, in its own
   process (``np.load`` timed apart).

Each run's phases come from its ``summary.json`` (start-up, read, backend set-up,
init, compute, write, total) beside the wall time of the whole command (process
start, MPI and imports included).  The cold run's centres must equal the warm
runs' bit for bit: a cache changes how long a run takes, never its answer.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from dataclasses import asdict, dataclass

from ..errors import RunError, UsageError
from .data import gen_arff
from .harness import Launch, Progress, quiet, stats

#: The phases of ``summary.json``'s ``timings``, in the order a run goes through them
#: (``launch_s``, the process's imports and MPI's start before the run, is not in ``total_s``).
PHASES = ("launch_s", "startup_s", "read_s", "setup_s", "init_s", "compute_s", "write_s", "total_s")


@dataclass
class TtsSettings:
    """What ``bench tts`` runs."""

    rows: int = 5_000_000
    attrs: int = 100
    k: int = 50
    ranks: int = 1
    repeats: int = 2
    gen_ranks: int = 0  # 0: as many as cores
    data_dir: str | None = None
    run_args: tuple = ()
    sklearn: bool = True
    cold: bool = True


def _run(launch: Launch, ranks: int, data: str, k: int, out: str, run_args: tuple) -> dict:
    ran = launch.mpi(ranks, "run", data, "-k", k, "-o", out, "--overwrite", "-q", *run_args)
    with open(os.path.join(out, "summary.json")) as f:
        summary = json.load(f)
    with open(os.path.join(out, "centers.csv"), "rb") as f:
        centres = f.read()
    return {"wall_s": ran.wall_s, "timings": {p: summary["timings"].get(p, float("nan")) for p in PHASES},
            "setup_parts": summary["timings"].get("setup_parts"),
            "iterations": summary["iterations"], "inertia": summary["inertia"], "backend": summary["backend"],
            "devices": summary["devices"], "dtype": summary["dtype"], "init": summary["init"],
            "bytes_read": summary["bytes_read"], "centres": centres,
            "background_compile_s": summary.get("background_compile_s") or {}}


def _median_run(runs: list) -> dict:
    """The phase medians and wall-time median of repeated runs (the rest from the first)."""
    out = {k: v for k, v in runs[0].items() if k != "centres"}
    out["timings"] = {p: stats([r["timings"][p] for r in runs])["median"] for p in PHASES}
    out["wall_s"] = stats([r["wall_s"] for r in runs])["median"]
    out["runs"] = [{"wall_s": r["wall_s"], "timings": r["timings"], "setup_parts": r["setup_parts"]} for r in runs]
    return out


_SKLEARN = r"""
import json, os, sys, time
import numpy as np
t0 = time.perf_counter()
from sklearn.cluster import KMeans
import sklearn
t1 = time.perf_counter()
x = np.load(sys.argv[1])
t2 = time.perf_counter()
km = KMeans(n_clusters=int(sys.argv[2])).fit(x)
t3 = time.perf_counter()
print(json.dumps({"import_s": t1 - t0, "load_s": t2 - t1, "fit_s": t3 - t2, "iterations": int(km.n_iter_),
                  "inertia": float(km.inertia_), "sklearn": sklearn.__version__,
                  "threads": os.environ.get("OMP_NUM_THREADS")}))
"""


def time_to_solution(settings: TtsSettings, launch: Launch, progress: Progress = quiet) -> dict:
    """Generate the input, then time the cold run, warm runs, the ``.npy`` path and scikit-learn.

    Returns
    -------
    dict
        ``gen``, ``cold``, ``warm``, ``convert``, ``npy``, ``sklearn`` (each a dict of
        figures), ``same_centres_cold_warm`` (bool), ``files`` (sizes, bytes).
    """
    s = settings
    if min(s.rows, s.attrs, s.k, s.ranks, s.repeats) < 1 or s.k > s.rows:
        raise UsageError("bench tts: rows, attrs, k, ranks and repeats must be at least 1, and k at most rows")
    cores = os.cpu_count() or 1
    base = s.data_dir or ("/dev/shm" if os.path.isdir("/dev/shm") else tempfile.gettempdir())
    work = tempfile.mkdtemp(prefix="mpikmeans-tts-", dir=base)
    cache = os.path.join(work, "cache")
    arff = os.path.join(work, "spec.arff")
    npy = os.path.join(work, "spec.npy")
    out = os.path.join(work, "out")
    result = {"settings": asdict(s)}
    try:
        gen = gen_arff(launch, s.gen_ranks or cores, arff, s.rows, s.attrs, s.k)
        result["gen"] = gen
        result["files"] = {"arff_bytes": os.path.getsize(arff)}
        progress(f"gen-data: {gen['bytes'] / 1e6:.0f} MB in {gen['write_s']:.2f} s on {gen['ranks']} ranks")
        run = launch.with_env(MPIKMEANS_CACHE_DIR=cache)
        cold = _run(run, s.ranks, arff, s.k, out, s.run_args)  # fills the empty caches
        if s.cold:
            result["cold"] = {k: v for k, v in cold.items() if k != "centres"}
            progress(_line("cold (empty caches)", cold))
            helpers = sorted(cold["background_compile_s"].items(), key=lambda kv: -kv[1])
            progress("  its compiling helpers, s: " + (", ".join(f"{p} {t:.1f}" for p, t in helpers) or "none"))
        warm = [_run(run, s.ranks, arff, s.k, out, s.run_args) for _ in range(s.repeats)]
        result["warm"] = _median_run(warm)
        progress(_line("warm, ARFF", result["warm"]))
        result["same_centres_cold_warm"] = all(r["centres"] == cold["centres"] for r in warm)
        conv = run.mpi(s.ranks, "convert", arff, npy, "--report", npy + ".report.json", "-q")
        with open(npy + ".report.json") as f:
            result["convert"] = {**json.load(f), "wall_s": conv.wall_s}
        result["files"]["npy_bytes"] = os.path.getsize(npy)
        progress(f"convert: {result['convert']['convert_s']:.2f} s (the ARFF read alone: "
                 f"{result['warm']['timings']['read_s']:.2f} s)")
        npy_runs = [_run(run, s.ranks, npy, s.k, out, s.run_args) for _ in range(s.repeats)]
        result["npy"] = _median_run(npy_runs)
        result["same_centres_npy"] = npy_runs[0]["centres"] == warm[0]["centres"]
        progress(_line("warm, .npy", result["npy"]))
        if s.sklearn:
            env = {v: str(cores) for v in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")}
            ran = launch.with_env(**env).python("-c", _SKLEARN, npy, s.k)
            sk = json.loads(ran.stdout.strip().splitlines()[-1])
            sk["wall_s"] = ran.wall_s
            result["sklearn"] = sk
            progress(f"scikit-learn KMeans({s.k}).fit on {cores} cores: fit {sk['fit_s']:.2f} s "
                     f"({sk['iterations']} iterations), np.load {sk['load_s']:.2f} s, whole process {ran.wall_s:.2f} s")
    except (OSError, ValueError) as exc:
        raise RunError(f"bench tts: {exc}") from None
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return result


def _line(label: str, r: dict) -> str:
    t = r["timings"]
    parts = r.get("setup_parts") or {}
    setup = ", ".join(f"{k[:-2]} {v:.2f}" for k, v in parts.items())
    return (f"{label}: total {t['total_s']:.2f} s (after a launch of {t['launch_s']:.2f}: start-up "
            f"{t['startup_s']:.2f}, read {t['read_s']:.2f}, "
            f"set-up {t['setup_s']:.2f} [{setup}], init {t['init_s']:.2f}, compute {t['compute_s']:.2f} in "
            f"{r['iterations']} iterations, write {t['write_s']:.2f}); whole command {r['wall_s']:.2f} s")


def tts_table(doc: dict) -> list:
    """The phases of every run side by side, and scikit-learn's fit, as lines of text."""
    cols = [(name, doc[key]) for name, key in (("cold ARFF", "cold"), ("warm ARFF", "warm"), ("warm .npy", "npy"))
            if key in doc]
    lines = [f"{'phase, s':<22}" + "".join(f"{name:>12}" for name, _ in cols)]
    for p in PHASES:
        lines.append(f"{p[:-2]:<22}" + "".join(f"{r['timings'][p]:>12.3f}" for _, r in cols))
    lines.append(f"{'whole command':<22}" + "".join(f"{r['wall_s']:>12.3f}" for _, r in cols))
    lines.append(f"{'iterations':<22}" + "".join(f"{r['iterations']:>12d}" for _, r in cols))
    if "convert" in doc:
        lines.append(f"convert: {doc['convert']['convert_s']:.3f} s; reading the ARFF: "
                     f"{doc['warm']['timings']['read_s']:.3f} s, the .npy: {doc['npy']['timings']['read_s']:.3f} s")
    if "sklearn" in doc:
        sk = doc["sklearn"]
        lines.append(f"scikit-learn KMeans({doc['settings']['k']}).fit: {sk['fit_s']:.3f} s "
                     f"({sk['iterations']} iterations), np.load {sk['load_s']:.3f} s, SSE {sk['inertia']:.10g}")
    w = doc["warm"]
    lines.append(f"mpikmeans: backend {w['backend']} {', '.join(w['devices'])} {w['dtype']}, SSE {w['inertia']:.10g}; "
                 f"centres cold = warm: {doc.get('same_centres_cold_warm')}, ARFF = .npy: {doc.get('same_centres_npy')}")
    return lines
