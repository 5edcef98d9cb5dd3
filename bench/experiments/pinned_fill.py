"""Why filling the GPU step buffer takes 2 ms on the H100 host at K x M = 257,000 (0.6 ms on a 2-core VM).

``Pack.fill`` (``backends/gpu/launch.py``) writes the step's centre data straight
into the pinned host buffer that one asynchronous copy then uploads
(``bench gpu --host-breakdown``, 3e5 x 257, K = 1000: fill 1.8-2.2 ms a step).
Timed here, best and median of ``REPEATS``:

* ``fill -> pinned``: :func:`fill_centres` into buffers of ``cuda.pinned_array``;
* ``fill -> pageable``: the same into ``np.empty`` buffers;
* ``copy -> pinned`` / ``copy -> pageable``: a plain 2 MB ``np.copyto`` into each;
* ``read pinned``: a sum over a pinned 2 MB buffer.

    python bench/experiments/pinned_fill.py [K M TC] [REPEATS]
"""
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))
from mpikmeans.backends.gpu.hostk import fill_centres  # noqa: E402


def best(f, repeats):
    f()
    ts = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        f()
        ts.append((time.perf_counter() - t0) * 1e3)
    ts.sort()
    return f"{ts[0]:.3f} / {ts[len(ts) // 2]:.3f} ms"


def main():
    a = sys.argv[1:]
    k, m, tc = (int(v) for v in a[:3]) if len(a) >= 3 else (1000, 257, 64)
    repeats = int(a[3]) if len(a) > 3 else 30
    from numba import cuda

    nct = -(-k // tc)
    cen = np.random.default_rng(0).normal(size=(k, m))

    def buffers(alloc):
        sh = alloc(m, np.float32)
        cc = alloc(nct * tc, np.float32)
        cc[:] = np.inf
        cm = alloc(nct * m * tc, np.float32).reshape(nct, m, tc)
        c64 = alloc(k * m, np.float64).reshape(k, m)
        zl = alloc(1, np.float32)
        return sh, cc, cm, c64, zl

    pin = buffers(lambda n, d: cuda.pinned_array(n, dtype=d))
    page = buffers(lambda n, d: np.empty(n, dtype=d))
    print(f"K = {k}, M = {m}, TC = {tc}; min / median of {repeats}")
    print("fill -> pinned  ", best(lambda: fill_centres(cen, True, *pin), repeats))
    print("fill -> pageable", best(lambda: fill_centres(cen, True, *page), repeats))
    print("copy -> pinned  ", best(lambda: np.copyto(pin[3], cen), repeats))
    print("copy -> pageable", best(lambda: np.copyto(page[3], cen), repeats))
    print("read pinned     ", best(lambda: pin[3].sum(), repeats))
    print("read pageable   ", best(lambda: page[3].sum(), repeats))


if __name__ == "__main__":
    main()
