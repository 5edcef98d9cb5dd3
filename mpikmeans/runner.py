"""One ``mpikmeans run`` from start to finish, on every rank (collective).

The order of the steps is chosen so that a run fails early and cheaply: the
output directory and the memory estimate are checked before the data is
parsed, the data before the backend takes it, and nothing is written to the
output directory before the clustering has finished.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import threading
import time
from dataclasses import dataclass

import numba
import numpy as np

from . import __version__
from .io.arff import read_arff, warm_up
from .io.header import shared_header
from .io.split import check_memory
from .backends import BackendUnavailable, cuda_simulator_requested, make_backend
from .checkpoint import Checkpointer, check_compatible, load
from .comm import LAUNCHER_VARIABLES, default_threads
from .errors import MpikmeansError, RunError, UsageError
from .faults import fault_point
from .interrupt import StopRequest
from .init import INIT_METHODS, check_centres
from .restarts import run_restarts
from .scaling import fit_scaler, global_means
from .io.output import (CENTERS, CLUSTERED, LABELS, SUMMARY, read_centres_csv, read_centres_fields, write_arrays,
                        write_summary)
from .io.wekaout import write_clustered_arff
from .nominal import Layout

log = logging.getLogger("mpikmeans")


@dataclass
class RunOutcome:
    """What the CLI reports.

    Attributes
    ----------
    summary : dict
        The content of summary.json (also for an interrupted run, unwritten).
    out_dir : str
    interrupted_by : str
        Signal name when a signal stopped the run, else "".
    checkpoint : str or None
        Where the state was saved.
    centres : ndarray, shape (k, m), or None
        Final centres in data units.
    full_means : ndarray, shape (m,), or None
        Mean of every attribute over all rows (Weka's "Full Data" column; a
        nominal attribute's block, its mode).
    layout : Layout or None
        Which columns are whose (see :mod:`mpikmeans.nominal`).
    """

    summary: dict
    out_dir: str
    interrupted_by: str = ""
    checkpoint: str | None = None
    centres: np.ndarray | None = None
    full_means: np.ndarray | None = None
    layout: Layout | None = None

    def table(self) -> list:
        """Weka's centroid table: the "Full Data" row, then one row per centre, of attribute
        values (a nominal attribute's category name, else a float)."""
        return self.layout.decode(np.vstack([self.full_means, self.centres]))


def default_output_dir(data: str) -> str:
    """DATA's path without its extension, plus ``.mpikmeans``."""
    return os.path.splitext(data)[0] + ".mpikmeans"


def prepare_output_dir(comm, out_dir: str, overwrite: bool) -> None:
    """Check, before any work, that results can be written and none would be lost (collective).

    Raises
    ------
    UsageError
        Results are already there and ``overwrite`` is False.
    RunError
        The directory cannot be created or written.
    """
    error = None
    if comm.rank == 0:
        present = [f for f in (CENTERS, LABELS, SUMMARY, CLUSTERED) if os.path.exists(os.path.join(out_dir, f))]
        if present and not overwrite:
            error = UsageError(f"{out_dir} already holds results ({', '.join(present)}); "
                               "pass --overwrite or choose another --output-dir")
        else:
            probe = os.path.join(out_dir, f".probe-{os.getpid()}")
            try:
                os.makedirs(out_dir, exist_ok=True)
                with open(probe, "wb"):
                    pass
                os.unlink(probe)
            except OSError as exc:
                error = RunError(f"{out_dir}: cannot write results there: {exc.strerror}")
    comm.agree(error)


def gpu_possible() -> bool:
    """Cheap test before importing numba-cuda (slow): is there an NVIDIA device node or the simulator?"""
    return cuda_simulator_requested() or os.path.exists("/dev/nvidiactl")


def gpu_wanted(cfg) -> bool:
    """Whether the run may have a GPU backend: ``gpu``, or ``auto`` on a node with NVIDIA devices."""
    return cfg.backend == "gpu" or (cfg.backend == "auto" and gpu_possible())


class DevicePreparation:
    """The GPU's one-time start (numba-cuda's import, the driver, the device context), begun early.

    It takes the better part of a second and needs nothing from the data, so a
    thread starts it as the read begins, which runs in compiled code without the
    GIL: by the time the rows are there, the device is ready for them.  (Started
    before the reader's own start-up, loading its kernels, the two took turns at
    the GIL: a second of start-up on the H100 machine.)  Nothing is started when
    the backend is ``cpu``, or ``auto`` on a node without NVIDIA devices.

    Parameters
    ----------
    comm : Comm or SerialComm
    cfg : RunConfig
    """

    def __init__(self, comm, cfg):
        self.device = None
        self.error = None
        self.reason = ""  # why there is no device, when there is none
        self._thread = None
        if not gpu_wanted(cfg):
            return
        self._thread = threading.Thread(target=self._prepare, args=(comm.node_rank, comm.node_size, cfg),
                                        name="mpikmeans-gpu-start", daemon=True)
        self._thread.start()

    def _prepare(self, node_rank: int, node_size: int, cfg) -> None:
        try:
            from .backends.gpu.device import cuda, gpu_available, select_device_for
        except ImportError as exc:  # auto falls back (and says why); gpu says why in make_backend
            self.reason = f"numba-cuda cannot be imported ({exc})"
            return
        try:
            if cfg.backend == "gpu" or gpu_available():
                self.device = select_device_for(node_rank, node_size, cfg.share_gpus)
                cuda.select_device(self.device)  # the primary context: the main thread's use finds it made
            else:
                from numba.cuda.cudadrv.driver import driver

                detail = getattr(driver, "initialization_error", None)
                self.reason = "no usable CUDA device" + (f" ({detail})" if detail else "")
        except Exception as exc:  # reported where the backend is made, in the main thread
            self.error = exc

    def result(self) -> int | None:
        """The device of this rank (None: no GPU); raises what the preparation met."""
        if self._thread is not None:
            self._thread.join()
        if self.error is not None:
            raise self.error
        return self.device


class BackgroundCompile:
    """A cold run's other kernels, compiled in helper processes while this one compiles the parser.

    On a machine whose caches do not hold this version's kernels, a run compiles
    the reader's (in this process, before it reads), then the rest: the
    statistics, initialisation and writer kernels, the CPU backend's or the GPU
    kernels of the run's shape, one after the other.  Started here, helper
    processes on one rank per node (node-local rank 0) compile the rest at the
    same time, into the same caches: each part of
    :data:`mpikmeans.warmup.HELPER_PARTS` that is cold in a process of its own
    (also on two cores: the parser's compile ends first, and the parts then share
    the cores instead of waiting for each other).  The ranks wait for them after
    the read, then load every kernel.  Nothing is started when the caches are warm.

    Parameters
    ----------
    comm : Comm or SerialComm
    data : str
    cfg : RunConfig
    gpu : bool
        Whether this run's backend will be a GPU.
    """

    def __init__(self, comm, data: str, cfg, gpu: bool):
        self.procs = []
        #: wall seconds of each helper, by part (filled by :meth:`wait`)
        self.seconds = {}
        self._watchers = []
        self.comm = comm
        if comm.node_rank != 0:
            return
        cold = self._cold(data, cfg, gpu, comm.size)
        if not cold:
            return
        args = [sys.executable, "-m", "mpikmeans", "warmup", data, "-k", str(cfg.k), "--dtype", cfg.dtype,
                "--gpu" if gpu else "--no-gpu", "-q"]
        rows = self._rows(data, comm.size) if any(p.startswith("gpu") for p in cold) else None
        if rows:
            args += ["--rows", str(rows)]
        env = {k: v for k, v in os.environ.items() if k not in LAUNCHER_VARIABLES}  # jobs of one, no MPI
        for part in cold:
            try:
                proc = subprocess.Popen(args + ["--part", part], env=env, stdout=subprocess.DEVNULL,
                                        stderr=subprocess.PIPE)
            except OSError:
                continue
            self.procs.append(proc)
            watcher = threading.Thread(target=self._watch, args=(part, proc, time.perf_counter()), daemon=True,
                                       name=f"mpikmeans-compile-{part}")
            watcher.start()
            self._watchers.append(watcher)
            log.info("kernel caches are cold: compiling the run's %s kernels in process %d", part, proc.pid)

    def _watch(self, part: str, proc, t0: float) -> None:
        _, err = proc.communicate()
        self.seconds[part] = time.perf_counter() - t0
        if proc.returncode != 0:  # the run compiles what is missing itself
            log.info("background compile of %s ended with %d: %s", part, proc.returncode, (err or b"")[-400:])

    @property
    def proc(self):
        """The first helper process (None when the caches were warm)."""
        return self.procs[0] if self.procs else None

    @staticmethod
    def _rows(data: str, size: int) -> int | None:
        if data.endswith(".npy"):
            return None  # the warm-up reads the shape itself
        try:
            from .io.header import read_header
            from .io.split import plan_local

            return plan_local(data, read_header(data), 0, size)["rows"]
        except Exception:  # the run reports a bad file itself
            return None

    @staticmethod
    def _cold(data: str, cfg, gpu: bool, size: int) -> list:
        """The parts of :data:`mpikmeans.warmup.HELPER_PARTS` this run needs and the caches lack."""
        from .warmup import GPU_PARTS, cpu_backend_cold, rest_warm

        cold = [] if rest_warm() else ["rest"]
        if not gpu:
            return cold + [f"cpu-{p}" for p in cpu_backend_cold()]
        if cfg.k is None or cuda_simulator_requested():  # the simulator compiles no kernels
            return cold
        try:
            from .cache import gpu_shape_key, gpu_shape_warm
            from .warmup import data_shape, needs_idx64

            m, rows = data_shape(data, size)
            if not gpu_shape_warm(gpu_shape_key(cfg.k, m, cfg.dtype, needs_idx64(m, rows))):
                cold += [f"gpu-{p}" for p in GPU_PARTS]
        except Exception:  # a file the run will report itself
            pass
        return cold

    def stop(self) -> None:
        """End the compiling processes (the run failed before it needed the kernels)."""
        for proc in self.procs:
            if proc.poll() is None:
                proc.terminate()
        for watcher in self._watchers:
            watcher.join()

    def wait(self) -> None:
        """Wait (collective) until this node's compiling processes, if any, are done."""
        for watcher in self._watchers:
            watcher.join()
        self.comm.barrier()


def _make_backend(cfg, threads: int, device: int | None, reason: str = "", node_ranks: int = 1):
    options = {"threads": threads, "dtype": cfg.dtype, "chunk_rows": cfg.chunk_rows, "node_ranks": node_ranks}
    if device is None:
        if cfg.backend == "auto" and reason:  # a node with NVIDIA devices, but none usable
            log.warning("--backend auto: the GPU cannot be used (%s); running on the CPU", reason)
        return make_backend("cpu" if cfg.backend == "auto" else cfg.backend, **options)
    return make_backend(cfg.backend, device=device, **options)


def _init_for(comm, cfg, local, scaler):
    """What :func:`run_restarts` starts from: a method name, or the centres of ``--init FILE`` (scaled).

    With nominal attributes clustered, the file gives their categories by name
    (as centers.csv writes them).
    """
    k, m = cfg.k, local.m
    if k > local.n:
        raise UsageError(f"-k {k} is more than the {local.n} rows of {local.path}", collective=True)
    if cfg.init in INIT_METHODS:
        return cfg.init
    layout = local.layout

    def read_file():
        try:
            if layout.has_nominal:
                rows, _ = read_centres_fields(cfg.init, local.names)
                centres = layout.encode([fields for _, fields in rows])
            else:
                centres = read_centres_csv(cfg.init, local.names)[0]
            return check_centres(centres, k, m, cfg.init)
        except (ValueError, OSError) as exc:
            raise UsageError(f"--init {cfg.init}: {exc}") from None
        except MpikmeansError as exc:  # wrong shape: a usage error of this run
            raise UsageError(exc.message) from None

    return scaler.transform(comm.from_root(read_file))  # the file is in data units


def _binding_settings(cfg, local) -> dict:
    return {"data": os.path.abspath(local.path), "data_size": local.header.file_size, "n": local.n,
            "m": local.m, "k": cfg.k, "tol": cfg.tol, "empty_cluster": cfg.empty_cluster,
            "init": cfg.init, "seed": cfg.seed, "normalize": cfg.normalize, "nominal": cfg.nominal}


def _resume_state(comm, cfg, settings: dict):
    def read_checkpoint():
        state, saved = load(cfg.resume)
        check_compatible(cfg.resume, saved, settings)
        return state

    return comm.from_root(read_checkpoint)


def dry_run(comm, data: str, cfg) -> list:
    """Per-rank estimates without parsing the data (collective).

    Returns
    -------
    list of dict
        One per rank: rank, host, byte range, bytes, estimated rows, host
        memory and device memory estimates, available memory.
    """
    from .io.split import available_memory, plan_local

    header = shared_header(data, comm)
    plan = plan_local(data, header, comm.rank, comm.size)
    m = len(header.attributes)
    item = 4 if cfg.dtype == "float32" else 8
    plan.update({"rank": comm.rank, "host": comm.host, "node_rank": comm.node_rank,
                 "device_bytes": plan["rows"] * (m * item + 8) + cfg.k * m * 16,
                 "available_bytes": available_memory(), "m": m})
    return comm.allgather(plan)


def rank_threads(comm, requested: int | None = None) -> int:
    """Threads of this rank, for parsing the file and for the CPU backend's compute.

    Decided once per run (and by ``mpikmeans info``, which shows what a run
    would use).

    Parameters
    ----------
    comm : Comm or SerialComm
    requested : int, optional
        ``--threads``: overrides the default.

    Returns
    -------
    int
        ``requested``, else :func:`mpikmeans.comm.default_threads` (this rank's
        share of its node's CPUs, lowered by ``OMP_NUM_THREADS``); at most
        Numba's pool (``NUMBA_NUM_THREADS``), at least 1.
    """
    return max(1, min(requested or default_threads(comm), numba.config.NUMBA_NUM_THREADS))


def prepare_read(comm, data: str, threads: int) -> None:
    """The reader's one-time start-up (Numba, its cached kernels, its ``threads``), before the read is timed.

    Collective: ends with a barrier, so the read that follows starts on every
    rank at once and its time is the reading alone (see :func:`run_job`).
    """
    if data.endswith(".npy"):
        from .io.binary import warm_up as warm_up_npy

        warm_up_npy(threads)
    else:
        warm_up(threads)
    comm.barrier()


def read_input(comm, data: str, cfg, threads: int):
    """This rank's rows of DATA: an ARFF file, or a ``.npy`` cache made by ``convert`` (collective).

    ``threads`` parse the ARFF file (:func:`rank_threads`).
    """
    if data.endswith(".npy"):
        from .io.binary import read_npy

        if cfg.ignore or cfg.missing != "error" or cfg.write_arff or cfg.nominal != "skip":
            raise UsageError("--ignore, --missing, --nominal and --write-arff need the ARFF file, not a .npy cache",
                             collective=True)
        return read_npy(data, comm, threads)
    header = shared_header(data, comm)
    check_memory(data, header, comm)
    numba.set_num_threads(threads)
    return read_arff(data, comm, header=header, ignore=cfg.ignore, missing=cfg.missing, threads=threads,
                     nominal=cfg.nominal)


def run_job(comm, data: str, cfg, launched_at: float | None = None) -> RunOutcome:
    """Read, cluster and write results (collective: every rank calls it).

    Parameters
    ----------
    comm : Comm or SerialComm
    data : str
        The ARFF file.
    cfg : RunConfig
        Validated settings.
    launched_at : float, optional
        ``time.perf_counter()`` when the command's process imported the package:
        its imports, MPI's start and the options before the run are reported as
        ``timings.launch_s``.

    Returns
    -------
    RunOutcome
    """
    t0 = time.perf_counter()
    out_dir = cfg.output_dir or default_output_dir(data)
    prepare_output_dir(comm, out_dir, cfg.overwrite)

    fault_point(comm.rank, "read")
    # one thread count for the whole run: the reader's and the CPU backend's
    threads = rank_threads(comm, cfg.threads)
    # the one-time start-up is timed apart: startup_s (with the output directory
    # check above), so read_s is the reading alone whatever the share of each rank
    # first what looks in the caches and the reader's start (in this thread), then the GPU's
    # start in another: the two would import the same modules at once, which Python does not allow
    compiling = BackgroundCompile(comm, data, cfg, gpu_wanted(cfg))
    try:
        prepare_read(comm, data, threads)
        t_ready = time.perf_counter()
        gpu_start = DevicePreparation(comm, cfg)  # overlaps the read
        local = read_input(comm, data, cfg, threads)
    except BaseException:
        compiling.stop()
        raise
    t_read = time.perf_counter()
    sel = local.selection
    if sel.skipped:
        log.warning("not clustered (not numeric%s): %s", " or nominal" if cfg.nominal == "weka" else "",
                    ", ".join(sel.skipped))
    if local.missing:
        log.warning("missing values: %s %d %s", "dropped" if cfg.missing == "drop" else "replaced by the mean",
                    local.missing, "rows" if cfg.missing == "drop" else "values")

    compiling.wait()  # a cold run's other kernels: compiled meanwhile, loaded from here on
    t_compiled = time.perf_counter()
    layout = local.layout
    # Weka's "Full Data" column: the means, a nominal attribute's mode (exact means: the same for any split)
    full_means = layout.project(global_means(comm, local.x, local.mins, local.maxs)[None, :])[0]
    # scaled in place: no second copy of the rows (centres go back to data units at the end)
    scaler = fit_scaler(comm, local.x, cfg.normalize, local.mins, local.maxs, layout.numeric_columns())
    x = scaler.transform(local.x, out=local.x)
    setup_parts = {"compile_wait_s": t_compiled - t_read, "statistics_s": time.perf_counter() - t_compiled}

    backend, error = None, None
    try:
        t = time.perf_counter()
        backend = _make_backend(cfg, threads, gpu_start.result(), gpu_start.reason, comm.node_size)
        setup_parts["backend_s"] = time.perf_counter() - t  # imports, device context
        t = time.perf_counter()
        # the reader's global bounds, scaled as the rows were (each scaling is monotonic):
        # the fixed-point sums' scales without another pass over the rows
        bounds = scaler.transform(np.vstack([local.mins, local.maxs]))
        backend.load(x, local.weights, magnitudes=np.abs(bounds).max(axis=0))
        setup_parts["load_s"] = time.perf_counter() - t  # the rows to the backend
        t = time.perf_counter()
        backend.warmup(cfg.k, local.m)
        setup_parts["kernels_s"] = time.perf_counter() - t  # compiled or loaded from the cache
    except (BackendUnavailable, MpikmeansError) as exc:
        error = RunError(str(exc))
    except MemoryError:
        error = RunError(f"rank {comm.rank}: not enough device or host memory for {len(local.x)} rows")
    comm.agree(error)
    t_setup = time.perf_counter()

    settings = _binding_settings(cfg, local)
    resume = _resume_state(comm, cfg, settings) if cfg.resume else None
    init = None if resume is not None else _init_for(comm, cfg, local, scaler)
    t_init = time.perf_counter()

    ckpt_path = cfg.checkpoint or os.path.join(out_dir, "checkpoint.npz")
    # without --checkpoint the state is saved only when a signal stops the run
    checkpointer = Checkpointer(ckpt_path, settings, every=cfg.checkpoint_every if cfg.checkpoint else None,
                                seconds=60.0 if cfg.checkpoint else float("inf"), is_root=comm.rank == 0)
    with StopRequest() as stop:
        restarts = run_restarts(comm, backend, x, local.row_offset, local.n, cfg.k, init=init, seed=cfg.seed,
                                n_init=cfg.n_init, weights=local.weights, max_iter=cfg.max_iter, tol=cfg.tol,
                                empty_cluster=cfg.empty_cluster,
                                init_options={"mins": local.mins, "maxs": local.maxs}
                                if cfg.normalize == "none" and cfg.init == "range" else None,
                                resume=resume, after_iteration=checkpointer, stop_requested=stop,
                                layout=layout if layout.has_nominal else None)
    result = restarts.best
    centres = scaler.inverse(result.centres)
    t_compute = time.perf_counter()
    # Lloyd time and iterations of all restarts (the initialisations are in init_s)
    lloyd_s = sum(r["compute_s"] for r in restarts.restarts)
    iterations = sum(r["iterations"] for r in restarts.restarts) - (resume.iteration if resume else 0)

    info = backend.info()
    summary = {
        "version": __version__,
        "data": os.path.abspath(data),
        "relation": local.header.relation,
        "k": cfg.k,
        "n": local.n,
        "m": len(local.names),  # attributes clustered (a nominal one takes several columns: "columns")
        "columns": local.m,
        "nominal": cfg.nominal,
        "nominal_attributes": [name for name, v in zip(layout.names, layout.values) if v is not None],
        "attributes": local.names,
        "skipped_attributes": sel.skipped,
        "ignored_attributes": sel.ignored,
        "input_rows": local.input_rows,
        "missing": {"policy": cfg.missing, "count": local.missing},
        "weighted": local.weights is not None,
        "iterations": result.iterations,
        "converged": result.converged,
        "stop_reason": result.stop_reason,
        "inertia": result.inertia,
        "inertia_units": "data" if cfg.normalize == "none" else f"scaled ({cfg.normalize})",
        "normalize": scaler.to_dict(),
        "n_init": cfg.n_init,
        "best_restart": restarts.best_index,
        "restarts": restarts.restarts,
        "sizes": None if result.sizes is None else [int(s) for s in result.sizes],
        "cluster_sse": None if result.cluster_sse is None else [float(v) for v in result.cluster_sse],
        "ranks": comm.size,
        "hosts": sorted(set(comm.allgather(comm.host))),
        "rows_per_rank": local.counts,
        "backend": info.name,
        "devices": [d for per_rank in comm.allgather(info.devices) for d in per_rank],
        "threads_per_rank": info.threads,
        "read_threads_per_rank": threads,
        "dtype": info.dtype,
        "init": cfg.init,
        "seed": cfg.seed,
        "tol": cfg.tol,
        "max_iter": cfg.max_iter,
        "empty_cluster": cfg.empty_cluster,
        "empty_relocations": result.relocated,
        "clusters_reseeded": result.relocated,
        "clusters_dropped": result.dropped,
        "clusters": int(result.centres.shape[0]),
        "resumed_from": os.path.abspath(cfg.resume) if cfg.resume else None,
        "resumed_at_iteration": resume.iteration if resume is not None else None,
        "mpi_library": comm.library(),
        "bytes_read": int(comm.allreduce(np.array([local.bytes_read], dtype=np.int64), "sum")[0]),
        "timings": {},
        # a cold run's helper processes on this node, by part: wall seconds (empty when the caches were warm)
        "background_compile_s": dict(compiling.seconds),
        "history": result.history,
    }
    if result.interrupted:
        backend.close()
        return RunOutcome(summary, out_dir, interrupted_by=stop.name or "a stop signal on another rank", checkpoint=ckpt_path)

    fault_point(comm.rank, "write")
    labels = result.labels
    if local.kept is not None:  # rows dropped for a missing value get -1, in input order
        labels = np.full(len(local.kept), -1, dtype=np.int32)
        labels[local.kept] = result.labels
    write_arrays(comm, out_dir, layout.decode(centres) if layout.has_nominal else centres, local.names, labels)
    if cfg.write_arff:
        write_clustered_arff(comm, local, labels, len(centres), os.path.join(out_dir, CLUSTERED))
    t_written = time.perf_counter()
    summary["timings"] = {
        **({"launch_s": t0 - launched_at} if launched_at is not None else {}),
        "startup_s": t_ready - t0,
        "read_s": t_read - t_ready,
        "setup_s": t_setup - t_read,
        "setup_parts": setup_parts,
        "init_s": t_init - t_setup + sum(r["init_s"] for r in restarts.restarts),
        "compute_s": lloyd_s,
        "write_s": t_written - t_compute,
        "total_s": t_written - t0,
        "per_iteration_s": lloyd_s / max(1, iterations),
    }
    write_summary(comm, out_dir, summary)
    backend.close()
    return RunOutcome(summary, out_dir, checkpoint=ckpt_path if checkpointer.written else None, centres=centres,
                      full_means=full_means, layout=layout)
