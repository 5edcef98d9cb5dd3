#!/usr/bin/env python3
"""Measure the tool on the CPU: read MB/s per rank, ms per Lloyd iteration, gen-data MB/s per rank.

Runs the real ``mpikmeans`` under ``mpirun`` for each rank count, on a file made
with ``mpikmeans gen-data`` (kept between runs), repeats each point, prints a
table and writes JSON.  Reading is compared with ``numpy.loadtxt`` and, when
installed, pandas' C reader, timed in the same run on the same file.

Every process pays a one-time start-up (Numba's initialisation and loading
its cached kernels, about 0.3-0.5 s, whatever the file size), which with many
ranks each reading a small share would hide the reading speed.  So each figure
is given both ways, labelled:

* read: ``read_s`` of ``summary.json`` is the reading alone (header, memory
  check, file reads, parsing, exchanges, min/max); the start-up is its own
  field, ``startup_s``; "incl. start-up" is the per-rank rate over both;
* gen-data: the writing time the command reports (its start-up is reported
  apart, after it; a version before that had the start-up inside) and, "excl.
  fixed", that time less the time it reports for a 10-row file (file
  creation, exchanges, fsync and rename).

The process launch itself (``mpirun``, Python, MPI_Init, imports) is in
neither; its wall time is recorded in the JSON.

    python scripts/bench_cpu.py --rows 1000000 --attrs 16 -k 8 --ranks 1 2
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import date

from mpikmeans.bench.sweeps import default_launcher, mpi_env


def mpirun(np_: int, args: list) -> tuple:
    """Wall time and standard output of ``mpikmeans ARGS`` on ``np_`` ranks."""
    cmd = [*default_launcher(), "-np", str(np_), sys.executable, "-m", "mpikmeans"] + [str(a) for a in args]
    t0 = time.perf_counter()
    done = subprocess.run(cmd, check=True, env=mpi_env(), stdout=subprocess.PIPE, text=True)
    return time.perf_counter() - t0, done.stdout


def gen_data(np_: int, path: str, rows: int, attrs: int, k: int) -> tuple:
    """``gen-data`` on ``np_`` ranks: (seconds the command reports for writing, wall seconds)."""
    wall, out = mpirun(np_, ["gen-data", path, "-n", rows, "-m", attrs, "-k", k])
    return float(re.search(r" in ([0-9.]+) s", out).group(1)), wall


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--attrs", type=int, default=16)
    ap.add_argument("-k", type=int, default=8)
    ap.add_argument("--ranks", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--gen-ranks", type=int, nargs="+", help="rank counts for timing gen-data (default: --ranks)")
    ap.add_argument("--iterations", type=int, default=20, help="Lloyd iterations per run (fixed for timing)")
    ap.add_argument("--data", help="input to use/create (default: a temporary file)")
    ap.add_argument("--json", default=f"bench/results/cpu_{platform.node()}_{date.today()}.json")
    ap.add_argument("--references", action="store_true", help="also time numpy.loadtxt and pandas on the file")
    a = ap.parse_args()

    tmp = tempfile.mkdtemp(prefix="mpikmeans-bench-")
    data = a.data or os.path.join(tmp, "bench.arff")
    # compile every kernel once (numba caches them), so no timing below includes the compiler
    sample = os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, "data", "sample.arff")
    mpirun(1, ["run", sample, "-k", 2, "-o", os.path.join(tmp, "warm"), "-q"])
    mpirun(1, ["gen-data", os.path.join(tmp, "warm.arff"), "-n", 10, "-m", 2, "-k", 2, "-q"])
    results = {"machine": platform.node(), "cpus": os.cpu_count(), "python": platform.python_version(),
               "rows": a.rows, "attrs": a.attrs, "k": a.k, "iterations": a.iterations, "points": [],
               "notes": "read_s: the reading alone; startup_s: the one-time start-up before it (Numba, cached "
                        "kernels, threads); gen write_s: as gen-data reports it (start-up apart); gen fixed_s: "
                        "what it reports for a 10-row file; wall_s: the whole mpirun command"}
    gen = []
    for np_ in a.gen_ranks or a.ranks:
        for _ in range(a.repeats):
            fixed, _ = gen_data(np_, os.path.join(tmp, "tiny.arff"), 10, a.attrs, a.k)
            write, wall = gen_data(np_, data, a.rows, a.attrs, a.k)
            gen.append((np_, write, wall, fixed))
    size = os.path.getsize(data)
    results["file_bytes"] = size
    for np_ in a.gen_ranks or a.ranks:
        runs = [g for g in gen if g[0] == np_]
        write = statistics.median(g[1] for g in runs)
        fixed = statistics.median(g[3] for g in runs)
        results["points"].append({"what": "gen-data", "ranks": np_, "median_s": write,
                                  "spread_s": [min(g[1] for g in runs), max(g[1] for g in runs)],
                                  "wall_s": statistics.median(g[2] for g in runs), "fixed_s": fixed,
                                  "MB_per_s": size / 1e6 / write, "MB_per_s_per_rank": size / 1e6 / write / np_,
                                  "MB_per_s_per_rank_excl_fixed": size / 1e6 / max(write - fixed, 1e-9) / np_})
    for np_ in a.ranks:
        reads, starts, iters, walls = [], [], [], []
        for r in range(a.repeats):
            out = os.path.join(tmp, f"out{np_}_{r}")
            wall, _ = mpirun(np_, ["run", data, "-k", a.k, "--max-iter", a.iterations, "--backend", "cpu", "-o", out,
                                   "-q"])
            with open(os.path.join(out, "summary.json")) as f:
                t = json.load(f)["timings"]
            reads.append(t["read_s"])
            starts.append(t.get("startup_s", 0.0))
            iters.append(t["per_iteration_s"])
            walls.append(wall)
        read, start = statistics.median(reads), statistics.median(starts)
        results["points"].append({"what": "run", "ranks": np_, "read_s": read, "read_spread_s": [min(reads), max(reads)],
                                  "startup_s": start, "startup_spread_s": [min(starts), max(starts)],
                                  "read_MB_per_s": size / 1e6 / read, "read_MB_per_s_per_rank": size / 1e6 / read / np_,
                                  "read_MB_per_s_per_rank_incl_startup": size / 1e6 / (read + start) / np_,
                                  "wall_s": statistics.median(walls),
                                  "ms_per_iteration": 1e3 * statistics.median(iters),
                                  "ms_per_iteration_spread": [1e3 * min(iters), 1e3 * max(iters)]})
    if a.references:
        import numpy as np

        t0 = time.perf_counter()
        np.loadtxt(data, delimiter=",", comments=["@", "%"])
        results["points"].append({"what": "numpy.loadtxt", "ranks": 1, "MB_per_s": size / 1e6 / (time.perf_counter() - t0)})
        try:
            import pandas as pd

            header_lines = 0
            with open(data, "rb") as f:
                for line in f:
                    header_lines += 1
                    if line.lower().startswith(b"@data"):
                        break
            t0 = time.perf_counter()
            pd.read_csv(data, skiprows=header_lines, header=None, engine="c", float_precision="round_trip")
            results["points"].append({"what": "pandas.read_csv (C)", "ranks": 1,
                                      "MB_per_s": size / 1e6 / (time.perf_counter() - t0)})
        except ImportError:
            pass

    print(f"{a.rows} rows x {a.attrs} attributes, k={a.k}, {size / 1e6:.0f} MB, {os.cpu_count()} CPUs "
          f"({platform.node()}); medians of {a.repeats}")
    print("MB/s: the whole file over the time; /rank: divided by the ranks.  run: read_s (the reading alone), "
          "and incl. the one-time start-up (startup_s).  gen-data: its reported time, and excl. its fixed cost "
          "(the time it reports for a 10-row file).  one-time s: startup_s (run) or that fixed cost (gen-data).")
    print(f"{'what':<22} {'ranks':>5} {'MB/s':>9} {'MB/s/rank':>10} {'incl.start-up':>14} {'excl.fixed':>11} "
          f"{'one-time s':>11} {'ms/iter':>9}")
    for p in results["points"]:
        mbs = p.get("read_MB_per_s", p.get("MB_per_s"))
        per = p.get("read_MB_per_s_per_rank", p.get("MB_per_s_per_rank", mbs))
        incl = p.get("read_MB_per_s_per_rank_incl_startup")
        excl = p.get("MB_per_s_per_rank_excl_fixed")
        once = p.get("startup_s", p.get("fixed_s"))
        it = p.get("ms_per_iteration")

        def cell(v, w, f):
            return f"{'':>{w}}" if v is None else f"{v:>{w}{f}}"

        print(f"{p['what']:<22} {p['ranks']:>5} {mbs:>9.0f} {per:>10.0f} {cell(incl, 14, '.0f')} "
              f"{cell(excl, 11, '.0f')} {cell(once, 11, '.3f')} {cell(it, 9, '.2f')}")
    os.makedirs(os.path.dirname(a.json) or ".", exist_ok=True)
    with open(a.json, "w") as f:
        json.dump(results, f, indent=2)
    print(f"wrote {a.json}")
    shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
