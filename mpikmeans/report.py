"""What a run reports: summary.json's content, its timings, and the notices said before long steps.

:func:`run_summary` gathers the keys of the output contract (shared/DESIGN.md)
and the extras (history, restarts, quality scores) from a finished or stopped
fit; :func:`run_timings` the ``timings`` object from the phases' clocks.  Both
are collective (a few small allgathers) or pure.
"""

from __future__ import annotations

import logging
import math
import os

import numpy as np

from . import __version__
from .config import NOTICE
from .jit import compile_stats

log = logging.getLogger("mpikmeans")

#: Centre-distance products a second a CPU thread makes in k-means++ at 10 attributes (about
#: 1.3e9 on a 2-core Zen 4 for K = 200..2000), rising with the attributes (about 6e9 at 100).
_KMPP_RATE_CPU = 1.2e9
#: The same for a GPU (a rough figure: only to tell seconds from minutes).
_KMPP_RATE_GPU = 1.0e11


def kmeanspp_seconds(n: int, m: int, k: int, workers: int, gpu: bool = False) -> float:
    """A rough estimate of k-means++'s time: about ``n * m * k * (3 + ln k)`` products.

    Parameters
    ----------
    n, m, k : int
    workers : int
        CPU threads over all ranks, or GPUs.
    gpu : bool
    """
    products = float(n) * m * k * (3.0 + math.log(max(k, 1)))
    rate = _KMPP_RATE_GPU if gpu else _KMPP_RATE_CPU * (max(m, 10) / 10.0) ** 0.66
    return products / (rate * max(1, workers))


def count_text(n: int) -> str:
    """A row count as people say it: 150, 20,000, 1e6, 2.5e7."""
    if n < 100_000:
        return f"{n:,}"
    mantissa, exponent = f"{n:.1e}".split("e")
    return f"{mantissa.rstrip('0').rstrip('.')}e{int(exponent)}"


def duration_text(seconds: float) -> str:
    """A duration as people say it: 40 s, 12 min, 2.5 h."""
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def kmeanspp_notice(comm, cfg, info, n: int, m: int, threads: int) -> None:
    """Rank 0 says, as a notice, how long k-means++ will take when that is more than a few seconds."""
    if cfg.init != "k-means++" or comm.rank != 0:
        return
    gpu = bool(info.devices) and info.name != "cpu"
    seconds = kmeanspp_seconds(n, m, cfg.k, comm.size * (1 if gpu else threads), gpu) * cfg.n_init
    if seconds > 5:
        log.log(NOTICE, "k-means++ with K = %d on %s rows x %d columns: about %s%s", cfg.k, count_text(n), m,
                duration_text(seconds), f" for {cfg.n_init} initialisations" if cfg.n_init > 1 else "")


def run_summary(comm, data: str, cfg, local, scaler, restarts, info, settings: dict, resume, threads: int,
                compile_seconds: dict, scores: dict | None) -> dict:
    """summary.json's content for one K, without its timings (collective: gathers hosts and devices).

    Parameters
    ----------
    comm : Comm or SerialComm
    data : str
    cfg : RunConfig
        The run's settings, one K.
    local : mpikmeans.io.arff.LocalData
    scaler : mpikmeans.scaling.Scaler
    restarts : mpikmeans.restarts.RestartsResult
        Its ``best`` is the result reported.
    info : mpikmeans.backends.base.BackendInfo
    settings : dict
        The checkpoint's settings (``max_iter``).
    resume : LoopState or None
        The state the run went on from.
    threads : int
        Reading threads per rank.
    compile_seconds : dict
        A cold run's helper processes on this node, by part: wall seconds.
    scores : dict or None
        :func:`mpikmeans.scores.quality_scores`'s result (None: not computed).

    Returns
    -------
    dict
    """
    result = restarts.best
    layout = local.layout
    sel = local.selection
    summary = {
        "version": __version__,
        "data": os.path.abspath(data),
        "relation": local.header.relation,
        "k": cfg.k,
        "n": local.n,
        "m": len(local.names),  # attributes clustered (a nominal one takes several columns: "columns")
        "columns": local.m,
        "nominal": cfg.nominal,
        "nominal_attributes": [name for name, v in zip(layout.names, layout.values) if v is not None],
        "attributes": local.names,
        "skipped_attributes": sel.skipped,
        "ignored_attributes": sel.ignored,
        "input_rows": local.input_rows,
        "missing": {"policy": cfg.missing, "count": local.missing},
        "weighted": local.weights is not None,
        "iterations": result.iterations,
        "converged": result.converged,
        "stop_reason": result.stop_reason,
        "inertia": result.inertia,
        "inertia_units": "data" if cfg.normalize == "none" else f"scaled ({cfg.normalize})",
        "normalize": scaler.to_dict(),
        "n_init": cfg.n_init,
        "best_restart": restarts.best_index,
        "restarts": restarts.restarts,
        "sizes": None if result.sizes is None else [int(s) for s in result.sizes],
        "cluster_sse": None if result.cluster_sse is None else [float(v) for v in result.cluster_sse],
        "ranks": comm.size,
        "hosts": sorted(set(comm.allgather(comm.host))),
        "rows_per_rank": local.counts,
        "backend": info.name,
        "devices": [d for per_rank in comm.allgather(info.devices) for d in per_rank],
        "threads_per_rank": info.threads,
        "read_threads_per_rank": threads,
        "dtype": info.dtype,
        "init": cfg.init,
        "seed": cfg.seed,
        "tol": cfg.tol,
        "max_iter": settings["max_iter"],
        "empty_cluster": cfg.empty_cluster,
        "empty_relocations": result.relocated,
        "clusters_reseeded": result.relocated,
        "clusters_dropped": result.dropped,
        "clusters": int(result.centres.shape[0]),
        "resumed_from": os.path.abspath(cfg.resume) if cfg.resume else None,
        "resumed_at_iteration": resume.iteration if resume is not None else None,
        "mpi_library": comm.library(),
        "bytes_read": int(comm.allreduce(np.array([local.bytes_read], dtype=np.int64), "sum")[0]),
        "timings": {},
        # a cold run's helper processes on this node, by part: wall seconds (empty when the caches were warm)
        "background_compile_s": dict(compile_seconds),
        "history": result.history,
    }
    if scores is not None:
        summary["scores"] = {key: v for key, v in scores.items() if key != "seconds"}
    return summary


def run_timings(clock: dict, restarts, iterations: int, scores: dict | None, launched_at: float | None) -> dict:
    """summary.json's ``timings`` from the phases' clocks (``time.perf_counter()`` values).

    Parameters
    ----------
    clock : dict
        ``t0`` (the command's run began), ``ready``, ``read``, ``setup`` (the
        read and the backend's set-up: a sweep's K report the sweep's, made once
        for all), ``setup_parts``, ``start`` (this K's results began: ``t0`` for
        a single run), ``start_fit`` (its initialisation began), ``init``
        (before the restarts), ``scored`` (the scores done), ``written``.
    restarts : mpikmeans.restarts.RestartsResult
    iterations : int
        Lloyd iterations this run made (a resumed run's own).
    scores : dict or None
    launched_at : float or None
        When the command's process imported the package (``launch_s``).

    ``kernels_compiled`` and ``compile_s`` count what this process compiled
    so far (inside the phases above, not beside them): 0 after a warm-up.
    """
    lloyd_s = sum(r["compute_s"] for r in restarts.restarts)
    out = {
        **({"launch_s": clock["t0"] - launched_at} if launched_at is not None else {}),
        "startup_s": clock["ready"] - clock["t0"],
        "read_s": clock["read"] - clock["ready"],
        "setup_s": clock["setup"] - clock["read"],
        "setup_parts": clock["setup_parts"],
        "init_s": clock["init"] - clock["start_fit"] + sum(r["init_s"] for r in restarts.restarts),
        "compute_s": lloyd_s,
        "scores_s": scores["seconds"] if scores is not None else 0.0,
        "write_s": clock["written"] - clock["scored"],
        "total_s": clock["written"] - clock["start"],
        "per_iteration_s": lloyd_s / max(1, iterations),
    }
    # what this process compiled (a kernel not found in the caches): 0 on a warm machine
    out["kernels_compiled"], out["compile_s"] = compile_stats()
    return out


__all__ = ["count_text", "duration_text", "kmeanspp_notice", "kmeanspp_seconds", "run_summary", "run_timings"]
