"""A communicator that runs P "ranks" as P threads of one process (tests only).

:class:`ThreadComm` has the methods of :class:`mpikmeans.comm.SerialComm` and
:class:`mpikmeans.comm.Comm` (``rank``, ``size``, ``node_rank``, ``node_size``,
``host``, ``is_mpi``; ``allreduce``, ``allgather``, ``bcast``, ``barrier``,
``agree``, ``library``, ``abort``), so the collective logic of the reader, the
writer and the Lloyd loop can be exercised at 1..7 ranks in-process, in
milliseconds, without ``mpirun``.  (Real ``mpirun`` tests exist separately.)

Like MPI, objects passed to ``allgather`` and ``bcast`` are pickled, so every
rank receives its own copy (aliasing bugs are not hidden, and an unpicklable
object fails here as it would under mpi4py).  ``allreduce`` adds the ranks'
arrays in rank order: ``((a_0 + a_1) + a_2) + ...``.

No thread can hang forever: every collective waits with a timeout, a rank that
raises wakes the ranks waiting in a collective (they raise
:class:`RankFailed`), and a rank that finishes while others wait in a
collective it will never join makes them raise :class:`CollectiveMismatch`.

Use :func:`run_ranks`::

    results = run_ranks(3, lambda comm: read_arff(path, comm))
"""

from __future__ import annotations

import pickle
import socket
import threading
import time
from typing import Any, Callable

import numpy as np

from mpikmeans.backends import RowDistances
from mpikmeans.comm import SerialComm

_OPS = ("sum", "min", "max")

#: Seconds a rank waits in one collective before the test fails (numba may
#: compile a kernel on one rank while the others wait).
DEFAULT_TIMEOUT = 120.0


class ThreadCommError(RuntimeError):
    """The simulated job went wrong (not an error of the code under test)."""


class RankFailed(ThreadCommError):
    """Another rank raised while this one waited in a collective."""


class CollectiveTimeout(ThreadCommError):
    """A collective was not joined by every rank in time (a hang under MPI)."""


class CollectiveMismatch(ThreadCommError):
    """A rank finished while others waited in a collective (a hang under MPI)."""


class Aborted(ThreadCommError):
    """``comm.abort(code)`` was called (MPI_Abort ends the whole job)."""

    def __init__(self, code: int, rank: int):
        super().__init__(f"rank {rank} called abort({code})")
        self.code = code
        self.rank = rank


class _World:
    """State shared by the P threads: a reusable rendezvous and exchange slots."""

    def __init__(self, size: int, timeout: float):
        self.size = size
        self.timeout = timeout
        self.cond = threading.Condition()
        self.count = 0
        self.generation = 0
        self.failed: str | None = None
        self.exited: list = []
        self.slots: list = [None] * size
        self.collectives = [0] * size  # per rank, for diagnostics

    def wait(self, rank: int) -> None:
        with self.cond:
            if self.failed is not None:
                raise RankFailed(f"rank {rank}: {self.failed}")
            if self.exited:
                raise CollectiveMismatch(
                    f"rank {rank} entered collective #{self.collectives[rank]} but rank(s) "
                    f"{self.exited} already finished: under MPI this would hang")
            gen = self.generation
            self.count += 1
            if self.count == self.size:
                self.count = 0
                self.generation += 1
                self.cond.notify_all()
                return
            released = self.cond.wait_for(
                lambda: self.generation != gen or self.failed is not None or bool(self.exited),
                self.timeout)
            if self.generation != gen:
                return  # released, whatever happened afterwards
            if self.failed is not None:
                raise RankFailed(f"rank {rank}: {self.failed}")
            if self.exited:
                raise CollectiveMismatch(
                    f"rank {rank} waits in collective #{self.collectives[rank]} but rank(s) "
                    f"{self.exited} already finished: under MPI this would hang")
            assert not released
            self.failed = f"collective timed out after {self.timeout} s (rank {rank} waited)"
            self.cond.notify_all()
            raise CollectiveTimeout(self.failed)

    def fail(self, why: str) -> None:
        with self.cond:
            if self.failed is None:
                self.failed = why
            self.cond.notify_all()

    def exit(self, rank: int) -> None:
        with self.cond:
            self.exited.append(rank)
            self.cond.notify_all()


def _copy(obj: Any) -> Any:
    return pickle.loads(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL))


class ThreadComm:
    """One rank of a job simulated with threads (see the module docstring)."""

    is_mpi = False

    def __init__(self, world: _World, rank: int):
        self._world = world
        self.rank = rank
        self.size = world.size
        # all ranks on one "node"
        self.node_rank = rank
        self.node_size = world.size
        self.host = socket.gethostname()

    # -- plumbing ------------------------------------------------------------
    def _exchange(self, obj: Any) -> list:
        """Every rank's ``obj`` in rank order (the objects themselves, not copies)."""
        w = self._world
        w.collectives[self.rank] += 1
        w.slots[self.rank] = obj
        w.wait(self.rank)
        out = list(w.slots)
        w.wait(self.rank)  # nobody overwrites a slot before everyone has read it
        return out

    # -- the communicator interface ----------------------------------------------
    def allreduce(self, buf: np.ndarray, op: str = "sum") -> np.ndarray:
        """Element-wise reduction over the ranks; ``sum`` adds in rank order."""
        if op not in _OPS:
            raise ValueError(f"unknown reduction {op!r}")
        mine = np.array(buf, copy=True)
        parts = self._exchange((op, mine))
        ops = {p[0] for p in parts}
        shapes = {(p[1].shape, p[1].dtype.str) for p in parts}
        if len(ops) != 1 or len(shapes) != 1:
            raise ThreadCommError(f"allreduce called with different ops/shapes/dtypes on the ranks: {ops} {shapes}")
        out = parts[0][1].copy()
        for _, arr in parts[1:]:
            if op == "sum":
                out = out + arr
            elif op == "min":
                out = np.minimum(out, arr)
            else:
                out = np.maximum(out, arr)
        return np.asarray(out, dtype=mine.dtype)

    def allreduce_in_place(self, buf: np.ndarray, op: str = "sum") -> None:
        """:meth:`allreduce` written back into ``buf``."""
        buf[...] = self.allreduce(buf, op)

    def allgather(self, obj: Any) -> list:
        """Every rank's ``obj`` (copies), in rank order."""
        return [_copy(o) for o in self._exchange(_copy(obj))]

    def bcast(self, obj: Any, root: int = 0) -> Any:
        """``obj`` of rank ``root`` (a copy) on every rank."""
        if not 0 <= root < self.size:
            raise ValueError(f"bcast root {root} out of range")
        parts = self._exchange(_copy(obj) if self.rank == root else None)
        return _copy(parts[root])

    def barrier(self) -> None:
        """Wait for all ranks."""
        self._exchange(None)

    def agree(self, error, key: float = 0.0) -> None:
        """As :meth:`mpikmeans.comm.Comm.agree`: every rank raises the error with the
        smallest ``(key, rank)``, marked collective, if any rank passed one."""
        mine = None if error is None else (key, self.rank, type(error), error.message)
        reports = [r for r in self.allgather(mine) if r is not None]
        if not reports:
            return
        _, _, cls, message = min(reports, key=lambda r: (r[0], r[1]))
        raise cls(message, collective=True)

    # the same helper the real communicators have, built on this class's bcast
    from_root = SerialComm.from_root

    def library(self) -> str:
        """What a real communicator reports about its MPI library."""
        return f"ThreadComm ({self.size} threads, no MPI)"

    def abort(self, code: int) -> None:
        """MPI_Abort: here the whole simulated job fails with :class:`Aborted`."""
        self._world.fail(f"rank {self.rank} called abort({code})")
        raise Aborted(code, self.rank)


def run_ranks(size: int, fn: Callable[[ThreadComm], Any], *, timeout: float = DEFAULT_TIMEOUT,
              return_exceptions: bool = False) -> list:
    """Run ``fn(comm)`` on ``size`` ranks, one thread each.

    Parameters
    ----------
    size : int
        Number of ranks.
    fn : callable(ThreadComm) -> object
    timeout : float
        Seconds any rank may wait in one collective (and bound on the whole run).
    return_exceptions : bool
        If True, a rank that raised contributes its exception object to the
        result list instead of the whole call raising.

    Returns
    -------
    list
        ``fn``'s result for each rank, in rank order.

    Raises
    ------
    BaseException
        With ``return_exceptions=False``: the first exception of the job, i.e.
        of the lowest rank that raised something other than a consequence of
        another rank's failure (:class:`RankFailed`), else the lowest rank's.
    ThreadCommError
        A rank did not finish (a hang).
    """
    if size < 1:
        raise ValueError("size must be >= 1")
    world = _World(size, timeout)
    results: list = [None] * size
    errors: list = [None] * size
    done = [False] * size

    def target(rank: int) -> None:
        try:
            results[rank] = fn(ThreadComm(world, rank))
        except BaseException as exc:  # noqa: BLE001 - handed to the caller
            errors[rank] = exc
            world.fail(f"rank {rank} raised {type(exc).__name__}: {exc}")
        else:
            world.exit(rank)
        finally:
            done[rank] = True

    threads = [threading.Thread(target=target, args=(r,), name=f"rank-{r}", daemon=True) for r in range(size)]
    for t in threads:
        t.start()
    # a rank may legitimately compute for a while between collectives; the
    # collective timeout catches hangs, this bound catches runaway ranks
    deadline = time.monotonic() + timeout * 3 + 60
    for t in threads:
        t.join(max(0.0, deadline - time.monotonic()))
    hung = [r for r in range(size) if not done[r]]
    if hung:
        world.fail("the test gave up")
        raise ThreadCommError(f"rank(s) {hung} did not finish (a hang)")
    if return_exceptions:
        return [errors[r] if errors[r] is not None else results[r] for r in range(size)]
    failed = [r for r in range(size) if errors[r] is not None]
    if failed:
        primary = [r for r in failed if not isinstance(errors[r], RankFailed)] or failed
        raise errors[primary[0]]
    return results


_backend_lock = threading.Lock()


class Serialised(RowDistances):
    """One rank's one-thread CPU backend, its compute calls serialised across the rank threads.

    numba's parallel kernels are not meant to be launched from several Python
    threads at once; the collectives between the calls stay concurrent.
    Loaded at once when given rows, else by the caller's ``load``.  The
    initialisations' distance passes take the generic path of
    :class:`~mpikmeans.backends.RowDistances` (one ``assign`` per candidate),
    so the tests that use it cover that path against the CPU backend's own.
    """

    def __init__(self, x=None, weights=None):
        from mpikmeans.backends.cpu import CPUBackend

        self.inner = CPUBackend(threads=1)
        if x is not None:
            self.load(x, weights)

    def load(self, x, weights=None, magnitudes=None):
        with _backend_lock:
            self.inner.load(x, weights, magnitudes)

    def magnitudes(self):
        return self.inner.magnitudes()

    def warmup(self, k, m):
        with _backend_lock:
            self.inner.warmup(k, m)

    def step(self, centres, scales):
        with _backend_lock:
            return self.inner.step(centres, scales)

    def farthest(self, centres, count):
        with _backend_lock:
            return self.inner.farthest(centres, count)

    def stored(self, rows):
        return self.inner.stored(rows)

    def assign(self, centres):
        with _backend_lock:
            return self.inner.assign(centres)

    def forget_labels(self):
        with _backend_lock:
            self.inner.forget_labels()

    def close(self):
        pass
