"""Stop requests by signal: finish the iteration, checkpoint, exit.

PBS and Slurm send SIGTERM to every process of a job before walltime (Slurm's
``--signal=USR1@SECONDS`` sends SIGUSR1 earlier), and ``mpirun`` forwards the
signals it gets to the ranks.  The handler only sets a flag; the Lloyd loop
polls it once per iteration and agrees on it through its Allreduce, so all
ranks stop at the same iteration.
"""

from __future__ import annotations

import signal

#: Exit code of a run stopped by a signal after writing its checkpoint
#: (EX_TEMPFAIL: "try again"), distinct from failures.
EXIT_CHECKPOINTED = 75

STOP_SIGNALS = (signal.SIGTERM, signal.SIGUSR1)


class StopRequest:
    """A flag set by SIGTERM or SIGUSR1 while installed (a context manager)."""

    def __init__(self, signals=STOP_SIGNALS):
        self.signals = signals
        self.signum = None
        self._previous = {}

    def _handler(self, signum, frame):  # noqa: ARG002 - signal handler signature
        self.signum = signum

    def __enter__(self) -> "StopRequest":
        for s in self.signals:
            self._previous[s] = signal.signal(s, self._handler)
        return self

    def __exit__(self, *exc) -> None:
        for s, handler in self._previous.items():
            signal.signal(s, handler)

    def __call__(self) -> bool:
        return self.signum is not None

    @property
    def name(self) -> str:
        return signal.Signals(self.signum).name if self.signum is not None else ""
