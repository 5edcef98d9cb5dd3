"""Compute backends: the per-rank arithmetic of one Lloyd iteration, and the choice of backend.

Every backend implements :class:`~.base.Backend` (:mod:`.base`) and is chosen by name with
:func:`make_backend`: ``cpu`` (:mod:`.cpu`), ``gpu`` (:mod:`.gpu`, imported only when asked for:
numba-cuda's import is slow), ``auto`` (the GPU where one is usable).
"""

from __future__ import annotations

import os

from ..choices import BACKEND_NAMES
from .base import (Backend, BackendInfo, BackendUnavailable, RowDistances, StepResult,  # noqa: F401
                   device_for_rank, farthest_rows)


def cuda_simulator_requested() -> bool:
    """Whether this process runs numba-cuda's simulator (``NUMBA_ENABLE_CUDASIM=1``): read from the
    environment, without importing numba-cuda (slow), for the checks made before a backend exists."""
    return os.environ.get("NUMBA_ENABLE_CUDASIM") == "1"


def make_backend(name: str, **options) -> Backend:
    """Create a backend by name.

    Parameters
    ----------
    name : {"cpu", "gpu", "auto"}
        ``auto`` picks the GPU when one is usable, else the CPU.
    **options
        Passed to the backend's constructor (``threads`` and ``node_ranks`` for the CPU;
        ``device``, ``dtype``, ``chunk_rows`` for the GPU).

    Raises
    ------
    BackendUnavailable
        ``gpu`` was asked for and cannot run here.
    """
    def cpu():
        from .cpu import CPUBackend

        return CPUBackend(threads=options.get("threads"), node_ranks=options.get("node_ranks", 1))

    if name == "cpu":
        return cpu()
    if name in ("gpu", "auto"):
        try:
            from .gpu import GPUBackend, gpu_available
        except ImportError as exc:  # numba-cuda not installed, or gpu.py absent
            if name == "gpu":
                raise BackendUnavailable(f"the GPU backend cannot be loaded: {exc}") from None
            return cpu()
        if name == "auto" and not gpu_available():
            return cpu()
        gpu_options = {k: v for k, v in options.items() if k not in ("threads", "node_ranks")}
        return GPUBackend(**gpu_options)
    raise ValueError(f"unknown backend {name!r}; expected one of {', '.join(BACKEND_NAMES)}")
