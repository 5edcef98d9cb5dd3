#!/usr/bin/env python3
"""Several GPUs under MPI: rank-count parity and strong scaling of the GPU backend.

Every rank takes its contiguous share of one synthetic data set (generated on its
GPU in fixed blocks of rows, each from its own seed, so the global data do not
depend on the number of ranks), picks its GPU by node-local rank, and runs Lloyd
iterations: ``GPUBackend.step`` then one ``Allreduce`` of sums, counts, SSE and the
change count.  Rank 0 writes the per-iteration time (median after warm-up), the
final centres and a label checksum as JSON, so runs with ``-np 1`` and ``-np 2``
can be compared.

    mpirun -np 1 python scripts/mpi_gpu_scaling.py --out np1.json
    mpirun -np 2 python scripts/mpi_gpu_scaling.py --out np2.json
    python scripts/mpi_gpu_scaling.py --compare np1.json np2.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

BLOCK = 1_000_000  # rows per generation block (one seed each)


def make_rows(torch, a, b, m, ctrue, dtype, seed):
    """Rows [a, b) of the global data set, column-major (m, b - a), on the current GPU."""
    tdt = torch.float32 if dtype == "float32" else torch.float64
    xt = torch.empty(m, b - a, device="cuda", dtype=tdt)
    k = ctrue.shape[0]
    for blk in range(a // BLOCK, -(-b // BLOCK)):
        lo, hi = blk * BLOCK, (blk + 1) * BLOCK
        g = torch.Generator(device="cuda").manual_seed(seed * 100_003 + blk)
        lab = torch.randint(0, k, (BLOCK,), generator=g, device="cuda")
        rows = ctrue.t()[:, lab] + torch.randn(m, BLOCK, generator=g, device="cuda", dtype=torch.float64)
        s, e = max(lo, a), min(hi, b)
        xt[:, s - a:e - a] = rows[:, s - lo:e - lo].to(tdt)
    return xt


def run(args):
    from mpi4py import MPI
    import torch

    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    node = comm.Split_type(MPI.COMM_TYPE_SHARED)
    from mpikmeans.backends.gpu import GPUBackend, select_device_for

    dev = select_device_for(node.Get_rank(), node.Get_size(), share=False)
    torch.cuda.set_device(dev)
    n, m, k = args.n, args.m, args.k
    a, b = n * rank // size, n * (rank + 1) // size
    rng = np.random.default_rng(args.seed)
    ctrue_np = rng.uniform(-10, 10, size=(k, m))
    start = ctrue_np + rng.normal(scale=2.0, size=(k, m))
    ctrue = torch.tensor(ctrue_np, device="cuda")
    xt = make_rows(torch, a, b, m, ctrue, args.dtype, args.seed)
    be = GPUBackend(device=dev, dtype=args.dtype)
    be.load_device(xt)
    t0 = time.perf_counter()
    be.warmup(k, m)  # the kernels' JIT, reported apart (jit_s), not in the first iterations
    jit_s = time.perf_counter() - t0
    cent = start.copy()
    times = []
    incremental = []
    res = None
    for it in range(args.iters):
        comm.Barrier()
        t0 = time.perf_counter()
        r = be.step(cent)
        sums = np.empty_like(r.sums)
        counts = np.empty_like(r.counts)
        comm.Allreduce(r.sums, sums, op=MPI.SUM)
        comm.Allreduce(r.counts, counts, op=MPI.SUM)
        sse = comm.allreduce(r.sse, op=MPI.SUM)
        changed = comm.allreduce(r.changed, op=MPI.SUM)
        good = counts > 0
        cent = cent.copy()
        cent[good] = sums[good] / counts[good, None]
        comm.Barrier()
        times.append(time.perf_counter() - t0)
        incremental.append(bool(be.last_delta))
        res = (sse, changed)
    labels, _ = be.assign(cent)
    idx = np.arange(a, b, dtype=np.float64)
    local = np.array([labels.astype(np.float64).sum(), (labels.astype(np.float64) * idx).sum()])
    check = np.empty(2)
    comm.Allreduce(local, check, op=MPI.SUM)
    warm = times[2:] if len(times) > 3 else times
    out = {"ranks": size, "n": n, "m": m, "k": k, "dtype": args.dtype, "device": be.info().devices,
           "iter_ms_median": 1e3 * statistics.median(warm), "iter_ms": [1e3 * t for t in times],
           "incremental": incremental, "jit_s": jit_s,
           "sse": res[0], "changed_last": res[1], "centres": cent.tolist(), "label_checksum": check.tolist(),
           "counts": counts.tolist()}
    devs = comm.gather(be.info().devices[0], root=0)
    if rank == 0:
        out["devices"] = devs
        Path(args.out).write_text(json.dumps(out))
        print(f"np={size} devices={devs}: {out['iter_ms_median']:.2f} ms/iteration (median of "
              f"{len(warm)}), sse={res[0]:.6e}, changed in last iteration {res[1]}", flush=True)


def compare(paths):
    a, b = (json.loads(Path(p).read_text()) for p in paths)
    ca, cb = np.array(a["centres"]), np.array(b["centres"])
    rel = float(np.abs(ca - cb).max() / np.abs(ca).max())
    same_labels = a["label_checksum"] == b["label_checksum"] and a["counts"] == b["counts"]
    speedup = a["iter_ms_median"] / b["iter_ms_median"]
    print(f"centres max rel diff {rel:.2e}; label checksums equal: {same_labels}; "
          f"np={a['ranks']} {a['iter_ms_median']:.2f} ms vs np={b['ranks']} {b['iter_ms_median']:.2f} ms: "
          f"speed-up {speedup:.2f}x")
    return rel <= 1e-9 and same_labels


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=20_000_000)
    ap.add_argument("--m", type=int, default=100)
    ap.add_argument("--k", type=int, default=50)
    ap.add_argument("--dtype", default="float64")
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--seed", type=int, default=3)
    ap.add_argument("--out", default="mpi_gpu.json")
    ap.add_argument("--compare", nargs=2, metavar="JSON")
    args = ap.parse_args()
    if args.compare:
        sys.exit(0 if compare(args.compare) else 1)
    run(args)


if __name__ == "__main__":
    main()
