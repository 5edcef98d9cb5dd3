"""Where a bounded CPU step's time goes as threads grow: row blocks, host work, memory stream.

Issue 17: on the 16-core Xeon, 10^6 x 16, K = 8 took 4.7 ms a step at 16 threads against
oneDAL's 3.9, although 2 threads took 13.5.  This replays one Lloyd run's centres
(``bench step``'s data and initial centres) through ``CPUBackend.step`` with the
step's row blocks (``tiles._BLOCKS``, 64) and with other block counts, at each
thread count, and prints per configuration the median ms of the settled steps
(iterations 3..), the step's host work outside its parallel pass (``_drops``,
``search_plan``, the blocks' reduction), and a plain parallel stream over the
rows (the memory's pace at that thread count).  Every block count must give the
same labels and an SSE within 1e-12 of the 64 blocks' (asserted).

    python bench/experiments/cpu_step_blocks.py N M K [THREADS,...] [BLOCKS,...] [ITERATIONS] [ROUNDS]
"""
import os
import sys
import tempfile
import time

import numba
import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))
from mpikmeans.backends.cpu import CPUBackend  # noqa: E402
from mpikmeans.backends.cpu.partials import reduce_blocks  # noqa: E402
from mpikmeans.backends.cpu.backend import search_plan  # noqa: E402
from mpikmeans.bench.data import initial_centres, write_blobs_npy  # noqa: E402
from mpikmeans.io.gen import GenSpec  # noqa: E402

sys.path.insert(0, os.path.dirname(__file__))
from cpu_step_scaling import stream_pass  # noqa: E402 - the memory's pace: a plain parallel pass over the rows


def centre_path(x, centres, iterations):
    """The centres of a Lloyd run from ``centres`` (one backend, default blocks)."""
    be = CPUBackend(threads=numba.config.NUMBA_NUM_THREADS)
    be.load(x)
    path = [centres]
    for _ in range(iterations):
        r = be.step(path[-1])
        c = path[-1].copy()
        good = r.counts > 0
        c[good] = r.sums[good] / r.counts[good, None]
        path.append(c)
    return path[:-1]


def replay(x, path, threads, nb):
    """ms of each step of ``path`` on a fresh backend with ``nb`` row blocks; labels, SSEs."""
    be = CPUBackend(threads=threads)
    be.load(x)
    k, m = path[0].shape
    be._parts = (np.empty((nb, k, m)), np.empty((nb, k)), np.empty(nb), np.empty(nb, dtype=np.int64),
                 np.empty(nb, dtype=np.int64), np.empty(nb, dtype=np.int64))
    times, sses = [], []
    for c in path:
        t0 = time.perf_counter()
        r = be.step(c)
        times.append(time.perf_counter() - t0)
        sses.append(r.sse)
    return np.array(times), be._labels.copy(), np.array(sses)


def host_work(x, path, threads):
    """ms of a step's work outside its parallel pass, on the settled state."""
    be = CPUBackend(threads=threads)
    be.load(x)
    for c in path[:3]:
        be.step(c)
    c = path[3] if len(path) > 3 else path[-1]
    k, m = c.shape
    parts = be._partials(k, m)
    out = []
    for _ in range(20):
        t0 = time.perf_counter()
        search_plan(c)
        be._drops(c)
        reduce_blocks(*parts[:4])
        out.append(time.perf_counter() - t0)
    return float(np.median(out))


def main():
    a = sys.argv[1:]
    n, m, k = int(float(a[0])), int(a[1]), int(a[2])
    threads = [int(t) for t in a[3].split(",")] if len(a) > 3 else [1, 2, 4, 8, 16]
    threads = [t for t in threads if t <= numba.config.NUMBA_NUM_THREADS]
    blocks = [int(b) for b in a[4].split(",")] if len(a) > 4 else [64, 128, 256]
    iterations = int(a[5]) if len(a) > 5 else 12
    rounds = int(a[6]) if len(a) > 6 else 3
    tmp = tempfile.mkdtemp()
    data = os.path.join(tmp, "x.npy")
    write_blobs_npy(GenSpec(n=n, m=m, k=k, seed=0), data)
    _, init = initial_centres(data, k, 1, os.path.join(tmp, "c"))
    x, c0 = np.load(data), np.load(init)
    path = centre_path(x, c0, iterations)
    print(f"{n} x {m}, K = {k}; {os.cpu_count()} CPUs; Numba layer {numba.config.THREADING_LAYER}; "
          f"median ms of steps 3..{iterations}, min over {rounds} rounds (blocks taking turns)")
    ref = None
    for t in threads:
        numba.set_num_threads(t)
        stream_pass(x, 64)
        ts = []
        for _ in range(5):
            t0 = time.perf_counter()
            stream_pass(x, 64)
            ts.append(time.perf_counter() - t0)
        best = {nb: np.inf for nb in blocks}
        for _ in range(rounds):
            for nb in blocks:
                times, labels, sses = replay(x, path, t, nb)
                if ref is None:
                    ref = (labels, sses)
                assert np.array_equal(labels, ref[0]), (t, nb)
                assert np.allclose(sses, ref[1], rtol=1e-12, atol=0), (t, nb)
                best[nb] = min(best[nb], float(np.median(times[2:])))
        host = host_work(x, path, t)
        cells = "  ".join(f"{nb} blocks {1e3 * v:7.2f}" for nb, v in best.items())
        print(f"threads {t:3d}  {cells}  host {1e3 * host:6.3f}  stream {1e3 * min(ts):6.2f} "
              f"({x.nbytes / min(ts) / 1e9:5.1f} GB/s)", flush=True)


if __name__ == "__main__":
    main()
