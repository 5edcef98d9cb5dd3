"""How many rows the CPU step's bounds would leave the GPU to search, on ``bench fullstep``'s data.

``bench fullstep`` (issue 16) times GPU full steps on noisy blobs: centres uniform in
[-10, 10]^M, rows at a centre plus normal noise (4 per attribute), stored as float32, the
run started from the first K rows.  Here the same kind of rows (fewer of them, on the CPU)
go through ``CPUBackend.step``, whose bounds (:mod:`mpikmeans.backends.cpu.bounds`: Hamerly's
lower bound and Elkan's half gaps) keep a row with its centre without a search; printed per
iteration: labels changed and rows searched.  The fraction searched is what a GPU step with
the same bounds would send to its certified screen (pass 1) instead of every row.

    python bench/experiments/bounds_on_fullstep_data.py [N M K NOISE ITERATIONS]
"""
import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))
from mpikmeans.backends.cpu import CPUBackend  # noqa: E402


def fullstep_rows(argv):
    """``(x, start, n, m, k, noise, iterations)`` from ``[N M K NOISE ITERATIONS]``: the rows as float32
    holds them, the first K rows as the start."""
    n, m, k = (int(float(v)) for v in argv[:3]) if len(argv) >= 3 else (200_000, 100, 50)
    noise = float(argv[3]) if len(argv) > 3 else 4.0
    iterations = int(argv[4]) if len(argv) > 4 else 20
    rng = np.random.default_rng(1)
    ctrue = rng.random((k, m)) * 20 - 10
    lab = rng.integers(0, k, n)
    x = (ctrue[lab] + rng.normal(size=(n, m)) * noise).astype(np.float32).astype(np.float64)
    return x, x[:k].copy(), n, m, k, noise, iterations


def moves_and_others(c, prev):
    """Each centre's move from ``prev`` to ``c``, and for each the largest move of any other centre."""
    moves = np.sqrt(((c - prev) ** 2).sum(1))
    order = np.argsort(moves)[::-1]
    return moves, np.where(np.arange(len(c)) == order[0], moves[order[1]], moves[order[0]])


def label_means(x, labels, c):
    """The next centres: each cluster's mean, ``c``'s row where a cluster is empty."""
    counts = np.bincount(labels, minlength=len(c))
    sums = np.zeros(c.shape)
    np.add.at(sums, labels, x)
    good = counts > 0
    out = c.copy()
    out[good] = sums[good] / counts[good, None]
    return out


def main():
    x, c, n, m, k, noise, iterations = fullstep_rows(sys.argv[1:])
    be = CPUBackend()
    be.load(x)
    print(f"{n} x {m}, K = {k}, noise {noise}, from the first K rows: iteration, labels changed, rows searched")
    for it in range(1, iterations + 1):
        r = be.step(c)
        print(f"{it:3d} {r.changed:9d} {be.rows_searched:9d} ({be.rows_searched / n:.3f})", flush=True)
        good = r.counts > 0
        c = c.copy()
        c[good] = r.sums[good] / r.counts[good, None]


if __name__ == "__main__":
    main()
