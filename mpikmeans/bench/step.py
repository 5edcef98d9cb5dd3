"""``mpikmeans bench step``: ms per Lloyd iteration on the CPU, against scikit-learn and oneDAL.

For each shape (rows x attributes, K) the driver writes blobs as ``gen-data``
makes them (:func:`mpikmeans.bench.data.write_blobs_npy`) and picks K of its
rows as the initial centres.  Then, for each thread count, each tool runs in a
process of its own (its thread pools size themselves at start-up, from
``OMP_NUM_THREADS`` and friends, which the driver sets):

* ``mpikmeans``: :class:`mpikmeans.api.KMeans` with the CPU backend as a run
  uses it (rows whose centre cannot have changed are not searched:
  :mod:`mpikmeans.backends.cpu.bounds`);
* ``mpikmeans-full``: the same with every row searched every iteration (the
  full step; the same labels, sums and SSE bit for bit);
* ``sklearn``: scikit-learn's ``KMeans(algorithm="lloyd")``;
* ``sklearn-elkan``: scikit-learn's ``KMeans(algorithm="elkan")``, its
  triangle-inequality bounds (the same labels and SSE);
* ``sklearnex``: scikit-learn's Lloyd estimator from scikit-learn-intelex
  (Intel's oneDAL), an optional extra (``pip install mpikmeans[bench]``):
  where it is not installed its rows say so and the rest runs.

Every tool is timed the same way: fits from the same centres with ``tol=0``
and ``max_iter`` 1 and ``iterations``, alternately, ``repeats`` times; the ms
per iteration is the difference of the median fit times over the difference of
their iteration counts.  With ``rounds`` above 1 the tools take turns that many
times, a process each, and each tool's figure is the median of its rounds
(every round's is kept): a virtual machine's speed drifts by a third between
minutes, and turns spread the drift over all tools alike.  What a fit does once (input checks, copies, the final
assignment) cancels, and only whole Lloyd iterations (assignment, sums, centre
update, empty clusters) remain.  The SSE and a digest of the labels of the long
fit are recorded, so the table also shows whether the tools agree.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass

from ..errors import RunError

# numpy and the bench harness are imported where they are used: the CLI imports
# this module for its defaults, and a command's start-up should not pay for them

#: The issue's shapes: (rows, attributes, K).
SHAPES = ((200_000, 100, 50), (1_000_000, 16, 8), (100_000, 257, 1000))
TOOLS = ("mpikmeans", "mpikmeans-full", "sklearn", "sklearn-elkan", "sklearnex")
#: the references each mpikmeans row is compared with (``ratio_to_<tool>``, ``same_labels_as_<tool>``)
REFERENCES = ("sklearn", "sklearn-elkan", "sklearnex")
NOTES = ("ms_per_iteration: (median fit time with max_iter=iterations - median with max_iter=1) / "
         "(difference of n_iter_); same initial centres, tol=0, one process per tool and thread count")


@dataclass
class StepSettings:
    """What ``bench step`` measures (the options of the command)."""

    shapes: tuple = SHAPES
    threads: tuple = (1, 2, 0)  # 0: all the CPUs this process may use
    iterations: int = 20
    repeats: int = 3
    tools: tuple = TOOLS
    seed: int = 0
    timeout_s: float = 1800.0
    rounds: int = 1


def _estimator(tool: str, k: int, init, max_iter: int, threads: int):
    if tool in ("mpikmeans", "mpikmeans-full"):
        from ..api import KMeans

        backend = "cpu"
        if tool == "mpikmeans-full":
            from ..backends.cpu import CPUBackend

            backend = CPUBackend(threads=threads, bounds=False)
        return KMeans(k, init=init, n_init=1, max_iter=max_iter, tol=0.0, backend=backend, threads=threads)
    if tool in ("sklearn", "sklearn-elkan"):
        from sklearn.cluster import KMeans
    else:
        from sklearnex.cluster import KMeans
    algorithm = "elkan" if tool == "sklearn-elkan" else "lloyd"
    return KMeans(n_clusters=k, init=init, n_init=1, max_iter=max_iter, tol=0.0, algorithm=algorithm)


def _library_version(tool: str) -> str:
    import importlib.metadata as md

    name = {"mpikmeans": "mpikmeans", "mpikmeans-full": "mpikmeans", "sklearn": "scikit-learn",
            "sklearn-elkan": "scikit-learn", "sklearnex": "scikit-learn-intelex"}[tool]
    try:
        return md.version(name)
    except md.PackageNotFoundError:
        if name == "mpikmeans":  # run from a checkout on PYTHONPATH (the lent GPU machines): no metadata
            from .. import __version__

            return __version__
        return "unknown"


def time_tool(tool: str, x, init, iterations: int, repeats: int, threads: int) -> dict:
    """Time one tool's Lloyd iterations (in this process; its thread count must already be set).

    Parameters
    ----------
    tool : {"mpikmeans", "mpikmeans-full", "sklearn", "sklearn-elkan", "sklearnex"}
    x : ndarray, shape (n, m), float64
    init : ndarray, shape (k, m), float64
    iterations, repeats : int
    threads : int
        Passed to mpikmeans; the others read the environment.

    Returns
    -------
    dict
        ``ms_per_iteration``, ``iterations`` (the long fit's ``n_iter_``), ``sse``,
        ``labels_sha1``, ``version``; or ``error`` when the tool is not installed.
    """
    try:
        _estimator(tool, len(init), init, 1, threads)
    except ImportError as exc:
        return {"error": f"{exc.name or exc} is not installed"}
    import numpy as np

    x = np.ascontiguousarray(x, dtype=np.float64)
    init = np.ascontiguousarray(init, dtype=np.float64)
    _estimator(tool, len(init), init, 2, threads).fit(x)  # warm-up: compiles, pools, caches
    short, long_, fit = [], [], None
    for _ in range(repeats):
        for runs, its in ((short, 1), (long_, iterations)):
            est = _estimator(tool, len(init), init, its, threads)
            t0 = time.perf_counter()
            est.fit(x)
            runs.append((time.perf_counter() - t0, int(est.n_iter_)))
            fit = est
    n_long, n_short = long_[-1][1], short[-1][1]
    per = (statistics.median(t for t, _ in long_) - statistics.median(t for t, _ in short)) / max(n_long - n_short, 1)
    labels = np.ascontiguousarray(fit.labels_, dtype=np.int32)
    out = {"ms_per_iteration": 1e3 * per, "iterations": n_long, "sse": float(fit.inertia_),
           "labels_sha1": hashlib.sha1(labels.tobytes()).hexdigest(), "version": _library_version(tool),
           "fit_s": statistics.median(t for t, _ in long_)}
    if per <= 0:
        # the iterations cost less than the fits' noise: the difference says nothing
        out["note"] = "below the timing noise: use more rows, --iterations or --repeats"
    return out


def thread_env(threads: int) -> dict:
    """The environment that gives every library in a child process ``threads`` threads."""
    env = dict(os.environ)
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "NUMBA_NUM_THREADS",
                "TBB_NUM_THREADS"):
        env[var] = str(threads)
    return env


def _all_threads() -> int:
    from ..cpus import usable_cpus

    return len(usable_cpus()) or os.cpu_count() or 1


def run_step(settings: StepSettings, progress=None) -> dict:
    """Measure every shape, thread count and tool; the results (``bench/results/step_*.json``).

    Returns
    -------
    dict
        ``cpus``, ``python``, ``notes`` and ``points``: one dict per shape, thread
        count and tool, with :func:`time_tool`'s figures and, for both mpikmeans
        rows, ``ratio_to_<reference>`` and ``same_labels_as_<reference>``.
    """
    from ..io.gen import GenSpec
    from .data import initial_centres, write_blobs_npy
    from .harness import quiet

    progress = progress or quiet
    s = settings
    every = _all_threads()
    counts = sorted({t if t else every for t in s.threads})
    tmp = tempfile.mkdtemp(prefix="mpikmeans-step-")
    points = []
    try:
        for n, m, k in s.shapes:
            data = os.path.join(tmp, f"x{n}_{m}_{k}.npy")
            write_blobs_npy(GenSpec(n=n, m=m, k=k, seed=s.seed), data)
            _, init = initial_centres(data, k, s.seed + 1, os.path.join(tmp, f"c{n}_{m}_{k}"))
            for threads in counts:
                runs = {tool: [] for tool in s.tools}
                for _ in range(s.rounds):
                    for tool in s.tools:
                        runs[tool].append(_time_in_process(tool, data, init, threads, s))
                        progress(_line(dict(runs[tool][-1], tool=tool, threads=threads, rows=n, attrs=m, k=k)))
                row = {}
                for tool, outs in runs.items():
                    out = _median_round(outs)
                    out.update(tool=tool, threads=threads, rows=n, attrs=m, k=k)
                    row[tool] = out
                for me in ("mpikmeans", "mpikmeans-full"):
                    mine = row.get(me, {})
                    for ref in REFERENCES:
                        other = row.get(ref, {})
                        if "ms_per_iteration" in mine and "ms_per_iteration" in other:
                            mine[f"ratio_to_{ref}"] = mine["ms_per_iteration"] / other["ms_per_iteration"]
                            mine[f"same_labels_as_{ref}"] = mine["labels_sha1"] == other["labels_sha1"]
                points += row.values()
            os.remove(data)
        return {"cpus": every, "python": sys.version.split()[0], "iterations": s.iterations, "repeats": s.repeats,
                "rounds": s.rounds, "points": points, "notes": NOTES}
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _time_in_process(tool: str, data: str, init: str, threads: int, s: StepSettings) -> dict:
    """One round of one tool: :func:`time_tool` in a process of its own, its threads set by the environment."""
    from .harness import run_command, tool_command

    cmd = tool_command("bench", "step-worker", tool, "--data", data, "--init", init, "--iterations", s.iterations,
                       "--repeats", s.repeats, "--threads", threads)
    try:
        ran = run_command(cmd, s.timeout_s, env=thread_env(threads))
        lines = [ln for ln in ran.stdout.splitlines() if ln.startswith("{")]
        return json.loads(lines[-1]) if lines else {"error": "no result line"}
    except RunError as exc:
        return {"error": exc.message}


def _median_round(outs: list) -> dict:
    """A tool's result over its rounds: the round of the median ms per iteration (the lower middle
    one of an even count), with every round's figure in ``rounds_ms``; the first error where none ran."""
    done = [o for o in outs if "ms_per_iteration" in o]
    if not done:
        return dict(outs[0])
    ranked = sorted(done, key=lambda o: o["ms_per_iteration"])
    out = dict(ranked[(len(ranked) - 1) // 2])
    if len(outs) > 1:
        out["rounds_ms"] = [o.get("ms_per_iteration") for o in outs]
    return out


def _line(p: dict) -> str:
    head = f"{p['rows']}x{p['attrs']} K={p['k']} threads={p['threads']:<3} {p['tool']:<10}"
    if "error" in p:
        return f"{head} skipped: {p['error']}"
    note = f"  [{p['note']}]" if "note" in p else ""
    return f"{head} {p['ms_per_iteration']:9.2f} ms/iter  SSE {p['sse']:.10g}  ({p['iterations']} iterations){note}"


def step_table(doc: dict) -> list:
    """The results as lines of a table (what ``bench step`` prints).

    ``full``: mpikmeans searching every row every iteration; ``elkan``:
    scikit-learn's Elkan; the ratios are mpikmeans' time over scikit-learn's
    Lloyd and over oneDAL's; ``labels``: whether mpikmeans' labels are
    scikit-learn's.
    """
    rounds = doc.get("rounds", 1)
    lines = [f"ms per Lloyd iteration, {doc.get('cpus')} CPUs ({doc['machine'].get('host')}), "
             f"{doc['iterations']} iterations, medians of {doc['repeats']}"
             + (f", the median of {rounds} rounds" if rounds > 1 else ""),
             f"{'shape':<22} {'threads':>7} {'mpikmeans':>10} {'full':>8} {'sklearn':>9} {'elkan':>8} "
             f"{'sklearnex':>10} {'/sklearn':>9} {'/oneDAL':>8} {'labels':>7}"]
    rows = {}
    for p in doc["points"]:
        rows.setdefault((p["rows"], p["attrs"], p["k"], p["threads"]), {})[p["tool"]] = p

    def ms(p):
        return f"{p['ms_per_iteration']:.1f}" if p and "ms_per_iteration" in p else "-"

    for (n, m, k, t), tools in rows.items():
        me = tools.get("mpikmeans", {})
        r1 = f"{me['ratio_to_sklearn']:.2f}" if "ratio_to_sklearn" in me else "-"
        r2 = f"{me['ratio_to_sklearnex']:.2f}" if "ratio_to_sklearnex" in me else "-"
        same = {True: "same", False: "differ"}.get(me.get("same_labels_as_sklearn"), "-")
        lines.append(f"{f'{n}x{m} K={k}':<22} {t:>7} {ms(me):>10} {ms(tools.get('mpikmeans-full')):>8} "
                     f"{ms(tools.get('sklearn')):>9} {ms(tools.get('sklearn-elkan')):>8} "
                     f"{ms(tools.get('sklearnex')):>10} {r1:>9} {r2:>8} {same:>7}")
    return lines
