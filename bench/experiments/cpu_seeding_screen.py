"""k-means++ on the CPU with and without the float32 screen of its passes (issue 17), scikit-learn beside.

Times ``init_kmeanspp`` through the CPU backend with ``seed_screen = False``
(every distance exact, as before the screen) and ``None`` (screened once few
rows are captured: the default), round-robin in one process so that this
machine's drifting speed falls on both alike, asserting the same centres; and
scikit-learn's ``kmeans_plusplus`` (its greedy k-means++, the same number of
candidates) on the same rows and threads.  The order of the three turns from
round to round, and each waits 0.3 s first: an OpenMP runtime's threads spin
for up to 200 ms after their work (``KMP_BLOCKTIME``) and would slow whatever
runs next.  Prints min and median seconds.

    python bench/experiments/cpu_seeding_screen.py [THREADS] [ROUNDS] [SHAPE ...]

SHAPE is ROWSxATTRSxK (default: 200000x100x50 1000000x16x8 100000x257x1000 2000000x3x7).
"""
import os
import sys
import time

threads = int(sys.argv[1]) if len(sys.argv) > 1 else 2
for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[var] = str(threads)
import numpy as np  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))
from sklearn.cluster import kmeans_plusplus  # noqa: E402

from mpikmeans.backends.cpu import CPUBackend  # noqa: E402
from mpikmeans.comm import SerialComm  # noqa: E402
from mpikmeans.init import init_kmeanspp  # noqa: E402

rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 3
shapes = sys.argv[3:] or ["200000x100x50", "1000000x16x8", "100000x257x1000", "2000000x3x7"]
print(f"threads {threads}, rounds {rounds}, {os.cpu_count()} CPUs")
for shape in shapes:
    n, m, k = (int(float(v)) for v in shape.split("x"))
    rng = np.random.default_rng(0)
    x = rng.normal(size=(k, m)) * 3
    x = x[rng.integers(0, k, n)] + rng.normal(size=(n, m))
    times = {"exact": [], "screened": [], "scikit-learn": []}
    centres = {}
    tools = [("exact", False), ("screened", None), ("scikit-learn", None)]
    for r in range(rounds + 1):  # the first round compiles and is not counted
        for label, mode in tools[r % 3:] + tools[:r % 3]:
            time.sleep(0.3)
            t0 = time.perf_counter()
            if label == "scikit-learn":
                kmeans_plusplus(x, k, random_state=r)
            else:
                cpu = CPUBackend(threads=threads)
                cpu.load(x)
                cpu.seed_screen = mode
                t0 = time.perf_counter()
                centres[label] = init_kmeanspp(SerialComm(), k, x, 0, n, r, backend=cpu)
            if r:
                times[label].append(time.perf_counter() - t0)
        assert centres["exact"].tobytes() == centres["screened"].tobytes(), shape
    print(f"{n} x {m}, K = {k}: " + "; ".join(
        f"{label} min {min(v):.3f} s median {np.median(v):.3f}" for label, v in times.items())
        + "; same centres screened and exact")
