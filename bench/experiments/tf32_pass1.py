"""Prototype: the GEMM-shaped certified pass 1 on TF32 tensor cores (issue 16), timed against the
float32 SIMT prototype (``gemm_pass1.py``) on the same data in the same run.

Not wired into the backend.  It answers two questions before any integration:
how fast Numba CUDA runs the screen's products on the tensor cores through inline
PTX (``mma.sync.aligned.m16n8k8 ... .tf32``), and how many rows the wider TF32
certificate leaves to the exact kernel.  The SIMT screen runs at 41 % of the FP32
FMA rate on the H100 (case D: 5.5 ms of a 9.1 ms step, GPU_NOTES v6 and v8).

Arithmetic.  The rows are shifted by the centres' mean (``y = x - s`` in float32,
as the backend does), then rounded to TF32 (``cvt.rna``: 10 explicit mantissa bits,
relative error at most 2^-11); the centre matrix ``-2 z`` is rounded likewise on
the host.  The tensor cores multiply the rounded values exactly and add in float32.
The estimate of ``|y - z_c|^2 - |y|^2`` is ``|z_c|^2 + sum_j tf32(y_j) tf32(-2 z_cj)``.
Its error against the exact value is at most ``2 (2^-10 + 2^-22) sum_j |y_j z_cj|
<= (2^-10 + 2^-22)(|y|^2 + |z_c|^2)`` from the rounding of the inputs, plus the
float32 errors of the shift, of ``|z_c|^2`` and of the accumulation, which the
float32 screen's own bound ``2.1 (M + 5) u (|y|^2 + 2 max |z|^2)`` covers for a
sequential sum; the tensor cores add in a different order and truncate, so that
term is taken four times here.  Two estimates are compared, so a label is kept
only when the gap between the best and the second best exceeds

    tol = (2^-9 (1 + 2^-12) + 8.4 (M + 5) u) (|y|^2 + 2 max |z|^2) + tiny.

Kernel.  256 threads (8 warps, 2 along the rows x 4 along the centres) compute a
128-row x 128-centre tile; each warp 64 x 32 as 4 x 4 ``m16n8k8`` products, 64
float32 accumulators a lane.  Attributes in stages of 16 through shared memory
(two buffers; the next stage's values are loaded into registers while this one is
multiplied; one barrier a stage); both operands stored attribute-major with a row
pitch of 136 words, so every fragment load is conflict-free.  Per centre tile each
lane folds its 8 columns of a row into a best and second best, the four lanes of a
quad merge theirs by shuffles, and one lane a quad keeps the warp's result in
shared memory; the row tile's end merges the four centre warps and certifies.

    python3 bench/experiments/tf32_pass1.py [--cases D,B,A] [--repeats 20] [--check-rows 20000] [--out F]
"""

from __future__ import annotations

import argparse
import functools
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.dirname(__file__))

from mpikmeans.backends.gpu.device import SIM, cuda  # noqa: E402
from mpikmeans.backends.gpu.intrinsics import ldx, stx  # noqa: E402

from numba import float32, int32  # noqa: E402

if SIM:
    raise SystemExit("tf32_pass1: the tensor-core kernel needs a GPU (inline PTX), not the simulator")

import gemm_pass1  # noqa: E402

from mpikmeans.backends.gpu.gemm import merge_best  # noqa: E402
from mpikmeans.backends.gpu.tensor import mma_tf32, tf32_rna  # noqa: E402  (the backend's inline PTX)

U32 = 2.0 ** -24
CASES = gemm_pass1.CASES
NT = 256
BM = 128  # rows per tile
BN = 128  # centres per tile
BK = 16  # attributes per stage
P = 136  # shared row pitch in words: (tig * 136 + gid) mod 32 covers every bank


def tf32_host(a: np.ndarray) -> np.ndarray:
    """float32 values rounded to TF32 as ``cvt.rna`` does (nearest, ties away from zero)."""
    b = np.ascontiguousarray(a, dtype=np.float32).view(np.uint32)
    r = ((b + np.uint32(0x1000)) & np.uint32(0xFFFFE000)).astype(np.uint32)
    # NaN and infinity keep their bits (none occur in the centre data)
    special = (b & np.uint32(0x7F800000)) == np.uint32(0x7F800000)
    r[special] = b[special]
    return r.view(np.float32)


@functools.lru_cache(maxsize=None)
def tf32_pass1_kernel(m: int, kp: int, maxreg: int = 0):
    """Certified nearest centre of every row on the tensor cores (see the module docstring)."""
    M_C, KP_C = int(m), int(kp)
    NCT = KP_C // BN
    NST = -(-M_C // BK)
    XQ = BK * BM // NT  # values each thread stages per stage: x
    CQ = BK * BN // NT  # and centres
    BUF = BK * P  # one stage buffer
    WN = 4  # warps along the centres
    BUF2 = 2 * BUF
    WNBM = WN * BM
    TOLT = np.float32(2.0 ** -9 * (1.0 + 2.0 ** -12) + 8.4 * (M_C + 5) * U32)
    TINY = np.float32(1.0e-36)
    BIG = np.float32(1.0e30)
    INF = np.float32(np.inf)

    def km_tf32_pass1(x, n, ld, cm, cc, sh, zlim, labels, flags, nflag):
        xs = cuda.shared.array(BUF2, dtype=float32)
        cs = cuda.shared.array(BUF2, dtype=float32)
        sb1 = cuda.shared.array(WNBM, dtype=float32)
        sb2 = cuda.shared.array(WNBM, dtype=float32)
        si1 = cuda.shared.array(WNBM, dtype=int32)
        syy = cuda.shared.array(BM, dtype=float32)
        scr = cuda.shared.array(1, dtype=float32)  # the simulator's exchange area of mma_tf32: unused here
        tid = cuda.threadIdx.x
        lane = tid % 32
        warp = tid // 32
        wm = warp % 2
        wn = warp // 2
        gid = lane // 4
        tig = lane % 4
        xr = tid % BM  # the row this thread stages; attributes xk, xk + 2, ...
        xk = tid // BM
        cr = tid % BN
        ck = tid // BN
        acc = cuda.local.array(64, dtype=float32)
        af = cuda.local.array(16, dtype=float32)
        bf = cuda.local.array(8, dtype=float32)
        px = cuda.local.array(XQ, dtype=float32)
        pc = cuda.local.array(CQ, dtype=float32)
        ntiles = (n + BM - 1) // BM
        for tile in range(cuda.blockIdx.x, ntiles, cuda.gridDim.x):
            row0 = tile * BM
            for q in range(tid, WN * BM, NT):
                stx(sb1, q, INF)
                stx(sb2, q, INF)
                stx(si1, q, 0)
            i = row0 + xr
            if i >= n:
                i = n - 1
            yp = float32(0.0)
            for ct in range(NCT):
                for q in range(64):
                    acc[q] = float32(0.0)
                for st in range(NST + 1):
                    if st < NST:
                        j0 = st * BK
                        for q in range(XQ):
                            j = j0 + xk + q * (NT // BM)
                            v = float32(0.0)
                            if j < M_C:
                                v = ldx(x, j * ld + i) - ldx(sh, j)
                            px[q] = v
                        for q in range(CQ):
                            j = j0 + ck + q * (NT // BN)
                            v = float32(0.0)
                            if j < M_C:
                                v = ldx(cm, j * KP_C + ct * BN + cr)
                            pc[q] = v
                    if st > 0:
                        bo = ((st - 1) & 1) * BUF
                        for ks in range(BK // 8):
                            k0 = bo + (ks * 8 + tig) * P
                            k4 = k0 + 4 * P
                            for mt in range(4):
                                r = wm * 64 + mt * 16 + gid
                                af[mt * 4] = ldx(xs, k0 + r)
                                af[mt * 4 + 1] = ldx(xs, k0 + r + 8)
                                af[mt * 4 + 2] = ldx(xs, k4 + r)
                                af[mt * 4 + 3] = ldx(xs, k4 + r + 8)
                            for nt in range(4):
                                c = wn * 32 + nt * 8 + gid
                                bf[nt * 2] = ldx(cs, k0 + c)
                                bf[nt * 2 + 1] = ldx(cs, k4 + c)
                            for mt in range(4):
                                for nt in range(4):
                                    q = (mt * 4 + nt) * 4
                                    d0, d1, d2, d3 = mma_tf32(scr, af[mt * 4], af[mt * 4 + 1], af[mt * 4 + 2],
                                                              af[mt * 4 + 3], bf[nt * 2], bf[nt * 2 + 1],
                                                              acc[q], acc[q + 1], acc[q + 2], acc[q + 3])
                                    acc[q] = d0
                                    acc[q + 1] = d1
                                    acc[q + 2] = d2
                                    acc[q + 3] = d3
                    if st < NST:
                        bo = (st & 1) * BUF
                        for q in range(XQ):
                            stx(xs, bo + (xk + q * (NT // BM)) * P + xr, tf32_rna(px[q]))
                            if ct == 0:
                                yp += px[q] * px[q]
                        for q in range(CQ):
                            stx(cs, bo + (ck + q * (NT // BN)) * P + cr, pc[q])
                    cuda.syncthreads()
                # each row's best and second best of this centre tile: the lane's 8 columns, then its quad
                for mt in range(4):
                    for h in range(2):
                        rr = wm * 64 + mt * 16 + gid + 8 * h
                        m1 = INF
                        m2 = INF
                        mi = 0
                        for nt in range(4):
                            for e in range(2):
                                col = ct * BN + wn * 32 + nt * 8 + 2 * tig + e
                                d = acc[(mt * 4 + nt) * 4 + 2 * h + e] + ldx(cc, col)
                                lt1 = d < m1
                                m2 = m1 if lt1 else (d if d < m2 else m2)
                                mi = col if lt1 else mi
                                m1 = d if lt1 else m1
                        for sx in (1, 2):
                            o1 = cuda.shfl_xor_sync(0xFFFFFFFF, m1, sx)
                            o2 = cuda.shfl_xor_sync(0xFFFFFFFF, m2, sx)
                            oi = cuda.shfl_xor_sync(0xFFFFFFFF, mi, sx)
                            m1, m2, mi = merge_best(m1, m2, mi, o1, o2, oi)
                        if tig == 0:
                            q = wn * BM + rr
                            p1 = ldx(sb1, q)
                            p2 = ldx(sb2, q)
                            pi = ldx(si1, q)
                            p1, p2, pi = merge_best(p1, p2, pi, m1, m2, mi)
                            stx(sb1, q, p1)
                            stx(sb2, q, p2)
                            stx(si1, q, pi)
            # |y|^2 of each row: the partial sums of the two threads that staged it
            if tid < BM:
                stx(syy, xr, yp)
            cuda.syncthreads()
            if tid >= BM:
                stx(syy, xr, ldx(syy, xr) + yp)
            cuda.syncthreads()
            if tid < BM:
                m1 = ldx(sb1, tid)
                m2 = ldx(sb2, tid)
                mi = ldx(si1, tid)
                for t in range(1, WN):
                    o1 = ldx(sb1, t * BM + tid)
                    o2 = ldx(sb2, t * BM + tid)
                    oi = ldx(si1, t * BM + tid)
                    m1, m2, mi = merge_best(m1, m2, mi, o1, o2, oi)
                i2 = row0 + tid
                if i2 < n:
                    scale = ldx(syy, tid) + zlim
                    tol = TOLT * scale + TINY
                    if m2 - m1 > tol and scale < BIG:
                        stx(labels, i2, mi)
                    else:
                        stx(labels, i2, -1)
                        p = cuda.atomic.add(nflag, 0, 1)
                        stx(flags, p, i2)
            cuda.syncthreads()

    return cuda.jit(km_tf32_pass1, max_registers=maxreg) if maxreg else cuda.jit(km_tf32_pass1)


def _time(kern, grid, args, nflag, repeats):
    times = []
    for _ in range(repeats):
        nflag.copy_to_device(np.zeros(1, dtype=np.int32))
        e0, e1 = cuda.event(), cuda.event()
        e0.record()
        kern[grid, NT](*args)
        e1.record()
        e1.synchronize()
        times.append(e0.elapsed_time(e1))
    return float(np.median(times)), float(np.min(times))


def run_case(name: str, n: int, m: int, k: int, repeats: int, check_rows: int, spread: float,
             tie: bool, maxregs: tuple) -> dict:
    rng = np.random.default_rng(0)
    t = time.perf_counter()
    centres = rng.uniform(-8, 8, size=(k, m))
    if tie:  # centre 1 = centre 0: their rows are exact ties and must all be flagged
        centres[1] = centres[0]
    lab0 = rng.integers(k, size=n)
    ld = -(-n // 32) * 32
    xt = np.empty((m, ld), dtype=np.float32)
    for j in range(m):
        xt[j, :n] = centres[lab0, j] + spread * rng.standard_normal(n, dtype=np.float32)
    xt[:, n:] = 0
    gen_s = time.perf_counter() - t
    rows = min(n, check_rows)
    x64 = xt[:, :rows].T.astype(np.float64)
    best = np.empty(rows, dtype=np.int64)
    for a in range(0, rows, 256):
        b = min(rows, a + 256)
        best[a:b] = ((x64[a:b, None, :] - centres[None, :, :]) ** 2).sum(axis=2).argmin(axis=1)
    dx = cuda.to_device(xt.ravel())
    labels = cuda.device_array(n, dtype=np.int32)
    flags = cuda.device_array(n, dtype=np.int32)
    nflag = cuda.to_device(np.zeros(1, dtype=np.int32))
    sms = cuda.get_current_device().MULTIPROCESSOR_COUNT
    out = {"case": name, "n": n, "m": m, "k": k, "spread": spread, "gen_s": gen_s, "runs": []}
    kp, s, cm, cc, zlim = gemm_pass1.pack(centres, BN)
    dcm, dcm32, dcc, dsh = cuda.to_device(tf32_host(cm)), cuda.to_device(cm), cuda.to_device(cc), cuda.to_device(s)
    ntiles = -(-n // BM)
    plans = [("tf32", mr, tf32_pass1_kernel(m, kp, mr), dcm) for mr in maxregs] + \
            [("fp32 simt", 0, gemm_pass1.gemm_pass1_kernel(m, kp, BN, 16, 0), dcm32)]
    for kind, mr, kern, dc in plans:
        args = (dx, n, ld, dc, dcc, dsh, zlim, labels, flags, nflag)
        t = time.perf_counter()
        try:
            kern[min(ntiles, 2), NT](*args)
            cuda.synchronize()
        except Exception as exc:
            out["runs"].append({"kind": kind, "maxreg": mr, "error": f"{type(exc).__name__}: {exc}"[:400]})
            continue
        compile_s = time.perf_counter() - t
        try:
            regs = int(next(iter(kern.overloads.values())).get_regs_per_thread())
        except Exception:
            regs = None
        for per_sm in (1, 2):
            grid = min(ntiles, sms * per_sm)
            ms, ms_min = _time(kern, grid, args, nflag, repeats)
            lab = labels.copy_to_host()
            kept = lab[:rows] >= 0
            run = {"kind": kind, "maxreg": mr, "grid": grid, "regs": regs, "compile_s": compile_s, "ms_median": ms,
                   "ms_min": ms_min, "tfma_per_s": n * kp * m / (ms * 1e-3) / 1e12,
                   "useful_tfma_per_s": n * k * m / (ms * 1e-3) / 1e12, "flagged": int(nflag.copy_to_host()[0]),
                   "checked_rows": rows, "wrong_labels": int((lab[:rows][kept] != best[kept]).sum())}
            if tie:
                run["tied_rows_kept"] = int(kept[np.isin(best, [0, 1])].sum())
            out["runs"].append(run)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cases", default="D,B,A")
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--check-rows", type=int, default=20_000)
    ap.add_argument("--spreads", default="1,4", help="the blobs' standard deviations (4: more rows near ties)")
    ap.add_argument("--maxregs", default="0", help="register caps of the tensor-core kernel (0: none)")
    ap.add_argument("--tie", action="store_true", help="two equal centres (their rows must be flagged)")
    ap.add_argument("--out")
    a = ap.parse_args()
    res = []
    for c in a.cases.split(","):
        n, m, k = CASES[c]
        for spread in (float(v) for v in a.spreads.split(",")):
            r = run_case(c, n, m, k, a.repeats, a.check_rows, spread, a.tie,
                         tuple(int(v) for v in a.maxregs.split(",")))
            res.append(r)
            for v in r["runs"]:
                if "error" in v:
                    print(f"{c} spread {spread}: {v['kind']} maxreg {v['maxreg']}: {v['error']}", flush=True)
                    continue
                print(f"{c}: {n} x {m}, K = {k}, spread {spread}, {v['kind']} maxreg {v['maxreg']} grid {v['grid']}: "
                      f"{v['ms_median']:.3f} ms (min {v['ms_min']:.3f}), {v['tfma_per_s']:.1f} TFMA/s "
                      f"({v['useful_tfma_per_s']:.1f} useful), regs {v['regs']}, flagged {v['flagged']} "
                      f"({100.0 * v['flagged'] / n:.3f} %), wrong {v['wrong_labels']} of {v['checked_rows']}"
                      + (f", tied rows kept {v['tied_rows_kept']}" if "tied_rows_kept" in v else "")
                      + f"; compile {v['compile_s']:.1f} s", flush=True)
    if a.out:
        from mpikmeans.bench.harness import result_document, write_result

        write_result(a.out, result_document("experiment", "python3 " + " ".join(sys.argv), vars(a),
                                            {"results": res}))


if __name__ == "__main__":
    main()
