"""The tools a user would pick instead, timed on the same data: scikit-learn and PyTorch.

``mpikmeans bench run`` compares the tool with

* scikit-learn's ``KMeans(algorithm="lloyd")``, given the same initial centres, the
  same iteration limit and ``tol=0``, on the CPU with a chosen number of threads;
* one Lloyd iteration written the way a GPU user would write it in PyTorch:
  distances by a GEMM (``addmm``), ``argmin``, ``index_add_`` for the sums.

The driver runs each reference in its own process (the hidden command
``mpikmeans bench reference``), so its thread pool, its GPU memory and any crash
stay apart from the driver and from the tool's own runs.  Neither library is a
dependency of the tool: they are imported only here, only when asked for.
"""

from __future__ import annotations

import statistics
import time

import numpy as np

from .harness import CudaEvents


def torch_iteration(torch, x, cent, xn, chunk_bytes: int = 2 << 30):
    """One Lloyd iteration in PyTorch: GEMM distances, argmin, ``index_add_``.

    Parameters
    ----------
    torch : module
        The imported ``torch``.
    x : torch.Tensor, shape (n, m)
        Rows on the GPU, any strides (a transposed column-major view works: cuBLAS
        takes it transposed, with no copy).
    cent : torch.Tensor, shape (k, m)
        Centres, same dtype and device as ``x``.
    xn : torch.Tensor, shape (n,)
        Squared norms of the rows, computed once outside the timing (only the SSE
        needs them).

    Returns
    -------
    sums : torch.Tensor, shape (k, m), x's dtype
    counts : torch.Tensor, shape (k,), int64
    sse : torch.Tensor, shape (), float64

    Notes
    -----
    Rows go in chunks so the (rows x k) distance block stays under ``chunk_bytes``.
    """
    n, m = x.shape
    k = cent.shape[0]
    cn = (cent * cent).sum(1)
    sums = torch.zeros(k, m, device=x.device, dtype=x.dtype)
    counts = torch.zeros(k, device=x.device, dtype=torch.int64)
    sse = torch.zeros((), device=x.device, dtype=torch.float64)
    rows = max(1024, chunk_bytes // (k * x.element_size()))
    for a in range(0, n, rows):
        xa = x[a : a + rows]
        d = torch.addmm(cn, xa, cent.t(), beta=1, alpha=-2)
        vals, lab = d.min(1)
        sums.index_add_(0, lab, xa)
        counts += torch.bincount(lab, minlength=k)
        sse += (vals + xn[a : a + rows]).sum(dtype=torch.float64)
    return sums, counts, sse


def torch_lloyd(x: np.ndarray, init: np.ndarray, iterations: int, repeats: int, dtype: str = "float64",
                device: int = 0) -> dict:
    """Time whole Lloyd iterations (step and centre update) written in PyTorch.

    Parameters
    ----------
    x : ndarray, shape (n, m)
        Rows; copied to the GPU once, outside the timing.
    init : ndarray, shape (k, m)
        Initial centres.
    iterations, repeats : int
        Iterations per timed run, and timed runs (the median is reported).
    dtype : {"float32", "float64"}
    device : int

    Returns
    -------
    dict
        ``per_iteration_s`` (median of the runs, wall clock with the GPU synchronised,
        as the tool reports its own), ``per_iteration_s_runs``, ``event_s`` (the same
        from CUDA events), ``inertia`` of the last iteration, ``device``.
    """
    import torch

    torch.cuda.set_device(device)
    tdt = torch.float32 if dtype == "float32" else torch.float64
    xd = torch.as_tensor(np.ascontiguousarray(x), device="cuda").to(tdt)
    xn = (xd * xd).sum(1)
    start = torch.as_tensor(init, device="cuda").to(tdt)

    def run(cent):
        sse = None
        for _ in range(iterations):
            sums, counts, sse = torch_iteration(torch, xd, cent, xn)
            nz = counts > 0
            cent = torch.where(nz[:, None], sums / counts.clamp(min=1)[:, None].to(tdt), cent)
        return sse

    run(start.clone())  # warm-up: cuBLAS handles, kernels' first launches
    timer = CudaEvents(torch)
    walls, events = [], []
    sse = None
    for _ in range(repeats):
        sse, event_ms, wall_ms = timer.measure(lambda: run(start.clone()))
        walls.append(wall_ms / 1e3 / iterations)
        events.append(event_ms / 1e3 / iterations)
    return {"per_iteration_s": statistics.median(walls), "per_iteration_s_runs": walls,
            "event_s": statistics.median(events), "inertia": float(sse), "iterations": iterations,
            "device": torch.cuda.get_device_name(device), "torch": torch.__version__}


def sklearn_lloyd(x: np.ndarray, init: np.ndarray, iterations: int, repeats: int) -> dict:
    """Time scikit-learn's Lloyd ``KMeans`` from the same centres, ``tol=0``.

    The thread count is the caller's: ``OMP_NUM_THREADS`` must be set before the
    process starts (the bench driver does it), since the pools size themselves at
    import.

    Parameters
    ----------
    x : ndarray, shape (n, m), float64
    init : ndarray, shape (k, m), float64
    iterations, repeats : int
        ``max_iter``, and timed fits (the median is reported).

    Returns
    -------
    dict
        ``per_iteration_s`` (fit time / ``n_iter_``, median of the fits; the fit's
        input checks and the first distance pass are included, as a user sees
        them), ``per_iteration_s_runs``, ``iterations`` (``n_iter_``), ``inertia``.
    """
    import sklearn
    from sklearn.cluster import KMeans

    x = np.ascontiguousarray(x, dtype=np.float64)
    init = np.ascontiguousarray(init, dtype=np.float64)
    per, km = [], None
    KMeans(n_clusters=len(init), init=init, n_init=1, max_iter=1, tol=0.0, algorithm="lloyd").fit(x[: 4 * len(init)])
    for _ in range(repeats):
        km = KMeans(n_clusters=len(init), init=init, n_init=1, max_iter=iterations, tol=0.0, algorithm="lloyd")
        t0 = time.perf_counter()
        km.fit(x)
        per.append((time.perf_counter() - t0) / km.n_iter_)
    return {"per_iteration_s": statistics.median(per), "per_iteration_s_runs": per, "iterations": int(km.n_iter_),
            "inertia": float(km.inertia_), "sklearn": sklearn.__version__}
