"""What a run (or a prediction) starts before its compute: threads, the reader's start-up, the GPU's
start, a cold machine's compiles, the backend.

Each piece is begun as early as it can be and overlaps the read where it needs
nothing from the data: the GPU's start in a thread (:class:`DevicePreparation`),
the kernels a cold machine lacks in helper processes (:class:`BackgroundCompile`).
"""

from __future__ import annotations

import logging
import os
import subprocess
import threading
import time

import numba

from .backends import BackendUnavailable, cuda_simulator_requested, device_for_rank, make_backend
from .cache import COMPILE_ESTIMATE_S, cold_parts, warming, warmup_command
from .comm import LAUNCHER_VARIABLES, default_threads
from .io import formats

log = logging.getLogger("mpikmeans")


def gpu_possible() -> bool:
    """Cheap test before importing numba-cuda (slow): is there an NVIDIA device node or the simulator?"""
    return cuda_simulator_requested() or os.path.exists("/dev/nvidiactl")


def gpu_wanted(cfg) -> bool:
    """Whether the run may have a GPU backend: ``gpu``, or ``auto`` on a node with NVIDIA devices."""
    return cfg.backend == "gpu" or (cfg.backend == "auto" and gpu_possible())


def _libcuda():
    import ctypes

    return ctypes.CDLL("libcuda.so.1")


def retain_primary_context(node_rank: int, node_size: int, share: bool, load=_libcuda) -> bool:
    """Start the CUDA driver and make this rank's device's primary context, through the driver's library alone.

    About half of a GPU's start is the driver's (``cuInit``, the context), and
    none of it needs numba-cuda, whose import is the other half: called
    through ctypes, which releases the GIL, it runs
    beside the start-up's imports and kernel loads, and numba-cuda later finds
    the driver started and the context made (it retains the same primary
    context).  The device is the one the backend takes
    (:func:`.backends.device_for_rank`); nothing is made where that refuses
    (more ranks than devices without ``share``) or the driver cannot start (the
    backend says why, later).

    Parameters
    ----------
    node_rank, node_size : int
    share : bool
    load : callable
        Returns the driver's library (``libcuda.so.1``).

    Returns
    -------
    bool
        Whether the context was made.
    """
    import ctypes

    try:
        lib = load()
        count = ctypes.c_int(0)
        if lib.cuInit(0) != 0 or lib.cuDeviceGetCount(ctypes.byref(count)) != 0:
            return False
        ordinal = device_for_rank(node_rank, node_size, count.value, share)
        dev = ctypes.c_int(0)
        ctx = ctypes.c_void_p(0)
        if lib.cuDeviceGet(ctypes.byref(dev), ordinal) != 0:
            return False
        return lib.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev) == 0
    except (OSError, AttributeError, BackendUnavailable):  # no driver library, no device for this rank
        return False


def start_driver(comm, cfg) -> threading.Thread | None:
    """:func:`retain_primary_context` in a thread, where the run may take a GPU (not under the simulator);
    begun first thing, before the start-up's imports and the read."""
    if not gpu_wanted(cfg) or cuda_simulator_requested():
        return None
    thread = threading.Thread(target=retain_primary_context, args=(comm.node_rank, comm.node_size, cfg.share_gpus),
                              name="mpikmeans-cuda-driver", daemon=True)
    thread.start()
    return thread


class DevicePreparation:
    """The GPU's one-time start (numba-cuda's import, the driver, the device context), begun early.

    It needs nothing from the data, so a thread starts it as the read begins,
    which runs in compiled code without the GIL: by the time the rows are there,
    the device is ready for them.  (Started before the reader's own start-up,
    loading its kernels, the two take turns at the GIL and both run slower.)  The
    driver's part of it begins earlier still, without numba-cuda
    (:func:`start_driver`).  Nothing is started when the backend is ``cpu``, or
    ``auto`` on a node without NVIDIA devices.

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


def make_run_backend(cfg, threads: int, device: int | None, reason: str = "", node_ranks: int = 1):
    options = {"threads": threads, "dtype": cfg.dtype, "chunk_rows": cfg.chunk_rows, "node_ranks": node_ranks}
    if device is None:
        if cfg.backend == "auto" and reason:  # a node with NVIDIA devices, but none usable
            log.warning("--backend auto: the GPU cannot be used (%s); running on the CPU", reason)
        return make_backend("cpu" if cfg.backend == "auto" else cfg.backend, **options)
    return make_backend(cfg.backend, device=device, **options)


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


def check_input(comm, data: str) -> None:
    """That DATA opens and its format is recognised, on rank 0 (collective): a missing, empty or unreadable
    file ends the run on every rank with its message before anything starts compiling.

    Raises
    ------
    UsageError, InputError
        On every rank (:func:`mpikmeans.io.formats.detect`'s).
    """
    comm.from_root(lambda: formats.detect(data).name)


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
