"""One ``mpikmeans run`` from start to finish, on every rank (collective).

The order of the steps is chosen so that a run fails early and cheaply: the
output directory and the memory estimate are checked before the data is
parsed, the data before the backend takes it, and nothing is written to the
output directory before the clustering has finished.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import signal
import time
from dataclasses import dataclass

import numpy as np

from .io import formats
from .io.split import available_memory, plan_local
from .backends import BackendUnavailable
from .checkpoint import Checkpointer, check_compatible, data_identity, file_sha256, is_checkpoint, load
from .choices import INIT_METHODS
from .errors import MpikmeansError, RunError, UsageError
from .faults import fault_point
from .initfile import initial_centres, model_k
from .interrupt import StopRequest
from .lloyd import prepare_loop
from .model import Model, write_model
from .report import kmeanspp_notice, run_summary, run_timings
from .restarts import run_restarts
from .scaling import fit_scaler, global_means
from .scores import quality_scores
from .startup import (BackgroundCompile, DevicePreparation, check_input, gpu_wanted, make_run_backend, prepare_read,
                      rank_threads, read_input, start_driver)
from .sweep import plan_sweep, run_sweep
from .io.output import (CENTERS, CLUSTERED, DEFAULT_CHECKPOINT, LABELS, MODEL, SUMMARY, SWEEP_PLOT, SWEEP_TABLE,
                        ResultsDir, remove_quietly, write_arrays, write_summary)
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
    sweep : dict or None
        A K sweep's: when finished, :func:`mpikmeans.sweep.finish_sweep`'s table
        (``columns``, ``rows``, ``knee``, ``rule``, ``plot``, ``out_dir``) and
        ``done``; when stopped, ``stopped_at`` (the K), ``done`` and ``out_dir``.
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
    sweep: dict | None = None

    def table(self) -> list:
        """Weka's centroid table: the "Full Data" row, then one row per centre, of attribute
        values (a nominal attribute's category name, else a float)."""
        return self.layout.decode(np.vstack([self.full_means, self.centres]))


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
    if os.path.basename(path) in (CENTERS, LABELS, SUMMARY, CLUSTERED, MODEL, SWEEP_TABLE, SWEEP_PLOT):
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
    except (OSError, MpikmeansError):  # reported by the read (DATA) or the initialisation (--init) themselves
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
                 "device_bytes": plan["rows"] * (m * item + 8) + max(cfg.k_values if cfg.k else (1,)) * m * 16,
                 "available_bytes": available_memory(), "m": m,
                 # what the run would use: a GPU where --backend gpu, or auto on a node with NVIDIA devices
                 "backend": "gpu" if gpu_wanted(cfg) else "cpu"})
    return comm.allgather(plan)


def run_job(comm, data: str, cfg, launched_at: float | None = None, config_path: str | None = None) -> RunOutcome:
    """Read, cluster and write results (collective: every rank calls it).

    Before any work it checks that nothing would be lost: the output directory
    (:class:`~mpikmeans.io.output.ResultsDir`), the checkpoint's path
    (:func:`check_checkpoint_path`) and the ``--resume`` file (readable, made
    under the same settings).  A stop signal (:mod:`mpikmeans.interrupt`) ends
    the run after the current iteration with a checkpoint; one that comes
    while the results are written lets the writing finish.  A ``-k`` of several
    values is a K sweep (:mod:`mpikmeans.sweep`): the data read and set up once,
    each K's results in ``k<K>/``.

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
    if cfg.k is None:  # --init model.json without -k: the model's K
        cfg = dataclasses.replace(cfg, k=model_k(comm, cfg.init))
    out_dir = cfg.output_dir or formats.results_dir(data)
    ckpt_path = cfg.checkpoint or os.path.join(out_dir, DEFAULT_CHECKPOINT)
    if cfg.n_init > 1 and cfg.checkpoint:
        log.warning("--n-init %d: a run of several restarts cannot be resumed, so --checkpoint %s is not written",
                    cfg.n_init, cfg.checkpoint)
    if cfg.sweep:
        return _sweep_job(comm, data, cfg, out_dir, ckpt_path, launched_at, config_path, t0)
    own = (cfg.checkpoint, cfg.resume, None if cfg.init in INIT_METHODS else cfg.init)
    results = ResultsDir(comm, out_dir, cfg.overwrite, own=own, data=data)

    def early_settings():
        check_checkpoint_path(data, cfg, ckpt_path, config_path)
        return _early_settings(data, cfg)

    settings = comm.from_root(early_settings)
    resumed = _load_resume(comm, cfg, settings) if cfg.resume else None
    checkpointer = _checkpointer(comm, cfg, ckpt_path, settings)
    # a stop signal saves the last completed iteration at once (a SIGKILL may follow within a second)
    with StopRequest(on_signal=checkpointer.save_now) as stop:
        try:
            prep = _prepare(comm, data, cfg, stop, t0)
            if isinstance(prep, RunOutcome):
                return prep
            try:
                outcome = _fit_and_write(comm, data, cfg, prep, results, settings, resumed, checkpointer, stop,
                                         launched_at, t0)
            finally:
                prep.backend.close()
        except BaseException:
            results.discard()
            raise
    if not outcome.interrupted_by:
        _remove_stop_checkpoint(comm, cfg, checkpointer)
    return outcome


def _checkpointer(comm, cfg, path: str, settings: dict) -> Checkpointer:
    # without --checkpoint the state is saved only when a signal stops the run
    return Checkpointer(path, settings, every=cfg.checkpoint_every if cfg.checkpoint else None,
                        seconds=60.0 if cfg.checkpoint else float("inf"), is_root=comm.rank == 0,
                        enabled=cfg.n_init == 1)


def _remove_stop_checkpoint(comm, cfg, checkpointer: Checkpointer) -> None:
    """The stop checkpoint of this run (or the one it went on from), beside its now complete results:
    nothing is left to resume (rank 0; a ``--checkpoint`` the user named stays)."""
    if comm.rank == 0 and not cfg.checkpoint and (checkpointer.written or _same_file(cfg.resume, checkpointer.path)):
        remove_quietly(checkpointer.path)


def _stopped(comm, stop) -> int:
    """The stop signal any rank has had so far, 0 if none (collective)."""
    return int(comm.allreduce(np.array([stop.signum or 0], dtype=np.int64), "max")[0])


def _stopped_early(comm, stop, signum: int, phase: str) -> RunOutcome:
    name = stop.name or signal.Signals(signum).name
    return RunOutcome({"iterations": 0}, "", interrupted_by=name, interrupted_phase=phase)


@dataclass
class Prepared:
    """The rows of a run, read, scaled and loaded into its backend: what each K's fit starts from.

    Attributes
    ----------
    local : mpikmeans.io.arff.LocalData
    x : ndarray, shape (n_local, columns), float64
        This rank's rows, scaled (``local.x`` itself).
    scaler : mpikmeans.scaling.Scaler
    magnitudes : ndarray, shape (columns,), float64
        A global bound on each scaled column's ``|x_j|``.
    full_means : ndarray, shape (m,)
        Weka's "Full Data" column.
    backend : mpikmeans.backends.base.Backend
    threads : int
    compiling : BackgroundCompile
    clock : dict
        ``t0``, ``ready``, ``read``, ``setup``, ``setup_parts`` (see :func:`mpikmeans.report.run_timings`).
    """

    local: object
    x: np.ndarray
    scaler: object
    magnitudes: np.ndarray
    full_means: np.ndarray
    backend: object
    threads: int
    compiling: BackgroundCompile
    clock: dict


def _prepare(comm, data: str, cfg, stop, t0: float):
    """Read DATA, scale it, make and load the backend (collective): a :class:`Prepared`, or the
    :class:`RunOutcome` of a run a stop signal ended before its first iteration."""
    fault_point(comm.rank, "read")
    # one thread count for the whole run: the reader's and the CPU backend's
    threads = rank_threads(comm, cfg.threads)
    # the one-time start-up is timed apart: startup_s (with the output directory
    # check above), so read_s is the reading alone whatever the share of each rank
    # first what looks in the caches and the reader's start (in this thread), then the GPU's
    # start in another: the two would import the same modules at once, which Python does not allow
    check_input(comm, data)  # a file that cannot be read says so before any kernel compiles
    start_driver(comm, cfg)  # the CUDA driver's part of a GPU's start, beside everything below
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
    # the reader's global bounds, scaled as the rows were (each scaling is monotonic):
    # the fixed-point sums' scales without another pass over the rows
    magnitudes = np.abs(scaler.transform(np.vstack([local.mins, local.maxs]))).max(axis=0)

    backend, error = None, None
    try:
        t = time.perf_counter()
        backend = make_run_backend(cfg, threads, gpu_start.result(), gpu_start.reason, comm.node_size)
        setup_parts["backend_s"] = time.perf_counter() - t  # imports, device context
        t = time.perf_counter()
        backend.load(x, local.weights, magnitudes=magnitudes)
        setup_parts["load_s"] = time.perf_counter() - t  # the rows to the backend
        t = time.perf_counter()
        prepare_loop(backend, max(cfg.k_values), local.m)
        setup_parts["kernels_s"] = time.perf_counter() - t  # compiled or loaded from the cache
    except (BackendUnavailable, MpikmeansError) as exc:
        error = RunError(str(exc))
    except MemoryError:
        error = RunError(f"rank {comm.rank}: not enough device or host memory for {len(local.x)} rows")
    comm.agree(error)
    clock = {"t0": t0, "ready": t_ready, "read": t_read, "setup": time.perf_counter(), "setup_parts": setup_parts}

    signum = _stopped(comm, stop)
    if signum:
        backend.close()
        return _stopped_early(comm, stop, signum, "setting up")
    return Prepared(local, x, scaler, magnitudes, full_means, backend, threads, compiling, clock)


def _fit_and_write(comm, data: str, cfg, prep: Prepared, results, settings: dict, resumed, checkpointer, stop,
                   launched_at, start: float) -> RunOutcome:
    """Cluster the prepared rows into ``cfg.k`` clusters, score them, and publish the results (collective).

    ``start``: when this K's results began (the run's start; a sweep's K, its own).
    """
    local, backend, scaler = prep.local, prep.backend, prep.scaler
    layout = local.layout
    clock = dict(prep.clock, start=start, start_fit=max(start, prep.clock["setup"]))
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
    init = None if resume is not None else initial_centres(comm, cfg, local, scaler, data)
    if resume is None:
        kmeanspp_notice(comm, cfg, backend.info(), local.n, local.m, prep.threads)
    clock["init"] = time.perf_counter()

    restarts = run_restarts(comm, backend, prep.x, local.row_offset, local.n, cfg.k, init=init, seed=cfg.seed,
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
    clock["compute"] = time.perf_counter()
    # Lloyd iterations of all restarts (the initialisations are in init_s)
    iterations = sum(r["iterations"] for r in restarts.restarts) - (resume.iteration if resume else 0)
    info = backend.info()
    if result.interrupted:
        summary = run_summary(comm, data, cfg, local, scaler, restarts, info, settings, resume, prep.threads,
                              prep.compiling.seconds, None)
        return RunOutcome(summary, results.path, interrupted_by=stop.name or "a stop signal on another rank",
                          checkpoint=checkpointer.path if checkpointer.written else None,
                          resumable=checkpointer.enabled)

    # from here a stop signal lets the writing finish: the results are complete or not written at all,
    # and the finished loop's state is what a signal saves meanwhile
    checkpointer.finished(result.state, result.converged, result.stop_reason)
    scores = None
    if cfg.scores != "none":
        k = int(result.centres.shape[0])
        scores = quality_scores(comm, prep.x, result.labels, k, weights=local.weights, centres=result.centres,
                                magnitudes=prep.magnitudes, sample_size=cfg.score_sample, seed=cfg.seed,
                                threads=prep.threads, rows=backend.score_rows(result.labels, k))
    clock["scored"] = time.perf_counter()
    summary = run_summary(comm, data, cfg, local, scaler, restarts, info, settings, resume, prep.threads,
                          prep.compiling.seconds, scores)
    fault_point(comm.rank, "write")
    labels = result.labels
    if local.kept is not None:  # rows dropped for a missing value get -1, in input order
        labels = np.full(len(local.kept), -1, dtype=np.int32)
        labels[local.kept] = result.labels
    staging = results.stage()
    write_arrays(comm, staging, layout.decode(centres) if layout.has_nominal else centres, local.names, labels)
    if cfg.write_arff:
        write_clustered_arff(comm, local, labels, len(centres), os.path.join(staging, CLUSTERED))
    write_model(comm, os.path.join(staging, MODEL), Model.from_run(local, scaler, result, cfg, info.dtype, scores))
    clock["written"] = time.perf_counter()
    summary["timings"] = run_timings(clock, restarts, iterations, scores, launched_at)
    write_summary(comm, staging, summary)
    results.publish()
    late_signal = _stopped(comm, stop)
    return RunOutcome(summary, results.path, checkpoint=checkpointer.path if checkpointer.written else None,
                      centres=centres, full_means=prep.full_means, layout=layout,
                      signal_while_writing=(stop.name or signal.Signals(late_signal).name) if late_signal else "")


class _CurrentCheckpointer:
    """The checkpointer of the K a sweep is fitting: what a stop signal saves."""

    def __init__(self):
        self.checkpointer = None
        self.written = False

    def save_now(self, signum: int | None = None) -> bool:
        current = self.checkpointer
        return current is not None and current.save_now(signum)


def _sweep_job(comm, data: str, cfg, out_dir: str, ckpt_path: str, launched_at, config_path, t0: float) -> RunOutcome:
    """A K sweep (:mod:`mpikmeans.sweep`): the rows read and set up once, then one fit per K (collective)."""
    def early_settings():
        check_checkpoint_path(data, cfg, ckpt_path, config_path)
        return _early_settings(data, dataclasses.replace(cfg, k=cfg.k[0]))

    base = comm.from_root(early_settings)

    def settings_for(k: int) -> dict:
        return dict(base, k=k)

    resumed = comm.from_root(lambda: load(cfg.resume)) if cfg.resume else None
    plan = plan_sweep(comm, cfg, out_dir, data, settings_for, resumed, own=(cfg.checkpoint, cfg.resume))
    current = _CurrentCheckpointer()
    with StopRequest(on_signal=current.save_now) as stop:
        prep = _prepare(comm, data, cfg, stop, t0)
        if isinstance(prep, RunOutcome):
            return prep

        def fit_k(k: int, results, resumed_k) -> RunOutcome:
            cfg_k = dataclasses.replace(cfg, k=k, resume=cfg.resume if resumed_k is not None else None)
            if current.checkpointer is not None:
                current.written = current.written or bool(current.checkpointer.written)
            current.checkpointer = _checkpointer(comm, cfg_k, ckpt_path, settings_for(k))
            return _fit_and_write(comm, data, cfg_k, prep, results, settings_for(k), resumed_k,
                                  current.checkpointer, stop, launched_at, time.perf_counter())

        try:
            swept = run_sweep(comm, cfg, plan, fit_k, lambda: _stopped(comm, stop))
        finally:
            prep.backend.close()
    last = current.checkpointer
    written = current.written or bool(last is not None and last.written)
    if swept.table is not None:
        if comm.rank == 0 and not cfg.checkpoint and (written or _same_file(cfg.resume, ckpt_path)):
            remove_quietly(ckpt_path)  # every K is done: nothing is left to resume
        return RunOutcome({"k": list(cfg.k)}, out_dir, sweep={**swept.table, "done": swept.done})
    stopped = swept.outcome
    if stopped is None:  # between two K: the last one's state (finished) is what the checkpoint holds
        saved = comm.bcast(os.path.exists(ckpt_path) if comm.rank == 0 else None, root=0)
        signum = _stopped(comm, stop)  # collective: before any rank's own answer
        name = stop.name or signal.Signals(signum).name
        stopped = RunOutcome({"iterations": 0}, out_dir, interrupted_by=name, checkpoint=ckpt_path if saved else None,
                             resumable=cfg.n_init == 1)
    stopped.sweep = {"stopped_at": swept.stopped_at, "done": swept.done, "out_dir": out_dir}
    return stopped
