"""Fault injection for the reliability tests: make one rank fail on purpose.

``MPIKMEANS_FAULT=RANK:STAGE:KIND[:COUNT]`` makes rank RANK fail when it
reaches STAGE (``read``, ``iteration``, ``write``) for the COUNT-th time
(default: the first).  KIND is ``raise`` (an unexpected exception), ``memory``
(MemoryError), ``exit`` (``sys.exit(5)``), ``kill`` (SIGKILL to itself) or
``term`` (SIGTERM to itself, as a scheduler's warning would).  Unset in normal
use: then :func:`fault_point` costs one dictionary look-up.
"""

from __future__ import annotations

import os
import signal
import sys
from collections import Counter

_reached: Counter = Counter()


def fault_point(rank: int, stage: str) -> None:
    """Fail here if ``MPIKMEANS_FAULT`` asks this rank to fail at ``stage``."""
    spec = os.environ.get("MPIKMEANS_FAULT")
    if not spec:
        return
    try:
        want_rank, want_stage, kind, *count = spec.split(":")
        if int(want_rank) != rank or want_stage != stage:
            return
        _reached[stage] += 1
        if _reached[stage] != (int(count[0]) if count else 1):
            return
    except ValueError:
        return
    if kind == "raise":
        raise RuntimeError(f"injected fault at {stage} (MPIKMEANS_FAULT)")
    if kind == "memory":
        raise MemoryError(f"injected out-of-memory at {stage} (MPIKMEANS_FAULT)")
    if kind == "exit":
        sys.exit(5)
    if kind == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    if kind == "term":
        os.kill(os.getpid(), signal.SIGTERM)
