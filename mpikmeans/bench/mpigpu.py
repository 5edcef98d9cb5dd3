"""``mpikmeans bench mpi-gpu``: several GPUs under MPI, rank-count parity and strong scaling.

Started under the launcher, one rank per GPU::

    mpirun -np 1 python -m mpikmeans bench mpi-gpu --out np1.json
    mpirun -np 2 python -m mpikmeans bench mpi-gpu --out np2.json
    python -m mpikmeans bench mpi-gpu --compare np1.json np2.json

Every rank takes its contiguous share of one synthetic data set, generated on its
GPU in fixed blocks of rows, each from its own seed, so the global data do not
depend on the number of ranks (:func:`mpikmeans.bench.data.gpu_rows`); picks its
GPU by node-local rank; and runs Lloyd iterations: ``GPUBackend.step``, then
Allreduces of the sums, counts, SSE and change count through the communicator
(:mod:`mpikmeans.comm`).  Rank 0 gets the per-iteration time (median after
warm-up), the final centres and a label checksum, so runs on different rank
counts can be compared (:func:`compare`).  Needs PyTorch and a CUDA GPU per rank.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass

import numpy as np

from ..errors import RunError, UsageError
from .data import gpu_rows
from .harness import Progress, quiet

DTYPES = ("float32", "float64")


@dataclass
class MpiGpuSettings:
    """What ``bench mpi-gpu`` runs (the options of the command, same names and defaults)."""

    n: int = 20_000_000
    m: int = 100
    k: int = 50
    dtype: str = "float64"
    iters: int = 10
    seed: int = 3

    def check(self) -> None:
        """Raise :class:`UsageError` for settings that cannot run."""
        if min(self.n, self.m, self.k, self.iters) < 1 or self.seed < 0:
            raise UsageError("bench mpi-gpu: --n, --m, --k and --iters must be at least 1, --seed at least 0")
        if self.k > self.n:
            raise UsageError(f"bench mpi-gpu: --k {self.k} is more than the {self.n} rows")
        if self.dtype not in DTYPES:
            raise UsageError(f"bench mpi-gpu: --dtype {self.dtype}: choose from {', '.join(DTYPES)}")


def _torch_and_device(comm):
    """PyTorch and this rank's GPU (by node-local rank); the same error on every rank if any lacks them."""
    from ..backends import BackendUnavailable

    error, torch, dev = None, None, None
    try:
        try:
            import torch
        except ImportError:
            raise RunError("bench mpi-gpu needs PyTorch (it makes the data on the GPU): pip install torch") from None
        from ..backends.gpu import SIM, select_device_for

        if SIM or not torch.cuda.is_available():
            raise RunError("bench mpi-gpu needs a CUDA GPU per rank (not the simulator): PyTorch sees none")
        dev = select_device_for(comm.node_rank, comm.node_size, share=False)
    except BackendUnavailable as exc:
        error = RunError(f"bench mpi-gpu: {exc}")
    except RunError as exc:
        error = exc
    comm.agree(error)
    return torch, dev


def run_mpi_gpu(comm, s: MpiGpuSettings, progress: Progress = quiet) -> dict | None:
    """Run the Lloyd iterations on this rank's share (collective).

    Parameters
    ----------
    comm : Comm or SerialComm
    s : MpiGpuSettings
    progress : callable
        Called on rank 0.

    Returns
    -------
    dict or None
        On rank 0: ``ranks``, ``n``, ``m``, ``k``, ``dtype``, ``device``,
        ``devices`` (every rank's), ``iter_ms_median`` (the iterations after the
        first two), ``iter_ms``, ``incremental``, ``jit_s``, ``sse``,
        ``changed_last``, ``centres`` (k, m), ``label_checksum``, ``counts``.
        None on the other ranks.
    """
    s.check()
    torch, dev = _torch_and_device(comm)
    torch.cuda.set_device(dev)
    from ..backends.gpu import GPUBackend

    n, m, k = s.n, s.m, s.k
    a, b = n * comm.rank // comm.size, n * (comm.rank + 1) // comm.size
    rng = np.random.default_rng(s.seed)
    ctrue_np = rng.uniform(-10, 10, size=(k, m))
    start = ctrue_np + rng.normal(scale=2.0, size=(k, m))
    xt = gpu_rows(torch, a, b, torch.tensor(ctrue_np, device="cuda"), s.dtype, s.seed)
    be = GPUBackend(device=dev, dtype=s.dtype)
    be.load_device(xt)
    t0 = time.perf_counter()
    be.warmup(k, m)  # the kernels' JIT, reported apart (jit_s), not in the first iterations
    jit_s = time.perf_counter() - t0
    cent = start.copy()
    times, incremental = [], []
    sse = changed = 0.0
    counts = None
    for _ in range(s.iters):
        comm.barrier()
        t0 = time.perf_counter()
        r = be.step(cent)
        sums = comm.allreduce(r.sums)
        counts = comm.allreduce(r.counts)
        sse, changed = comm.allreduce(np.array([r.sse, float(r.changed)]))
        good = counts > 0
        cent = cent.copy()
        cent[good] = sums[good] / counts[good, None]
        comm.barrier()
        times.append(time.perf_counter() - t0)
        incremental.append(bool(be.last_delta))
    labels, _ = be.assign(cent)
    idx = np.arange(a, b, dtype=np.float64)
    lab = labels.astype(np.float64)
    check = comm.allreduce(np.array([lab.sum(), (lab * idx).sum()]))
    devices = comm.allgather(be.info().devices[0])
    if comm.rank != 0:
        return None
    warm = times[2:] if len(times) > 3 else times
    out = {"ranks": comm.size, "n": n, "m": m, "k": k, "dtype": s.dtype, "device": be.info().devices,
           "iter_ms_median": 1e3 * statistics.median(warm), "iter_ms": [1e3 * t for t in times],
           "incremental": incremental, "jit_s": jit_s, "sse": float(sse), "changed_last": int(changed),
           "centres": cent.tolist(), "label_checksum": check.tolist(), "counts": counts.tolist(),
           "devices": devices}
    progress(f"np={comm.size} devices={devices}: {out['iter_ms_median']:.2f} ms/iteration (median of "
             f"{len(warm)}), sse={sse:.6e}, changed in last iteration {int(changed)}")
    return out


def compare(a: dict, b: dict) -> dict:
    """Two runs (their result documents) against each other: parity and speed-up.

    Returns
    -------
    dict
        ``centres_max_rel_diff``, ``labels_equal`` (label checksums and counts),
        ``speedup`` (a's time over b's), ``ok`` (centres within 1e-9 relative and
        the same labels), ``line`` (a sentence saying so).
    """
    ca, cb = np.array(a["centres"]), np.array(b["centres"])
    if ca.shape != cb.shape:
        raise UsageError(f"bench mpi-gpu: the runs have centres of shapes {ca.shape} and {cb.shape}: "
                         "not the same problem")
    rel = float(np.abs(ca - cb).max() / np.abs(ca).max())
    same_labels = a["label_checksum"] == b["label_checksum"] and a["counts"] == b["counts"]
    speedup = a["iter_ms_median"] / b["iter_ms_median"]
    line = (f"centres max rel diff {rel:.2e}; label checksums equal: {same_labels}; "
            f"np={a['ranks']} {a['iter_ms_median']:.2f} ms vs np={b['ranks']} {b['iter_ms_median']:.2f} ms: "
            f"speed-up {speedup:.2f}x")
    return {"centres_max_rel_diff": rel, "labels_equal": same_labels, "speedup": speedup,
            "ok": rel <= 1e-9 and same_labels, "line": line}
