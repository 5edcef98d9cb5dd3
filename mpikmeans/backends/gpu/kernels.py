"""The kernel factories: the fused step kernel and the exact (recheck) kernel.

Each factory builds, once per configuration (:func:`functools.lru_cache`), a
``numba.cuda.jit`` kernel whose shape, plan and memory layouts are compile-time
constants (see :mod:`.plan`); loops over them unroll and the per-thread arrays
stay in registers.  The algorithm, the certification bound and the measurements
behind the choices are described in the package docstring and ``bench/GPU_NOTES.md``.
"""

from __future__ import annotations

import functools

import numpy as np

from .device import SIM, cuda
from .bounds import listed_rows, store_row_bounds, tile_row
from .intrinsics import ld4, ldc32, ldc64, ldx, stx
from .plan import (MODE_ASSIGN, MODE_STEP_DELTA, MODE_STEP_GLOBAL, MODE_STEP_SHARED, MODE_STEP_SPLIT, PackLayout,
                   SharedLayout)

if cuda is not None:
    from numba import float32, float64, int32, int64

#: float32 unit roundoff; the certification bound is written in multiples of it.
_U32 = 2.0 ** -24
#: rows whose |y|^2 + 2 max|z|^2 exceeds this go to the exact path (float32 overflow guard).
_BIG = 1.0e30
#: the 16-byte centre loads need an aligned shared base (the simulator refuses the argument)
SMEM_ALIGN = None if SIM else 16


def certificate(m: int) -> tuple:
    """The float32 screen's certificate for rows of ``m`` attributes: ``(tolf, tiny, big)``.

    A row keeps its float32 winner when ``gap > tolf (|y|^2 + zlim) + tiny`` and
    ``|y|^2 + zlim < big``; every other row goes to the exact kernel.  The bound on
    ``|computed - exact|`` of ``|z|^2 - 2 y.z`` for one centre is
    ``(m + 4)(1 + eps) u (|y|^2 + 2 max|z|^2)`` in any summation order; two centres, a
    computed ``|y|^2`` and a computed gap need a little more: factor 2.1 and ``m + 5``.
    Shared by the fused kernel's pass 1 and the GEMM screen (:mod:`.gemm`).
    """
    return np.float32(2.1 * (int(m) + 5) * _U32), np.float32(1.0e-36), np.float32(_BIG)


@functools.lru_cache(maxsize=None)
def fused_kernel(storage: str, R: int, TC: int, NT: int, weighted: bool, mode: int, centres_shared: bool,
                 maxreg: int, k_c: int, m_c: int, nct_c: int, offs_c: tuple, pack_c: tuple, idx32: bool = False,
                 diag_skip_pass2: bool = False, lineinfo: bool = False, bounds: bool = False,
                 rowmajor: bool = False):
    """Build (once per configuration and shape) the fused assignment + accumulation kernel.

    Everything but the rows is a compile-time constant: rows per thread ``R``, centres
    per register tile ``TC``, threads per block ``NT``, weighting, mode, where the
    centres are read from, the shape (``k_c``, ``m_c``, ``nct_c``), the shared-memory
    layout ``offs_c`` (a :class:`.plan.SharedLayout`) and the layout ``pack_c`` of the step
    buffer (a :class:`.plan.PackLayout`).  Loops over them
    unroll, the per-thread arrays stay in registers, and no register holds an offset
    (a run compiles once per K x M).  ``idx32``: the rows array has fewer than
    ``2**31`` elements, so its indices are computed on 32 bits (:func:`ldc32`).
    ``diag_skip_pass2`` is for profiling only: pass 2 is left out, so the sums, counts
    and SSE are wrong (``mpikmeans bench gpu`` uses it to time pass 1 alone).
    ``lineinfo`` adds source lines for ``ncu``'s per-line sampling.  ``bounds`` (split and
    incremental steps on resident rows): pass 1 writes each row's kept bounds
    (:mod:`.bounds`) and, where ``gat``, searches only the rows the bounds test listed.
    ``rowmajor`` (with ``bounds``, for the listed rows; modes without a pass 2): ``x`` is the
    row-major copy of the rows (``x[i * ld + j]``, ``ld = m``: :meth:`.rows.DeviceRows.row_major`),
    so a scattered row's values are consecutive, not a 32-byte sector each.

    Kernel arguments (all arrays 1-D, C-contiguous, on the device)
    ---------------------------------------------------------------
    x : storage dtype, (m * ld,)      rows, column-major: x[j * ld + i]
    n, ld : int64                     rows, row stride
    p32, p64, ctr : float32, float64, int64 views of one step buffer (:func:`.plan.pack_layout`):
        p32[P32_CM:]  -2 (c - s) laid out [tile][attribute][TC]
        p32[P32_CC:]  |c - s|^2 (+inf for padding)
        p32/p64[..SH:] s, the mean of the centres, in the storage dtype
        p32[P32_ZL]   2 max |c - s|^2 (certification bound: tol = tolf (|y|^2 + zlim) + tiny)
        p64[P64_C64:] centres, row-major
        p64[P64_SUMS:], p64[P64_CNT:], p64[P64_SSE]   accumulated float64 deviation sums
                      (of x - c), counts, SSE (DELTA: their changes; see GPUBackend)
        ctr[I64_CHG]  changed rows; ctr[fslot] flagged rows (one slot per chunk)
    labels : int32, (n,)              previous labels in, new labels out
    flags : int32, (n,)               indices of rows handed to the exact kernel
    w : float64, (n,) or (1,)         weights (read only when weighted)
    dist2 : float64, (n,) or (1,)     exact squared distances (assign mode); int32 (n,) in the
                                      split mode: each row's certified label, -1 where flagged
    fslot : int64                     index in ``ctr`` of this launch's flagged-row counter
    idx : int32, (n,) or (1,)         with ``bounds`` and ``gat``: the rows to search, ``ctr[gslot]`` of them
    ub, lb : float32, (n,) or (1,)    with ``bounds``: each searched row's kept bounds, written
    gat, gslot : int64                search the listed rows (``gat`` != 0) or all ``n``

    All hot-loop accesses go through :func:`ldx` / :func:`stx` (no wraparound
    select); row indices past ``n`` are clamped to ``n - 1`` for the loads, so only
    the attribute bound is tested in the loops.
    """
    DT = float64 if storage == "float64" else float32
    BR = NT * R
    ACC = R * TC
    JB = max(1, min(4, 8 // R))  # attributes per prefetch block (<= 8 values in flight)
    XB = JB * R
    EB = 8  # epilogue (global sums / assign): attributes per batch
    WB = 4  # pass-2 walk: sorted rows per batch
    WARP = 32
    GROUPS = max(1, NT // WARP)  # pass-2 row slices: one per warp
    TC4 = TC // 4
    SHARED = mode == MODE_STEP_SHARED
    DELTA = mode == MODE_STEP_DELTA
    GLOBAL = mode == MODE_STEP_GLOBAL
    ASSIGN = mode == MODE_ASSIGN
    SPLIT = mode == MODE_STEP_SPLIT
    WEIGHTED = weighted
    CSH = centres_shared
    SH32 = storage == "float32"
    F32_INF = np.float32(np.inf)

    K_C, M_C, NCT_C = int(k_c), int(m_c), int(nct_c)
    TOLF, TINY, BIG = certificate(M_C)
    (O_CM, O_CC, O_SH, O_SUMS, O_CNT, O_HIST, O_START, O_PERM, O_SLAB, O_LAB, O_W, O_XS, O_RED,
     O_JC, O_BRP, O_TMP) = (int(v) for v in SharedLayout(*offs_c))
    L = PackLayout(*pack_c)
    (P_CM, P_CC, P_SH32, P_ZL, P_C64, P_SH64, P_SUMS, P_CNT, P_SSE, I_CHG) = (
        int(v) for v in (L.p32_cm, L.p32_cc, L.p32_sh, L.p32_zl, L.p64_c64, L.p64_sh, L.p64_sums, L.p64_cnt,
                         L.p64_sse, L.i64_chg))
    # pass-2 staging: about 16 loads in flight per thread, in batches that divide the
    # attribute chunk as evenly as possible (no all-idle tail batch)
    SJ0 = max(1, 16 // R)
    SJ = -(-O_JC // -(-O_JC // SJ0))
    SV = SJ * R
    # compile-time facts that drop bound tests from the loops
    FULLJ = M_C % JB == 0  # every prefetch block is whole
    FULLC = M_C % O_JC == 0  # every staged chunk has jc attributes
    # loads of the rows, x[j * ld + i]: 32-bit index arithmetic where it is allowed, except
    # in the staging loop, where LLVM strength-reduces the 64-bit form into fewer instructions
    LDC = ldc32 if idx32 else ldc64
    BOUNDS = bool(bounds)
    ROWMAJOR = bool(rowmajor)
    if ROWMAJOR and not (BOUNDS and (SPLIT or DELTA)):
        raise ValueError("fused_kernel: row-major rows only for the listed rows of a split or incremental step")

    def km_fused(x, n, ld, p32, p64, ctr, labels, flags, w, dist2, fslot, idx, ub, lb, gat, gslot):
        smf = cuda.shared.array(0, dtype=float32, alignment=SMEM_ALIGN)
        smd = cuda.shared.array(0, dtype=float64)
        smi = cuda.shared.array(0, dtype=int32)
        smx = cuda.shared.array(0, dtype=DT)
        tid = cuda.threadIdx.x
        m = M_C
        k = K_C
        nct = NCT_C
        o_cm = O_CM
        o_cc = O_CC
        o_sh = O_SH
        o_sums = O_SUMS
        o_cnt = O_CNT
        o_hist = O_HIST
        o_start = O_START
        o_perm = O_PERM
        o_slab = O_SLAB
        o_w = O_W
        o_xs = O_XS
        o_red = O_RED
        jc = O_JC
        brp = O_BRP
        o_tmp = O_TMP
        kp = nct * TC
        zlim = p32[P_ZL]

        # ---- block set-up: centres (and their norms) to shared memory, zero partials
        if CSH:
            for q in range(tid, kp * m, NT):
                stx(smf, o_cm + q, ldx(p32, P_CM + q))
        for q in range(tid, kp, NT):
            stx(smf, o_cc + q, ldx(p32, P_CC + q))
        for q in range(tid, m, NT):
            if SH32:
                stx(smx, o_sh + q, ldx(p32, P_SH32 + q))
            else:
                stx(smx, o_sh + q, ldx(p64, P_SH64 + q))
        if SHARED:
            for q in range(tid, k * m, NT):
                stx(smd, o_sums + q, 0.0)
            for q in range(tid, k, NT):
                stx(smd, o_cnt + q, 0.0)
        if tid == 0:
            smd[o_red] = 0.0
            smi[o_tmp] = 0
        cuda.syncthreads()

        sse_t = 0.0
        changed_t = 0
        acc = cuda.local.array(ACC, dtype=float32)
        yv = cuda.local.array(R, dtype=float32)
        xb = cuda.local.array(XB, dtype=DT)
        xn = cuda.local.array(XB, dtype=DT)
        sv = cuda.local.array(SV, dtype=DT)
        ev = cuda.local.array(EB, dtype=float64)
        ec = cuda.local.array(EB, dtype=float64)
        wx = cuda.local.array(WB, dtype=float64)
        ww = cuda.local.array(WB, dtype=float64)
        yy = cuda.local.array(R, dtype=float32)
        b1 = cuda.local.array(R, dtype=float32)
        b2 = cuda.local.array(R, dtype=float32)
        i1 = cuda.local.array(R, dtype=int32)
        labr = cuda.local.array(R, dtype=int32)
        pos = cuda.local.array(R, dtype=int32)
        rowc = cuda.local.array(R, dtype=int64)

        # the rows searched: all n, or the ctr[gslot] the bounds test listed in idx
        nrow = listed_rows(n, ctr, gat, gslot) if BOUNDS else n
        ntiles = (nrow + BR - 1) // BR
        for tile in range(cuda.blockIdx.x, ntiles, cuda.gridDim.x):
            row0 = tile * BR
            # ================= pass 1: certified nearest centre =================
            for r in range(R):
                yy[r] = float32(0.0)
                b1[r] = F32_INF
                b2[r] = F32_INF
                i1[r] = 0
                i = row0 + tid + r * NT
                # rows past the end load the last row (always in bounds) and are ignored
                rowc[r] = tile_row(i, nrow, idx, gat) if BOUNDS else (i if i < n else n - 1)
            for ct in range(nct):
                for r in range(R):
                    for c in range(TC):
                        acc[r * TC + c] = smf[o_cc + ct * TC + c]
                cbase = ct * m * TC
                # the rows' values for attributes jb..jb+JB-1 are loaded one block ahead,
                # so the global loads of the next block overlap the FMAs of this one
                # (row-major rows: the same loads with the index roles swapped, x[i * ld + j])
                for q in range(JB):
                    for r in range(R):
                        if ROWMAJOR:
                            xb[q * R + r] = LDC(x, rowc[r], ld, q) if q < m else DT(0.0)
                        else:
                            xb[q * R + r] = LDC(x, q, ld, rowc[r]) if q < m else DT(0.0)
                for jb in range(0, m, JB):
                    if FULLJ:
                        # no bound tests: the last block re-reads itself (in bounds, unused)
                        nb = jb + JB if jb + JB < m else jb
                        for q in range(JB):
                            for r in range(R):
                                if ROWMAJOR:
                                    xn[q * R + r] = LDC(x, rowc[r], ld, nb + q)
                                else:
                                    xn[q * R + r] = LDC(x, nb + q, ld, rowc[r])
                    else:
                        for q in range(JB):
                            jn = jb + JB + q
                            for r in range(R):
                                if ROWMAJOR:
                                    xn[q * R + r] = LDC(x, rowc[r], ld, jn) if jn < m else DT(0.0)
                                else:
                                    xn[q * R + r] = LDC(x, jn, ld, rowc[r]) if jn < m else DT(0.0)
                    for q in range(JB):
                        j = jb + q
                        if FULLJ or j < m:
                            sj = ldx(smx, o_sh + j)
                            for r in range(R):
                                yv[r] = float32(xb[q * R + r] - sj)
                            if ct == 0:
                                for r in range(R):
                                    yy[r] += yv[r] * yv[r]
                            # the next 16-byte vector is requested before this one is used
                            if CSH:
                                nxt = ld4(smf, o_cm + cbase + j * TC)
                            else:
                                nxt = ld4(p32, P_CM + cbase + j * TC)
                            for c4 in range(TC4):
                                w0, w1, w2, w3 = nxt
                                if c4 + 1 < TC4:
                                    if CSH:
                                        nxt = ld4(smf, o_cm + cbase + j * TC + 4 * c4 + 4)
                                    else:
                                        nxt = ld4(p32, P_CM + cbase + j * TC + 4 * c4 + 4)
                                for r in range(R):
                                    a = r * TC + 4 * c4
                                    acc[a] += yv[r] * w0
                                    acc[a + 1] += yv[r] * w1
                                    acc[a + 2] += yv[r] * w2
                                    acc[a + 3] += yv[r] * w3
                    for q in range(XB):
                        xb[q] = xn[q]
                # fold this tile of centres into best / second best (strict '<' keeps
                # the lowest index on ties; an exact tie leaves gap 0, so it is rechecked)
                for c in range(TC):
                    kk = ct * TC + c
                    for r in range(R):
                        d = acc[r * TC + c]
                        o1 = b1[r]
                        o2 = b2[r]
                        lt1 = d < o1
                        # selects, not branches: b2 <- min(b2, max(b1, d)), b1 <- min(b1, d)
                        b2[r] = o1 if lt1 else (d if d < o2 else o2)
                        b1[r] = d if lt1 else o1
                        i1[r] = kk if lt1 else i1[r]
            # ---- certify, write labels, flag the rest for the exact kernel
            for r in range(R):
                pr = row0 + tid + r * NT
                i = rowc[r]
                lab = -1
                if pr < nrow:
                    scale = yy[r] + zlim
                    tol = TOLF * scale + TINY
                    gap = b2[r] - b1[r]
                    certified = gap > tol and scale < BIG
                    if BOUNDS:
                        store_row_bounds(ub, lb, i, certified, yy[r], b1[r], b2[r], tol)
                    if certified:
                        lab = i1[r]
                        if ASSIGN:
                            stx(labels, i, lab)
                        elif SPLIT:
                            pass  # the sums kernel counts the change and writes the label
                        elif DELTA:
                            # a row that keeps its label: the kept sums and SSE hold it
                            # already.  One that changes is rare here: the exact kernel
                            # moves it (no per-attribute code in this kernel, whose
                            # registers pass 1 needs)
                            if ldx(labels, i) != lab:
                                p = cuda.atomic.add(ctr, fslot, 1)
                                stx(flags, p, i)
                            lab = -1
                        else:
                            if ldx(labels, i) != lab:
                                changed_t += 1
                                stx(labels, i, lab)
                    else:
                        p = cuda.atomic.add(ctr, fslot, 1)
                        stx(flags, p, i)
                labr[r] = lab
                if SPLIT and pr < nrow:
                    stx(dist2, i, int32(lab))
                if SHARED:
                    if WEIGHTED:
                        stx(smd, o_w + tid + r * NT, ldx(w, i) if pr < nrow else 0.0)

            if ASSIGN or GLOBAL:
                # exact float64 distance to the chosen centre and, for a step, the
                # deviation sums; the rows come from L1/L2
                for r in range(R):
                    lab = labr[r]
                    if lab >= 0:
                        i = rowc[r]
                        wi = ldx(w, i) if WEIGHTED else 1.0
                        cb = lab * m
                        s2 = 0.0
                        # EB attributes per batch: their loads are in flight together
                        for jb in range(0, m, EB):
                            for q in range(EB):
                                j = jb + q
                                if j < m:
                                    ev[q] = float64(LDC(x, j, ld, i))
                                    ec[q] = ldx(p64, P_C64 + cb + j)
                            for q in range(EB):
                                j = jb + q
                                if j < m:
                                    t = ev[q] - ec[q]
                                    s2 += t * t
                                    if not ASSIGN:
                                        cuda.atomic.add(p64, P_SUMS + cb + j, wi * t)
                        if ASSIGN:
                            stx(dist2, i, s2)
                        else:
                            sse_t += wi * s2
                            cuda.atomic.add(p64, P_CNT + lab, wi)

            if SHARED and not diag_skip_pass2:
                # ================= pass 2: fused per-block sums =================
                # counting sort of the tile's rows by label
                for q in range(tid, k, NT):
                    stx(smi, o_hist + q, 0)
                cuda.syncthreads()
                for r in range(R):
                    lab = labr[r]
                    if lab >= 0:
                        pos[r] = cuda.atomic.add(smi, o_hist + lab, 1)
                cuda.syncthreads()
                # exclusive scan of the histogram into start[0..k]
                if k <= 4 * NT:
                    for q in range(tid, k + 1, NT):
                        s = 0
                        for e in range(q):
                            s += ldx(smi, o_hist + e)
                        stx(smi, o_start + q, s)
                else:
                    if tid == 0:
                        s = 0
                        for e in range(k):
                            stx(smi, o_start + e, s)
                            s += ldx(smi, o_hist + e)
                        stx(smi, o_start + k, s)
                cuda.syncthreads()
                for r in range(R):
                    lab = labr[r]
                    if lab >= 0:
                        dst = ldx(smi, o_start + lab) + pos[r]
                        stx(smi, o_perm + dst, tid + r * NT)
                        stx(smi, o_slab + dst, lab)
                if not WEIGHTED:
                    for q in range(tid, k, NT):
                        stx(smd, o_cnt + q, ldx(smd, o_cnt + q) + float64(ldx(smi, o_hist + q)))
                cuda.syncthreads()
                nval = smi[o_start + k]
                # each warp walks one slice of the sorted rows, its lanes one attribute
                # each; a slice crosses about nval/k cluster segments, and a segment is
                # summed in registers, then added once: plainly when the whole cluster
                # lies in this slice (no other warp touches it), else atomically
                g = tid // WARP
                jj = tid - g * WARP
                p0 = (g * nval) // GROUPS
                p1 = ((g + 1) * nval) // GROUPS
                for j0 in range(0, m, jc):
                    jn = jc if FULLC else min(jc, m - j0)
                    # stage attributes j0..j0+jn of the tile (coalesced, mostly from L2)
                    # SJ attributes x R rows per batch, loads issued before any store
                    for jb in range(0, jn, SJ):
                        for q in range(SJ):
                            jr = jb + q
                            for r in range(R):
                                sv[q * R + r] = ldc64(x, j0 + jr, ld, rowc[r]) if jr < jn else DT(0.0)
                        for q in range(SJ):
                            jr = jb + q
                            if jr < jn:
                                for r in range(R):
                                    stx(smx, o_xs + jr * brp + tid + r * NT, sv[q * R + r])
                    cuda.syncthreads()
                    if g < GROUPS and jj < jn and p0 < p1:
                        j = j0 + jj
                        xsb = o_xs + jj * brp
                        csb = P_C64 + j
                        lab = ldx(smi, o_slab + p0)
                        last = ldx(smi, o_slab + p1 - 1)
                        sl = ldx(smi, o_start + lab)
                        while lab <= last:
                            sr = ldx(smi, o_start + lab + 1)
                            a = sl if sl > p0 else p0
                            b = sr if sr < p1 else p1
                            if b > a:
                                cj = ldx(p64, csb + lab * m)
                                s_run = 0.0
                                q_run = 0.0
                                w_run = 0.0
                                p = a
                                # WB rows per batch: their loads are independent
                                while p + WB <= b:
                                    for u in range(WB):
                                        rl = ldx(smi, o_perm + p + u)
                                        wx[u] = float64(ldx(smx, xsb + rl))
                                        if WEIGHTED:
                                            ww[u] = ldx(smd, o_w + rl)
                                    for u in range(WB):
                                        t = wx[u] - cj
                                        if WEIGHTED:
                                            s_run += ww[u] * t
                                            q_run += ww[u] * (t * t)
                                            w_run += ww[u]
                                        else:
                                            s_run += t
                                            q_run += t * t
                                    p += WB
                                while p < b:
                                    rl = ldx(smi, o_perm + p)
                                    t = float64(ldx(smx, xsb + rl)) - cj
                                    if WEIGHTED:
                                        wi = ldx(smd, o_w + rl)
                                        s_run += wi * t
                                        q_run += wi * (t * t)
                                        w_run += wi
                                    else:
                                        s_run += t
                                        q_run += t * t
                                    p += 1
                                sse_t += q_run
                                o = o_sums + lab * m + j
                                if sl >= p0 and sr <= p1:
                                    stx(smd, o, ldx(smd, o) + s_run)
                                    if WEIGHTED and j == 0:
                                        stx(smd, o_cnt + lab, ldx(smd, o_cnt + lab) + w_run)
                                else:
                                    cuda.atomic.add(smd, o, s_run)
                                    if WEIGHTED and j == 0:
                                        cuda.atomic.add(smd, o_cnt + lab, w_run)
                            sl = sr
                            lab += 1
                    cuda.syncthreads()

        # ---- block epilogue: one global atomic per (cluster, attribute)
        if not ASSIGN:
            cuda.atomic.add(smd, o_red, sse_t)
            cuda.atomic.add(smi, o_tmp, changed_t)
        cuda.syncthreads()
        if SHARED:
            for q in range(tid, k * m, NT):
                v = ldx(smd, o_sums + q)
                if v != 0.0:
                    cuda.atomic.add(p64, P_SUMS + q, v)
            for q in range(tid, k, NT):
                v = ldx(smd, o_cnt + q)
                if v != 0.0:
                    cuda.atomic.add(p64, P_CNT + q, v)
        if not ASSIGN and tid == 0:
            cuda.atomic.add(p64, P_SSE, smd[o_red])
            cuda.atomic.add(ctr, I_CHG, int64(smi[o_tmp]))

    if SIM:
        return cuda.jit(km_fused)
    # a register cap trades scheduling freedom for resident warps (see GPU_NOTES.md)
    return cuda.jit(km_fused, fastmath=False, max_registers=maxreg or None, lineinfo=lineinfo)
