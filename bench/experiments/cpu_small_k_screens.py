"""Screens for the CPU step's small shapes (issue 17), against the exact kernels, in one process.

At K <= 8 and K x M <= 256 the CPU step runs the exact float64 kernels
(``backends/cpu/backend.py: screened``).  Three ways to do fewer float64
operations, each giving the exact kernels' bits (asserted here before timing):

* ``sgemm``: the shipped screen (float32 products by BLAS: ``bounds.step_pass`` with the screen's plan, no bounds);
* ``reg``: a float32 screen in Numba on a transposed float32 tile (no BLAS call);
* ``s64``: a float64 screen with FMAs on the exact kernels' transposed tile,
  certified with the float64 form of the bound (``8 (m + 5) u``, which also
  covers the exact kernels' own rounding), then the exact distance to the chosen
  centre.

Timed round-robin, so that this virtual machine's drifting speed falls on all
alike; min and median ms per step over the rounds.  ``--in-cache`` instead times
the exact kernel per row on rows that fit in L2 and on rows that do not.

    python bench/experiments/cpu_small_k_screens.py N M K [THREADS] [REG_TILE] [ROUNDS] [S64_TILE]
    python bench/experiments/cpu_small_k_screens.py --in-cache
"""
import time, sys, numpy as np, numba
from numba import prange, njit
import os

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))
from mpikmeans.backends.cpu import bounds as B, certified as C, tiles as T
from mpikmeans.backends.cpu.blas import one_thread
if sys.argv[1:2] == ["--in-cache"]:
    m, k = 16, 8
    numba.set_num_threads(1)
    rng = np.random.default_rng(0)
    cen0 = rng.normal(size=(k, m)) * 3
    for n in (8000, 1000000):  # 1 MB of rows (in L2) and 128 MB
        x = cen0[rng.integers(0, k, n)] + rng.normal(size=(n, m))
        parts = (np.empty((T._BLOCKS, k, m)), np.empty((T._BLOCKS, k)), np.empty(T._BLOCKS),
                 np.empty(T._BLOCKS, dtype=np.int64))
        lab = np.full(n, -1, np.int32)
        reps = max(1, 2000000 // n)
        ts = []
        for _ in range(7):
            s = time.perf_counter()
            for _ in range(reps):
                T._lloyd_pass(x, cen0 + 0.1, 64, lab, np.ones(0), False, *parts)
            ts.append((time.perf_counter() - s) / reps / n * 1e9)
        print(f"exact kernel, {n} rows x {m}, K = {k}, one thread: ns per row min {min(ts):.2f} "
              f"median {np.median(ts):.2f}")
    sys.exit()
n, m, k = int(float(sys.argv[1])), int(sys.argv[2]), int(sys.argv[3])
th = int(sys.argv[4]) if len(sys.argv) > 4 else 1
numba.set_num_threads(th)
rng = np.random.default_rng(0)
cen0 = rng.normal(size=(k, m)) * 3
x = cen0[rng.integers(0, k, n)] + rng.normal(size=(n, m))
cen = cen0 + 0.1
nb = T._BLOCKS

@njit(cache=False)
def shifted_cols(x, t0, rt, rv, shift, yt, yy):
    m = x.shape[1]
    for r in range(rt):
        for j in range(m):
            yt[j, r] = np.float32(x[t0 + r, j] - shift[j])
    for r in range(rv):
        yy[r] = 0
    for j in range(m):
        yj = yt[j]
        for r in range(rv):
            yy[r] += yj[r] * yj[r]

@njit(fastmath={"contract"})
def dot_est(zt, yt, rv, est):
    k, m = zt.shape
    m4 = m - m % 4
    for c in range(k):
        a = est[c]
        for r in range(rv):
            a[r] = 0.0
        for j in range(0, m4, 4):
            z0 = zt[c, j]; z1 = zt[c, j + 1]; z2 = zt[c, j + 2]; z3 = zt[c, j + 3]
            y0 = yt[j]; y1 = yt[j + 1]; y2 = yt[j + 2]; y3 = yt[j + 3]
            for r in range(rv):
                a[r] = a[r] + z0 * y0[r] + z1 * y1[r] + z2 * y2[r] + z3 * y3[r]
        for j in range(m4, m):
            z0 = zt[c, j]
            y0 = yt[j]
            for r in range(rv):
                a[r] = a[r] + z0 * y0[r]

@njit(fastmath={"contract"})
def est64(yt, rv, zt, est):
    k, m = zt.shape
    for c0 in range(0, k, 4):
        c1 = min(c0 + 1, k - 1); c2 = min(c0 + 2, k - 1); c3 = min(c0 + 3, k - 1)
        a0 = est[c0]; a1 = est[c1]; a2 = est[c2]; a3 = est[c3]
        for r in range(rv):
            a0[r] = 0.0; a1[r] = 0.0; a2[r] = 0.0; a3[r] = 0.0
        for j in range(0, m - 1, 2):
            p0 = zt[c0, j]; p1 = zt[c1, j]; p2 = zt[c2, j]; p3 = zt[c3, j]
            q0 = zt[c0, j + 1]; q1 = zt[c1, j + 1]; q2 = zt[c2, j + 1]; q3 = zt[c3, j + 1]
            ya = yt[j]; yb = yt[j + 1]
            for r in range(rv):
                e = ya[r]; f = yb[r]
                a0[r] = a0[r] + p0 * e + q0 * f
                a1[r] = a1[r] + p1 * e + q1 * f
                a2[r] = a2[r] + p2 * e + q2 * f
                a3[r] = a3[r] + p3 * e + q3 * f
        if m % 2:
            j = m - 1
            p0 = zt[c0, j]; p1 = zt[c1, j]; p2 = zt[c2, j]; p3 = zt[c3, j]
            ya = yt[j]
            for r in range(rv):
                e = ya[r]
                a0[r] = a0[r] + p0 * e
                a1[r] = a1[r] + p1 * e
                a2[r] = a2[r] + p2 * e
                a3[r] = a3[r] + p3 * e

@njit
def shift_tile(xt, rv, shift, yy):
    m = xt.shape[0]
    for r in range(rv):
        yy[r] = 0.0
    for j in range(m):
        s = shift[j]
        a = xt[j]
        for r in range(rv):
            v = a[r] - s
            a[r] = v
            yy[r] += v * v

@njit
def screen_f32(x, t0, rt, rv, shift, zt, yt, yy, est):
    """``reg``: float32 rows of the tile, transposed, then their products with the centres."""
    shifted_cols(x, t0, rt, rv, shift, yt, yy)
    dot_est(zt, yt, rv, est)


@njit
def screen_f64(x, t0, rt, rv, shift, zt, yt, yy, est):
    """``s64``: the exact kernels' transposed float64 tile, shifted, then FMA products."""
    T._load_tile(x, t0, rt, yt)
    shift_tile(yt, rv, shift, yy)
    est64(yt, rv, zt, est)


@njit
def recheck_tile(x, t0, rt, cen, zlim, tolf, yy, b1, b2, i1):
    """Exact labels for the tile's rows the bound cannot certify (the shipped screen's test); how many."""
    exact = 0
    for r in range(rt):
        if not C.is_certified(b1[r], b2[r], yy[r], zlim, tolf):
            i1[r] = C._exact_nearest(x, t0 + r, cen)[0]
            exact += 1
    return exact


@njit
def sum_tile(x, t0, rt, cen, i1, labels, sums, counts, sse, tile, rows, dt):
    """The shipped step's sums of the tile's rows (exact distances to their labels, rows in order)."""
    for r in range(rt):
        rows[r] = r
    T.label_dists(x, t0, rows, rt, cen, i1, dt)
    return B._sum_rows(x, t0, rt, i1, dt, labels, np.ones(0), False, sums, counts, sse, tile)


@njit(parallel=True)
def screened_pass(screen, x, cen, shift, zt, cc, zlim, tolf, tile, labels, ps, pc, pse, pch, pex):
    """The screened step with the tile's estimates from ``screen`` (in the float type of ``zt``):
    ranked, rechecked and summed by the shipped helpers, so the same bits or an assertion fails."""
    n = x.shape[0]
    nb = ps.shape[0]
    k, m = zt.shape
    for b in prange(nb):
        yt = np.zeros((m, tile + 8), dtype=zt.dtype)  # 8 spare columns: the float64 tile's pitch
        est = np.zeros((k, tile), dtype=zt.dtype)
        yy = np.zeros(tile, dtype=zt.dtype)
        b1 = np.empty(tile, dtype=zt.dtype)
        b2 = np.empty(tile, dtype=zt.dtype)
        i1 = np.empty(tile, dtype=np.int32)
        rows = np.empty(tile, dtype=np.int64)
        dt = np.empty(tile)
        sums = ps[b]
        counts = pc[b]
        sums[:, :] = 0.0
        counts[:] = 0.0
        lo = n * b // nb
        hi = n * (b + 1) // nb
        sse = 0.0
        changed = 0
        exact = 0
        for t0 in range(lo, hi, tile):
            rt = min(tile, hi - t0)
            rv = min(tile, (rt + 15) // 16 * 16)
            screen(x, t0, rt, rv, shift, zt, yt, yy, est)
            C._rank(est, cc, rt, b1, b2, i1)
            exact += recheck_tile(x, t0, rt, cen, zlim, tolf, yy, b1, b2, i1)
            sse, moved = sum_tile(x, t0, rt, cen, i1, labels, sums, counts, sse, tile, rows, dt)
            changed += moved
        pse[b] = sse
        pch[b] = changed
        pex[b] = exact


def centre64(centres):
    k, m = centres.shape
    shift = centres.mean(axis=0)
    z = centres - shift
    norms = np.einsum("ij,ij->i", z, z)
    zlim = 2.0 * float(norms.max()) * (1.0 + 1e-6)
    return shift, -2.0 * z, norms, zlim, 8.0 * (m + 5) * 2.0 ** -53

def parts():
    return (np.empty((nb, k, m)), np.empty((nb, k)), np.empty(nb), np.empty(nb, dtype=np.int64), np.empty(nb, dtype=np.int64))
P = {name: parts() for name in ("exact", "sgemm", "reg", "s64")}
L = {name: np.full(n, -1, np.int32) for name in P}
prep = C.centre_data(cen)
rtile = int(sys.argv[5]) if len(sys.argv) > 5 else 256
def f_exact():
    T._lloyd_pass(x, cen, T._tile_rows(m), L["exact"], np.ones(0), False, *P["exact"][:4])
searched = np.empty(nb, dtype=np.int64)
def f_sgemm():
    s, ex = P["sgemm"][:4], P["sgemm"][4]
    with one_thread():
        B.step_pass(x, cen, (True, *prep), C.screen_rows(k, m), L["sgemm"], np.zeros(n), False, np.zeros(k), np.zeros(k),
                    np.ones(0), False, *s, searched, ex)
def f_reg():
    screened_pass(screen_f32, x, cen, *prep, rtile, L["reg"], *P["reg"])
prep64 = centre64(cen)
stile = int(sys.argv[7]) if len(sys.argv) > 7 else 64
def f_s64():
    screened_pass(screen_f64, x, cen, *prep64, stile, L["s64"], *P["s64"])
F = {"exact": f_exact, "sgemm": f_sgemm, "reg": f_reg, "s64": f_s64}
for f in F.values():
    f()
for v in ("sgemm", "reg", "s64"):
    assert np.array_equal(L["exact"], L[v]), v
    for i in range(4):
        assert np.array_equal(P["exact"][i], P[v][i]), (v, i)
print("same bits: exact == sgemm == reg == s64; rows rechecked by reg, s64:", P["reg"][4].sum(), P["s64"][4].sum())
T_ = {name: [] for name in F}
for _ in range(int(sys.argv[6]) if len(sys.argv) > 6 else 12):
    for name, f in F.items():
        t = time.perf_counter(); f(); T_[name].append(1e3 * (time.perf_counter() - t))
for name, ts in T_.items():
    print(f"{name:6s} min {min(ts):7.2f}  median {np.median(ts):7.2f} ms")
