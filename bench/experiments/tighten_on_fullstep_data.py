"""How many rows Hamerly's second test (the upper bound tightened to the exact distance to the own centre)
would spare the GPU's pass 1, on ``bench fullstep``'s kind of data.

The GPU's bounds test (:mod:`mpikmeans.backends.gpu.bounds`) lists every row whose moved upper bound is not
below its moved lower bound; pass 1 then searches all K centres for it.  Hamerly's algorithm first tightens
the upper bound to the exact distance to the row's own centre and lists the row only if that still fails.
Here both rules in numpy with exact distances (no rounding margins), on the rows of
``bounds_on_fullstep_data.py`` (A's shape at fewer rows by default).  Printed per iteration: labels
changed, rows failing the moved bounds, rows still failing after the tightening, and both as shares.

    python bench/experiments/tighten_on_fullstep_data.py [N M K NOISE ITERATIONS]
"""
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(__file__))
from bounds_on_fullstep_data import fullstep_rows, label_means, moves_and_others  # noqa: E402


def distances(x, c):
    """Euclidean distances (rows, K), float64."""
    d = (x * x).sum(1)[:, None] - 2 * x @ c.T + (c * c).sum(1)[None, :]
    return np.sqrt(np.maximum(d, 0))


def main():
    x, c, n, m, k, noise, iterations = fullstep_rows(sys.argv[1:])
    d = distances(x, c)
    lab = d.argmin(1)
    s = np.sort(d, 1)
    u, lo = s[:, 0].copy(), s[:, 1].copy()
    prev, c = c, label_means(x, lab, c)
    print(f"{n} x {m}, K = {k}, noise {noise}: iteration, changed, failing the moved bounds, failing after "
          "the tightening (shares)")
    for it in range(2, iterations + 1):
        mv, other = moves_and_others(c, prev)
        u = u + mv[lab]
        lo = lo - other[lab]
        fail = u > lo
        tight = np.sqrt(((x[fail] - c[lab[fail]]) ** 2).sum(1))
        u[fail] = tight
        idx = np.where(fail)[0][tight > lo[fail]]
        di = distances(x[idx], c)
        new = di.argmin(1)
        si = np.sort(di, 1)
        changed = int((new != lab[idx]).sum())
        lab[idx], u[idx], lo[idx] = new, si[:, 0], si[:, 1]
        print(f"{it:3d} {changed:8d} {int(fail.sum()):8d} {len(idx):8d}   {fail.mean():.3f} {len(idx) / n:.3f}",
              flush=True)
        prev, c = c, label_means(x, lab, c)


if __name__ == "__main__":
    main()
