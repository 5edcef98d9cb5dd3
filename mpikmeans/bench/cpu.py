"""``mpikmeans bench cpu``: read MB/s per rank, ms per Lloyd iteration and gen-data MB/s per rank on CPUs.

Runs the real tool under the MPI launcher for each rank count, on a file made
with ``mpikmeans gen-data`` (kept between runs when ``data`` is given), repeats
each point and keeps the median and the spread.  Reading can be compared with
``numpy.loadtxt`` and pandas' C reader on the same file
(:func:`mpikmeans.bench.references.read_references`).

Every process pays a one-time start-up (Numba's initialisation and loading its
cached kernels, about 0.3-0.5 s, whatever the file size), which with many ranks
each reading a small share would hide the reading speed.  So each figure is
given both ways, labelled:

* read: ``read_s`` of ``summary.json`` is the reading alone (header, memory
  check, file reads, parsing, exchanges, min/max); the start-up is its own
  field, ``startup_s``; "incl. start-up" is the per-rank rate over both;
* gen-data: the writing time from its ``--report`` (its start-up apart) and,
  "excl. fixed", that time less the time it reports for a 10-row file (file
  creation, exchanges, fsync and rename).

The process launch itself (``mpirun``, Python, MPI_Init, imports) is in
neither; its wall time is recorded too.
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import tempfile
from dataclasses import dataclass

from .data import gen_arff
from .harness import GenRuns, Launch, Progress, quiet, stats, warm_up
from .references import read_references

NOTES = ("read_s: the reading alone; startup_s: the one-time start-up before it (Numba, cached kernels, threads); "
         "gen write_s: as gen-data reports it (start-up apart); gen fixed_s: what it reports for a 10-row file; "
         "wall_s: the whole mpirun command")


@dataclass
class CpuSettings(GenRuns):
    """What ``bench cpu`` measures (the options of the command, same names and defaults)."""

    rows: int = 1_000_000
    gen_ranks: tuple | None = None
    iterations: int = 20
    data: str | None = None
    references: bool = False

    def check(self) -> None:
        """Raise :class:`UsageError` for settings that cannot run."""
        self.check_runs("cpu", ("iterations",), ("gen_ranks",))


def _gen_point(runs: list, size: int, ranks: int) -> dict:
    write = stats(g["write_s"] for g in runs)
    fixed = stats(g["fixed_s"] for g in runs)["median"]
    return {"what": "gen-data", "ranks": ranks, "median_s": write["median"], "spread_s": [write["min"], write["max"]],
            "wall_s": stats(g["wall_s"] for g in runs)["median"], "fixed_s": fixed,
            "MB_per_s": size / 1e6 / write["median"], "MB_per_s_per_rank": size / 1e6 / write["median"] / ranks,
            "MB_per_s_per_rank_excl_fixed": size / 1e6 / max(write["median"] - fixed, 1e-9) / ranks}


def _run_point(runs: list, size: int, ranks: int) -> dict:
    read, start = stats(r["read_s"] for r in runs), stats(r["startup_s"] for r in runs)
    it = stats(r["per_iteration_s"] for r in runs)
    return {"what": "run", "ranks": ranks, "read_s": read["median"], "read_spread_s": [read["min"], read["max"]],
            "startup_s": start["median"], "startup_spread_s": [start["min"], start["max"]],
            "read_MB_per_s": size / 1e6 / read["median"], "read_MB_per_s_per_rank": size / 1e6 / read["median"] / ranks,
            "read_MB_per_s_per_rank_incl_startup": size / 1e6 / (read["median"] + start["median"]) / ranks,
            "wall_s": stats(r["wall_s"] for r in runs)["median"],
            "ms_per_iteration": 1e3 * it["median"], "ms_per_iteration_spread": [1e3 * it["min"], 1e3 * it["max"]]}


def run_cpu(settings: CpuSettings, launch: Launch, progress: Progress = quiet) -> dict:
    """Measure; the results (the keys of ``bench/results/cpu_*.json``).

    Parameters
    ----------
    settings : CpuSettings
    launch : Launch
    progress : callable
        One line per measured command.

    Returns
    -------
    dict
        ``rows``, ``attrs``, ``k``, ``iterations``, ``cpus``, ``python``,
        ``file_bytes``, ``notes`` and ``points``: one dict per gen-data rank
        count (``what: "gen-data"``), per run rank count (``what: "run"``) and per
        reference reader.
    """
    settings.check()
    s = settings
    tmp = tempfile.mkdtemp(prefix="mpikmeans-bench-")
    try:
        data = s.data or os.path.join(tmp, "bench.arff")
        progress(f"warm-up (Numba compiles, cached for the runs that follow): "
                 f"{warm_up(launch, os.path.join(tmp, 'warm'), ['cpu']):.1f} s")
        results = {"cpus": os.cpu_count(), "python": platform.python_version(), "rows": s.rows, "attrs": s.attrs,
                   "k": s.k, "iterations": s.iterations, "points": [], "notes": NOTES}
        gen = {}
        for ranks in s.gen_ranks or s.ranks:
            for _ in range(s.repeats):
                fixed = gen_arff(launch, ranks, os.path.join(tmp, "tiny.arff"), 10, s.attrs, s.k)
                fig = gen_arff(launch, ranks, data, s.rows, s.attrs, s.k)
                gen.setdefault(ranks, []).append({**fig, "fixed_s": fixed["write_s"]})
                progress(f"gen-data np={ranks}: {fig['bytes'] / 1e6:.1f} MB in {fig['write_s']:.3f} s "
                         f"(fixed {fixed['write_s']:.3f} s, whole command {fig['wall_s']:.2f} s)")
        size = os.path.getsize(data)
        results["file_bytes"] = size
        results["points"] += [_gen_point(runs, size, ranks) for ranks, runs in gen.items()]
        for ranks in s.ranks:
            runs = []
            for rep in range(s.repeats):
                out = os.path.join(tmp, f"out{ranks}_{rep}")
                ran = launch.mpi(ranks, "run", data, "-k", s.k, "--max-iter", s.iterations, "--backend", "cpu",
                                 "-o", out, "-q")
                with open(os.path.join(out, "summary.json")) as f:
                    t = json.load(f)["timings"]
                runs.append({"read_s": t["read_s"], "startup_s": t.get("startup_s", 0.0),
                             "per_iteration_s": t["per_iteration_s"], "wall_s": ran.wall_s})
                progress(f"run np={ranks}: read {t['read_s']:.3f} s, start-up {runs[-1]['startup_s']:.3f} s, "
                         f"{1e3 * t['per_iteration_s']:.2f} ms/iter")
            results["points"].append(_run_point(runs, size, ranks))
        if s.references:
            results["points"] += read_references(data)
        return results
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def cpu_table(doc: dict) -> list:
    """The results as the lines of a table (what ``bench cpu`` prints)."""
    lines = [f"{doc['rows']} rows x {doc['attrs']} attributes, k={doc['k']}, {doc['file_bytes'] / 1e6:.0f} MB, "
             f"{doc.get('cpus')} CPUs ({doc['machine'].get('host')}); medians of {doc['settings'].get('repeats')}",
             "MB/s: the whole file over the time; /rank: divided by the ranks.  run: read_s (the reading alone), "
             "and incl. the one-time start-up (startup_s).  gen-data: its reported time, and excl. its fixed cost "
             "(the time it reports for a 10-row file).  one-time s: startup_s (run) or that fixed cost (gen-data).",
             f"{'what':<22} {'ranks':>5} {'MB/s':>9} {'MB/s/rank':>10} {'incl.start-up':>14} {'excl.fixed':>11} "
             f"{'one-time s':>11} {'ms/iter':>9}"]

    def cell(v, w, f):
        return f"{'':>{w}}" if v is None else f"{v:>{w}{f}}"

    for p in doc["points"]:
        mbs = p.get("read_MB_per_s", p.get("MB_per_s"))
        per = p.get("read_MB_per_s_per_rank", p.get("MB_per_s_per_rank", mbs))
        lines.append(f"{p['what']:<22} {p['ranks']:>5} {mbs:>9.0f} {per:>10.0f} "
                     f"{cell(p.get('read_MB_per_s_per_rank_incl_startup'), 14, '.0f')} "
                     f"{cell(p.get('MB_per_s_per_rank_excl_fixed'), 11, '.0f')} "
                     f"{cell(p.get('startup_s', p.get('fixed_s')), 11, '.3f')} "
                     f"{cell(p.get('ms_per_iteration'), 9, '.2f')}")
    return lines
