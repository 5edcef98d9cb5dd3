"""The GPU backend's host work of one step, part by part, at a shape's K x M (no GPU needed).

``bench gpu --host-breakdown`` splits a step's host time into the step buffer's fill and
``rest``; at 3e5 x 257, K = 1000 (K x M = 257,000) the rest was 1.0-1.1 ms of a 1.6 ms
steady full step on the H100 host once the sums by label made the kernels 0.34 ms
(``bench/results/steady_D_H100_2026-11-26_s13_*``).  This times each compiled helper a
step calls, with the arrays a step passes them, on this machine's threads.  (The centres' moves
for the kept bounds are made on the device since session 15: ``bounds.moves_kernel``;
``bench/experiments/host_profile.py`` times the parts inside a real run on a GPU.)

    python3 bench/experiments/host_step_parts.py --k 1000 --m 257 --tc 128
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

from mpikmeans.backends.gpu.hostk import add_step, carry_kept, copy_centres, fill_centres
from mpikmeans.backends.gpu.kept import KeptSums


def timed(fn, reps: int) -> float:
    """Median microseconds of ``fn()`` over ``reps`` calls, after two."""
    fn()
    fn()
    out = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return 1e6 * statistics.median(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--k", type=int, default=1000)
    ap.add_argument("--m", type=int, default=257)
    ap.add_argument("--tc", type=int, default=128, help="centres a tile of the step buffer")
    ap.add_argument("--reps", type=int, default=50)
    a = ap.parse_args()
    k, m = a.k, a.m
    rng = np.random.default_rng(0)
    old = rng.normal(size=(k, m))
    new = old + 1e-3 * rng.normal(size=(k, m))
    nct = -(-k // a.tc)
    f32 = np.ones(1, dtype=np.bool_)[0]
    sh, cc, cm = np.zeros(m, np.float32), np.zeros(nct * a.tc, np.float32), np.zeros((nct, m, a.tc), np.float32)
    c64, zl = np.zeros((k, m)), np.zeros(1, np.float32)
    dev, counts = np.zeros((k, m)), np.ones(k)
    out = np.empty((k, m))
    d_dev, d_counts = rng.normal(size=(k, m)), np.ones(k)
    kept = KeptSums()
    parts = {
        "fill_centres": lambda: fill_centres(new, f32, sh, cc, cm, c64, zl),
        "copy_centres (the GEMM path's fill)": lambda: copy_centres(new, c64),
        "kept centres copied (overlapped)": lambda: kept.spare(k, m).take(new),
        "add_step": lambda: add_step(dev, counts, d_dev, d_counts, new, out),
        "add_step fresh": lambda: add_step(dev, counts, d_dev, d_counts, new, out, True),
        "carry_kept": lambda: carry_kept(dev, counts, old, new, np.empty((k, m)), np.empty(k)),
    }
    import numba

    from mpikmeans.backends.gpu import hostk

    parts["fill one thread"] = lambda: hostk._fill_one(new, f32, sh, cc, cm, c64, zl)
    parts["fill threads"] = lambda: hostk._fill_threads(new, f32, sh, cc, cm, c64, zl)
    print(f"numba {numba.get_num_threads()} threads, layer {numba.config.THREADING_LAYER}")
    print(f"K {k} x M {m}, tiles of {a.tc}: median us of {a.reps} calls")
    for name, fn in parts.items():
        print(f"  {name:<34}{timed(fn, a.reps):9.1f}")
    print(f"threading layer used: {numba.threading_layer()}")


if __name__ == "__main__":
    main()
