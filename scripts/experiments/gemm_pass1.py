"""Prototype: a GEMM-shaped certified pass 1 (issue 16), timed against the shapes of ``bench fullstep``.

Not wired into the backend: it answers whether Numba CUDA can run the float32
screen of the full step as a register-blocked GEMM near the FMA rate, which the
fused kernel's pass 1 does not (bench/GPU_NOTES.md; case D 22 ms against a 2.3 ms
floor).  Same certificate as the fused kernel's pass 1 (kernels.py): a row's
label is kept only when the float32 gap between its best and second-best centre
exceeds ``TOLF (|y|^2 + 2 max|z|^2) + tiny``; the other rows are flagged.

Block of 256 threads (16 x 16) computes a 128-row x 128-centre tile per centre
tile, each thread 8 x 8 accumulators (rows ``ty*4 + {0..3}, 64 + ty*4 + {0..3}``,
centres likewise with ``tx``: conflict-free 16-byte shared loads), attributes in
stages of BK through shared memory; best / second best per row are kept across
the centre tiles and merged over the 16 threads of a row group in shared memory.

    python3 scripts/experiments/gemm_pass1.py [--cases A,D] [--repeats 20] [--check-rows 20000] [--out F]
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))

from mpikmeans.backends.gpu.device import SIM, cuda  # noqa: E402
from mpikmeans.backends.gpu.intrinsics import ld4, ldx, stx  # noqa: E402

from numba import float32, int32  # noqa: E402

U32 = 2.0 ** -24
CASES = {"A": (5_000_000, 100, 50), "B": (10_000_000, 32, 1000), "C": (100_000_000, 8, 16),
         "D": (300_000, 257, 1000), "E": (2_000_000, 3, 7)}
NT = 256
BM = BN = 128
BK = 8
_ALIGN = None if SIM else 16  # the 16-byte shared loads need it; the simulator refuses the argument


@functools.lru_cache(maxsize=None)
def gemm_pass1_kernel(m: int, kp: int):
    """Certified nearest centre of every row, float32 GEMM form (see the module docstring)."""
    M_C, KP_C = int(m), int(kp)
    NCT = KP_C // BN
    TOLF = np.float32(2.1 * (M_C + 5) * U32)
    TINY = np.float32(1.0e-36)
    BIG = np.float32(1.0e30)
    INF = np.float32(np.inf)

    def km_gemm_pass1(x, n, ld, cm, cc, sh, zlim, labels, flags, nflag):
        xs = cuda.shared.array(BK * BM, dtype=float32, alignment=_ALIGN)
        cs = cuda.shared.array(BK * BN, dtype=float32, alignment=_ALIGN)
        sb1 = cuda.shared.array(16 * BM, dtype=float32)
        sb2 = cuda.shared.array(16 * BM, dtype=float32)
        si1 = cuda.shared.array(16 * BM, dtype=int32)
        syy = cuda.shared.array(BM, dtype=float32)
        tid = cuda.threadIdx.x
        tx = tid % 16
        ty = tid // 16
        acc = cuda.local.array(64, dtype=float32)
        yy = cuda.local.array(8, dtype=float32)
        b1 = cuda.local.array(8, dtype=float32)
        b2 = cuda.local.array(8, dtype=float32)
        i1 = cuda.local.array(8, dtype=int32)
        av = cuda.local.array(8, dtype=float32)
        cv8 = cuda.local.array(8, dtype=float32)
        ntiles = (n + BM - 1) // BM
        for tile in range(cuda.blockIdx.x, ntiles, cuda.gridDim.x):
            row0 = tile * BM
            for r in range(8):
                yy[r] = float32(0.0)
                b1[r] = INF
                b2[r] = INF
                i1[r] = 0
            for ct in range(NCT):
                for q in range(64):
                    acc[q] = float32(0.0)
                for j0 in range(0, M_C, BK):
                    # stage BK attributes of the 128 rows and of the 128 centres
                    for q in range(BK * BM // NT):
                        e = tid + q * NT
                        kk = e // BM
                        rr = e - kk * BM
                        j = j0 + kk
                        i = row0 + rr
                        if i >= n:
                            i = n - 1
                        v = float32(0.0)
                        if j < M_C:
                            v = ldx(x, j * ld + i) - ldx(sh, j)
                        stx(xs, e, v)
                        cv = float32(0.0)
                        if j < M_C:
                            cv = ldx(cm, j * KP_C + ct * BN + rr)
                        stx(cs, e, cv)
                    cuda.syncthreads()
                    for kk in range(BK):
                        av[0], av[1], av[2], av[3] = ld4(xs, kk * BM + ty * 4)
                        av[4], av[5], av[6], av[7] = ld4(xs, kk * BM + 64 + ty * 4)
                        cv8[0], cv8[1], cv8[2], cv8[3] = ld4(cs, kk * BN + tx * 4)
                        cv8[4], cv8[5], cv8[6], cv8[7] = ld4(cs, kk * BN + 64 + tx * 4)
                        if ct == 0:
                            for r in range(8):
                                yy[r] += av[r] * av[r]
                        for r in range(8):
                            for c in range(8):
                                acc[r * 8 + c] += av[r] * cv8[c]
                    cuda.syncthreads()
                # fold this centre tile into each row's best and second best
                for c in range(8):
                    col = ct * BN + (tx * 4 + c if c < 4 else 64 + tx * 4 + c - 4)
                    cc_c = ldx(cc, col)
                    for r in range(8):
                        d = acc[r * 8 + c] + cc_c
                        o1 = b1[r]
                        lt1 = d < o1
                        b2[r] = o1 if lt1 else (d if d < b2[r] else b2[r])
                        b1[r] = d if lt1 else o1
                        i1[r] = col if lt1 else i1[r]
            # merge over the 16 threads that hold the same rows (other centres), in shared memory
            for r in range(8):
                rr = ty * 4 + r if r < 4 else 64 + ty * 4 + r - 4
                stx(sb1, tx * BM + rr, b1[r])
                stx(sb2, tx * BM + rr, b2[r])
                stx(si1, tx * BM + rr, i1[r])
                if tx == 0:
                    stx(syy, rr, yy[r])
            cuda.syncthreads()
            if tid < BM:
                m1 = ldx(sb1, tid)
                m2 = ldx(sb2, tid)
                mi = ldx(si1, tid)
                for t in range(1, 16):
                    o1 = ldx(sb1, t * BM + tid)
                    o2 = ldx(sb2, t * BM + tid)
                    oi = ldx(si1, t * BM + tid)
                    take = o1 < m1 or (o1 == m1 and oi < mi)
                    hi = m1 if take else o1  # the larger of the two bests
                    s2 = m2 if m2 < o2 else o2
                    m2 = hi if hi < s2 else s2
                    m1 = o1 if take else m1
                    mi = oi if take else mi
                i = row0 + tid
                if i < n:
                    scale = ldx(syy, tid) + zlim
                    tol = TOLF * scale + TINY
                    if m2 - m1 > tol and scale < BIG:
                        stx(labels, i, mi)
                    else:
                        stx(labels, i, -1)
                        p = cuda.atomic.add(nflag, 0, 1)
                        stx(flags, p, i)
            cuda.syncthreads()

    return cuda.jit(km_gemm_pass1)


def pack(centres: np.ndarray):
    """The kernel's centre data: shift s, -2(c - s) attribute-major padded to BN, |c - s|^2, zlim."""
    k, m = centres.shape
    kp = -(-k // BN) * BN
    s = centres.mean(axis=0)
    z = centres - s
    cm = np.zeros((m, kp), dtype=np.float32)
    cm[:, :k] = (-2.0 * z).T
    cc = np.full(kp, np.inf, dtype=np.float32)
    cc[:k] = (z * z).sum(axis=1)
    zlim = np.float32(2.0 * (z * z).sum(axis=1).max())
    return kp, s.astype(np.float32), cm.ravel(), cc, zlim


def run_case(name: str, n: int, m: int, k: int, repeats: int, check_rows: int, tie: bool = False) -> dict:
    rng = np.random.default_rng(0)
    t = time.perf_counter()
    centres = rng.uniform(-8, 8, size=(k, m))
    if tie:  # centre 1 = centre 0: their rows are exact ties and must all be flagged
        centres[1] = centres[0]
    lab0 = rng.integers(k, size=n)
    ld = -(-n // 32) * 32
    xt = np.empty((m, ld), dtype=np.float32)  # column-major rows: blobs of spread 1 around the centres
    for j in range(m):
        xt[j, :n] = centres[lab0, j] + rng.standard_normal(n, dtype=np.float32)
    xt[:, n:] = 0
    gen_s = time.perf_counter() - t
    kp, s, cm, cc, zlim = pack(centres)
    dx = cuda.to_device(xt.ravel())
    dcm, dcc, dsh = cuda.to_device(cm), cuda.to_device(cc), cuda.to_device(s)
    labels = cuda.device_array(n, dtype=np.int32)
    flags = cuda.device_array(n, dtype=np.int32)
    nflag = cuda.to_device(np.zeros(1, dtype=np.int32))
    kern = gemm_pass1_kernel(m, kp)
    ntiles = -(-n // BM)
    sms = 132 if SIM else cuda.get_current_device().MULTIPROCESSOR_COUNT
    grid = min(ntiles, 2 if SIM else sms * 4)
    args = (dx, n, ld, dcm, dcc, dsh, zlim, labels, flags, nflag)
    t = time.perf_counter()
    kern[grid, NT](*args)
    cuda.synchronize()
    compile_s = time.perf_counter() - t
    times = []
    for _ in range(repeats):
        nflag.copy_to_device(np.zeros(1, dtype=np.int32))
        e0, e1 = cuda.event(), cuda.event()
        e0.record()
        kern[grid, NT](*args)
        e1.record()
        e1.synchronize()
        times.append(e0.elapsed_time(e1))
    regs = None
    try:
        regs = int(next(iter(kern.overloads.values())).get_regs_per_thread())
    except Exception:  # the simulator, or an older numba-cuda
        pass
    lab = labels.copy_to_host()
    flagged = int(nflag.copy_to_host()[0])
    # the labels kept must be the exact float64 nearest centre (rows checked: the first check_rows)
    rows = min(n, check_rows)
    x64 = xt[:, :rows].T.astype(np.float64)
    best = np.empty(rows, dtype=np.int64)
    for a in range(0, rows, 2048):
        b = min(rows, a + 2048)
        d = ((x64[a:b, None, :] - centres[None, :, :]) ** 2).sum(axis=2)
        best[a:b] = d.argmin(axis=1)
    kept = lab[:rows] >= 0
    if tie:
        assert (~kept[np.isin(best, [0, 1])]).all(), "a row of the tied centres kept a label"
    wrong = int((lab[:rows][kept] != best[kept]).sum())
    ms = float(np.median(times))
    fma = n * kp * m
    return {"case": name, "n": n, "m": m, "k": k, "kp": kp, "grid": grid, "gen_s": gen_s, "compile_s": compile_s,
            "ms_median": ms, "ms_min": float(np.min(times)), "tfma_per_s": fma / (ms * 1e-3) / 1e12,
            "flagged": flagged, "regs": regs, "checked_rows": rows, "wrong_labels": wrong}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cases", default="A,D")
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--check-rows", type=int, default=20_000)
    ap.add_argument("--shape", help="NxMxK instead of the cases (simulator tests)")
    ap.add_argument("--tie", action="store_true", help="two equal centres (their rows must be flagged)")
    ap.add_argument("--out")
    a = ap.parse_args()
    todo = [(c, *CASES[c]) for c in a.cases.split(",")] if not a.shape else \
        [("custom", *(int(v) for v in a.shape.split("x")))]
    res = []
    for name, n, m, k in todo:
        r = run_case(name, n, m, k, a.repeats, a.check_rows, a.tie)
        res.append(r)
        print(f"{name}: {n} x {m}, K = {k}: {r['ms_median']:.3f} ms (min {r['ms_min']:.3f}), "
              f"{r['tfma_per_s']:.1f} TFMA/s (padded K {r['kp']}), flagged {r['flagged']}, regs {r['regs']}, "
              f"wrong {r['wrong_labels']} of {r['checked_rows']} checked; compile {r['compile_s']:.1f} s", flush=True)
    if a.out:
        with open(a.out, "w") as f:
            json.dump({"device": None if SIM else cuda.get_current_device().name.decode()
                       if isinstance(cuda.get_current_device().name, bytes) else str(cuda.get_current_device().name),
                       "results": res}, f, indent=1)


if __name__ == "__main__":
    main()
