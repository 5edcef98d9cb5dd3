"""Where the CPU step's bounds pay: ms and rows searched per Lloyd iteration, with and without bounds.

The data and initial centres are ``bench step``'s (``gen-data`` blobs, K rows
drawn with seed 1).  Each iteration's step runs with bounds (the backend's
default, :mod:`mpikmeans.backends.cpu.bounds`) and without (every row searched)
on two backends side by side, the order turning each iteration, from the same
centres; both must give the same sums, SSE and labels (asserted).  Printed per
iteration: ms with bounds / rows searched, ms without, labels changed.

    python bench/experiments/cpu_bounds_trace.py N M K [THREADS] [ITERATIONS]
"""
import os
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))
from mpikmeans.backends.cpu import CPUBackend  # noqa: E402
from mpikmeans.bench.data import initial_centres, write_blobs_npy  # noqa: E402
from mpikmeans.io.gen import GenSpec  # noqa: E402


def main():
    n, m, k = int(float(sys.argv[1])), int(sys.argv[2]), int(sys.argv[3])
    threads = int(sys.argv[4]) if len(sys.argv) > 4 else 1
    iterations = int(sys.argv[5]) if len(sys.argv) > 5 else 20
    tmp = tempfile.mkdtemp()
    data = os.path.join(tmp, "x.npy")
    write_blobs_npy(GenSpec(n=n, m=m, k=k, seed=0), data)
    _, init = initial_centres(data, k, 1, os.path.join(tmp, "c"))
    x, centres = np.load(data), np.load(init)
    with_bounds, full = CPUBackend(threads=threads), CPUBackend(threads=threads, bounds=False)
    for be in (with_bounds, full):
        be.load(x)
        be.step(centres)  # compiles
        be.load(x)
    print(f"{n} x {m}, K = {k}, {threads} thread(s): ms with bounds / rows searched, ms without, labels changed")
    total = [0.0, 0.0]
    for it in range(1, iterations + 1):
        out = {}
        for be in ((with_bounds, full) if it % 2 else (full, with_bounds)):
            t0 = time.perf_counter()
            r = be.step(centres)
            out[be.bounds] = (time.perf_counter() - t0, r, be.rows_searched)
        (tb, rb, searched), (tf, rf, _) = out[True], out[False]
        assert rb.sse == rf.sse and rb.changed == rf.changed and np.array_equal(rb.sums, rf.sums)
        assert np.array_equal(with_bounds._labels, full._labels)
        if it > 1:
            total[0] += tb
            total[1] += tf
        print(f"{it:3d}  {1e3 * tb:8.2f} / {searched:9d}  {1e3 * tf:8.2f}  {rb.changed:9d}", flush=True)
        good = rb.counts > 0
        centres = centres.copy()
        centres[good] = rb.sums[good] / rb.counts[good, None]
        if rb.changed == 0:
            break
    steps = max(it - 1, 1)
    print(f"mean of iterations 2..{it}: {1e3 * total[0] / steps:.2f} ms with bounds, {1e3 * total[1] / steps:.2f} without")


if __name__ == "__main__":
    main()
