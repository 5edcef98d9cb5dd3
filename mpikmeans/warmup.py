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
import sys
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


#: The GPU kernels of a run's shape, in parts compiled side by side: the Lloyd step's three
#: kernel pairs (full step, final assignment, incremental step), the initialisations' passes, and
#: the rows' sums by label a GPU run's fixed-point centres are summed again with on the CPU (``fixed``:
#: no GPU needed; in the rest, the longest helper of a cold run, they took about a third of it).
GPU_PARTS = ("full", "assign", "delta", "init", "fixed")
#: The CPU backend's kernels, in parts compiled side by side: the Lloyd step and final assignment,
#: and the initialisations' passes.
CPU_PARTS = ("step", "init")
#: What a cold run's helper processes compile (``mpikmeans warmup --part``), each part in a
#: process of its own: ``rest`` the CPU kernels of every run besides the reader's and the
#: backend's, ``cpu-*`` the CPU backend's, ``gpu-*`` the GPU kernels of the run's shape.
HELPER_PARTS = ("rest",) + tuple(f"cpu-{p}" for p in CPU_PARTS) + tuple(f"gpu-{p}" for p in GPU_PARTS)


def warm_rest(threads: int = 1) -> float:
    """Compile (or load) the CPU kernels every run needs besides the reader's and the backend's.

    The reader's small kernels, the statistics, the ``.npy`` scan, the exact
    sums the initialisations draw with, the serial kernels and the writer, on tiny
    arrays (a GPU run's final sums: :func:`warm_fixed`).  A cold run starts this in a helper
    process (:class:`mpikmeans.runner.BackgroundCompile`) while it compiles the
    parser itself.

    Returns
    -------
    float
        Seconds it took.
    """
    import numba

    from .backends.serial import SerialRows, weighted_lloyd
    from .comm import SerialComm
    from .exact import column_limb_sums, fixed_potential, scale_factors
    from .io import rowparse
    from .io.binary import PAGE_VALUES, fault_in, scan_rows
    from .io.output import write_arrays

    t0 = time.perf_counter()
    numba.set_num_threads(max(1, min(threads, numba.config.NUMBA_NUM_THREADS)))
    x = np.random.default_rng(0).normal(size=(64, 3))
    text = np.frombuffer(b"1,2\n3,4\n", dtype=np.uint8).copy()
    rowparse.last_newline(text, 0)
    rowparse.line_cuts(text, 1)
    rowparse.column_min_max(x, 1)
    c = x[:3].copy()
    scales = np.zeros(3, dtype=np.int64)
    column_limb_sums(x, scales)
    column_limb_sums(x, scales, x[0])
    f1, f2 = scale_factors(0)
    fixed_potential(x[:, 0].copy(), x[:, 1].copy(), x[:0, 0].copy(), False, f1, f2)
    scan_rows(x, 1)
    fault_in(x.reshape(-1), PAGE_VALUES, 1)
    SerialRows(x).assign(c)
    weighted_lloyd(x, np.ones(len(x)), c.copy(), 2)
    tmp = tempfile.mkdtemp(prefix="mpikmeans-warmup-")
    try:
        write_arrays(SerialComm(), tmp, c, ["a", "b", "c"], np.zeros(len(x), dtype=np.int32))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return time.perf_counter() - t0


def warm_fixed() -> None:
    """Compile (or load) the rows' sums by label a GPU run's fixed-point centres are summed again
    with on the CPU (``lloyd._label_means``; their parallel reduction: the ``assign`` part of
    :func:`warm_gpu`)."""
    from .backends.cpu import label_sums

    x = np.random.default_rng(0).normal(size=(64, 3))
    label_sums(x, np.zeros(len(x), dtype=np.int32), 3)


def warm_cpu_backend(threads: int = 1, parts: tuple = CPU_PARTS) -> float:
    """Compile (or load) the CPU backend's kernels: its step and assignment, its initialisation passes.

    Parameters
    ----------
    threads : int
    parts : tuple of :data:`CPU_PARTS`

    Returns
    -------
    float
        Seconds it took.
    """
    from .backends.cpu import CPUBackend

    t0 = time.perf_counter()
    x = np.random.default_rng(0).normal(size=(64, 3))
    c = x[:3].copy()
    backend = CPUBackend(threads=threads)
    backend.load(x)
    if "step" in parts:
        backend.warmup(3, 3, every_plan=True)
        backend.step(c)
    if "init" in parts:
        d2 = backend.dist2_to(c[0])
        backend.potentials(d2, c, None, 0)
        backend.lower_d2(d2, c[1])
        backend.seed_screen = True  # the screened passes' float32 rows (the pass itself is one kernel)
        backend.potentials(d2, c, None, 0)
    return time.perf_counter() - t0


def needs_idx64(m: int, rows: int) -> bool:
    """Whether a rank's ``rows`` x ``m`` block needs 64-bit indices on the GPU (as the backend decides)."""
    # the backend's row stride: rows rounded up to 32 (backends/gpu/plan.round_up, not
    # imported here: this is asked before numba-cuda is)
    return m * (-(-max(rows, 1) // 32) * 32) >= 2**31


def gpu_warm_tune(m: int, rows: int, dtype: str, free_memory: int) -> dict:
    """The kernel overrides that make a warm-up on a few rows compile what a run on ``rows`` rows
    (its largest rank's) of ``m`` attributes launches: 64-bit indices as that run needs them, and
    its full step's plan, the split step (pass 1, the sums kernel, the kept bounds' kernels) where
    its rows are resident (as :meth:`mpikmeans.backends.gpu.rows.DeviceRows.load` decides, from
    ``free_memory`` bytes) and many enough (:data:`mpikmeans.backends.gpu.plan.SPLIT_MIN_VALUES`).
    A warm-up on its own few rows would compile the fused kernel's summing plan instead.  Resident
    rows fewer than that: the backend's own rule, which takes the split step where it is one kernel
    (as it does for the run's rows: it does not depend on their number); streamed rows: no split.
    """
    from .backends.gpu.plan import SPLIT_MIN_VALUES

    row_bytes = m * (8 if dtype == "float64" else 4) + 8
    resident = rows * row_bytes <= 0.8 * free_memory
    tune = {"idx64": needs_idx64(m, rows)}
    if not resident or m * rows >= SPLIT_MIN_VALUES:
        tune["split"] = resident
    return tune


def warm_gpu(k: int, m: int, dtype: str = "float64", rows: int = 1, device: int = 0,
             trials: int | None = None, parts: tuple = GPU_PARTS) -> float:
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
    parts : tuple of :data:`GPU_PARTS`
        Which kernels: the Lloyd step's (``full``, ``assign``, ``delta``: see
        :meth:`mpikmeans.backends.gpu.GPUBackend.warmup`), the
        initialisations' passes (``init``) and the fixed point's CPU sums by label (``fixed``,
        :func:`warm_fixed`: no GPU context for it alone).

    Returns
    -------
    float
        Seconds it took.
    """
    from .backends.gpu import GPUBackend
    from .exact import fixed_scale

    t0 = time.perf_counter()
    if "fixed" in parts:
        warm_fixed()
    if not set(parts) - {"fixed"}:
        return time.perf_counter() - t0
    backend = GPUBackend(device=device, dtype=dtype)
    backend.tune.update(gpu_warm_tune(m, rows, dtype, backend.limits.free_memory()))
    r = np.random.default_rng(0)
    x = r.normal(size=(max(64, 2 * k), m))
    backend.load(x)
    kinds = tuple(p for p in parts if p in backend.STEP_KINDS)
    if kinds:
        backend.warmup(k, m, kinds)
    if "assign" in parts:
        # the run's fixed-point centres are summed again on the CPU (lloyd._label_means), from K x M =
        # partials.REDUCE_CHUNK on by the parallel reduction: compiled here, beside the final assignment's
        # kernels, not inside the run (4 s of its Lloyd phase); with the sums by label in one helper, the two
        # parallel kernels took it to 17-18 s, the longest of a cold run (bench/GPU_NOTES.md v16)
        from .backends.cpu.partials import compile_reductions

        compile_reductions(np.zeros((2, k, m)), np.zeros((2, k)), np.zeros(2), np.zeros(2, dtype=np.int64))
    if "init" in parts:
        d2 = backend.dist2_to(x[0])
        s = fixed_scale(backend.d2_max(d2, None))
        backend.potentials(d2, x[: trials or default_trials(k)], None, s)
        backend.d2_fixed(d2, None, s)
        backend.lower_d2(d2, x[1])
        backend.nearest(x[:3])
    backend.close()
    return time.perf_counter() - t0


def _cached(dispatcher) -> bool:
    """Whether Numba's cache holds a compiled version of ``dispatcher`` (for this source)."""
    try:
        return bool(dispatcher._cache._cache_file._load_index())
    except Exception:  # Numba internals moved: take it as not cached
        return False


def rest_warm() -> bool:
    """Whether the kernels :func:`warm_rest` compiles are all in Numba's cache."""
    from .backends import serial
    from .exact import _column_limbs, fixed_potential
    from .io.binary import fault_in, scan_rows
    from .io.textfmt import _write_fixed

    kernels = [_column_limbs, fixed_potential, scan_rows, fault_in, serial._assign_serial, serial.weighted_lloyd,
               _write_fixed]
    return all(_cached(k) for k in kernels)


def _cpu_step_kernels() -> list:
    """The CPU backend's step and assignment kernels, each parallel pass with the block function it calls
    (Numba caches each apart; both search plans run them: :func:`.backends.cpu.backend.search_plan`), and
    both forms of the step's reduction."""
    from .backends.cpu import bounds, partials

    return [bounds.step_pass, bounds._step_block, bounds.assign_pass, bounds._assign_block, partials.reduce_serial,
            partials.reduce_parallel]


def cpu_backend_cold() -> list:
    """The parts of :data:`CPU_PARTS` whose kernels (:func:`warm_cpu_backend`) Numba's cache lacks."""
    from .backends.cpu import seeding, tiles

    kernels = {"step": _cpu_step_kernels(), "init": [seeding.potentials_pass, seeding.shifted_rows, tiles._tile_dist2]}
    return [p for p in CPU_PARTS if not all(_cached(k) for k in kernels[p])]


def data_shape(data: str, ranks: int = 1) -> tuple:
    """(M, rows of the largest rank) of a run on ``data``: the ``.npy``'s shape, or the ARFF's
    numeric attributes and its first rank's rows as :func:`mpikmeans.io.split.plan_local` estimates them."""
    if data.endswith(".npy"):
        from .io.binary import npy_layout

        (n, m), _, _ = npy_layout(data)
        return m, -(-n // ranks)
    from .io.header import read_header
    from .io.split import plan_local

    header = read_header(data)
    m = sum(1 for a in header.attributes if a.kind == "numeric")
    return m, plan_local(data, header, 0, ranks)["rows"]


#: CPU kernels whose presence in Numba's cache says the reader and the CPU backend are warm.
def _cpu_kernels() -> list:
    from .io import rowparse, textfmt

    return [rowparse.parse_rows, rowparse._min_max_rows, rowparse._combine_min_max, rowparse.span_cuts,
            textfmt._write_fixed, *_cpu_step_kernels()]


def bytecode_status() -> dict:
    """Whether Python finds this package byte-compiled, or compiles its sources in every process.

    An installation without ``.pyc`` files in an environment that forbids writing
    them (``PYTHONDONTWRITEBYTECODE``, as some images set) compiles every module of
    numpy, numba and this package again at each start: a second of every run on the
    project's GPU machines, and compiles hold the GIL, which slowed the read beside
    the GPU's start.

    Returns
    -------
    dict
        ``cached`` (this package's modules have bytecode: always, once imported, unless
        Python may not write it), ``writes`` (Python writes it where it is missing),
        ``prefix`` (``PYTHONPYCACHEPREFIX``, or None).
    """
    import importlib.util

    from . import runner

    cached = os.path.exists(importlib.util.cache_from_source(runner.__file__))
    return {"cached": cached, "writes": not sys.dont_write_bytecode, "prefix": sys.pycache_prefix}


def cache_status() -> dict:
    """What the caches hold for this version of the package.

    Returns
    -------
    dict
        ``root`` (the cache directory), ``numba_dir``, ``cpu_kernels_cached`` and
        ``cpu_kernels`` (how many of the main CPU kernels are in Numba's cache),
        ``gpu_kernels`` (compiled GPU kernels stored, all devices and versions),
        ``bytecode`` (:func:`bytecode_status`).
    """
    out = {"root": cache_root(), "numba_dir": os.environ.get("NUMBA_CACHE_DIR") or numba_cache_dir(),
           "bytecode": bytecode_status()}
    kernels = _cpu_kernels()
    cached = sum(_cached(disp) for disp in kernels)
    out["cpu_kernels"] = len(kernels)
    out["cpu_kernels_cached"] = cached
    try:
        from .backends.gpu.compiled import cached_entries

        out["gpu_kernels"] = cached_entries()
    except ImportError:
        out["gpu_kernels"] = 0
    return out
