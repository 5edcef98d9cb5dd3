"""One ``mpikmeans run`` from start to finish, on every rank (collective).

The order of the steps is chosen so that a run fails early and cheaply: the
output directory and the memory estimate are checked before the data is
parsed, the data before the backend takes it, and nothing is written to the
output directory before the clustering has finished.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass

import numba
import numpy as np

from . import __version__
from .io import formats
from .io.split import available_memory, plan_local
from .backends import BackendUnavailable, cuda_simulator_requested, make_backend
from .cache import COMPILE_ESTIMATE_S, cold_parts, warming, warmup_command
from .config import NOTICE
from .checkpoint import Checkpointer, check_compatible, data_identity, file_sha256, is_checkpoint, load
from .comm import LAUNCHER_VARIABLES, default_threads
from .errors import MpikmeansError, RunError, UsageError
from .faults import fault_point
from .interrupt import StopRequest
from .init import INIT_METHODS, check_centres
from .restarts import run_restarts
from .scaling import fit_scaler, global_means
from .io.output import (CENTERS, CLUSTERED, DEFAULT_CHECKPOINT, LABELS, SUMMARY, ResultsDir, order_by_header,
                        read_centres_csv, read_centres_fields, remove_quietly, write_arrays, write_summary)
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
        Where the state was saved (None: nothing was saved).
    centres : ndarray, shape (k, m), or None
        Final centres in data units.
    full_means : ndarray, shape (m,), or None
        Mean of every attribute over all rows (Weka's "Full Data" column; a
        nominal attribute's block, its mode).
    layout : Layout or None
        Which columns are whose (see :mod:`mpikmeans.nominal`).
    interrupted_phase : str
        What a stop signal interrupted before the first iteration (``reading the
        data``, ``setting up``); empty when it stopped the iterations.
    resumable : bool
        False for a stopped run that cannot be resumed (several restarts).
    signal_while_writing : str
        A stop signal that came while the results were written (they were
        finished, and are complete).
    """

    summary: dict
    out_dir: str
    interrupted_by: str = ""
    checkpoint: str | None = None
    centres: np.ndarray | None = None
    full_means: np.ndarray | None = None
    layout: Layout | None = None
    interrupted_phase: str = ""
    resumable: bool = True
    signal_while_writing: str = ""

    def table(self) -> list:
        """Weka's centroid table: the "Full Data" row, then one row per centre, of attribute
        values (a nominal attribute's category name, else a float)."""
        return self.layout.decode(np.vstack([self.full_means, self.centres]))


def default_output_dir(data: str) -> str:
    """Where a run's results go by default: an ARFF file's path without ``.arff``, any other
    file's whole name, plus ``.mpikmeans`` (``data.arff`` -> ``data.mpikmeans``, ``data.npy`` ->
    ``data.npy.mpikmeans``, ``data.csv`` -> ``data.csv.mpikmeans``), so that the ``.npy`` or CSV
    copy of a file never shares its results directory."""
    stem, ext = os.path.splitext(data)
    return (stem if ext.lower() == ".arff" else data.rstrip(os.sep)) + ".mpikmeans"


def _same_file(a: str | None, b: str | None) -> bool:
    try:
        return bool(a and b) and os.path.samefile(a, b)
    except OSError:
        return False


def _inputs(data: str, cfg, config_path: str | None = None) -> list:
    """(option, path) of every file the run reads: never written over."""
    found = [("DATA", data)] + [("DATA's companion file", f) for f in formats.input_files(data) if f != data]
    if cfg.init not in INIT_METHODS:
        found.append(("--init", cfg.init))
    if config_path:
        found.append(("--config", config_path))
    return found


def check_checkpoint_path(data: str, cfg, path: str, config_path: str | None = None) -> None:
    """Refuse a checkpoint path that would write over a file this run did not create (rank 0).

    A checkpoint is written over only where it is the ``--resume`` file, or an
    older checkpoint and ``--overwrite`` is given; never over an input of the
    run (DATA, ``--init``, ``--config``), a results file or another program's file.

    Raises
    ------
    UsageError
    """
    flag = f"--checkpoint {path}" if cfg.checkpoint else f"the stop checkpoint {path}"
    for what, other in _inputs(data, cfg, config_path):
        if _same_file(path, other):
            raise UsageError(f"{flag}: is the run's input ({what}); a checkpoint never writes over it: "
                             "choose another --checkpoint path")
    if os.path.basename(path) in (CENTERS, LABELS, SUMMARY, CLUSTERED):
        raise UsageError(f"{flag}: the name of a results file: choose another --checkpoint path")
    if os.path.isdir(path):
        raise UsageError(f"{flag}: is a directory; --checkpoint names a file")
    parent = os.path.dirname(os.path.abspath(path))
    if cfg.checkpoint and not os.path.isdir(parent):
        raise UsageError(f"{flag}: no such directory {parent}")
    if not os.path.exists(path) or _same_file(path, cfg.resume):
        return
    if not is_checkpoint(path):
        raise UsageError(f"{flag}: the file exists and is not an mpikmeans checkpoint: choose another "
                         "--checkpoint path (it is never written over)")
    if not cfg.overwrite:
        raise UsageError(f"{flag}: a checkpoint of an earlier run is there: go on from it with --resume {path}, "
                         "start afresh and replace it with --overwrite, or choose another --checkpoint path")


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
    """A cold machine's kernels, compiled in helper processes while this run reads.

    Every kernel takes any shape, so what a machine compiles is known before the
    data (:mod:`mpikmeans.warmup`'s parts).  Where ``mpikmeans warmup`` has not
    compiled the parts this run needs, rank 0 says so once, on stderr, with the
    time it expects, and one process per part starts on each node's first rank
    (``mpikmeans warmup --part``), into the shared caches.  The ranks wait for
    them after the read, then load every kernel.  Nothing starts when the
    caches are warm.

    Parameters
    ----------
    comm : Comm or SerialComm
    cfg : RunConfig
    gpu : bool
        Whether this run's backend may be a GPU.
    """

    def __init__(self, comm, cfg, gpu: bool):
        self.procs = []
        #: wall seconds of each helper, by part (filled by :meth:`wait`)
        self.seconds = {}
        self._watchers = []
        self.comm = comm
        cold = [] if warming() else cold_parts(cfg.dtype if gpu and not cuda_simulator_requested() else None)
        if comm.rank == 0 and cold:
            expected = max(COMPILE_ESTIMATE_S[p] for p in cold)
            log.warning("compiling kernels for this machine, once: about %d s (%s); `mpikmeans warmup` does it "
                        "ahead of any run", expected, ", ".join(cold))
        if comm.node_rank != 0:
            return
        env = {k: v for k, v in os.environ.items() if k not in LAUNCHER_VARIABLES}  # jobs of one, no MPI
        for part in cold:
            try:
                proc = subprocess.Popen(warmup_command(part), env=env, stdout=subprocess.DEVNULL,
                                        stderr=subprocess.PIPE)
            except OSError:
                continue
            self.procs.append(proc)
            watcher = threading.Thread(target=self._watch, args=(part, proc, time.perf_counter()), daemon=True,
                                       name=f"mpikmeans-compile-{part}")
            watcher.start()
            self._watchers.append(watcher)
            log.info("compiling the %s kernels in process %d", part, proc.pid)

    def _watch(self, part: str, proc, t0: float) -> None:
        _, err = proc.communicate()
        self.seconds[part] = time.perf_counter() - t0
        if proc.returncode != 0:  # the run compiles what is missing itself
            log.info("background compile of %s ended with %d: %s", part, proc.returncode, (err or b"")[-400:])

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
        # a header line's names say which column is which attribute: matched by name, never by position
        try:
            if layout.has_nominal:
                rows, header = read_centres_fields(cfg.init, local.names)
                fields = [values for _, values in rows]
                if header is not None:
                    _check_widths(header, {len(v) for v in fields})
                    order = order_by_header(header, local.names, cfg.init)
                    fields = [[values[j] for j in order] for values in fields]
                centres = layout.encode(fields)
            else:
                centres, header = read_centres_csv(cfg.init, local.names)
                if header is not None:
                    _check_widths(header, {centres.shape[1]})
                    centres = centres[:, order_by_header(header, local.names, cfg.init)]
            return check_centres(centres, k, m, cfg.init)
        except (ValueError, OSError) as exc:
            raise UsageError(f"--init {cfg.init}: {exc}") from None
        except MpikmeansError as exc:  # wrong shape: a usage error of this run
            raise UsageError(exc.message) from None

    return scaler.transform(comm.from_root(read_file))  # the file is in data units


def _check_widths(header: list, widths: set) -> None:
    if widths and widths != {len(header)}:
        raise ValueError(f"its header line names {len(header)} columns, its rows have "
                         f"{', '.join(str(w) for w in sorted(widths))}")


def _early_settings(data: str, cfg) -> dict:
    """The settings that change the answer and are known before the data is read (rank 0).

    With what :func:`_late_settings` adds, the binding settings of a checkpoint
    (:data:`mpikmeans.checkpoint.BINDING`); ``data`` and ``max_iter`` only for messages.
    """
    from_file = cfg.init not in INIT_METHODS
    settings = {"data": os.path.abspath(data), "k": cfg.k, "init": "file" if from_file else cfg.init,
                "init_file": os.path.abspath(cfg.init) if from_file else None, "seed": cfg.seed,
                "n_init": cfg.n_init, "normalize": cfg.normalize, "nominal": cfg.nominal, "missing": cfg.missing,
                "tol": cfg.tol, "empty_cluster": cfg.empty_cluster, "max_iter": cfg.max_iter}
    try:
        settings["data_identity"] = data_identity(data)
        settings["init_sha256"] = file_sha256(cfg.init) if from_file else None
    except OSError:  # reported by the read (DATA) or the initialisation (--init) with their own messages
        pass
    return settings


def _late_settings(local, dtype: str) -> dict:
    """The binding settings known once the data is read and the backend made."""
    return {"n": local.n, "m": local.m, "attributes": list(local.names), "dtype": dtype}


def _load_resume(comm, cfg, settings: dict):
    """The ``--resume`` checkpoint, read and checked against the settings known so far (collective)."""
    def read_checkpoint():
        ckpt = load(cfg.resume)
        check_compatible(cfg.resume, ckpt.settings, settings)
        return ckpt

    return comm.from_root(read_checkpoint)


def dry_run(comm, data: str, cfg) -> list:
    """Per-rank estimates without parsing the data (collective).

    Returns
    -------
    list of dict
        One per rank: rank, host, byte range, bytes, estimated rows, host
        memory and device memory estimates, available memory.
    """
    header = formats.shared_header(data, comm)
    plan = plan_local(data, header, comm.rank, comm.size)
    m = len(header.attributes)
    item = 4 if cfg.dtype == "float32" else 8
    plan.update({"rank": comm.rank, "host": comm.host, "node_rank": comm.node_rank,
                 "device_bytes": plan["rows"] * (m * item + 8) + cfg.k * m * 16,
                 "available_bytes": available_memory(), "m": m,
                 # what the run would use: a GPU where --backend gpu, or auto on a node with NVIDIA devices
                 "backend": "gpu" if gpu_wanted(cfg) else "cpu"})
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
    pool = numba.config.NUMBA_NUM_THREADS
    if requested is not None and requested > pool:
        log.warning("--threads %d: a rank here can run at most %d thread%s (Numba's pool, NUMBA_NUM_THREADS); "
                    "using %d", requested, pool, "" if pool == 1 else "s", pool)
    return max(1, min(requested or default_threads(comm), pool))


def prepare_read(comm, data: str, threads: int) -> None:
    """The reader's one-time start-up (Numba, its cached kernels, its ``threads``), before the read is timed.

    Collective: ends with a barrier, so the read that follows starts on every
    rank at once and its time is the reading alone (see :func:`run_job`).
    """
    formats.warm_up(data, threads)
    comm.barrier()


def read_input(comm, data: str, cfg, threads: int):
    """This rank's rows of DATA, whatever its format (:mod:`mpikmeans.io.formats` decides; collective).

    ``threads`` parse a text file (:func:`rank_threads`).
    """
    return formats.read_local(comm, data, formats.ReadOptions(ignore=cfg.ignore, missing=cfg.missing,
                                                              nominal=cfg.nominal, threads=threads,
                                                              write_arff=bool(cfg.write_arff)))


def run_job(comm, data: str, cfg, launched_at: float | None = None, config_path: str | None = None) -> RunOutcome:
    """Read, cluster and write results (collective: every rank calls it).

    Before any work it checks that nothing would be lost: the output directory
    (:class:`~mpikmeans.io.output.ResultsDir`), the checkpoint's path
    (:func:`check_checkpoint_path`) and the ``--resume`` file (readable, made
    under the same settings).  A stop signal (:mod:`mpikmeans.interrupt`) ends
    the run after the current iteration with a checkpoint; one that comes
    while the results are written lets the writing finish.

    Parameters
    ----------
    comm : Comm or SerialComm
    data : str
        The ARFF or CSV file, or the ``.npy`` copy ``convert`` made.
    cfg : RunConfig
        Validated settings.
    launched_at : float, optional
        ``time.perf_counter()`` when the command's process imported the package:
        its imports, MPI's start and the options before the run are reported as
        ``timings.launch_s``.
    config_path : str, optional
        The ``--config`` file (an input: a checkpoint never writes over it).

    Returns
    -------
    RunOutcome
    """
    t0 = time.perf_counter()
    out_dir = cfg.output_dir or default_output_dir(data)
    ckpt_path = cfg.checkpoint or os.path.join(out_dir, DEFAULT_CHECKPOINT)
    own = (cfg.checkpoint, cfg.resume, None if cfg.init in INIT_METHODS else cfg.init)
    results = ResultsDir(comm, out_dir, cfg.overwrite, own=own, data=data)

    def early_settings():
        check_checkpoint_path(data, cfg, ckpt_path, config_path)
        return _early_settings(data, cfg)

    settings = comm.from_root(early_settings)
    resumed = _load_resume(comm, cfg, settings) if cfg.resume else None
    if cfg.n_init > 1 and cfg.checkpoint:
        log.warning("--n-init %d: a run of several restarts cannot be resumed, so --checkpoint %s is not written",
                    cfg.n_init, cfg.checkpoint)
    # without --checkpoint the state is saved only when a signal stops the run
    checkpointer = Checkpointer(ckpt_path, settings, every=cfg.checkpoint_every if cfg.checkpoint else None,
                                seconds=60.0 if cfg.checkpoint else float("inf"), is_root=comm.rank == 0,
                                enabled=cfg.n_init == 1)
    # a stop signal saves the last completed iteration at once (a SIGKILL may follow within a second)
    with StopRequest(on_signal=checkpointer.save_now) as stop:
        try:
            return _run(comm, data, cfg, launched_at, t0, results, settings, resumed, checkpointer, stop)
        except BaseException:
            results.discard()
            raise


def _count(n: int) -> str:
    """A row count as people say it: 150, 20,000, 1e6, 2.5e7."""
    if n < 100_000:
        return f"{n:,}"
    mantissa, exponent = f"{n:.1e}".split("e")
    return f"{mantissa.rstrip('0').rstrip('.')}e{int(exponent)}"


def _duration(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def _stopped(comm, stop) -> int:
    """The stop signal any rank has had so far, 0 if none (collective)."""
    return int(comm.allreduce(np.array([stop.signum or 0], dtype=np.int64), "max")[0])


def _stopped_early(comm, stop, signum: int, phase: str) -> RunOutcome:
    name = stop.name or signal.Signals(signum).name
    return RunOutcome({"iterations": 0}, "", interrupted_by=name, interrupted_phase=phase)


#: Centre-distance products a second a CPU thread makes in k-means++ at 10 attributes (about
#: 1.3e9 on a 2-core Zen 4 for K = 200..2000), rising with the attributes (about 6e9 at 100).
_KMPP_RATE_CPU = 1.2e9
#: The same for a GPU (a rough figure: only to tell seconds from minutes).
_KMPP_RATE_GPU = 1.0e11


def kmeanspp_seconds(n: int, m: int, k: int, workers: int, gpu: bool = False) -> float:
    """A rough estimate of k-means++'s time: about ``n * m * k * (3 + ln k)`` products.

    Parameters
    ----------
    n, m, k : int
    workers : int
        CPU threads over all ranks, or GPUs.
    gpu : bool
    """
    products = float(n) * m * k * (3.0 + math.log(max(k, 1)))
    rate = _KMPP_RATE_GPU if gpu else _KMPP_RATE_CPU * (max(m, 10) / 10.0) ** 0.66
    return products / (rate * max(1, workers))


def _run(comm, data: str, cfg, launched_at, t0: float, results, settings: dict, resumed, checkpointer,
         stop) -> RunOutcome:
    fault_point(comm.rank, "read")
    # one thread count for the whole run: the reader's and the CPU backend's
    threads = rank_threads(comm, cfg.threads)
    # the one-time start-up is timed apart: startup_s (with the output directory
    # check above), so read_s is the reading alone whatever the share of each rank
    # first what looks in the caches and the reader's start (in this thread), then the GPU's
    # start in another: the two would import the same modules at once, which Python does not allow
    compiling = BackgroundCompile(comm, cfg, gpu_wanted(cfg))
    try:
        prepare_read(comm, data, threads)
        t_ready = time.perf_counter()
        gpu_start = DevicePreparation(comm, cfg)  # overlaps the read
        local = read_input(comm, data, cfg, threads)
    except BaseException:
        compiling.stop()
        raise
    t_read = time.perf_counter()
    signum = _stopped(comm, stop)
    if signum:  # nothing to save before the first iteration: stop now rather than set up and initialise
        compiling.stop()
        return _stopped_early(comm, stop, signum, "reading the data")
    sel = local.selection
    if sel.skipped:
        log.warning("not clustered (not numeric%s): %s", " or nominal" if cfg.nominal == "weka" else "",
                    ", ".join(sel.skipped))
    if local.missing:
        what = "row" if cfg.missing == "drop" else "value"
        log.warning("missing values: %s %d %s%s", "dropped" if cfg.missing == "drop" else "replaced by the mean",
                    local.missing, what, "" if local.missing == 1 else "s")

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

    signum = _stopped(comm, stop)
    if signum:
        backend.close()
        return _stopped_early(comm, stop, signum, "setting up")

    settings.update(_late_settings(local, backend.info().dtype))
    resume = None
    if resumed is not None:
        late = tuple(_late_settings(local, "").keys())
        comm.from_root(lambda: check_compatible(cfg.resume, resumed.settings, settings, keys=late))
        resume = resumed.state
        if resumed.finished:
            # the loop had ended (it was saved while its results were written): no iteration is left,
            # only the final assignment, exactly as the uninterrupted run's
            cfg = dataclasses.replace(cfg, max_iter=resume.iteration)
    init = None if resume is not None else _init_for(comm, cfg, local, scaler)
    if resume is None and cfg.init == "k-means++" and comm.rank == 0:
        info = backend.info()
        gpu = bool(info.devices) and info.name != "cpu"
        seconds = kmeanspp_seconds(local.n, local.m, cfg.k, comm.size * (1 if gpu else threads), gpu) * cfg.n_init
        if seconds > 5:
            log.log(NOTICE, "k-means++ with K = %d on %s rows x %d columns: about %s%s", cfg.k, _count(local.n),
                    local.m, _duration(seconds), f" for {cfg.n_init} initialisations" if cfg.n_init > 1 else "")
    t_init = time.perf_counter()

    restarts = run_restarts(comm, backend, x, local.row_offset, local.n, cfg.k, init=init, seed=cfg.seed,
                            n_init=cfg.n_init, weights=local.weights, max_iter=cfg.max_iter, tol=cfg.tol,
                            empty_cluster=cfg.empty_cluster,
                            init_options={"mins": local.mins, "maxs": local.maxs}
                            if cfg.normalize == "none" and cfg.init == "range" else None,
                            resume=resume, after_iteration=checkpointer, stop_requested=stop,
                            layout=layout if layout.has_nominal else None)
    result = restarts.best
    if resumed is not None and resumed.finished and not result.interrupted:
        result.converged = bool(resumed.finished.get("converged"))
        result.stop_reason = str(resumed.finished.get("stop_reason", result.stop_reason))
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
        "max_iter": settings["max_iter"],
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
        return RunOutcome(summary, results.path, interrupted_by=stop.name or "a stop signal on another rank",
                          checkpoint=checkpointer.path if checkpointer.written else None,
                          resumable=checkpointer.enabled)

    # from here a stop signal lets the writing finish: the results are complete or not written at all,
    # and the finished loop's state is what a signal saves meanwhile
    checkpointer.finished(result.state, result.converged, result.stop_reason)
    fault_point(comm.rank, "write")
    labels = result.labels
    if local.kept is not None:  # rows dropped for a missing value get -1, in input order
        labels = np.full(len(local.kept), -1, dtype=np.int32)
        labels[local.kept] = result.labels
    staging = results.stage()
    write_arrays(comm, staging, layout.decode(centres) if layout.has_nominal else centres, local.names, labels)
    if cfg.write_arff:
        write_clustered_arff(comm, local, labels, len(centres), os.path.join(staging, CLUSTERED))
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
    write_summary(comm, staging, summary)
    results.publish()
    backend.close()
    late_signal = _stopped(comm, stop)
    if comm.rank == 0 and not cfg.checkpoint and (checkpointer.written or _same_file(cfg.resume, checkpointer.path)):
        # the stop checkpoint of this run (or the one it went on from) beside its now complete results:
        # nothing is left to resume
        remove_quietly(checkpointer.path)
    return RunOutcome(summary, results.path, checkpoint=checkpointer.path if checkpointer.written else None,
                      centres=centres, full_means=full_means, layout=layout,
                      signal_while_writing=(stop.name or signal.Signals(late_signal).name) if late_signal else "")
