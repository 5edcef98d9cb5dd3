#!/usr/bin/env python3
"""Measure the tool on the CPU: read MB/s per rank, ms per Lloyd iteration, gen-data MB/s.

Runs the real ``mpikmeans`` under ``mpirun`` for each rank count, on a file made
with ``mpikmeans gen-data`` (kept between runs), repeats each point, prints a
table and writes JSON.  Reading is compared with ``numpy.loadtxt`` and, when
installed, pandas' C reader, timed in the same run on the same file.

    python scripts/bench_cpu.py --rows 1000000 --attrs 16 -k 8 --ranks 1 2
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import date

from mpikmeans.bench import default_launcher, mpi_env


def mpirun(np_: int, args: list) -> float:
    cmd = [*default_launcher(), "-np", str(np_), sys.executable, "-m", "mpikmeans"] + [str(a) for a in args]
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True, env=mpi_env(), stdout=subprocess.DEVNULL)
    return time.perf_counter() - t0


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
               "rows": a.rows, "attrs": a.attrs, "k": a.k, "iterations": a.iterations, "points": []}
    gen = []
    for np_ in a.gen_ranks or a.ranks:
        for _ in range(a.repeats):
            gen.append((np_, mpirun(np_, ["gen-data", data, "-n", a.rows, "-m", a.attrs, "-k", a.k, "-q"])))
    size = os.path.getsize(data)
    results["file_bytes"] = size
    for np_ in a.gen_ranks or a.ranks:
        times = [t for n, t in gen if n == np_]
        results["points"].append({"what": "gen-data", "ranks": np_, "median_s": statistics.median(times),
                                  "MB_per_s": size / 1e6 / statistics.median(times),
                                  "MB_per_s_per_rank": size / 1e6 / statistics.median(times) / np_})
    for np_ in a.ranks:
        reads, iters = [], []
        for r in range(a.repeats):
            out = os.path.join(tmp, f"out{np_}_{r}")
            mpirun(np_, ["run", data, "-k", a.k, "--max-iter", a.iterations, "--backend", "cpu", "-o", out, "-q"])
            with open(os.path.join(out, "summary.json")) as f:
                t = json.load(f)["timings"]
            reads.append(t["read_s"])
            iters.append(t["per_iteration_s"])
        read = statistics.median(reads)
        results["points"].append({"what": "run", "ranks": np_, "read_s": read, "read_spread_s": [min(reads), max(reads)],
                                  "read_MB_per_s": size / 1e6 / read, "read_MB_per_s_per_rank": size / 1e6 / read / np_,
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

    print(f"{a.rows} rows x {a.attrs} attributes, k={a.k}, {size / 1e6:.0f} MB, {os.cpu_count()} CPUs ({platform.node()})")
    print(f"{'what':<22} {'ranks':>5} {'MB/s':>9} {'MB/s/rank':>10} {'ms/iter':>9}")
    for p in results["points"]:
        mbs = p.get("read_MB_per_s", p.get("MB_per_s"))
        per = p.get("read_MB_per_s_per_rank", p.get("MB_per_s_per_rank", mbs))
        it = p.get("ms_per_iteration")
        print(f"{p['what']:<22} {p['ranks']:>5} {mbs:>9.0f} {per:>10.0f} {'' if it is None else f'{it:9.2f}'}")
    os.makedirs(os.path.dirname(a.json) or ".", exist_ok=True)
    with open(a.json, "w") as f:
        json.dump(results, f, indent=2)
    print(f"wrote {a.json}")
    shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
