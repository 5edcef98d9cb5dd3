"""The screen for many centres: a register-blocked GEMM over tiles of rows and of centres.

The register screen (:func:`.stepk.step_kernels`) keeps a thread's rows in
registers and streams the centres past them a tile of 16 at a time, so every
row's values are read again for each tile: with many centres (K = 1000, 63
tiles) those reads bound it.  Here a block takes :data:`BM` rows and :data:`BN`
centres at a time, both staged in shared memory :data:`BK` attributes at a time
(the next slice's values in flight while this one is multiplied), each thread an
8 x 8 block of the float32 ``|z|^2 - 2 y.z`` (one 16-byte load of four rows' or
four centres' values feeds 16 FMAs); a row's values are read once per ``BN``
centres.  Each thread keeps the best, the second best and the best centre of its
8 rows among its columns in shared memory across the centre tiles; at the end a
thread per row merges its columns' slots and gives the row's verdict
(:func:`.stepk.row_functions`: the register screen's certificate, exact distance
and lower bound).

Arguments and results are the register screen's, so the backend launches either
(:func:`.policy.step_layout` chooses): the centres in that screen's layout
(``-2 z`` by tiles of 16, ``|z|^2`` with +inf padding), the rows by ``x[j * ld + i]``
or the listed rows ``idx``.  Only the float32 sums' order differs, so a row may
be flagged by one screen and certified by the other; the labels, exact distances
and bounds are the same.
"""

from __future__ import annotations

import functools

import numpy as np

from .device import SIM, cuda
from .intrinsics import ld4
from .stepk import SCREEN_TILES, row_functions

if cuda is not None:
    from numba import float32, float64, int32, uint64

#: threads of a block along the centres and along the rows (8 x 8 under the simulator: its threads are slow)
TXN = 8 if SIM else 16
TYN = 8 if SIM else 16
#: threads per block
NT = TXN * TYN
#: rows and centres of a block's tile (8 of each a thread), attributes of a staged slice
BM = 8 * TYN
BN = 8 * TXN
BK = 8
#: the layout of the centres it reads: the register screen's wide tile (16 centres)
TC = SCREEN_TILES[1][1]
#: values of a slice each thread stages: rows, then centres
XQ = BK * BM // NT
CQ = BK * BN // NT
_ALIGN = None if SIM else 16  # the 16-byte shared loads need it; the simulator refuses the argument


def gemm_grid(n: int, sm_count: int) -> int:
    """Blocks of the screen for ``n`` rows: each takes row tiles in turn, several a multiprocessor."""
    return max(1, min(-(-n // BM), 8 * sm_count))


@functools.lru_cache(maxsize=None)
def gemm_screen(storage: str):
    """The GEMM screen for rows stored as ``storage`` (``float32`` or ``float64``): a numba-cuda dispatcher with
    the arguments of :func:`.stepk.step_kernels`'s ``screen`` (``chunk`` unused; no dynamic shared memory),
    grid :func:`gemm_grid`, :data:`NT` threads a block."""
    DT = float64 if storage == "float64" else float32
    XSTEP, CSTEP = NT // BM, NT // BN
    HM, HN = BM // 2, BN // 2
    # shared arrays' sizes: constants of the closure (an expression inside the kernel is not one)
    XS_N, CS_N, SLOTS_N, YY_N = BK * BM, BK * BN, TXN * BM, XSTEP * BM
    F32_INF = np.float32(np.inf)
    exact_d2, slack, verdict = row_functions()

    def km_gemm_screen(x, ld, n, m, k, ntiles, chunk, cm, cc, sh, zl, tolf, tiny, big, ct, labels, d2, flags,
                       counters, listed, idx, lb):
        xs = cuda.shared.array(XS_N, dtype=float32, alignment=_ALIGN)
        cs = cuda.shared.array(CS_N, dtype=float32, alignment=_ALIGN)
        sb1 = cuda.shared.array(SLOTS_N, dtype=float32)
        sb2 = cuda.shared.array(SLOTS_N, dtype=float32)
        si1 = cuda.shared.array(SLOTS_N, dtype=int32)
        syy = cuda.shared.array(YY_N, dtype=float32)
        tid = cuda.threadIdx.x
        tx = tid % TXN  # the centres of this thread: 4 from 4 tx, 4 from HN + 4 tx
        ty = tid // TXN  # its rows: 4 from 4 ty, 4 from HM + 4 ty
        xr = tid % BM  # the row it stages, and its first attribute of a slice (then every XSTEP)
        xk = tid // BM
        cr = tid % BN  # the centre it stages, and its first attribute (then every CSTEP)
        ck = tid // BN
        acc = cuda.local.array(64, dtype=float32)
        av = cuda.local.array(8, dtype=float32)
        cv = cuda.local.array(8, dtype=float32)
        px = cuda.local.array(XQ, dtype=float32)
        pc = cuda.local.array(CQ, dtype=float32)
        zlim = zl[0]
        if listed:
            n = counters[2]  # the rows the bounds could not keep, listed in idx
        kp = ntiles * TC  # centre slots, the padded ones (+inf) included
        nct = (kp + BN - 1) // BN
        nst = (m + BK - 1) // BK
        for tile in range(cuda.blockIdx.x, (n + BM - 1) // BM, cuda.gridDim.x):
            row0 = tile * BM
            p = row0 + xr
            p = p if p < n else n - 1  # past the end: the last row again, ignored
            i = idx[p] if listed else p
            for r in range(8):
                q = tx * BM + (4 * ty + r if r < 4 else HM + 4 * ty + r - 4)
                sb1[q] = F32_INF
                sb2[q] = F32_INF
                si1[q] = 0
            yp = float32(0.0)
            for ctile in range(nct):
                cb = ctile * BN
                # the sums start at |z|^2 (one more term, in an order the certificate allows)
                for c in range(8):
                    cidx = cb + (4 * tx + c if c < 4 else HN + 4 * tx + c - 4)
                    z = cc[cidx] if cidx < kp else F32_INF
                    for r in range(8):
                        acc[r * 8 + c] = z
                cidx = cb + cr
                cbase = (cidx // TC) * m * TC + cidx % TC
                for q in range(XQ):
                    j = xk + q * XSTEP
                    px[q] = float32(x[uint64(j * ld + i)] - sh[j]) if j < m else float32(0.0)
                for q in range(CQ):
                    j = ck + q * CSTEP
                    pc[q] = cm[cbase + j * TC] if j < m and cidx < kp else float32(0.0)
                for st in range(nst):
                    cuda.syncthreads()  # every thread is done with the last slice
                    for q in range(XQ):
                        xs[(xk + q * XSTEP) * BM + xr] = px[q]
                        if ctile == 0:
                            yp += px[q] * px[q]
                    for q in range(CQ):
                        cs[(ck + q * CSTEP) * BN + cr] = pc[q]
                    cuda.syncthreads()
                    if st + 1 < nst:  # the next slice's values are in flight while this one is multiplied
                        j0 = (st + 1) * BK
                        for q in range(XQ):
                            j = j0 + xk + q * XSTEP
                            px[q] = float32(x[uint64(j * ld + i)] - sh[j]) if j < m else float32(0.0)
                        for q in range(CQ):
                            j = j0 + ck + q * CSTEP
                            pc[q] = cm[cbase + j * TC] if j < m and cidx < kp else float32(0.0)
                    for kk in range(BK):
                        a0, a1, a2, a3 = ld4(xs, kk * BM + 4 * ty)
                        a4, a5, a6, a7 = ld4(xs, kk * BM + HM + 4 * ty)
                        c0, c1, c2, c3 = ld4(cs, kk * BN + 4 * tx)
                        c4, c5, c6, c7 = ld4(cs, kk * BN + HN + 4 * tx)
                        av[0], av[1], av[2], av[3], av[4], av[5], av[6], av[7] = a0, a1, a2, a3, a4, a5, a6, a7
                        cv[0], cv[1], cv[2], cv[3], cv[4], cv[5], cv[6], cv[7] = c0, c1, c2, c3, c4, c5, c6, c7
                        for r in range(8):
                            for c in range(8):
                                acc[r * 8 + c] += av[r] * cv[c]
                # this tile's centres into the running best, second best and best centre of each row; the
                # centres come in ascending order and a tie leaves gap 0, so the row is rechecked exactly
                for r in range(8):
                    q = tx * BM + (4 * ty + r if r < 4 else HM + 4 * ty + r - 4)
                    o1 = sb1[q]
                    o2 = sb2[q]
                    oi = si1[q]
                    for c in range(8):
                        d = acc[r * 8 + c]
                        lt1 = d < o1
                        o2 = o1 if lt1 else (d if d < o2 else o2)
                        oi = cb + (4 * tx + c if c < 4 else HN + 4 * tx + c - 4) if lt1 else oi
                        o1 = d if lt1 else o1
                    sb1[q] = o1
                    sb2[q] = o2
                    si1[q] = oi
            syy[xk * BM + xr] = yp
            cuda.syncthreads()
            if tid < BM and row0 + tid < n:
                yy = float32(0.0)
                for h in range(XSTEP):
                    yy += syy[h * BM + tid]
                m1 = F32_INF
                m2 = F32_INF
                mi = 0
                for t in range(TXN):  # the columns' slots, merged: on equal bests the lower centre wins
                    o1 = sb1[t * BM + tid]
                    o2 = sb2[t * BM + tid]
                    oi = si1[t * BM + tid]
                    take = o1 < m1 or (o1 == m1 and oi < mi)
                    hi = m1 if take else o1
                    m2 = min(min(m2, o2), hi)
                    mi = oi if take else mi
                    m1 = o1 if take else m1
                verdict(x, ld, idx[row0 + tid] if listed else row0 + tid, m, k, ct, yy, m1, m2, mi, zlim, tolf, tiny,
                        big, labels, d2, flags, counters, lb)
            cuda.syncthreads()  # the slots and |y|^2 are read before the next tile resets them

    # two blocks a multiprocessor: 128 registers a thread
    bounds = {} if SIM else {"launch_bounds": (NT, 2)}
    return cuda.jit(km_gemm_screen, **bounds)
