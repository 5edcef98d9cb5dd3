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

    python3 bench/experiments/gemm_pass1.py [--cases A,D] [--repeats 20] [--check-rows 20000] [--out F]
"""

from __future__ import annotations

import argparse
import functools
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))

from mpikmeans.backends.gpu.device import SIM, cuda  # noqa: E402
from mpikmeans.backends.gpu.gemm import merge_best  # noqa: E402
from mpikmeans.backends.gpu.intrinsics import ld4, ldx, stx  # noqa: E402

from numba import float32, int32  # noqa: E402

U32 = 2.0 ** -24
CASES = {"A": (5_000_000, 100, 50), "B": (10_000_000, 32, 1000), "C": (100_000_000, 8, 16),
         "D": (300_000, 257, 1000), "E": (2_000_000, 3, 7)}
NT = 256
_ALIGN = None if SIM else 16  # the 16-byte shared loads need it; the simulator refuses the argument


@functools.lru_cache(maxsize=None)
def gemm_pass1_kernel(m: int, kp: int, bn: int = 128, bk: int = 16, maxreg: int = 0):
    """Certified nearest centre of every row, float32 GEMM form (see the module docstring).

    ``bn`` centres per tile (128 or 64; rows per tile ``bm = 8 * 256 / (bn / 8)``), ``bk``
    attributes per stage; two shared buffers per operand, the next stage's values loaded
    into registers while this one is multiplied (one barrier per stage).
    """
    M_C, KP_C, BN_, BK_ = int(m), int(kp), int(bn), int(bk)
    TX = BN_ // 8  # threads along the centres
    TY = NT // TX  # threads along the rows
    BM_ = TY * 8
    HM, HN = BM_ // 2, BN_ // 2
    NCT = KP_C // BN_
    NST = -(-M_C // BK_)  # stages per centre tile
    XQ = BK_ * BM_ // NT  # x values each thread stages per stage
    CQ = BK_ * BN_ // NT  # centre values likewise
    XSN = BK_ * BM_
    CSN = BK_ * BN_
    XS2, CS2, MN = 2 * XSN, 2 * CSN, TX * BM_
    TOLF = np.float32(2.1 * (M_C + 5) * U32)
    TINY = np.float32(1.0e-36)
    BIG = np.float32(1.0e30)
    INF = np.float32(np.inf)

    def km_gemm_pass1(x, n, ld, cm, cc, sh, zlim, labels, flags, nflag):
        xs = cuda.shared.array(XS2, dtype=float32, alignment=_ALIGN)
        cs = cuda.shared.array(CS2, dtype=float32, alignment=_ALIGN)
        sb1 = cuda.shared.array(MN, dtype=float32)
        sb2 = cuda.shared.array(MN, dtype=float32)
        si1 = cuda.shared.array(MN, dtype=int32)
        syy = cuda.shared.array(BM_, dtype=float32)
        tid = cuda.threadIdx.x
        tx = tid % TX
        ty = tid // TX
        xr = tid % BM_  # the row this thread stages
        xk = tid // BM_  # its first attribute in a stage (then every NT // BM_)
        cr = tid % BN_
        ck = tid // BN_
        acc = cuda.local.array(64, dtype=float32)
        av = cuda.local.array(8, dtype=float32)
        cv = cuda.local.array(8, dtype=float32)
        px = cuda.local.array(XQ, dtype=float32)
        pc = cuda.local.array(CQ, dtype=float32)
        ntiles = (n + BM_ - 1) // BM_
        for tile in range(cuda.blockIdx.x, ntiles, cuda.gridDim.x):
            row0 = tile * BM_
            for r in range(8):
                rr = ty * 4 + r if r < 4 else HM + ty * 4 + r - 4
                stx(sb1, tx * BM_ + rr, INF)
                stx(sb2, tx * BM_ + rr, INF)
                stx(si1, tx * BM_ + rr, 0)
            i = row0 + xr
            if i >= n:
                i = n - 1
            yp = float32(0.0)
            for ct in range(NCT):
                for q in range(64):
                    acc[q] = float32(0.0)
                for st in range(NST + 1):
                    # load stage st (registers), multiply stage st - 1 (shared), store stage st
                    if st < NST:
                        j0 = st * BK_
                        for q in range(XQ):
                            j = j0 + xk + q * (NT // BM_)
                            v = float32(0.0)
                            if j < M_C:
                                v = ldx(x, j * ld + i) - ldx(sh, j)
                            px[q] = v
                        for q in range(CQ):
                            j = j0 + ck + q * (NT // BN_)
                            v = float32(0.0)
                            if j < M_C:
                                v = ldx(cm, j * KP_C + ct * BN_ + cr)
                            pc[q] = v
                    if st > 0:
                        bx = ((st - 1) & 1) * XSN
                        bc = ((st - 1) & 1) * CSN
                        for kk in range(BK_):
                            av[0], av[1], av[2], av[3] = ld4(xs, bx + kk * BM_ + ty * 4)
                            av[4], av[5], av[6], av[7] = ld4(xs, bx + kk * BM_ + HM + ty * 4)
                            cv[0], cv[1], cv[2], cv[3] = ld4(cs, bc + kk * BN_ + tx * 4)
                            cv[4], cv[5], cv[6], cv[7] = ld4(cs, bc + kk * BN_ + HN + tx * 4)
                            for r in range(8):
                                for c in range(8):
                                    acc[r * 8 + c] += av[r] * cv[c]
                    if st < NST:
                        bx = (st & 1) * XSN
                        bc = (st & 1) * CSN
                        for q in range(XQ):
                            stx(xs, bx + (xk + q * (NT // BM_)) * BM_ + xr, px[q])
                            if ct == 0:
                                yp += px[q] * px[q]
                        for q in range(CQ):
                            stx(cs, bc + (ck + q * (NT // BN_)) * BN_ + cr, pc[q])
                    cuda.syncthreads()
                # fold this centre tile into each row's best and second best (shared, own entries)
                for r in range(8):
                    rr = ty * 4 + r if r < 4 else HM + ty * 4 + r - 4
                    m1 = ldx(sb1, tx * BM_ + rr)
                    m2 = ldx(sb2, tx * BM_ + rr)
                    mi = ldx(si1, tx * BM_ + rr)
                    for c in range(8):
                        col = ct * BN_ + (tx * 4 + c if c < 4 else HN + tx * 4 + c - 4)
                        d = acc[r * 8 + c] + ldx(cc, col)
                        lt1 = d < m1
                        m2 = m1 if lt1 else (d if d < m2 else m2)
                        mi = col if lt1 else mi
                        m1 = d if lt1 else m1
                    stx(sb1, tx * BM_ + rr, m1)
                    stx(sb2, tx * BM_ + rr, m2)
                    stx(si1, tx * BM_ + rr, mi)
            # |y|^2 of each row: the partial sums of the threads that staged it
            if tid < BM_:
                stx(syy, xr, yp)
            cuda.syncthreads()
            for h in range(1, NT // BM_):
                if tid // BM_ == h:
                    stx(syy, xr, ldx(syy, xr) + yp)
                cuda.syncthreads()
            if tid < BM_:
                m1 = ldx(sb1, tid)
                m2 = ldx(sb2, tid)
                mi = ldx(si1, tid)
                for t in range(1, TX):
                    o1 = ldx(sb1, t * BM_ + tid)
                    o2 = ldx(sb2, t * BM_ + tid)
                    oi = ldx(si1, t * BM_ + tid)
                    m1, m2, mi = merge_best(m1, m2, mi, o1, o2, oi)
                i2 = row0 + tid
                if i2 < n:
                    scale = ldx(syy, tid) + zlim
                    tol = TOLF * scale + TINY
                    if m2 - m1 > tol and scale < BIG:
                        stx(labels, i2, mi)
                    else:
                        stx(labels, i2, -1)
                        p = cuda.atomic.add(nflag, 0, 1)
                        stx(flags, p, i2)
            cuda.syncthreads()

    return cuda.jit(km_gemm_pass1, max_registers=maxreg) if maxreg else cuda.jit(km_gemm_pass1)


def pack(centres: np.ndarray, bn: int):
    """The kernel's centre data: shift s, -2(c - s) attribute-major padded to ``bn``, |c - s|^2, zlim."""
    k, m = centres.shape
    kp = -(-k // bn) * bn
    s = centres.mean(axis=0)
    z = centres - s
    cm = np.zeros((m, kp), dtype=np.float32)
    cm[:, :k] = (-2.0 * z).T
    cc = np.full(kp, np.inf, dtype=np.float32)
    cc[:k] = (z * z).sum(axis=1)
    zlim = np.float32(2.0 * (z * z).sum(axis=1).max())
    return kp, s.astype(np.float32), cm.ravel(), cc, zlim


def run_case(name: str, n: int, m: int, k: int, repeats: int, check_rows: int, tie: bool = False,
             variants: tuple = ((128, 16, 0),)) -> dict:
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
    # the labels kept must be the exact float64 nearest centre (rows checked: the first check_rows)
    rows = min(n, check_rows)
    x64 = xt[:, :rows].T.astype(np.float64)
    best = np.empty(rows, dtype=np.int64)
    for a in range(0, rows, 2048):
        b = min(rows, a + 2048)
        best[a:b] = ((x64[a:b, None, :] - centres[None, :, :]) ** 2).sum(axis=2).argmin(axis=1)
    dx = cuda.to_device(xt.ravel())
    labels = cuda.device_array(n, dtype=np.int32)
    flags = cuda.device_array(n, dtype=np.int32)
    nflag = cuda.to_device(np.zeros(1, dtype=np.int32))
    sms = 132 if SIM else cuda.get_current_device().MULTIPROCESSOR_COUNT
    out = {"case": name, "n": n, "m": m, "k": k, "gen_s": gen_s, "variants": []}
    for bn, bk, maxreg in variants:
        kp, s, cm, cc, zlim = pack(centres, bn)
        dcm, dcc, dsh = cuda.to_device(cm), cuda.to_device(cc), cuda.to_device(s)
        kern = gemm_pass1_kernel(m, kp, bn, bk, maxreg)
        bm = 8 * NT // (bn // 8)
        ntiles = -(-n // bm)
        args = (dx, n, ld, dcm, dcc, dsh, zlim, labels, flags, nflag)
        t = time.perf_counter()
        try:
            kern[min(ntiles, 2), NT](*args)  # compile
            cuda.synchronize()
        except Exception as exc:  # e.g. more static shared memory than a block may have
            out["variants"].append({"bn": bn, "bk": bk, "maxreg": maxreg, "error": f"{type(exc).__name__}: {exc}"[:300]})
            continue
        compile_s = time.perf_counter() - t
        regs = None
        try:
            regs = int(next(iter(kern.overloads.values())).get_regs_per_thread())
        except Exception:  # the simulator, or an older numba-cuda
            pass
        for per_sm in ((1,) if SIM else (1, 2, 4)):
            grid = min(ntiles, 2 if SIM else sms * per_sm)
            times = []
            for _ in range(repeats):
                nflag.copy_to_device(np.zeros(1, dtype=np.int32))
                e0, e1 = cuda.event(), cuda.event()
                e0.record()
                kern[grid, NT](*args)
                e1.record()
                e1.synchronize()
                times.append(e0.elapsed_time(e1))
            ms = float(np.median(times))
            out["variants"].append({"bn": bn, "bk": bk, "maxreg": maxreg, "kp": kp, "grid": grid, "regs": regs,
                                    "compile_s": compile_s, "ms_median": ms, "ms_min": float(np.min(times)),
                                    "tfma_per_s": n * kp * m / (ms * 1e-3) / 1e12,
                                    "useful_tfma_per_s": n * k * m / (ms * 1e-3) / 1e12})
        lab = labels.copy_to_host()
        kept = lab[:rows] >= 0
        if tie:
            assert (~kept[np.isin(best, [0, 1])]).all(), "a row of the tied centres kept a label"
        for v in out["variants"]:
            if v["bn"] == bn and v["bk"] == bk and v["maxreg"] == maxreg:
                v.update(flagged=int(nflag.copy_to_host()[0]), checked_rows=rows,
                         wrong_labels=int((lab[:rows][kept] != best[kept]).sum()))
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cases", default="A,D")
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--check-rows", type=int, default=20_000)
    ap.add_argument("--shape", help="NxMxK instead of the cases (simulator tests)")
    ap.add_argument("--tie", action="store_true", help="two equal centres (their rows must be flagged)")
    ap.add_argument("--variants", default="128:8:0,64:8:0,128:16:0,64:16:0",
                    help="bn:bk:maxreg,... (maxreg 0: no limit)")
    ap.add_argument("--out")
    a = ap.parse_args()
    todo = [(c, *CASES[c]) for c in a.cases.split(",")] if not a.shape else \
        [("custom", *(int(v) for v in a.shape.split("x")))]
    res = []
    for name, n, m, k in todo:
        variants = tuple(tuple(int(v) for v in part.split(":")) for part in a.variants.split(","))
        r = run_case(name, n, m, k, a.repeats, a.check_rows, a.tie, variants)
        res.append(r)
        for v in r["variants"]:
            if "error" in v:
                print(f"{name}: bn {v['bn']} bk {v['bk']} maxreg {v['maxreg']}: {v['error']}", flush=True)
                continue
            print(f"{name}: {n} x {m}, K = {k}, bn {v['bn']} bk {v['bk']} maxreg {v['maxreg']} grid {v['grid']}: "
                  f"{v['ms_median']:.3f} ms (min {v['ms_min']:.3f}), {v['tfma_per_s']:.1f} TFMA/s "
                  f"({v['useful_tfma_per_s']:.1f} useful, padded K {v['kp']}), regs {v['regs']}, "
                  f"flagged {v.get('flagged')}, wrong {v.get('wrong_labels')} of {v.get('checked_rows')}; "
                  f"compile {v['compile_s']:.1f} s", flush=True)
    if a.out:
        from mpikmeans.bench.harness import result_document, write_result

        write_result(a.out, result_document("experiment", "python3 " + " ".join(sys.argv), vars(a),
                                            {"results": res}))


if __name__ == "__main__":
    main()
