"""How many rows the GPU's kept bounds would leave pass 1, on ``bench fullstep``'s data, emulated on the CPU.

The GPU backend (:mod:`mpikmeans.backends.gpu.bounds`) keeps, per row, an upper bound on its
distance to its centre and a lower bound on its distance to every other, both from the step that
last searched it, moved by the centres' moves but never tightened (unlike the CPU backend's, whose
upper bound is the exact distance each step: ``bounds_on_fullstep_data.py``).  Here the same rule in
numpy with exact distances (no rounding margins), on ``bench fullstep``'s kind of data: centres
uniform in [-10, 10]^M, rows at a centre plus normal noise (4 per attribute), float32, the run
started from the first K rows.  Printed per iteration: labels changed, the rows the test fails
(searched, as the GPU does), and of those the rows that still fail once their upper bound is
tightened to the exact distance to their own centre (what Hamerly's second test leaves: with
``--tighten``, only those are searched).

    python bench/experiments/stale_bounds_on_fullstep_data.py [N M K NOISE ITERATIONS] [--tighten]
"""
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(__file__))
from bounds_on_fullstep_data import fullstep_rows, label_means, moves_and_others  # noqa: E402  (the same rows, start)


def search(x, xx, rows, c):
    """Nearest centre, its distance and the second-nearest distance of ``rows``."""
    d = xx[rows, None] - 2.0 * x[rows] @ c.T + (c * c).sum(1)[None]
    d = np.sqrt(np.maximum(d, 0.0))
    part = np.partition(d, 1, axis=1)
    return np.argmin(d, axis=1), part[:, 0], part[:, 1]


def main():
    tighten = "--tighten" in sys.argv
    x, c, n, m, k, noise, iterations = fullstep_rows([a for a in sys.argv[1:] if a != "--tighten"])
    xx = (x * x).sum(1)
    labels = np.full(n, -1)
    ub = np.full(n, np.inf)
    lb = np.zeros(n)
    prev = None
    print(f"{n} x {m}, K = {k}, noise {noise}, from the first K rows{', tightened' if tighten else ''}: iteration, "
          "labels changed, rows failing the test, of them failing with the upper bound tightened")
    for it in range(1, iterations + 1):
        if prev is not None:
            moves, others = moves_and_others(c, prev)
            ub = ub + moves[np.maximum(labels, 0)]
            lb = lb - others[np.maximum(labels, 0)]
        fail = np.nonzero(~(ub < lb) | (labels < 0))[0]
        own = np.sqrt(((x[fail] - c[np.maximum(labels[fail], 0)]) ** 2).sum(1))
        still = fail[~(own < lb[fail]) | (labels[fail] < 0)]
        if tighten:
            ub[fail] = own
            searched = still
        else:
            searched = fail
        new, u, low = search(x, xx, searched, c)
        changed = int((labels[searched] != new).sum())
        labels[searched], ub[searched], lb[searched] = new, u, low
        print(f"{it:3d} {changed:9d} {len(fail):9d} ({len(fail) / n:.3f}) {len(still):9d} ({len(still) / n:.3f})",
              flush=True)
        prev = c.copy()
        c = label_means(x, labels, c)


if __name__ == "__main__":
    main()
