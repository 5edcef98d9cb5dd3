"""How many rows group lower bounds (Yinyang's global filter) would leave a search, on ``bench fullstep``'s data.

The GPU backend keeps one lower bound a row (Hamerly's: the second-nearest distance, moved down by the
largest move of any other centre).  At K = 1000 (``bench fullstep``'s B: 1e7 x 32) that bound fails for
every row while labels still change, so every step searches every row.  Yinyang k-means keeps a lower
bound a row for each of G groups of centres instead (each moved down by the largest move in its group)
and searches only the groups whose bound is below the row's upper bound.  Here both rules in numpy with
exact distances (no rounding margins), on the same rows as ``stale_bounds_on_fullstep_data.py`` (centres
uniform in [-10, 10]^M, rows at a centre plus normal noise, float32, the run started from the first K rows).
The groups: K-means of the starting centres (five Lloyd steps from every G-th centre), as Yinyang forms them.

Printed per iteration: labels changed; rows failing the one-bound test (searched now); rows failing the
group test; of the centres' distances those rows need, the share whose group bound is below the row's
upper bound (what a search of only those groups computes).

    python bench/experiments/group_bounds_on_fullstep_data.py [N M K NOISE ITERATIONS] [--groups G]
"""
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(__file__))
from bounds_on_fullstep_data import fullstep_rows, label_means, moves_and_others  # noqa: E402  (the same rows, start)

CHUNK = 20_000


def distances(x, xx, c):
    """Exact Euclidean distances, float64 (rows, K)."""
    d = xx[:, None] - 2.0 * x @ c.T + (c * c).sum(1)[None]
    return np.sqrt(np.maximum(d, 0.0))


def group_of_centres(c, g):
    """Group index of each centre: five Lloyd steps on the centres from every ``K // g``-th one."""
    k = len(c)
    seeds = c[:: max(1, k // g)][:g].copy()
    for _ in range(5):
        lab = np.argmin(((c[:, None, :] - seeds[None]) ** 2).sum(2), axis=1)
        for j in range(g):
            if np.any(lab == j):
                seeds[j] = c[lab == j].mean(0)
    return lab


def search(x, xx, rows, c, group, g):
    """Label, distance to it, second-nearest distance and each group's nearest distance but the label's."""
    lab = np.empty(len(rows), np.int64)
    ub = np.empty(len(rows))
    lb = np.empty(len(rows))
    lbg = np.empty((len(rows), g))
    for s in range(0, len(rows), CHUNK):
        r = rows[s:s + CHUNK]
        d = distances(x[r], xx[r], c)
        best = np.argmin(d, axis=1)
        ub[s:s + CHUNK] = d[np.arange(len(r)), best]
        d[np.arange(len(r)), best] = np.inf
        lab[s:s + CHUNK] = best
        lb[s:s + CHUNK] = d.min(1)
        for j in range(g):
            lbg[s:s + CHUNK, j] = d[:, group == j].min(1)
    return lab, ub, lb, lbg


def main():
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    g = int(sys.argv[sys.argv.index("--groups") + 1]) if "--groups" in sys.argv else 0
    if "--groups" in sys.argv:
        args.remove(str(g))
    x, c, n, m, k, noise, iterations = fullstep_rows(args)
    g = g or max(1, k // 10)
    xx = (x * x).sum(1)
    group = group_of_centres(c, g)
    sizes = np.bincount(group, minlength=g)
    labels = np.full(n, -1)
    ub1, lb1 = np.full(n, np.inf), np.zeros(n)           # the one-bound rule
    ubg, lbg = np.full(n, np.inf), np.zeros((n, g))      # the group rule (its own bounds)
    prev = None
    print(f"{n} x {m}, K = {k}, noise {noise}, {g} groups (sizes {sizes.min()}-{sizes.max()}): iteration, "
          "labels changed, rows failing one bound, rows failing the group bounds, share of their distances "
          "in groups below the upper bound")
    for it in range(1, iterations + 1):
        if prev is not None:
            moves, others = moves_and_others(c, prev)
            own = moves[labels]
            ub1, lb1 = ub1 + own, lb1 - others[labels]
            drift = np.zeros(g)
            np.maximum.at(drift, group, moves)
            ubg, lbg = ubg + own, lbg - drift[None]
        fail1 = ~(ub1 < lb1) | (labels < 0)
        failg = np.nonzero(~(ubg < lbg.min(1)) | (labels < 0))[0]
        open_groups = lbg[failg] <= ubg[failg, None]
        share = (open_groups * sizes[None]).sum() / max(1, len(failg) * k)
        # every row is searched exactly (labels are the argmin either way); each rule's bounds are
        # refreshed only where its own test failed
        lab, u, low, lowg = search(x, xx, np.arange(n), c, group, g)
        changed = int((labels != lab).sum())
        ub1[fail1], lb1[fail1] = u[fail1], low[fail1]
        ubg[failg], lbg[failg] = u[failg], lowg[failg]
        assert np.all(lab[~fail1] == labels[~fail1]) and np.all(np.delete(lab, failg) == np.delete(labels, failg))
        labels = lab
        print(f"{it:3d} {changed:9d} {fail1.sum():9d} ({fail1.mean():.3f}) {len(failg):9d} ({len(failg) / n:.3f}) "
              f"{share:.3f}", flush=True)
        prev = c.copy()
        c = label_means(x, labels, c)


if __name__ == "__main__":
    main()
