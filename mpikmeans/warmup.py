"""Compile every kernel a run needs ahead of the run, and say whether the caches are warm.

``mpikmeans warmup`` (a PBS/Slurm prologue, ``make run``) runs a tiny job through
the real code paths, so that Numba compiles and caches every CPU kernel (the
parser, the writers, the CPU backend, every initialisation), and, with a GPU, the
GPU kernels for the shape of the coming run (their specialisation depends on K,
M, the dtype and whether the rank's rows need 64-bit indices).  A run that finds
everything in the caches spends no time compiling (see :mod:`mpikmeans.cache`).
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time

import numpy as np

from .cache import cache_root, numba_cache_dir


def default_trials(k: int) -> int:
    """k-means++ candidates per centre by default (scikit-learn's ``2 + int(ln k)``)."""
    return 2 + int(np.log(k))


def warm_cpu(threads: int = 1) -> float:
    """Compile (or load) every CPU kernel through a tiny job in a temporary directory.

    Returns
    -------
    float
        Seconds it took.
    """
    from .comm import SerialComm
    from .config import RunConfig
    from .io.binary import convert
    from .io.gen import GenSpec, prepare, write_blobs
    from .runner import run_job

    t0 = time.perf_counter()
    comm = SerialComm()
    tmp = tempfile.mkdtemp(prefix="mpikmeans-warmup-")
    try:
        data = os.path.join(tmp, "warm.arff")
        prepare(comm)
        write_blobs(GenSpec(n=600, m=3, k=3, seed=1), data, comm)
        for init, write_arff in (("k-means++", True), ("k-means||", False)):
            cfg = RunConfig(k=3, init=init, backend="cpu", threads=threads, output_dir=os.path.join(tmp, init),
                            overwrite=True, write_arff=write_arff).validate()
            run_job(comm, data, cfg)
        convert(comm, data, os.path.join(tmp, "warm.npy"), threads=threads)
        cfg = RunConfig(k=3, backend="cpu", threads=threads, output_dir=os.path.join(tmp, "npy"),
                        overwrite=True).validate()
        run_job(comm, os.path.join(tmp, "warm.npy"), cfg)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return time.perf_counter() - t0


def needs_idx64(m: int, rows: int) -> bool:
    """Whether a rank's ``rows`` x ``m`` block needs 64-bit indices on the GPU (as the backend decides)."""
    from .backends.gpu.plan import round_up

    return m * round_up(max(rows, 1), 32) >= 2**31


def warm_gpu(k: int, m: int, dtype: str = "float64", rows: int = 1, device: int = 0,
             trials: int | None = None) -> float:
    """Compile (or load) the GPU kernels of a run with ``k`` centres of ``m`` attributes.

    Parameters
    ----------
    k, m : int
    dtype : {"float64", "float32"}
    rows : int
        Rows of the largest rank of the coming run (only whether they need 64-bit
        indices matters).
    device : int
    trials : int, optional
        k-means++ candidates per centre (default :func:`default_trials`).

    Returns
    -------
    float
        Seconds it took.
    """
    from .backends.gpu import GPUBackend
    from .exact import fixed_scale

    t0 = time.perf_counter()
    backend = GPUBackend(device=device, dtype=dtype, tune={"idx64": needs_idx64(m, rows)})
    r = np.random.default_rng(0)
    x = r.normal(size=(max(64, 2 * k), m))
    backend.load(x)
    backend.warmup(k, m)  # the step's, the incremental step's and the final assignment's kernels
    # the initialisations' passes
    d2 = backend.dist2_to(x[0])
    s = fixed_scale(backend.d2_max(d2, None))
    backend.potentials(d2, x[: trials or default_trials(k)], None, s)
    backend.d2_fixed(d2, None, s)
    backend.lower_d2(d2, x[1])
    backend.nearest(x[:3])
    backend.close()
    return time.perf_counter() - t0


#: CPU kernels whose presence in Numba's cache says the reader and the CPU backend are warm.
def _cpu_kernels() -> list:
    from .backends import cpu
    from .io import rowparse, textfmt

    return [rowparse.parse_rows, rowparse.parse_parallel, rowparse.column_min_max, rowparse.line_cuts,
            textfmt._write_fixed, cpu._lloyd_pass, cpu._assign_pass]


def cache_status() -> dict:
    """What the caches hold for this version of the package.

    Returns
    -------
    dict
        ``root`` (the cache directory), ``numba_dir``, ``cpu_kernels_cached`` and
        ``cpu_kernels`` (how many of the main CPU kernels are in Numba's cache),
        ``gpu_kernels`` (compiled GPU kernels stored, all devices and versions).
    """
    out = {"root": cache_root(), "numba_dir": os.environ.get("NUMBA_CACHE_DIR") or numba_cache_dir()}
    kernels = _cpu_kernels()
    cached = 0
    for disp in kernels:
        try:
            cached += bool(disp._cache._cache_file._load_index())
        except Exception:  # Numba internals moved: report unknown as not cached
            pass
    out["cpu_kernels"] = len(kernels)
    out["cpu_kernels_cached"] = cached
    try:
        from .backends.gpu.compiled import cached_entries

        out["gpu_kernels"] = cached_entries()
    except ImportError:
        out["gpu_kernels"] = 0
    return out
