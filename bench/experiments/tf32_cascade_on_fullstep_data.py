"""How many rows the TF32 screen could not certify, on ``bench fullstep``'s data: all of them and the listed ones.

The GEMM path (D: 3e5 x 257, K = 1000) screens rows in float32 at about 41 % of the FP32 rate; the
TF32 screen (:mod:`mpikmeans.backends.gpu.tensor`) is 2.3x faster but its certificate is about 60x
wider, so it leaves more rows uncertified.  A cascade (TF32 first, the float32 screen on the rows
TF32 leaves, the exact kernel on what float32 leaves) pays while the share TF32 leaves is well
under 1 - 1/2.3.  Here, in numpy with exact float64 distances, on the same rows as
``bounds_on_fullstep_data.py`` (centres uniform in [-10, 10]^M, rows at a centre plus normal
noise, float32, the run started from the first K rows), each step's rows whose gap between the
nearest and second-nearest squared distance is within each screen's tolerance
``tolf (|y|^2 + zlim) + tiny`` (``y`` the row less the shift, the centres' mean; ``zlim`` twice
the largest ``|z|^2``): what that screen would leave (its own rounding can leave a few more).

Printed per iteration: labels changed; rows the one-bound test lists (Hamerly's bound, exact
distances, as the GPU keeps it); of all rows and of the listed rows, the share the float32 and the
TF32 certificates leave.

    python bench/experiments/tf32_cascade_on_fullstep_data.py [N M K NOISE ITERATIONS]
"""
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))
from bounds_on_fullstep_data import fullstep_rows, label_means, moves_and_others  # noqa: E402

from mpikmeans.backends.gpu.kernels import certificate as float32_certificate  # noqa: E402
from mpikmeans.backends.gpu.tensor import certificate as tf32_certificate  # noqa: E402

CHUNK = 10_000


def nearest_two(x, xx, c):
    """Nearest centre, its squared distance and the second-nearest squared distance (exact, float64)."""
    lab = np.empty(len(x), np.int64)
    d1 = np.empty(len(x))
    d2 = np.empty(len(x))
    cc = (c * c).sum(1)
    for s in range(0, len(x), CHUNK):
        d = xx[s:s + CHUNK, None] - 2.0 * x[s:s + CHUNK] @ c.T + cc[None]
        r = np.arange(len(d))
        best = np.argmin(d, axis=1)
        lab[s:s + CHUNK] = best
        d1[s:s + CHUNK] = d[r, best]
        d[r, best] = np.inf
        d2[s:s + CHUNK] = d.min(1)
    return lab, np.maximum(d1, 0.0), np.maximum(d2, 0.0)


def main():
    x, c, n, m, k, noise, iterations = fullstep_rows(sys.argv[1:])
    xx = (x * x).sum(1)
    tols = {"float32": float32_certificate(m), "tf32": tf32_certificate(m)}
    print(f"{n} x {m}, K = {k}, noise {noise}, from the first K rows; tolf float32 {float(tols['float32'][0]):.3g},"
          f" TF32 {float(tols['tf32'][0]):.3g}")
    print("iter  changed   listed  | all rows: float32  TF32 | listed rows: float32  TF32")
    labels = ub = lb = prev = None
    for it in range(1, iterations + 1):
        lab, d1, d2 = nearest_two(x, xx, c)
        shift = c.mean(0)
        y2 = ((x - shift) ** 2).sum(1)
        scale = y2 + 2.0 * ((c - shift) ** 2).sum(1).max()
        gap = d2 - d1
        left = {name: gap <= float(t[0]) * scale + float(t[1]) for name, t in tols.items()}
        if ub is None:
            listed = np.ones(n, bool)
        else:
            moves, others = moves_and_others(c, prev)
            listed = ub + moves[labels] > lb - others[labels]
        nl = max(1, int(listed.sum()))
        changed = n if labels is None else int((lab != labels).sum())
        f32, tf = left["float32"], left["tf32"]
        print(f"{it:4d} {changed:8d} {int(listed.sum()):8d}  | {f32.mean():16.5f} {tf.mean():6.4f}"
              f" | {f32[listed].sum() / nl:19.5f} {tf[listed].sum() / nl:6.4f}", flush=True)
        labels, ub, lb, prev = lab, np.sqrt(d1), np.sqrt(d2), c
        c = label_means(x, labels, c)


if __name__ == "__main__":
    main()
