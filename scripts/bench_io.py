#!/usr/bin/env python3
"""Time the I/O paths: ``gen-data`` MB/s per rank, and the ARFF read phase with its parts.

For each rank count (and thread count for reading) it runs the real command
under ``mpirun``:

* ``mpikmeans gen-data``: the time the command reports for writing (process
  launch and Numba's start-up excluded: it reports the start-up apart; a
  version before that had it inside), that time less its fixed cost (the
  time it reports for a 10-row file: file creation, exchanges, fsync,
  rename), and the whole command's wall time;
* ``mpikmeans run --max-iter 1``: ``read_s`` from ``summary.json`` (header,
  memory check, reading, parsing, exchanges, min/max) and ``startup_s``, the
  one-time start-up before it (Numba's initialisation, loading the reader's
  cached kernels, its threads), shown apart and added in "incl. start-up"
  (a version without ``startup_s`` had it inside ``read_s``);

and, in one process per thread count, the read phase split into its parts by
wrapping the reader's functions (file reads, line cutting, parsing, min/max,
the rest).  With ``--baseline DIR`` (a directory holding another version of
the ``mpikmeans`` package, e.g. ``git archive HEAD mpikmeans | tar -x -C DIR``)
every measurement is also made with that version, interleaved with the current
one, so that before/after figures come from the same run on a shared machine;
the generated files of both versions are compared byte for byte.

    python scripts/bench_io.py --rows 2000000 --attrs 16 --ranks 1 2 --threads 1 2
    python scripts/bench_io.py --baseline /tmp/base --repeats 3
"""

from __future__ import annotations

import argparse
import filecmp
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

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
BIN = os.path.dirname(sys.executable)
BASE_ENV = {**os.environ, "OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
            "OMPI_MCA_rmaps_base_oversubscribe": "1", "PATH": BIN + os.pathsep + os.environ.get("PATH", "")}


def env_for(package_dir: str) -> dict:
    return {**BASE_ENV, "PYTHONPATH": package_dir + os.pathsep + BASE_ENV.get("PYTHONPATH", "")}


def mpirun(ranks: int, args: list, env: dict, cwd: str) -> tuple:
    # cwd: not the repository, whose package ``python -m`` would import before PYTHONPATH's
    cmd = [shutil.which("mpirun", path=env["PATH"]), "-np", str(ranks), "--bind-to", "none",
           "-x", "PYTHONPATH", sys.executable, "-m", "mpikmeans"] + [str(a) for a in args]
    t0 = time.perf_counter()
    done = subprocess.run(cmd, check=True, env=env, capture_output=True, text=True, cwd=cwd)
    return time.perf_counter() - t0, done.stdout


def package_of(env: dict, cwd: str) -> str:
    """Where the ``mpikmeans`` that ``env`` imports lives."""
    return subprocess.run([sys.executable, "-c", "import mpikmeans, os; print(os.path.dirname(mpikmeans.__file__))"],
                          env=env, cwd=cwd, check=True, capture_output=True, text=True).stdout.strip()


# --------------------------------------------------------------------------- phases (in a child process)

def phases(path: str, threads: int, repeats: int) -> dict:
    """The read of ``path`` at one rank, split by wrapping the reader's functions (best of ``repeats``)."""
    import functools

    import numba
    import numpy as np

    import mpikmeans.io.arff as A
    import mpikmeans.io.rowparse as R
    from mpikmeans.comm import SerialComm

    numba.set_num_threads(min(threads, numba.config.NUMBA_NUM_THREADS))
    spent: dict = {}

    def wrap(mod, name, label):
        f = getattr(mod, name, None)
        if f is None:
            return

        @functools.wraps(f)
        def timed(*a, **k):
            t0 = time.perf_counter()
            try:
                return f(*a, **k)
            finally:
                spent[label] = spent.get(label, 0.0) + time.perf_counter() - t0

        setattr(mod, name, timed)

    for name, label in [("line_cuts", "cut_lines"), ("last_newline", "cut_lines"), ("parse_parallel", "parse"),
                        ("column_min_max", "min_max"), ("_parse_span", "span"), ("_read_into", "read_file"),
                        ("read_header", "header"), ("check_memory", "memory_check")]:
        wrap(R if hasattr(R, name) else A, name, label)
    wrap(os, "pread", "read_file")
    flatnonzero = np.flatnonzero
    A.np = type(np)("numpy_wrapped")  # the old reader found newlines with np.flatnonzero: time it too
    A.np.__dict__.update(np.__dict__)

    def timed_flatnonzero(*a):
        t0 = time.perf_counter()
        try:
            return flatnonzero(*a)
        finally:
            spent["cut_lines"] = spent.get("cut_lines", 0.0) + time.perf_counter() - t0

    A.np.flatnonzero = timed_flatnonzero
    comm = SerialComm()
    A.read_arff(os.path.join(ROOT, "data", "sample.arff"), comm, threads=threads)  # compile / load the kernels
    best = None
    for _ in range(repeats):
        spent.clear()
        c0, t0 = time.process_time(), time.perf_counter()
        header = A.shared_header(path, comm)
        A.check_memory(path, header, comm)
        data = A.read_arff(path, comm, header=header, threads=threads)
        total, cpu = time.perf_counter() - t0, time.process_time() - c0
        del data
        parts = dict(spent)
        inside = sum(parts.get(k, 0.0) for k in ("read_file", "cut_lines", "parse"))
        parts["span_other"] = parts.pop("span", 0.0) - inside  # copies, allocation, Python between kernels
        parts["other"] = total - sum(v for k, v in parts.items())
        if best is None or total < best["total_s"]:
            best = {"total_s": total, "cpu_s": cpu, "parts_s": parts}
    best["MB_per_s"] = os.path.getsize(path) / 1e6 / best["total_s"]
    return best


# --------------------------------------------------------------------------- driver

def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=2_000_000)
    ap.add_argument("--attrs", type=int, default=16)
    ap.add_argument("-k", type=int, default=8)
    ap.add_argument("--ranks", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2], help="parse threads per rank (reading)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--baseline", help="directory holding another version of the mpikmeans package")
    ap.add_argument("--dir", help="where to put the files (default: a temporary directory, removed after)")
    ap.add_argument("--json", help="write the results here")
    ap.add_argument("--phases", nargs=3, metavar=("FILE", "THREADS", "REPEATS"), help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.phases:
        print(json.dumps(phases(a.phases[0], int(a.phases[1]), int(a.phases[2]))))
        return

    variants = {"current": env_for(ROOT)}
    if a.baseline:
        variants = {"baseline": env_for(os.path.abspath(a.baseline)), **variants}
    work = a.dir or tempfile.mkdtemp(prefix="mpikmeans-io-")
    os.makedirs(work, exist_ok=True)
    results = {"machine": platform.node(), "cpus": os.cpu_count(), "rows": a.rows, "attrs": a.attrs, "k": a.k,
               "gen": [], "read": [], "phases": []}
    sample = os.path.join(ROOT, "data", "sample.arff")
    for name, env in variants.items():  # load every kernel once, so no timing includes the compiler
        results.setdefault("packages", {})[name] = package_of(env, work)
        print(f"{name}: {results['packages'][name]}", flush=True)
        mpirun(1, ["gen-data", os.path.join(work, "warm.arff"), "-n", 100, "-m", 2, "-k", 2], env, work)
        mpirun(1, ["run", sample, "-k", 2, "--max-iter", 1, "-o", os.path.join(work, "warm"), "--overwrite", "-q"],
               env, work)
    if len(set(results["packages"].values())) != len(variants):
        sys.exit(f"the versions import the same package: {results['packages']}")

    def gen_data(ranks: int, path: str, rows: int, env: dict) -> tuple:
        wall, out = mpirun(ranks, ["gen-data", path, "-n", rows, "-m", a.attrs, "-k", a.k], env, work)
        return float(re.search(r" in ([0-9.]+) s", out).group(1)), wall

    files = {}
    for ranks in a.ranks:
        for rep in range(a.repeats):
            for name, env in variants.items():
                path = os.path.join(work, f"{name}.arff")
                fixed, _ = gen_data(ranks, os.path.join(work, f"tiny-{name}.arff"), 10, env)
                reported, wall = gen_data(ranks, path, a.rows, env)
                size = os.path.getsize(path)
                files[name] = path
                results["gen"].append({"version": name, "ranks": ranks, "bytes": size, "write_s": reported,
                                       "fixed_s": fixed, "wall_s": wall})
                print(f"gen-data  {name:9s} ranks={ranks} {size / 1e6 / reported / ranks:6.0f} MB/s/rank, "
                      f"{size / 1e6 / max(reported - fixed, 1e-9) / ranks:6.0f} excl. fixed cost "
                      f"(write {reported:.2f} s, fixed {fixed:.2f} s, whole command {wall:.2f} s)", flush=True)
        if len(files) == 2:
            same = filecmp.cmp(*files.values(), shallow=False)
            results.setdefault("same_bytes", []).append(same)
            print(f"gen-data  files of both versions identical: {same}", flush=True)
    data = files["current"]
    size = os.path.getsize(data)
    for ranks in a.ranks:
        for threads in a.threads:
            for rep in range(a.repeats):
                for name, env in variants.items():
                    out = os.path.join(work, f"out-{name}")
                    mpirun(ranks, ["run", data, "-k", a.k, "--max-iter", 1, "--backend", "cpu", "--threads", threads,
                                   "-o", out, "--overwrite", "-q"], env, work)
                    with open(os.path.join(out, "summary.json")) as f:
                        timings = json.load(f)["timings"]
                    read_s, startup_s = timings["read_s"], timings.get("startup_s")
                    results["read"].append({"version": name, "ranks": ranks, "threads": threads, "read_s": read_s,
                                            "startup_s": startup_s})
                    both = read_s + (startup_s or 0.0)
                    alone = (f"{size / 1e6 / read_s / ranks:6.0f} MB/s/rank reading alone, "
                             if startup_s is not None else "")
                    print(f"read      {name:9s} ranks={ranks} threads={threads} {alone}"
                          f"{size / 1e6 / both / ranks:6.0f} incl. start-up (read_s {read_s:.3f}, startup_s "
                          f"{'in read_s' if startup_s is None else f'{startup_s:.3f}'})", flush=True)
    for threads in a.threads:
        for name, env in variants.items():
            done = subprocess.run([sys.executable, os.path.abspath(__file__), "--phases", data, str(threads),
                                   str(a.repeats)], env=env, cwd=work, check=True, capture_output=True, text=True)
            p = json.loads(done.stdout.strip().splitlines()[-1])
            results["phases"].append({"version": name, "threads": threads, **p})
            parts = "  ".join(f"{k} {v:.3f}" for k, v in p["parts_s"].items())
            print(f"phases    {name:9s} 1 rank, threads={threads}: {p['MB_per_s']:.0f} MB/s, {p['total_s']:.3f} s "
                  f"(cpu {p['cpu_s']:.2f} s): {parts}", flush=True)

    print(f"\n{a.rows} rows x {a.attrs} attributes, {size / 1e6:.0f} MB, {os.cpu_count()} CPUs; "
          f"medians of {a.repeats}, MB/s per rank")
    print("gen:  as reported / excluding its fixed cost (a 10-row run's reported time) [fixed cost, s]")
    print("read: reading alone (read_s) / including the one-time start-up (read_s + startup_s) [startup_s]")

    def median(rs, key):
        values = [r[key] for r in rs if r.get(key) is not None]
        return statistics.median(values) if values else None

    for kind, keys in (("gen", ("ranks",)), ("read", ("ranks", "threads"))):
        for point in sorted({tuple(r[k] for k in keys) for r in results[kind]}):
            row = []
            for name in variants:
                rs = [r for r in results[kind] if r["version"] == name and tuple(r[k] for k in keys) == point]
                ranks = point[0]
                if kind == "gen":
                    mb = rs[0]["bytes"] / 1e6
                    secs, once = median(rs, "write_s"), median(rs, "fixed_s")
                    row.append(f"{name} {mb / secs / ranks:6.0f} / {mb / max(secs - once, 1e-9) / ranks:6.0f} "
                               f"[{once:.2f}]")
                else:
                    secs, once = median(rs, "read_s"), median(rs, "startup_s")
                    alone = "     -" if once is None else f"{size / 1e6 / secs / ranks:6.0f}"
                    row.append(f"{name} {alone} / {size / 1e6 / (secs + (once or 0.0)) / ranks:6.0f} "
                               f"[{'in read_s' if once is None else f'{once:.2f}'}]")
            print(f"{kind:5s} " + " ".join(f"{k}={v}" for k, v in zip(keys, point)) + ":  " + "   ".join(row))
    if a.json:
        os.makedirs(os.path.dirname(os.path.abspath(a.json)), exist_ok=True)
        with open(a.json, "w") as f:
            json.dump(results, f, indent=2)
        print(f"wrote {a.json}")
    if not a.dir:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
