"""The GPU backend against the CPU backend through the command line, under mpirun.

On one file made by ``mpikmeans gen-data``, ``mpirun -np P mpikmeans run``
runs three times on the same ranks: the CPU backend (float64), the GPU backend
with float64 and with float32 storage (each rank its node-local GPU).  Then:
labels identical, centres equal within 1e-9 relative (float64 on the GPU; 1e-5
float32), cluster sizes equal.  Exits 1 on a mismatch.  Under
``NUMBA_ENABLE_CUDASIM=1`` with ``--run-args=--share-gpus`` it runs without a GPU
(small data: the simulator is slow).

    python bench/parity.py /tmp/parity --np 2
    NUMBA_ENABLE_CUDASIM=1 python bench/parity.py /tmp/p --np 2 -n 3000 -m 4 -k 3 --run-args=--share-gpus
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys

import numpy as np

#: (backend, dtype) of each run, the CPU one first: it is the reference.
RUNS = (("cpu", "float64"), ("gpu", "float64"), ("gpu", "float32"))
#: Largest relative difference of the centres allowed, per GPU storage dtype.
TOLERANCE = {"float64": 1e-9, "float32": 1e-5}


def _load(directory: str) -> tuple:
    with open(os.path.join(directory, "summary.json")) as f:
        summary = json.load(f)
    labels = np.loadtxt(os.path.join(directory, "labels.txt"), dtype=np.int64, ndmin=1)
    centres = np.loadtxt(os.path.join(directory, "centers.csv"), delimiter=",", skiprows=1, ndmin=2)
    return labels, centres, summary


def compare(result_dir: str) -> dict:
    """The GPU runs in ``result_dir`` (``gpu_float64/``, ``gpu_float32/``) against its ``cpu_float64/`` run."""
    lc, cc, sc = _load(os.path.join(result_dir, "cpu_float64"))
    out = {"n": sc["n"], "m": sc["m"], "k": sc["k"], "ranks": sc["ranks"],
           "cpu": {"iterations": sc["iterations"], "inertia": sc["inertia"]}, "gpu": {}, "ok": True}
    for backend, dtype in RUNS[1:]:
        lg, cg, sg = _load(os.path.join(result_dir, f"{backend}_{dtype}"))
        same_shape = cg.shape == cc.shape and lg.shape == lc.shape
        rel = float(np.abs(cg - cc).max() / np.abs(cc).max()) if same_shape else float("inf")
        r = {"labels_identical": bool(same_shape and np.array_equal(lc, lg)), "centres_max_rel_diff": rel,
             "sizes_equal": sg["sizes"] == sc["sizes"], "iterations": sg["iterations"], "devices": sg["devices"],
             "backend": sg["backend"], "dtype": sg["dtype"]}
        r["ok"] = r["labels_identical"] and rel <= TOLERANCE[dtype] and r["sizes_equal"] and sg["backend"] == "gpu"
        r["line"] = (f"np={sc['ranks']} gpu {dtype} vs cpu float64: labels identical {r['labels_identical']}, "
                     f"centres max rel diff {rel:.2e} (tol {TOLERANCE[dtype]:g}), iterations {r['iterations']} vs "
                     f"{sc['iterations']}, devices {r['devices']}: {'OK' if r['ok'] else 'MISMATCH'}")
        out["gpu"][dtype] = r
        out["ok"] &= r["ok"]
    return out


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("result_dir")
    p.add_argument("--np", type=int, default=2, help="ranks of every run  [%(default)s]")
    p.add_argument("-n", type=int, default=2_000_000)
    p.add_argument("-m", type=int, default=20)
    p.add_argument("-k", type=int, default=12)
    p.add_argument("--seed", type=int, default=3, help="gen-data's seed  [%(default)s]")
    p.add_argument("--run-args", default="", help="more options of every run, e.g. '--chunk-rows 100000'")
    p.add_argument("--compare-only", action="store_true", help="compare the runs already in RESULT_DIR")
    p.add_argument("--timeout", type=float, default=1800)
    a = p.parse_args(argv)
    if min(a.np, a.n, a.m, a.k) < 1 or a.k > a.n:
        p.error("--np, -n, -m and -k at least 1, and -k at most -n")
    from mpikmeans.bench.harness import Launch, result_document, write_result
    from mpikmeans.errors import RunError

    os.makedirs(a.result_dir, exist_ok=True)
    launch = Launch(timeout_s=a.timeout)
    try:
        if not a.compare_only:
            data = os.path.join(a.result_dir, "data.arff")
            launch.mpi(1, "gen-data", data, "-n", a.n, "-m", a.m, "-k", a.k, "--seed", a.seed, "-q")
            for backend, dtype in RUNS:
                ran = launch.mpi(a.np, "run", data, "-k", a.k, "--seed", 5, "--backend", backend, "--dtype", dtype,
                                 "-o", os.path.join(a.result_dir, f"{backend}_{dtype}"), "--overwrite", "-q",
                                 *shlex.split(a.run_args))
                print(f"np={a.np} {backend} {dtype}: {ran.wall_s:.1f} s", flush=True)
            os.remove(data)
        results = compare(a.result_dir)
    except RunError as exc:
        print(f"parity: {exc.message}", file=sys.stderr)
        return 1
    except (OSError, ValueError, KeyError) as exc:
        print(f"parity: {a.result_dir}: not three finished runs ({exc})", file=sys.stderr)
        return 2
    settings = {k: v for k, v in vars(a).items() if k != "result_dir"}
    write_result(os.path.join(a.result_dir, "parity.json"),
                 result_document("parity", "python bench/parity.py " + shlex.join(argv), settings, results))
    for r in results["gpu"].values():
        print(r["line"])
    return 0 if results["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
