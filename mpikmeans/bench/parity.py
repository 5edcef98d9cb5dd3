"""``mpikmeans bench parity``: the GPU and CPU backends through the real command line, under mpirun.

On one file made by ``gen-data``, ``mpikmeans run`` runs three times on the same
ranks: the CPU backend (float64), the GPU backend with float64 storage and with
float32 storage (each rank its node-local GPU).  :func:`compare_runs` then checks
that the labels are identical, the centres equal within 1e-9 relative (float64
on the GPU; 1e-5 for float32) and the cluster sizes equal, and reports the SSE,
the iterations and the devices.  Under ``NUMBA_ENABLE_CUDASIM=1`` with
``--share-gpus`` it runs without a GPU (small data: the simulator is slow).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field

import numpy as np

from ..errors import UsageError
from .data import gen_arff
from .harness import Launch, Progress, quiet

#: (backend, dtype) of each run, the CPU one first: it is the reference.
RUNS = (("cpu", "float64"), ("gpu", "float64"), ("gpu", "float32"))
#: Largest relative difference of the centres allowed, per GPU storage dtype.
TOLERANCE = {"float64": 1e-9, "float32": 1e-5}


@dataclass
class ParitySettings:
    """What ``bench parity`` runs (the options of the command; the script's defaults)."""

    np: int = 2
    n: int = 2_000_000
    m: int = 20
    k: int = 12
    seed: int = 3
    data: str = "/tmp/gpu_cpu_parity.arff"
    run_args: list = field(default_factory=list)

    def check(self) -> None:
        """Raise :class:`UsageError` for settings that cannot run."""
        if min(self.np, self.n, self.m, self.k) < 1 or self.seed < 0:
            raise UsageError("bench parity: --np, -n, -m and -k must be at least 1, --seed at least 0")
        if self.k > self.n:
            raise UsageError(f"bench parity: -k {self.k} is more than the {self.n} rows")


def run_dir(result_dir: str, backend: str, dtype: str) -> str:
    """Where the run of ``backend`` with ``dtype`` writes its results."""
    return os.path.join(result_dir, f"{backend}_{dtype}")


def run_parity(s: ParitySettings, result_dir: str, launch: Launch, progress: Progress = quiet) -> dict:
    """Generate the data, run the three runs, compare them (see :func:`compare_runs`)."""
    s.check()
    os.makedirs(result_dir, exist_ok=True)
    fig = gen_arff(launch, 1, s.data, s.n, s.m, s.k, "--seed", s.seed)
    progress(f"generated {s.data}: {fig['bytes'] / 1e6:.1f} MB")
    for backend, dtype in RUNS:
        ran = launch.mpi(s.np, "run", s.data, "-k", s.k, "--seed", 5, "--backend", backend, "--dtype", dtype,
                         "-o", run_dir(result_dir, backend, dtype), "--overwrite", "-q", *s.run_args)
        progress(f"np={s.np} {backend} {dtype}: {ran.wall_s:.1f} s")
    return compare_runs(result_dir, s.np)


def _load(directory: str) -> tuple:
    try:
        with open(os.path.join(directory, "summary.json")) as f:
            summary = json.load(f)
        labels = np.loadtxt(os.path.join(directory, "labels.txt"), dtype=np.int64, ndmin=1)
        centres = np.loadtxt(os.path.join(directory, "centers.csv"), delimiter=",", skiprows=1, ndmin=2)
    except (OSError, ValueError) as exc:
        raise UsageError(f"bench parity: {directory}: not a finished run ({exc})") from None
    return labels, centres, summary


def compare_runs(result_dir: str, ranks: int | None = None) -> dict:
    """The GPU runs in ``result_dir`` against its CPU run.

    Parameters
    ----------
    result_dir : str
        Holds ``cpu_float64/``, ``gpu_float64/`` and ``gpu_float32/``, each the
        output directory of one ``mpikmeans run``.
    ranks : int, optional
        Recorded as ``ranks`` (default: the CPU run's).

    Returns
    -------
    dict
        ``ranks``, ``n``, ``m``, ``k``, ``cpu`` (iterations, inertia, devices),
        ``gpu`` per dtype (``labels_identical``, ``centres_max_rel_diff``,
        ``inertia_rel_diff``, ``sizes_equal``, ``iterations``, ``devices``,
        ``backend``, ``dtype``, ``per_iteration_s``, ``ok``, ``line``), ``ok``.

    Raises
    ------
    UsageError
        A run is missing or unfinished.
    """
    lc, cc, sc = _load(run_dir(result_dir, *RUNS[0]))
    out = {"ranks": ranks if ranks is not None else sc.get("ranks"), "n": sc["n"], "m": sc["m"], "k": sc["k"],
           "cpu": {"iterations": sc["iterations"], "inertia": sc["inertia"], "devices": sc["devices"]}, "gpu": {}}
    ok = True
    for backend, dtype in RUNS[1:]:
        lg, cg, sg = _load(run_dir(result_dir, backend, dtype))
        tol = TOLERANCE[dtype]
        same_shape = cg.shape == cc.shape and lg.shape == lc.shape
        rel = float(np.abs(cg - cc).max() / np.abs(cc).max()) if same_shape else float("inf")
        r = {"labels_identical": bool(same_shape and np.array_equal(lc, lg)), "centres_max_rel_diff": rel,
             "inertia_rel_diff": abs(sg["inertia"] - sc["inertia"]) / sc["inertia"] if sc["inertia"] else 0.0,
             "sizes_equal": sg["sizes"] == sc["sizes"], "iterations": sg["iterations"], "devices": sg["devices"],
             "backend": sg["backend"], "dtype": sg["dtype"], "per_iteration_s": sg["timings"]["per_iteration_s"]}
        r["ok"] = r["labels_identical"] and rel <= tol and r["sizes_equal"] and sg["backend"] == "gpu"
        r["line"] = (f"np={out['ranks']} gpu {dtype} vs cpu float64: labels identical {r['labels_identical']}, "
                     f"centres max rel diff {rel:.2e} (tol {tol:g}), inertia rel diff {r['inertia_rel_diff']:.2e}, "
                     f"iterations {r['iterations']} vs {sc['iterations']}, devices {r['devices']}: "
                     f"{'OK' if r['ok'] else 'MISMATCH'}")
        ok &= r["ok"]
        out["gpu"][dtype] = r
    out["ok"] = ok
    return out
