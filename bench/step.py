"""ms per Lloyd iteration on the CPU: mpikmeans against scikit-learn, its Elkan, and oneDAL.

A developer's measurement of the CPU backend (the user's one is ``mpikmeans bench
run``).  For each shape the driver writes blobs as ``gen-data`` makes them and
picks K rows as the start; then for each thread count each tool runs in a
process of its own, its thread pools sized by ``OMP_NUM_THREADS`` and friends:

* ``mpikmeans``: ``mpikmeans.KMeans(backend="cpu")``, as a run clusters;
* ``sklearn`` / ``sklearn-elkan``: scikit-learn's ``KMeans(algorithm="lloyd" / "elkan")``;
* ``sklearnex``: scikit-learn-intelex's (oneDAL's) Lloyd, where installed.

Every tool fits from the same centres with ``tol=0`` and ``max_iter`` 1 and
``--iterations``, alternately, ``--repeats`` times; ms per iteration = the
difference of the median fit times over the difference of their iteration
counts, so what a fit does once cancels.  ``--rounds R``: the tools take turns R
times and each keeps its median round (a virtual machine's speed drifts between
minutes).  The SSE and a digest of the labels show whether the tools agree.

    python bench/step.py --out step.json
    python bench/step.py --shapes 200000x100x50 --threads 1,2 --rounds 3 --out step.json
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

SHAPES = "200000x100x50,1000000x16x8,100000x257x1000"
TOOLS = ("mpikmeans", "sklearn", "sklearn-elkan", "sklearnex")
REFERENCES = ("sklearn", "sklearn-elkan", "sklearnex")


def _estimator(tool: str, k: int, init, max_iter: int, threads: int):
    if tool == "mpikmeans":
        from mpikmeans import KMeans

        return KMeans(k, init=init, n_init=1, max_iter=max_iter, tol=0.0, backend="cpu", threads=threads)
    if tool == "sklearnex":
        from sklearnex.cluster import KMeans
    else:
        from sklearn.cluster import KMeans
    return KMeans(n_clusters=k, init=init, n_init=1, max_iter=max_iter, tol=0.0,
                  algorithm="elkan" if tool == "sklearn-elkan" else "lloyd")


def time_tool(tool: str, data: str, init: str, iterations: int, repeats: int, threads: int) -> dict:
    """One tool's ms per iteration, in this process (its threads already set by the environment)."""
    import numpy as np

    x, c = np.load(data), np.load(init)
    try:
        _estimator(tool, len(c), c, 2, threads).fit(x)  # warm-up: compiles, pools, caches
    except ImportError as exc:
        return {"error": f"{exc.name or exc} is not installed"}
    short, long_, fit = [], [], None
    for _ in range(repeats):
        for runs, its in ((short, 1), (long_, iterations)):
            fit = _estimator(tool, len(c), c, its, threads)
            t0 = time.perf_counter()
            fit.fit(x)
            runs.append((time.perf_counter() - t0, int(fit.n_iter_)))
    per = ((statistics.median(t for t, _ in long_) - statistics.median(t for t, _ in short))
           / max(long_[-1][1] - short[-1][1], 1))
    labels = np.ascontiguousarray(fit.labels_, dtype=np.int32)
    out = {"ms_per_iteration": 1e3 * per, "iterations": long_[-1][1], "sse": float(fit.inertia_),
           "labels_sha1": hashlib.sha1(labels.tobytes()).hexdigest()}
    if per <= 0:
        out["note"] = "below the timing noise: use more rows, --iterations or --repeats"
    return out


def _in_process(tool: str, data: str, init: str, threads: int, a) -> dict:
    env = dict(os.environ, **{v: str(threads) for v in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS",
                                                         "NUMBA_NUM_THREADS", "TBB_NUM_THREADS")})
    cmd = [sys.executable, os.path.abspath(__file__), "--worker", tool, data, init, str(a.iterations), str(a.repeats),
           str(threads)]
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=a.timeout)
    except subprocess.TimeoutExpired:
        return {"error": f"no result within {a.timeout} s"}
    lines = [ln for ln in p.stdout.splitlines() if ln.startswith("{")]
    if p.returncode or not lines:
        return {"error": (p.stderr.strip().splitlines() or ["no result line"])[-1]}
    return json.loads(lines[-1])


def _median_round(outs: list) -> dict:
    done = sorted((o for o in outs if "ms_per_iteration" in o), key=lambda o: o["ms_per_iteration"])
    if not done:
        return dict(outs[0])
    out = dict(done[(len(done) - 1) // 2])
    if len(outs) > 1:
        out["rounds_ms"] = [o.get("ms_per_iteration") for o in outs]
    return out


def measure(a) -> dict:
    """Every shape, thread count and tool: ``points`` (one per shape, threads and tool) and the settings."""
    from mpikmeans.bench.data import initial_centres, write_blobs_npy
    from mpikmeans.io.gen import GenSpec

    every = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    counts = sorted({every if t == "all" else int(t) for t in a.threads.split(",")})
    tools = a.tools.split(",")
    tmp = tempfile.mkdtemp(prefix="mpikmeans-step-")
    points = []
    try:
        for shape in a.shapes.split(","):
            n, m, k = (int(v) for v in shape.lower().split("x"))
            data = os.path.join(tmp, f"x{n}_{m}_{k}.npy")
            write_blobs_npy(GenSpec(n=n, m=m, k=k, seed=a.seed), data)
            _, init = initial_centres(data, k, a.seed + 1, os.path.join(tmp, f"c{n}_{m}_{k}"))
            for threads in counts:
                runs = {tool: [] for tool in tools}
                for _ in range(a.rounds):
                    for tool in tools:
                        runs[tool].append(_in_process(tool, data, init, threads, a))
                        print(_line(dict(runs[tool][-1], tool=tool, threads=threads, rows=n, attrs=m, k=k)), flush=True)
                row = {tool: dict(_median_round(outs), tool=tool, threads=threads, rows=n, attrs=m, k=k)
                       for tool, outs in runs.items()}
                mine = row.get("mpikmeans", {})
                for ref in REFERENCES:
                    other = row.get(ref, {})
                    if "ms_per_iteration" in mine and "ms_per_iteration" in other:
                        mine[f"ratio_to_{ref}"] = mine["ms_per_iteration"] / other["ms_per_iteration"]
                        mine[f"same_labels_as_{ref}"] = mine["labels_sha1"] == other["labels_sha1"]
                points += row.values()
            os.remove(data)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return {"cpus": every, "points": points}


def _line(p: dict) -> str:
    head = f"{p['rows']}x{p['attrs']} K={p['k']} threads={p['threads']:<3} {p['tool']:<13}"
    if "error" in p:
        return f"{head} skipped: {p['error']}"
    return (f"{head} {p['ms_per_iteration']:9.2f} ms/iter  SSE {p['sse']:.10g}  ({p['iterations']} iterations)"
            + (f"  [{p['note']}]" if "note" in p else ""))


def table(doc: dict) -> list:
    """The points as lines: ms per iteration per tool, mpikmeans over scikit-learn and oneDAL, same labels."""
    lines = [f"ms per Lloyd iteration, {doc['cpus']} CPUs, {doc['settings']['iterations']} iterations, medians of "
             f"{doc['settings']['repeats']}, rounds {doc['settings']['rounds']}",
             f"{'shape':<22}{'threads':>8}{'mpikmeans':>11}{'sklearn':>9}{'elkan':>8}{'oneDAL':>8}{'/sklearn':>9}"
             f"{'/oneDAL':>8}{'labels':>7}"]
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
        lines.append(f"{f'{n}x{m} K={k}':<22}{t:>8}{ms(me):>11}{ms(tools.get('sklearn')):>9}"
                     f"{ms(tools.get('sklearn-elkan')):>8}{ms(tools.get('sklearnex')):>8}{r1:>9}{r2:>8}{same:>7}")
    return lines


def main(argv=None) -> int:
    if argv is None:
        argv = sys.argv[1:]
    if argv and argv[0] == "--worker":
        tool, data, init, iterations, repeats, threads = argv[1:7]
        print(json.dumps(time_tool(tool, data, init, int(iterations), int(repeats), int(threads))))
        return 0
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shapes", default=SHAPES, help="ROWSxATTRSxK, comma-separated  [%(default)s]")
    p.add_argument("--threads", default="1,2,all", help="thread counts, comma-separated; all: every CPU")
    p.add_argument("--iterations", type=int, default=20)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--tools", default=",".join(TOOLS))
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--timeout", type=float, default=1800)
    p.add_argument("--out", required=True, help="the JSON result")
    a = p.parse_args(argv)
    bad = [t for t in a.tools.split(",") if t not in TOOLS]
    if bad or a.iterations < 2 or min(a.repeats, a.rounds) < 1:
        p.error(f"--tools among {', '.join(TOOLS)}; --iterations at least 2; --repeats and --rounds at least 1")
    try:
        shapes = [tuple(int(v) for v in s.lower().split("x")) for s in a.shapes.split(",")]
        if any(int(t) < 1 for t in a.threads.split(",") if t != "all"):
            raise ValueError
    except ValueError:
        p.error("--shapes as 200000x100x50,...; --threads as 1,2,all (counts at least 1)")
    if any(len(s) != 3 or min(s) < 1 or s[2] > s[0] for s in shapes):
        p.error("each shape ROWSxATTRSxK, each at least 1, K at most ROWS")
    from mpikmeans.bench.harness import result_document, write_result

    settings = {k: v for k, v in vars(a).items() if k != "out"}
    doc = result_document("step", "python bench/step.py " + shlex.join(argv), settings, measure(a))
    write_result(a.out, doc)
    print("\n".join(table(doc)))
    print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
