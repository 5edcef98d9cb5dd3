"""What the benchmarks share: starting the tool, statistics, the machine, the result file.

* :func:`default_launcher`, :func:`mpi_env` and :class:`Launch`: the tool is
  started as a user starts it, ``python -m mpikmeans ...`` alone or under
  ``mpirun -np P``, with the environment Open MPI needs as root and
  oversubscribed, a time limit and one clear error when it fails
  (:func:`run_command`).
* :func:`stats`: median, min and max of repeated measurements.
* :class:`CudaEvents` and :func:`time_cuda`: GPU work timed with CUDA events
  (PyTorch's), with the wall clock beside them.
* :func:`machine_description`, :func:`code_commit`, :func:`result_document`,
  :func:`write_result`, :func:`read_result`: one JSON format for every
  benchmark.  A result file holds ``bench`` (which benchmark), ``command`` (the
  exact command line), ``date``, ``commit`` (the code measured), ``machine``
  (host, cores, GPUs, library versions), ``settings``, then the benchmark's own
  keys.

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
from ..cache import cpu_model
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
    ``mpirun`` and the packages of the environment the benchmark runs in.  A
    value of None in ``extra`` removes that variable.
    """
    # root (containers, the lent GPU machines) and more ranks than cores must be allowed
    env = {**os.environ, "OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
           "OMPI_MCA_rmaps_base_oversubscribe": "1", "PRTE_MCA_rmaps_default_mapping_policy": ":oversubscribe",
           "PATH": os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", "")}
    for key, value in (extra or {}).items():
        if value is None:
            env.pop(key, None)
        else:
            env[key] = str(value)
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


#: What Open MPI's mpirun prints when its PMIx server cannot start (seen now and then on a busy machine)
MPI_START_FAILURE = "PMIx server's listener thread failed to start"


def run_command(cmd: list, timeout: float, env: dict | None = None, cwd: str | None = None) -> Ran:
    """Run ``cmd`` to the end within ``timeout`` seconds.

    Parameters
    ----------
    cmd : list of str
    timeout : float
    env : dict, optional
        Added to :func:`mpi_env` (None values remove a variable).
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
    for attempt in range(2):
        t0 = time.perf_counter()
        try:
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=mpi_env(env), cwd=cwd)
        except subprocess.TimeoutExpired:
            raise RunError(f"bench: no result within {timeout:.0f} s from: {' '.join(cmd)}") from None
        except OSError as exc:
            raise RunError(f"bench: cannot start {cmd[0]}: {exc.strerror or exc}") from None
        wall = time.perf_counter() - t0
        # Open MPI's runtime failing to start, before any rank ran: launched once more, as a user would
        if done.returncode == 0 or MPI_START_FAILURE not in (done.stderr or "") or attempt:
            break
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
        The MPI launcher and its options (default: :func:`default_launcher`,
        looked up when a command first needs it).
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

    def with_env(self, **env) -> "Launch":
        """The same launch with more environment (None removes a variable)."""
        return Launch(self.launcher, self.timeout_s, {**self.env, **env}, self.cwd)

    def mpirun(self) -> list:
        """The launcher's command; :class:`UsageError` where there is none."""
        if not self.launcher:
            self.launcher = default_launcher()
        return self.launcher

    def has_launcher(self) -> bool:
        """Whether :meth:`mpi` can start ranks here."""
        try:
            self.mpirun()
        except UsageError:
            return False
        return True

    def mpi(self, ranks: int, *args) -> Ran:
        """``LAUNCHER -np RANKS python -m mpikmeans ARGS``."""
        launcher = self.mpirun()
        forward = []
        if (self.env.get("PYTHONPATH") or os.environ.get("PYTHONPATH")) and is_open_mpi(launcher[0]):
            forward = ["-x", "PYTHONPATH"]  # other nodes' ranks do not inherit the launcher's environment
        return run_command([*launcher, "-np", str(ranks), *forward, *tool_command(*args)], self.timeout_s,
                           self.env, self.cwd)

    def alone(self, *args) -> Ran:
        """``python -m mpikmeans ARGS`` in one process, without the launcher."""
        return run_command(tool_command(*args), self.timeout_s, self.env, self.cwd)

    def tool(self, ranks: int, *args) -> Ran:
        """:meth:`mpi` with ``ranks`` ranks, or :meth:`alone` where ``ranks`` is 0."""
        return self.mpi(ranks, *args) if ranks else self.alone(*args)

    def python(self, *args) -> Ran:
        """``python ARGS`` with this launch's environment (a helper process of a benchmark)."""
        return run_command([sys.executable, *args], self.timeout_s, self.env, self.cwd)


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


def code_commit() -> str:
    """The commit of the code measured: ``MPIKMEANS_COMMIT`` where set, else git's, else "unknown".

    Git's answer is the checkout's ``HEAD`` (12 digits), with ``+dirty`` where
    the package's tracked files differ from it.  A copy without ``.git`` (the
    lent GPU machines get one) says "unknown" unless the variable names it.
    """
    given = os.environ.get("MPIKMEANS_COMMIT")
    if given:
        return given
    package = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    root = os.path.dirname(package)
    try:
        head = subprocess.run(["git", "-C", root, "rev-parse", "--short=12", "HEAD"], capture_output=True,
                              text=True, timeout=30)
        if head.returncode != 0:
            return "unknown"
        dirty = subprocess.run(["git", "-C", root, "status", "--porcelain", "--untracked-files=no", "--", package],
                               capture_output=True, text=True, timeout=30).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return head.stdout.strip() + ("+dirty" if dirty else "")


def result_document(bench: str, command: str, settings: dict, results: dict, machine: dict | None = None) -> dict:
    """One result in the common format: what was run, where, on which code, how; then the benchmark's keys.

    Parameters
    ----------
    bench : str
        The benchmark (``"run"``, ``"runs"``, ``"runs-sweep"``...).
    command : str
        The exact command line.
    settings : dict
        The options it ran with.
    results : dict
        The benchmark's own keys; a key of the common part (``date``,
        ``machine``...) is the common part's.
    machine : dict, optional
        Default: :func:`machine_description`.

    Returns
    -------
    dict
    """
    head = {"bench": bench, "command": command, "date": datetime.now().isoformat(timespec="seconds"),
            "commit": code_commit(), "machine": machine if machine is not None else machine_description(),
            "settings": settings}
    return {**head, **{k: v for k, v in results.items() if k not in head}}


def write_result(path: str, doc: dict) -> str:
    """Write a result document as JSON (atomic), making its directory; the path written."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    write_atomic(path, (json.dumps(doc, indent=1) + "\n").encode())
    return path


def read_result(path: str) -> dict:
    """A result file, in the common format.

    The sweeps' ``meta.json`` files written before the common format get
    ``bench`` ("run") from their keys, and ``machine`` as a dict where it was a
    host name.  Everything else is as written.

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
    if "bench" not in doc:
        doc["bench"] = "run" if "sweeps" in doc else None
    machine = doc.get("machine")
    if isinstance(machine, str):
        doc["machine"] = {"host": machine}
    elif machine is None:
        doc["machine"] = {"host": doc.get("host")}
    return doc
