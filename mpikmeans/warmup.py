"""Compile every kernel ahead of any run, and say what is warm.

Every kernel's shape is a run-time argument, so what a machine must compile is
a finite set, known before any data: ``mpikmeans warmup`` compiles all of it
once per machine type (the caches of :mod:`mpikmeans.cache`), and a run then
loads it in milliseconds.  Each part runs the real code on tiny data, so every
signature a run uses is compiled and no list of kernels has to follow the code:

=================  ==============================================================  ==========================
part               what it runs                                                    what it compiles
=================  ==============================================================  ==========================
``cpu``            ``convert`` of an ARFF file, then (once its pieces below are    the parser, the writers,
                   done) small jobs through :func:`mpikmeans.runner.run_job`:      the statistics and exact
                   ARFF, CSV and ``.npy`` input, weights and a missing value,      sums, whatever the pieces
                   every initialisation, ``--write-arff``, ``--normalize``,        left
                   ``--nominal weka``
``cpu-lloyd``      a piece of ``cpu``: the CPU backend's ``warmup``                the step, the assignment,
                                                                                   the sums
``cpu-host``       a piece of ``cpu``: k-means++ and k-means|| on the CPU          the seeding's passes, the
                   backend, and the quality scores, on rows in memory              scores' passes
``gpu-float64``,   the GPU backend's kernels of that dtype and a small GPU job     the GPU kernels, the host
``gpu-float32``                                                                    kernels of a GPU run
=================  ==============================================================  ==========================

The ``cpu`` part starts its two pieces, each in a process of its own, before
its own work: the longest compiles of the part (the step's and the seeding's
kernels take seconds each, and one process compiles one kernel at a time) run
beside each other and beside the parser's.  Processes that compile the same
kernel do the work twice but save it safely (:func:`mpikmeans.cache.harden_numba_cache`).
A part that finishes marks itself warm (:func:`mpikmeans.cache.mark_warm`); a
piece marks nothing, its part does.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time

import numpy as np

from .backends.cpu import CPUBackend
from .cache import CPU_HELPERS, CPU_PART, GPU_PARTS, PARTS, gpu_part, mark_warm, warming, warmup_command
from .comm import LAUNCHER_VARIABLES, SerialComm
from .config import RunConfig
from .io.formats import convert
from .io.gen import GenSpec, prepare, write_blobs
from .init import initial_centres
from .runner import run_job
from .scores import quality_scores


def parts_for(gpu: bool) -> tuple:
    """The parts this machine needs: the CPU kernels, and with a GPU both dtypes' GPU kernels."""
    return PARTS if gpu else (CPU_PART,)


def _job(data: str, out: str, **settings) -> None:
    cfg = RunConfig(output_dir=out, overwrite=True, max_iter=5, **settings).validate()
    run_job(SerialComm(), data, cfg)


#: seconds the cpu part waits for one of its pieces (many times what compiling a piece takes) before it
#: stops it and compiles the piece's kernels itself
PIECE_TIMEOUT_S = 600


def _start_pieces(pieces) -> list:
    """Start each piece's process (``mpikmeans warmup --part PIECE``); those that cannot start are left out."""
    env = {k: v for k, v in os.environ.items() if k not in LAUNCHER_VARIABLES}  # jobs of one, no MPI
    procs = []
    for piece in pieces:
        try:
            procs.append(subprocess.Popen(warmup_command(piece), env=env, stdout=subprocess.DEVNULL,
                                          stderr=subprocess.DEVNULL))
        except OSError:  # the part's own jobs compile what the piece would have
            pass
    return procs


def _warm_lloyd(threads: int) -> None:
    CPUBackend(threads=threads).warmup(3, 3)


def _warm_host(threads: int) -> None:
    comm = SerialComm()
    rng = np.random.default_rng(1)
    x = rng.normal(size=(300, 3)) + np.repeat(np.eye(3) * 8, 100, axis=0)
    for weights in (None, np.ones(len(x))):
        backend = CPUBackend(threads=threads)
        backend.load(x, weights)
        for init in ("k-means++", "k-means||"):
            centres = initial_centres(comm, init, 3, x, 0, len(x), 1, weights=weights, backend=backend)
        labels, _ = backend.assign(centres)
        quality_scores(comm, x, labels, 3, weights=weights, centres=centres, sample_size=50, seed=1,
                       threads=threads)
        backend.close()


def _warm_cpu(tmp: str, threads: int) -> None:
    pieces = _start_pieces(CPU_HELPERS)
    comm = SerialComm()
    try:
        prepare(comm)
        arff = os.path.join(tmp, "warm.arff")
        write_blobs(GenSpec(n=600, m=3, k=3, seed=1), arff, comm)
        npy = os.path.join(tmp, "warm.npy")
        convert(comm, arff, npy, threads=threads)  # the parser's kernels, beside the pieces'
        for proc in pieces:
            try:
                proc.wait(timeout=PIECE_TIMEOUT_S)
            except subprocess.TimeoutExpired:  # stuck: the jobs below compile what it would have
                pass
    finally:  # a piece still running (stuck, or this part failed) is stopped: no process outlives its part
        for proc in pieces:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    for init in ("k-means++", "k-means||", "range", "sample"):
        _job(arff, os.path.join(tmp, init), k=3, init=init, backend="cpu", threads=threads,
             write_arff=init == "k-means++")
    _job(arff, os.path.join(tmp, "scaled"), k=3, backend="cpu", threads=threads, normalize="zscore")
    special = os.path.join(tmp, "special.arff")
    with open(special, "w", encoding="utf-8") as f:
        f.write("@relation r\n@attribute a numeric\n@attribute b numeric\n@attribute c {x,y}\n@data\n")
        f.write("".join(f"{i % 7},{(i * 3) % 5},{'xy'[i % 2]},{{{1 + i % 3}}}\n" for i in range(40)))
        f.write("?,1,x\n")
    _job(special, os.path.join(tmp, "special"), k=2, backend="cpu", threads=threads, missing="mean",
         nominal="weka")
    csv = os.path.join(tmp, "warm.csv")
    with open(csv, "w", encoding="utf-8") as f:
        f.write("a,b\n" + "".join(f"{i % 7}.5,{i % 3}\n" for i in range(50)))
    _job(csv, os.path.join(tmp, "csv"), k=2, backend="cpu", threads=threads)
    _job(npy, os.path.join(tmp, "npy"), k=3, backend="cpu", threads=threads)


def _warm_gpu(tmp: str, dtype: str, threads: int) -> None:
    from .backends.gpu import GPUBackend

    backend = GPUBackend(dtype=dtype)
    backend.warmup(1, 1)
    backend.close()
    comm = SerialComm()
    prepare(comm)
    arff = os.path.join(tmp, "warm.arff")
    write_blobs(GenSpec(n=600, m=3, k=3, seed=1), arff, comm)
    for init in ("k-means++", "k-means||"):
        _job(arff, os.path.join(tmp, init), k=3, init=init, backend="gpu", dtype=dtype, threads=threads)


def warm_part(part: str, threads: int = 1) -> float:
    """Compile (or load) one part's kernels in this process and mark it warm; returns its seconds.

    Parameters
    ----------
    part : one of :data:`mpikmeans.cache.PARTS`, or a piece of the CPU part (:data:`mpikmeans.cache.CPU_HELPERS`:
        compiled, not marked)
    threads : int
    """
    if part not in PARTS + CPU_HELPERS:
        raise ValueError(f"unknown warm-up part {part!r}; expected one of {', '.join(PARTS + CPU_HELPERS)}")
    t0 = time.perf_counter()
    tmp = tempfile.mkdtemp(prefix="mpikmeans-warmup-")
    warming(True)
    try:
        if part == CPU_PART:
            _warm_cpu(tmp, threads)
        elif part == CPU_HELPERS[0]:
            _warm_lloyd(threads)
        elif part == CPU_HELPERS[1]:
            _warm_host(threads)
        else:
            _warm_gpu(tmp, part[len("gpu-"):], threads)
    finally:
        warming(False)
        shutil.rmtree(tmp, ignore_errors=True)
    seconds = time.perf_counter() - t0
    if part in PARTS:
        mark_warm(part, seconds)
    return seconds


def warm_parts(parts, jobs: int) -> dict:
    """Compile ``parts`` side by side, each in a process of its own (``mpikmeans warmup --part``).

    Returns
    -------
    dict
        part -> (seconds, error message or "")
    """
    env = {k: v for k, v in os.environ.items() if k not in LAUNCHER_VARIABLES}  # jobs of one, no MPI
    pending = list(parts)
    running, done = {}, {}
    while pending or running:
        while pending and len(running) < max(1, jobs):
            part = pending.pop(0)
            running[part] = (subprocess.Popen(warmup_command(part), env=env, stdout=subprocess.DEVNULL,
                                              stderr=subprocess.PIPE), time.perf_counter())
        for part, (proc, t0) in list(running.items()):
            if proc.poll() is not None:
                err = proc.stderr.read().decode(errors="replace").strip() if proc.returncode else ""
                done[part] = (time.perf_counter() - t0, err.splitlines()[-1] if err else "")
                del running[part]
        if running:
            time.sleep(0.2)
    return done


__all__ = ["GPU_PARTS", "PARTS", "gpu_part", "parts_for", "warm_part", "warm_parts"]
