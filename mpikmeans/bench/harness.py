"""What every benchmark mode shares: starting the tool, timing, statistics, the result file.

* :func:`default_launcher`, :func:`mpi_env` and :class:`Launch`: the tool is
  started as a user starts it, ``mpirun -np P python -m mpikmeans ...``, with the
  environment Open MPI needs as root and oversubscribed, a time limit and one
  clear error when it fails (:func:`run_command`).
* :func:`stats`: median, min and max of repeated measurements.
* :class:`CudaEvents` and :func:`time_cuda`: GPU work timed with CUDA events
  (PyTorch's) after a warm-up, with the wall clock beside it.
* :func:`machine_description`, :func:`result_document`, :func:`write_result`,
  :func:`read_result`: one JSON format for every mode.  A result file holds
  ``bench`` (the mode), ``command`` (the exact command line), ``date``,
  ``machine`` (host, cores, GPUs, library versions), ``settings``, then the
  mode's own keys (the keys the scripts of earlier versions wrote, so
  ``bench/results/`` reads the same); :func:`read_result` also reads those older
  files.

Nothing here prints; callers pass a ``progress`` callable where they want lines.
"""

from __future__ import annotations

import functools
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from datetime import datetime
from typing import Callable

import numpy as np

from .. import __version__
from ..backends import cuda_simulator_requested
from ..errors import RunError, UsageError
from ..io.output import write_atomic

#: What benchmark functions take to report a line of progress.
Progress = Callable[[str], None]


def quiet(line: str) -> None:
    """A ``progress`` that drops every line."""


# -- starting the tool ---------------------------------------------------------------------


def default_launcher() -> list:
    """``mpirun`` (the one beside this Python first), ranks unbound: each sets its own threads."""
    path = os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", "")
    mpirun = shutil.which("mpirun", path=path) or shutil.which("mpiexec", path=path)
    if mpirun is None:
        raise UsageError("no mpirun found: install the 'mpi' extra or give --launcher")
    return [mpirun, "--bind-to", "none"]


def mpi_env(extra: dict | None = None) -> dict:
    """This environment plus what Open MPI 4 and 5 need to run as root and oversubscribed.

    The directory of this Python goes first on ``PATH``, so the ranks find the
    ``mpirun`` and the packages of the environment the benchmark runs in.
    """
    # root (containers, the lent GPU machines) and more ranks than cores must be allowed
    env = {**os.environ, "OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
           "OMPI_MCA_rmaps_base_oversubscribe": "1", "PRTE_MCA_rmaps_default_mapping_policy": ":oversubscribe",
           "PATH": os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", "")}
    env.update(extra or {})
    return env


@functools.lru_cache(maxsize=None)
def is_open_mpi(launcher: str) -> bool:
    """Whether ``launcher`` is Open MPI's (which takes ``-x VAR`` to pass a variable on)."""
    try:
        out = subprocess.run([launcher, "--version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return False
    return "Open MPI" in out.stdout + out.stderr


@dataclass
class Ran:
    """A finished command: its standard output and wall time."""

    stdout: str
    wall_s: float


def run_command(cmd: list, timeout: float, env: dict | None = None, cwd: str | None = None) -> Ran:
    """Run ``cmd`` to the end within ``timeout`` seconds.

    Parameters
    ----------
    cmd : list of str
    timeout : float
    env : dict, optional
        Added to :func:`mpi_env`.
    cwd : str, optional

    Returns
    -------
    Ran

    Raises
    ------
    RunError
        It could not start, ran past ``timeout`` or exited non-zero; the message
        holds the command and the last lines of its output.
    """
    cmd = [str(c) for c in cmd]
    t0 = time.perf_counter()
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=mpi_env(env), cwd=cwd)
    except subprocess.TimeoutExpired:
        raise RunError(f"bench: no result within {timeout:.0f} s from: {' '.join(cmd)}") from None
    except OSError as exc:
        raise RunError(f"bench: cannot start {cmd[0]}: {exc.strerror or exc}") from None
    wall = time.perf_counter() - t0
    if done.returncode != 0:
        tail = (done.stderr or done.stdout).strip().splitlines()[-8:]
        raise RunError(f"bench: exit {done.returncode} from: {' '.join(cmd)}\n" + "\n".join(tail))
    return Ran(done.stdout, wall)


def tool_command(*args) -> list:
    """``python -m mpikmeans ARGS`` with this Python."""
    return [sys.executable, "-m", "mpikmeans", *[str(a) for a in args]]


@dataclass
class Launch:
    """How a benchmark starts the tool: launcher, time limit, extra environment, directory.

    Attributes
    ----------
    launcher : list of str
        The MPI launcher and its options (default: :func:`default_launcher`).
    timeout_s : float
        Seconds allowed for any one command.
    env : dict
        Added to :func:`mpi_env`.  ``PYTHONPATH`` (here or in this environment)
        is passed on to the ranks where the launcher is Open MPI's.
    cwd : str, optional
        Working directory of the commands (not a checkout whose package
        ``python -m`` would import before ``PYTHONPATH``'s).
    """

    launcher: list = field(default_factory=list)
    timeout_s: float = 1800.0
    env: dict = field(default_factory=dict)
    cwd: str | None = None

    def __post_init__(self):
        if not self.launcher:
            self.launcher = default_launcher()

    def with_env(self, **env) -> "Launch":
        """The same launch with more environment."""
        return Launch(self.launcher, self.timeout_s, {**self.env, **env}, self.cwd)

    def mpi(self, ranks: int, *args) -> Ran:
        """``LAUNCHER -np RANKS python -m mpikmeans ARGS``."""
        forward = []
        if (self.env.get("PYTHONPATH") or os.environ.get("PYTHONPATH")) and is_open_mpi(self.launcher[0]):
            forward = ["-x", "PYTHONPATH"]  # other nodes' ranks do not inherit the launcher's environment
        return run_command([*self.launcher, "-np", str(ranks), *forward, *tool_command(*args)], self.timeout_s,
                           self.env, self.cwd)

    def alone(self, *args) -> Ran:
        """``python -m mpikmeans ARGS`` in one process, without the launcher."""
        return run_command(tool_command(*args), self.timeout_s, self.env, self.cwd)

    def python(self, *args) -> Ran:
        """``python ARGS`` with this launch's environment (a helper process of a benchmark)."""
        return run_command([sys.executable, *args], self.timeout_s, self.env, self.cwd)


def warm_up(launch: Launch, directory: str, backends: list) -> float:
    """Run gen-data and the tool once on a tiny input with each backend; the seconds it took.

    Numba caches the parser's, the writer's and the CPU backend's kernels on disk;
    the first run of a fresh checkout compiles them (tens of seconds), which would
    otherwise land in the first measurement.  GPU kernels are compiled per shape
    inside each run's own warm-up and are outside ``per_iteration_s`` anyway.
    """
    t0 = time.perf_counter()
    os.makedirs(directory, exist_ok=True)
    arff = os.path.join(directory, "warm.arff")
    launch.mpi(1, "gen-data", arff, "-n", 2000, "-m", 3, "-k", 2, "-q")
    for backend in backends:
        launch.mpi(1, "run", arff, "-k", 2, "--max-iter", 2, "--backend", backend,
                   "-o", os.path.join(directory, backend), "--overwrite", "-q")
    return time.perf_counter() - t0


@dataclass
class GenRuns:
    """Settings of a mode that runs the tool on a ``gen-data`` input: its size, rank counts and repeats."""

    rows: int = 1_000_000
    attrs: int = 16
    k: int = 8
    ranks: tuple = (1, 2)
    repeats: int = 3

    def check_runs(self, mode: str, positive: tuple = (), lists: tuple = ()) -> None:
        """Raise :class:`UsageError` for a size, repeat or count below 1, or more blobs than rows.

        ``positive`` and ``lists`` name the mode's own numbers and lists of counts to check too.
        """
        for name in ("rows", "attrs", "k", "repeats", *positive):
            if getattr(self, name) < 1:
                raise UsageError(f"bench {mode}: {name} must be at least 1")
        if self.k > self.rows:
            raise UsageError(f"bench {mode}: k={self.k} is more than the {self.rows} rows")
        for name in ("ranks", *lists):
            values = getattr(self, name)
            if values is not None and (not values or min(values) < 1):
                raise UsageError(f"bench {mode}: --{name.replace('_', '-')} must be counts of at least 1")


# -- statistics and timing -----------------------------------------------------------------


def stats(values) -> dict:
    """Median, minimum and maximum of repeated measurements.

    Parameters
    ----------
    values : sequence of float, at least one

    Returns
    -------
    dict
        ``median``, ``min``, ``max``.
    """
    values = list(values)
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


class CudaEvents:
    """Two CUDA events (PyTorch's) around a piece of GPU work, with the wall clock beside them."""

    def __init__(self, torch):
        self.torch = torch
        self.start = torch.cuda.Event(enable_timing=True)
        self.end = torch.cuda.Event(enable_timing=True)

    def measure(self, fn: Callable, calls: int = 1) -> tuple:
        """Call ``fn`` ``calls`` times between the events.

        Returns
        -------
        (last result, event milliseconds, wall milliseconds with the GPU synchronised)
        """
        self.torch.cuda.synchronize()
        w0 = time.perf_counter()
        self.start.record()
        out = None
        for _ in range(calls):
            out = fn()
        self.end.record()
        self.end.synchronize()
        return out, self.start.elapsed_time(self.end), (time.perf_counter() - w0) * 1e3


def time_cuda(torch, fn: Callable, calls: int, repeats: int, warmup: int = 0) -> dict:
    """Milliseconds per call of GPU work, from CUDA events, after ``warmup`` untimed calls.

    Parameters
    ----------
    torch : module
    fn : callable
        Launches the work (asynchronously is fine: the events wait for it).
    calls : int
        Calls per timed run.
    repeats : int
        Timed runs.
    warmup : int

    Returns
    -------
    dict
        ``ms`` (median per call), ``ms_runs`` (per call, each run), ``wall_ms``
        (median wall time per call with the GPU synchronised).
    """
    for _ in range(warmup):
        fn()
    events = CudaEvents(torch)
    runs, walls = [], []
    for _ in range(repeats):
        _, ms, wall = events.measure(fn, calls)
        runs.append(ms / calls)
        walls.append(wall / calls)
    return {"ms": statistics.median(runs), "ms_runs": runs, "wall_ms": statistics.median(walls)}


# -- the machine and the result file -------------------------------------------------------


def count_gpus() -> int:
    """NVIDIA GPUs this process may use (``nvidia-smi -L``, narrowed by ``CUDA_VISIBLE_DEVICES``)."""
    if cuda_simulator_requested() or not shutil.which("nvidia-smi"):
        return 0
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return 0
    found = sum(1 for line in out.splitlines() if line.startswith("GPU "))
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        found = min(found, len([v for v in visible.split(",") if v.strip()]))
    return found


def cpu_model() -> str:
    """The processor's model name (``/proc/cpuinfo``), or "" where it cannot be read: the lent GPU
    machines are all "vm" with 16 cores, and only the model tells their hosts' CPUs apart."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return ""


def machine_description(gpus: int | None = None) -> dict:
    """Host, cores, GPUs and library versions, for result files and the plots' captions.

    Parameters
    ----------
    gpus : int, optional
        GPUs to name (default: :func:`count_gpus`).
    """
    gpus = count_gpus() if gpus is None else gpus
    gpu_names = []
    if gpus and shutil.which("nvidia-smi"):
        try:
            out = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                                 text=True, timeout=30).stdout
            gpu_names = [line.strip() for line in out.splitlines() if line.strip()][:gpus]
        except (OSError, subprocess.SubprocessError):
            pass
    import numba

    return {"host": platform.node(), "cores": os.cpu_count(), "cpu": platform.processor() or platform.machine(),
            "cpu_model": cpu_model(), "gpus": gpu_names, "python": platform.python_version(), "numpy": np.__version__,
            "numba": numba.__version__, "mpikmeans": __version__}


def result_document(bench: str, command: str, settings: dict, results: dict, machine: dict | None = None) -> dict:
    """One result in the common format: what was run, where, how, then the mode's own keys.

    Parameters
    ----------
    bench : str
        The mode (``"gpu"``, ``"cpu"``, ``"read"``, ``"mpi-gpu"``, ``"parity"``, ``"run"``...).
    command : str
        The exact command line.
    settings : dict
        The options the mode ran with.
    results : dict
        The mode's own keys; a key of the common part (``date``, ``machine``...)
        is the common part's.
    machine : dict, optional
        Default: :func:`machine_description`.

    Returns
    -------
    dict
    """
    head = {"bench": bench, "command": command, "date": datetime.now().isoformat(timespec="seconds"),
            "machine": machine if machine is not None else machine_description(), "settings": settings}
    return {**head, **{k: v for k, v in results.items() if k not in head}}


def write_result(path: str, doc: dict) -> str:
    """Write a result document as JSON (atomic), making its directory; the path written."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    write_atomic(path, (json.dumps(doc, indent=1) + "\n").encode())
    return path


def _mode_of(doc: dict) -> str | None:
    # files written before the common format: each script's keys say which it was
    if "sweeps" in doc and "mode" in doc:
        return "run"
    if "variants" in (doc.get("results") or [{}])[0]:
        return "gpu"
    if "points" in doc:
        return "cpu"
    if "phases" in doc and "gen" in doc:
        return "read"
    if "iter_ms_median" in doc:
        return "mpi-gpu"
    if "cpu" in doc and "gpu" in doc:
        return "parity"
    return None


def read_result(path: str) -> dict:
    """A result file of any version, in the common format.

    Files written before it get ``bench`` from their keys, and ``machine`` as a
    dict (the CPU script wrote the host name there; the GPU script wrote
    ``host``).  Everything else is as written.

    Raises
    ------
    UsageError
        The file is missing or not JSON.
    """
    try:
        with open(path) as f:
            doc = json.load(f)
    except OSError as exc:
        raise UsageError(f"{path}: cannot read: {exc.strerror or exc}") from None
    except ValueError as exc:
        raise UsageError(f"{path}: not a JSON result file: {exc}") from None
    if not isinstance(doc, dict):
        raise UsageError(f"{path}: not a JSON result file (no object at the top)")
    doc.setdefault("bench", _mode_of(doc))
    machine = doc.get("machine")
    if isinstance(machine, str):
        doc["machine"] = {"host": machine, "cores": doc.get("cpus"), "python": doc.get("python")}
    elif machine is None:
        doc["machine"] = {"host": doc.get("host")}
    return doc
