"""Helpers of the tests that run library code on simulated ranks (threads, see threadcomm.py)."""

from __future__ import annotations

from threadcomm import run_ranks

from mpikmeans.io.gen import GenSpec, blob_centres, generate_block


def bounds(n, ranks, rank, layout="even"):
    """Rows [lo, hi) of ``rank``: even, or uneven with rank 1 empty."""
    if layout == "even" or ranks == 1:
        return n * rank // ranks, n * (rank + 1) // ranks
    cuts = [0, n // 7, n // 7] + [n // 7 + (n - n // 7) * r // (ranks - 2) for r in range(1, ranks - 1)]
    cuts[-1] = n
    return cuts[rank], cuts[rank + 1]


def on_ranks(ranks, x, fn, layout="even", weights=None):
    """``fn(comm, x_local, row_offset, w_local)`` on ``ranks`` threads."""
    def body(comm):
        lo, hi = bounds(len(x), ranks, comm.rank, layout)
        return fn(comm, x[lo:hi], lo, None if weights is None else weights[lo:hi])
    return run_ranks(ranks, body)


def split(x, ranks, rank, empty_first=False):
    """Consecutive slices of ``x``; optionally rank 0 gets none."""
    n = len(x)
    if empty_first and ranks > 1:
        lo = 0 if rank == 0 else n * (rank - 1) // (ranks - 1)
        hi = 0 if rank == 0 else n * rank // (ranks - 1)
    else:
        lo, hi = n * rank // ranks, n * (rank + 1) // ranks
    return x[lo:hi], lo


def blobs(m, spread, n=20_000, k=50, seed=1):
    """Gaussian blobs from mpikmeans.io.gen (the rows gen-data would write), in memory."""
    spec = GenSpec(n=n, m=m, k=k, seed=seed, spread=spread, decimals=6)
    ticks, _ = generate_block(spec, 0, blob_centres(spec))
    return ticks / 1e6
