"""The only module that imports mpi4py.

:func:`world` returns a :class:`Comm`: an MPI communicator wrapped in the few
operations the tool needs, or :class:`SerialComm`, a stand-in with the same
methods for a single process without MPI.  Everything else receives the
communicator as an argument and never touches mpi4py.

mpi4py is imported inside :func:`world`, so ``mpikmeans --help`` and the pure
modules work on a machine without MPI.
"""

from __future__ import annotations

import os
import socket
import sys
import time
from typing import Any, Callable

import numpy as np

from .cpus import cgroup_cpu_limit, cpus_per_rank, own_share, threads_for_share, usable_cpus
from .errors import MpikmeansError

_OPS = ("sum", "min", "max")


def default_threads(comm) -> int:
    """Threads per rank when the user gives no ``--threads``: ranks x threads stay within the node's CPUs.

    This rank's share of its node's CPUs (:func:`~mpikmeans.cpus.cpus_per_rank`:
    the affinity mask shared by the ranks whose masks overlap it, within the
    cgroup's CPU quota), lowered to ``OMP_NUM_THREADS`` or ``NUMBA_NUM_THREADS``
    when one is set (:func:`~mpikmeans.cpus.threads_for_share`).  ``--threads``
    is the way to ask for more.  The one decision for reading, the CPU
    backend's compute and ``gen-data``.
    """
    share = getattr(comm, "cpus_per_rank", None)
    if share is None:  # a stand-in communicator without the node's masks: all its ranks share this one
        mine = usable_cpus()
        share = cpus_per_rank(mine, [mine] * comm.node_size, comm.node_size, cgroup_cpu_limit())
    return threads_for_share(share)


class SerialComm:
    """A one-process communicator: every collective is the identity."""

    rank = 0
    size = 1
    node_rank = 0
    node_size = 1
    is_mpi = False

    def __init__(self):
        self.host = socket.gethostname()
        #: This rank's share of the node's CPUs (see :func:`~mpikmeans.cpus.cpus_per_rank`).
        self.cpus_per_rank = own_share()

    def allreduce(self, buf: np.ndarray, op: str = "sum") -> np.ndarray:
        """Element-wise reduction of a numeric array over all ranks (a copy)."""
        if op not in _OPS:
            raise ValueError(f"unknown reduction {op!r}")
        return np.array(buf, copy=True)

    def allreduce_in_place(self, buf: np.ndarray, op: str = "sum") -> None:
        """:meth:`allreduce` into ``buf`` itself (a C-contiguous array), with no copy."""
        if op not in _OPS:
            raise ValueError(f"unknown reduction {op!r}")

    def allgather(self, obj: Any) -> list:
        """Every rank's ``obj``, in rank order."""
        return [obj]

    def bcast(self, obj: Any, root: int = 0) -> Any:
        """``obj`` from rank ``root`` on every rank."""
        return obj

    def barrier(self) -> None:
        """Wait for all ranks."""

    def abort(self, code: int) -> None:
        """End the whole job at once with ``code``."""
        os._exit(code)

    def library(self) -> str:
        """The MPI library's name and version, or why there is none."""
        return "none (one process, not started by an MPI launcher)"

    def from_root(self, fn: Callable[[], Any]) -> Any:
        """Run ``fn`` on rank 0 only; every rank gets its result, or raises its error (collective).

        For work one rank does for all (parsing a header, reading a small file):
        an :class:`MpikmeansError` raised by ``fn`` is raised on every rank,
        marked collective, so all ranks exit together with its code.
        """
        result, failure = None, None
        if self.rank == 0:
            try:
                result = fn()
            except MpikmeansError as exc:
                failure = (type(exc), exc.message)
        result, failure = self.bcast((result, failure), root=0)
        if failure is not None:
            cls, message = failure
            raise cls(message, collective=True)
        return result

    def agree(self, error: MpikmeansError | None, key: float = 0.0) -> None:
        """Raise, on every rank, the first error any rank has (see :meth:`Comm.agree`)."""
        if error is not None:
            error.collective = True
            raise error


class Comm(SerialComm):
    """An MPI communicator with the operations mpikmeans uses.

    Parameters
    ----------
    mpi_comm : mpi4py.MPI.Comm
        Usually ``MPI.COMM_WORLD``.
    """

    is_mpi = True

    def __init__(self, mpi_comm):
        super().__init__()
        from mpi4py import MPI

        self._MPI = MPI
        self._comm = mpi_comm
        self.rank = mpi_comm.Get_rank()
        self.size = mpi_comm.Get_size()
        # node-local rank from the MPI library itself, so it works under any
        # launcher (mpirun, mpiexec.hydra, srun), not from one launcher's variables
        node = mpi_comm.Split_type(MPI.COMM_TYPE_SHARED, key=self.rank)
        self.node_rank = node.Get_rank()
        self.node_size = node.Get_size()
        # which ranks of the node share which CPUs: unbound ranks share them all,
        # ranks bound to cores or sockets share only those (one exchange, at start)
        mine = usable_cpus()
        self.cpus_per_rank = cpus_per_rank(mine, node.allgather(mine), self.node_size, cgroup_cpu_limit())
        node.Free()
        self._ops = {"sum": MPI.SUM, "min": MPI.MIN, "max": MPI.MAX}

    def allreduce(self, buf: np.ndarray, op: str = "sum") -> np.ndarray:
        out = np.ascontiguousarray(buf).copy()
        self._comm.Allreduce(self._MPI.IN_PLACE, out, op=self._ops[op])
        return out

    def allreduce_in_place(self, buf: np.ndarray, op: str = "sum") -> None:
        if not buf.flags.c_contiguous:
            raise ValueError("allreduce_in_place needs a C-contiguous array")
        self._comm.Allreduce(self._MPI.IN_PLACE, buf, op=self._ops[op])

    def allgather(self, obj: Any) -> list:
        return self._comm.allgather(obj)

    def bcast(self, obj: Any, root: int = 0) -> Any:
        return self._comm.bcast(obj, root=root)

    def barrier(self) -> None:
        self._comm.Barrier()

    def abort(self, code: int) -> None:
        # give the launcher a moment to forward the message just printed:
        # Abort kills every rank, and output still in the pipe can be lost
        sys.stdout.flush()
        sys.stderr.flush()
        time.sleep(0.5)
        self._comm.Abort(code)

    def library(self) -> str:
        # Open MPI 4 pads the string with NUL bytes
        return self._MPI.Get_library_version().split("\x00")[0].strip().splitlines()[0]

    def agree(self, error: MpikmeansError | None, key: float = 0.0) -> None:
        """Make an error seen by some ranks an error of every rank.

        Every rank calls this at the same point.  If any rank passes an error,
        every rank raises the one with the smallest ``key`` (for a data error:
        the global line number, so the message names the first bad line of the
        file), marked collective, so all ranks exit cleanly with its code and
        no rank is left waiting in a later collective.

        Parameters
        ----------
        error : MpikmeansError or None
            This rank's error, if any.
        key : float
            Orders errors from different ranks; the smallest wins.
        """
        mine = None if error is None else (key, self.rank, type(error), error.message)
        reports = [r for r in self._comm.allgather(mine) if r is not None]
        if not reports:
            return
        _, _, cls, message = min(reports, key=lambda r: (r[0], r[1]))
        raise cls(message, collective=True)


#: Variables an MPI launcher (mpirun/mpiexec of Open MPI, MPICH, Intel MPI, MVAPICH; srun;
#: PMI/PMIx) sets in the processes it starts.
LAUNCHER_VARIABLES = ("OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_RANK", "PMI_SIZE", "PMI_FD", "MV2_COMM_WORLD_SIZE",
                      "MPI_LOCALNRANKS", "HYDI_CONTROL_FD", "SLURM_STEP_ID", "ALPS_APP_PE", "PALS_RANKID")


def launched() -> bool:
    """Whether an MPI launcher started this process (else it is one process on its own)."""
    return any(v in os.environ for v in LAUNCHER_VARIABLES)


def world() -> SerialComm:
    """The communicator of all processes of this job.

    Returns a :class:`Comm` on ``MPI.COMM_WORLD`` when an MPI launcher started
    this process and mpi4py can be imported, else a :class:`SerialComm`: a
    process started on its own is a job of one, and initialising MPI for it
    (a singleton start of the MPI runtime) would cost about a second of every
    such run.  ``MPIKMEANS_NO_MPI=1`` forces the serial stand-in,
    ``MPIKMEANS_NO_MPI=0`` initialises MPI whatever started the process.
    """
    forced = os.environ.get("MPIKMEANS_NO_MPI")
    if forced == "1" or (forced != "0" and not launched()):
        return SerialComm()
    try:
        from mpi4py import MPI
    except ImportError:
        return SerialComm()
    return Comm(MPI.COMM_WORLD)


def run_guarded(comm: SerialComm, body: Callable[[], int], report: Callable[[MpikmeansError | BaseException, bool], None]) -> int:
    """Run ``body`` so that no failure on any rank can leave the job hanging.

    Parameters
    ----------
    comm : SerialComm or Comm
    body : callable returning int
        The command; returns the exit code.
    report : callable(error, fatal)
        Shows an error to the user (the CLI prints it).  ``fatal`` is True when
        the job is about to be aborted.

    Returns
    -------
    int
        The exit code, when the job was not aborted.

    Notes
    -----
    An :class:`MpikmeansError` marked ``collective`` was raised on every rank:
    each rank returns its exit code and the job ends normally.  Any other
    exception (one rank's bug, an I/O error, MemoryError) may have left other
    ranks inside a collective, so with more than one rank the job is aborted
    with ``MPI_Abort`` and the error's exit code.
    """
    try:
        return body()
    except MpikmeansError as exc:
        if exc.collective or comm.size == 1:
            report(exc, False)
            return exc.exit_code
        report(exc, True)
        comm.abort(exc.exit_code)
        return exc.exit_code
    except KeyboardInterrupt:
        if comm.size > 1:
            comm.abort(130)
        return 130
    except BaseException as exc:  # noqa: BLE001 - the last line of defence against a hang
        if isinstance(exc, SystemExit) and (exc.code in (0, None)):
            raise
        report(exc, True)
        if comm.size > 1:
            comm.abort(1)
        return 1
