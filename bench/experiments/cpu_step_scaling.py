"""How each part of the CPU step scales with threads (issue 17: 4.5x on 16 cores against oneDAL's 10x).

The screened step (``backends/cpu/bounds.py: step_pass`` with the screen's plan,
every row searched) does, per tile of rows: the float32 shifted copy, one ``sgemm`` by the BLAS library behind
Numba's ``np.dot`` (held to one thread per caller), the ranking, the exact
recheck of uncertified rows, the exact distance to the chosen centre and the
sums.  Here each part runs alone over the same rows and tiles, in the step's 64
row blocks under ``prange``, at 1, 2, 4, ... threads, so the part that stops
scaling shows:

* ``step``: the backend's whole step (``CPUBackend.step``);
* ``convert``: the float32 shifted copy and ``|y|^2`` only;
* ``sgemm``: the tile products only (on a tile converted once);
* ``screen``: convert + sgemm + ranking (no recheck, no sums);
* ``sums``: the exact distance to a fixed label and the sums (``label_dists``, ``_sum_rows``);
* ``stream``: a plain sum over the rows, vectorised (memory bandwidth).

Also printed: the BLAS library and its threading (threadpoolctl), Numba's
threading layer, and the CPU topology.  Min ms of ``ROUNDS`` rounds, parts
timed round-robin inside each round.

    python bench/experiments/cpu_step_scaling.py [N M K] [THREADS,...] [ROUNDS] [TILES,...]

With ``TILES`` (rows per screen tile, e.g. ``96,208,416,832``) the step is also
timed at each tile size (``step@T``: ``step_pass`` with that tile; the
shipped size is ``screen_rows(K, M)``).  Every tile size gives the same bits
(checked).
"""
import os
import sys
import time

import numba
import numpy as np
from numba import njit, prange

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))
from mpikmeans.backends.cpu import bounds as B  # noqa: E402
from mpikmeans.backends.cpu import certified as C  # noqa: E402
from mpikmeans.backends.cpu import tiles as T  # noqa: E402
from mpikmeans.backends.cpu.backend import CPUBackend  # noqa: E402
from mpikmeans.backends.cpu.blas import one_thread  # noqa: E402
from mpikmeans.backends.cpu.partials import reduce_blocks  # noqa: E402


@njit
def convert_tile(x, t0, rt, shift, zt, cc, ys, est, yy, b1, b2, i1):
    """The float32 shifted copy and ``|y|^2`` only."""
    C._shifted_rows(x, t0, rt, shift, ys, yy)
    return yy[0]


@njit
def sgemm_tile(x, t0, rt, shift, zt, cc, ys, est, yy, b1, b2, i1):
    """The tile's product only (on whatever the tile buffer holds)."""
    np.dot(zt, ys.T, est)
    return est[0, 0]


@njit
def screen_tile(x, t0, rt, shift, zt, cc, ys, est, yy, b1, b2, i1):
    """Convert, product and ranking, as the shipped ``screen_search`` does them on a whole tile."""
    C._shifted_rows(x, t0, rt, shift, ys, yy)
    np.dot(zt, ys.T, est)
    C._rank(est, cc, rt, b1, b2, i1)
    return i1[0]


@njit(parallel=True)
def tile_pass(part, x, shift, zt, cc, tile, nb):
    """``part`` on every screen tile of the step's ``nb`` row blocks, blocks under ``prange``."""
    n, m = x.shape
    acc = np.zeros(nb)
    for b in prange(nb):
        ys, est = np.zeros((tile, m), dtype=np.float32), np.zeros((zt.shape[0], tile), dtype=np.float32)
        yy, b1, b2 = np.empty(tile, np.float32), np.empty(tile, np.float32), np.empty(tile, np.float32)
        i1 = np.empty(tile, dtype=np.int32)
        hi = n * (b + 1) // nb
        for t0 in range(n * b // nb, hi, tile):
            acc[b] += part(x, t0, min(tile, hi - t0), shift, zt, cc, ys, est, yy, b1, b2, i1)
    return acc.sum()


@njit(parallel=True)
def sums_pass(x, cen, lab, tile, part_sums, part_counts):
    n, m = x.shape
    nb = part_sums.shape[0]
    labels = lab.copy()
    total = 0.0
    for b in prange(nb):
        sums = part_sums[b]
        counts = part_counts[b]
        sums[:, :] = 0.0
        counts[:] = 0.0
        hi = n * (b + 1) // nb
        sse = 0.0
        rows = np.arange(tile)
        dt = np.empty(tile)
        for t0 in range(n * b // nb, hi, tile):
            rt = min(tile, hi - t0)
            i1 = lab[t0:t0 + rt]
            T.label_dists(x, t0, rows, rt, cen, i1, dt)
            sse, moved = B._sum_rows(x, t0, rt, i1, dt, labels, lab[:0].astype(np.float64), False, sums, counts,
                                     sse, tile)
        total += sse
    return total


@njit(parallel=True, fastmath=True)
def stream_pass(x, nb):
    n, m = x.shape
    acc = np.zeros(nb)
    for b in prange(nb):
        s = 0.0
        for i in range(n * b // nb, n * (b + 1) // nb):
            for j in range(m):
                s += x[i, j]
        acc[b] = s
    return acc.sum()


def tiled_step(be, cen, tile):
    """The backend's step with ``tile`` rows per screen tile: sums, counts, SSE."""
    k, m = cen.shape
    parts = be._partials(k, m)
    with one_thread():
        B.step_pass(be._x, cen, (True, *C.centre_data(cen)), tile, be._labels, be._lower, False, np.zeros(k), np.zeros(k),
                    be._weights, False, *parts)
    return reduce_blocks(*parts[:4])[:3]


def topology() -> str:
    out = []
    try:
        import subprocess
        lines = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=10).stdout.splitlines()
        keep = ("Model name", "Thread(s) per core", "Core(s) per socket", "Socket(s)", "NUMA node(s)", "L2", "L3",
                "CPU(s)", "Flags")
        for line in lines:
            if line.split(":")[0].strip() in keep:
                v = line.split(":", 1)[1].strip()
                if line.startswith("Flags"):
                    v = " ".join(f for f in v.split() if f.startswith("avx512") or f in ("avx2", "fma"))
                out.append(f"  {line.split(':')[0].strip()}: {v}")
    except Exception as e:  # noqa: BLE001 - a report, not a requirement
        out.append(f"  lscpu: {e}")
    return "\n".join(out)


def main():
    args = sys.argv[1:]
    n, m, k = (int(float(a)) for a in args[:3]) if len(args) >= 3 else (200000, 100, 50)
    threads = [int(t) for t in args[3].split(",")] if len(args) > 3 else [1, 2, 4, 8, os.cpu_count()]
    threads = [t for t in threads if t <= numba.config.NUMBA_NUM_THREADS]
    rounds = int(args[4]) if len(args) > 4 else 5
    tiles = [int(t) for t in args[5].split(",")] if len(args) > 5 else []
    rng = np.random.default_rng(0)
    cen0 = rng.normal(size=(k, m)) * 3
    x = cen0[rng.integers(0, k, n)] + rng.normal(size=(n, m))
    cen = cen0 + 0.1
    shift, zt, cc, zlim, tolf = C.centre_data(cen)
    tile = C.screen_rows(k, m)
    nb = T._BLOCKS
    be = CPUBackend(threads=max(threads))
    be.load(x)
    lab = be.assign(cen)[0]
    parts = (np.empty((nb, k, m)), np.empty((nb, k)))
    from threadpoolctl import threadpool_info
    import scipy.linalg.cython_blas  # noqa: F401 - the library Numba's np.dot calls
    print(f"{n} x {m}, K = {k}, screen tile {tile} rows, {nb} blocks; screened: "
          f"{__import__('mpikmeans.backends.cpu.backend', fromlist=['x']).screened(k, m)}")
    print(f"numba {numba.__version__}, threading layer after the first parallel call below; "
          f"NUMBA_NUM_THREADS {numba.config.NUMBA_NUM_THREADS}")
    print(topology())
    parts_fns = {
        "step": lambda: be.step(cen),
        "convert": lambda: tile_pass(convert_tile, x, shift, zt, cc, tile, nb),
        "sgemm": lambda: tile_pass(sgemm_tile, x, shift, zt, cc, tile, nb),
        "screen": lambda: tile_pass(screen_tile, x, shift, zt, cc, tile, nb),
        "sums": lambda: sums_pass(x, cen, lab, tile, *parts),
        "stream": lambda: stream_pass(x, nb),
    }
    shipped = be.step(cen)
    for t in tiles:
        parts_fns[f"step@{t}"] = (lambda t=t: tiled_step(be, cen, t))
    with one_thread():
        for name, f in parts_fns.items():  # compile, and every tile's bits against the shipped step's
            out = f()
            if name.startswith("step@"):
                same = (np.array_equal(out[0], shipped.sums) and np.array_equal(out[1], shipped.counts)
                        and out[2] == shipped.sse)
                assert same, f"{name}: not the shipped step's bits"
    print(f"threading layer: {numba.threading_layer()}")
    for info in threadpool_info():
        print(f"  pool: {info.get('internal_api')} {info.get('version')} {info.get('threading_layer')} "
              f"arch {info.get('architecture')} threads {info.get('num_threads')} ({os.path.basename(info['filepath'])})")
    times = {t: {p: [] for p in parts_fns} for t in threads}
    for _ in range(rounds):
        for t in threads:
            be.threads = t
            numba.set_num_threads(t)
            with one_thread():
                for p, f in parts_fns.items():
                    s = time.perf_counter()
                    f()
                    times[t][p].append((time.perf_counter() - s) * 1e3)
    print(f"min ms of {rounds} rounds (speed-up over the first thread count)")
    print("threads " + "".join(f"{p:>16}" for p in parts_fns))
    base = {p: min(times[threads[0]][p]) for p in parts_fns}
    for t in threads:
        cells = "".join(f"{min(times[t][p]):9.2f} ({base[p] / min(times[t][p]):4.1f})" for p in parts_fns)
        print(f"{t:>7} {cells}")


if __name__ == "__main__":
    main()
