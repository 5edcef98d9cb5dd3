"""Stop requests by signal: finish the iteration, checkpoint, exit 75.

Schedulers and terminals stop a job with signals, and ``mpirun`` passes them on
in its own way (measured with Open MPI 5.0 and 4.1):

- SIGTERM or SIGINT to ``mpirun`` (a scheduler's walltime, ``qdel``/``scancel``,
  Ctrl-C): mpirun sends the ranks SIGCONT, then SIGTERM (0.25 s later with Open
  MPI 5, 1 s with Open MPI 4.1), then SIGKILL as long again after that; it
  stops forwarding the ranks' output and exits 1 whatever the ranks do.
- SIGUSR1 (Open MPI 5) and SIGUSR2 (Open MPI 4.1 and 5) to ``mpirun`` reach the
  ranks as they are, and mpirun exits with the ranks' code (75): the gentle way
  to stop a job, which the job templates use.
- PBS and Slurm may signal every process of the job at once (the ranks too).

So a rank has a fraction of a second between SIGTERM and SIGKILL.  The
handler only sets a flag, which the Lloyd loop polls once per iteration and
agrees on through its Allreduce, so all ranks stop after the same iteration
and write the checkpoint then; and at the signal itself a helper thread calls
``on_signal`` at once, even while the main thread is inside compiled code, to
save the last completed iteration before a SIGKILL can come.
"""

from __future__ import annotations

import os
import signal
import threading

#: Exit code of a run stopped by a signal (EX_TEMPFAIL: "try again"), distinct
#: from failures: the state is saved in the checkpoint the message names, or,
#: stopped before its first iteration, there was nothing to save.
EXIT_CHECKPOINTED = 75

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1, signal.SIGUSR2)


class StopRequest:
    """A flag set by a stop signal while installed (a context manager).

    Parameters
    ----------
    signals : tuple of signal numbers
    on_signal : callable(int), optional
        Called once, with the first signal's number, from a helper thread as
        soon as the signal arrives (Python runs a handler itself only between
        two bytecodes of the main thread, which can be seconds away in a
        compiled kernel).  Exceptions it raises are its own to report.

    Notes
    -----
    A second SIGINT (Ctrl-C pressed again) raises :class:`KeyboardInterrupt`:
    stop at once, without a checkpoint.  Outside the main thread (where
    Python allows no signal handlers) the request is never set.
    """

    def __init__(self, signals=STOP_SIGNALS, on_signal=None):
        self.signals = signals
        self.signum = None
        self.on_signal = on_signal
        self._previous = {}
        self._wakeup = None  # (read fd, write fd, previous wakeup fd)
        self._watcher = None

    def _handler(self, signum, frame):  # noqa: ARG002 - signal handler signature
        if signum == signal.SIGINT and self.signum is not None:
            raise KeyboardInterrupt
        if self.signum is None:
            self.signum = signum

    def __enter__(self) -> "StopRequest":
        if threading.current_thread() is not threading.main_thread():
            return self
        for s in self.signals:
            self._previous[s] = signal.signal(s, self._handler)
        if self.on_signal is not None:
            r, w = os.pipe()
            os.set_blocking(w, False)
            previous = signal.set_wakeup_fd(w, warn_on_full_buffer=False)
            self._wakeup = (r, w, previous)
            self._watcher = threading.Thread(target=self._watch, args=(r,), name="mpikmeans-stop-signal", daemon=True)
            self._watcher.start()
        return self

    def _watch(self, fd: int) -> None:
        called = False
        while True:
            try:
                data = os.read(fd, 64)
            except OSError:
                return
            if not data:  # the write end closed: the request is over
                return
            if called:
                continue
            mine = [b for b in data if b in self.signals]
            if mine:
                called = True
                self.on_signal(mine[0])

    def __exit__(self, *exc) -> None:
        for s, handler in self._previous.items():
            signal.signal(s, handler)
        self._previous = {}
        if self._wakeup is not None:
            r, w, previous = self._wakeup
            signal.set_wakeup_fd(previous)
            os.close(w)
            # a save the signal started finishes before the run decides what to keep of it (a loaded
            # node may take seconds); a save stuck on a dead file system does not hold the exit for ever
            self._watcher.join(timeout=60)
            os.close(r)
            self._wakeup = None

    def __call__(self) -> bool:
        return self.signum is not None

    @property
    def name(self) -> str:
        return signal.Signals(self.signum).name if self.signum is not None else ""


def exit_code_of(signum: int) -> int:
    """The shell's code for a process killed by ``signum`` (128 + N)."""
    return 128 + int(signum)
