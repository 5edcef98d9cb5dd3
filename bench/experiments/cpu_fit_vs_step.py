"""Why ``bench step``'s ms per iteration exceeds the backend's step (issue 17).

On the 16-core H100 host, 2e5 x 100, K = 50, 16 threads, ``bench step`` measured
17-20 ms per Lloyd iteration (bench/results/step_16core_h100host_2026-11-2*),
while ``cpu_step_scaling.py`` timed ``CPUBackend.step`` alone at 8.4 ms.  Here,
in one process with the thread environment ``bench step`` gives its workers
(read from the environment: run it under ``OMP_NUM_THREADS=16`` and friends):

* ``step``: ``CPUBackend.step`` alone, min and median of ``REPEATS``;
* ``fit``: ``time_tool``'s figure, (median fit of ``ITER`` iterations - median fit
  of 1) / (ITER - 1), the api's ``KMeans`` as ``bench step`` runs it;
* a cProfile of one long fit: where the rest goes.

    OMP_NUM_THREADS=16 python bench/experiments/cpu_fit_vs_step.py [N M K] [THREADS] [ITER] [REPEATS]
"""
import cProfile
import io
import os
import pstats
import statistics
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))
from mpikmeans.api import KMeans  # noqa: E402
from mpikmeans.backends.cpu.backend import CPUBackend  # noqa: E402
from mpikmeans.bench.step import time_tool  # noqa: E402


def main() -> None:
    a = sys.argv[1:]
    n, m, k = (int(float(v)) for v in a[:3]) if len(a) >= 3 else (200000, 100, 50)
    threads = int(a[3]) if len(a) > 3 else os.cpu_count()
    iters = int(a[4]) if len(a) > 4 else 6
    repeats = int(a[5]) if len(a) > 5 else 5
    rng = np.random.default_rng(0)
    c0 = rng.normal(size=(k, m)) * 3
    x = c0[rng.integers(0, k, n)] + rng.normal(size=(n, m))
    init = x[rng.choice(n, k, replace=False)]
    env = {v: os.environ.get(v) for v in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "NUMBA_NUM_THREADS",
                                          "OMP_WAIT_POLICY", "NUMBA_THREADING_LAYER")}
    print(f"{n} x {m}, K = {k}, {threads} threads; env {env}")
    be = CPUBackend(threads=threads)
    be.load(x)
    be.step(init)
    steps = []
    for _ in range(repeats * 2):
        t0 = time.perf_counter()
        be.step(init)
        steps.append((time.perf_counter() - t0) * 1e3)
    print(f"step alone: min {min(steps):.2f} median {statistics.median(steps):.2f} ms")
    be.close()
    out = time_tool("mpikmeans", x, init, iters, repeats, threads)
    print(f"fit: {out['ms_per_iteration']:.2f} ms per iteration ({out['iterations']} iterations)")
    fit = KMeans(k, init=init, n_init=1, max_iter=iters, tol=0.0, backend="cpu", threads=threads)
    prof = cProfile.Profile()
    prof.enable()
    fit.fit(x)
    prof.disable()
    s = io.StringIO()
    pstats.Stats(prof, stream=s).sort_stats("tottime").print_stats(14)
    print(s.getvalue())


if __name__ == "__main__":
    main()
