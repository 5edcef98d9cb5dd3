"""The split full step's summing kernel: per-block float64 sums in shared memory, no atomics per row.

A full step of the fused kernel (:mod:`.kernels`, ``MODE_STEP_SHARED``) sums each tile
in its pass 2, inside the kernel whose pass 1 holds 255 registers: pass 2 then runs
at pass 1's occupancy (8 warps per multiprocessor), latency-bound, 3.2 of 5 ms of a
full step of 5e6 x 100, K = 50 on the H100 for 1/50 of pass 1's arithmetic
(``bench/GPU_NOTES.md``).  The split step (``MODE_STEP_SPLIT``) runs pass 1 alone,
which writes each row's certified label (-1 where flagged for the exact kernel), and
then this kernel, small enough for many resident warps:

* a tile of rows is read column-major (a warp on 32 consecutive rows of an attribute)
  into registers, with its labels (and weights), while the block sums the tile before
  (software pipelining: every load of a tile is in flight during the last tile's sums,
  not one batch at a time between barriers); then it is staged row-major in shared
  memory with an odd row pitch;
* the block keeps ``groups`` copies of the K x M float64 deviation sums and K counts
  in shared memory (and, where they fit, the K x M centres: the walk reads one per
  value, and from global memory that is an L2 round trip, as the staged tiles leave the
  L1 little room); thread ``c`` of group ``g`` owns attribute ``c`` of copy ``g`` and
  adds ``w (x - c_lab)`` of the group's rows (``g, g + groups, ...``) into it: one
  owner per sum, so plain loads and stores, no atomics (threads past ``groups x M``
  only stage); a batch of rows with one cluster is added up in registers first, so
  the batch's sums are loaded together and stored together;
* at the end the copies are added up and into the global sums, one atomic per
  (cluster, attribute) and block.

It also counts the changed labels and writes the new ones (pass 1 leaves ``labels``
alone, so the exact kernel still sees a flagged row's old label) and sums
``w |x - c_lab|^2`` per element, the exact diff form, for the SSE.

Where a thread loads whole rows (tiles of a multiple of the block's threads) and the
centres are few (:data:`.plan.ASSIGN_TC_MAX`), the kernel can find the labels itself
(``assign_tc``): pass 1's float32 screen and certificate on the rows in its registers, the
rows it cannot certify listed for the exact kernel.  A full step without kept bounds is then
this kernel alone: the rows are read once (1e8 x 8, K = 16 on the H100: 3.1 against 4.1 ms
float32, 3.8 against 5.1 float64, ``bench/GPU_NOTES.md`` v16).
"""

from __future__ import annotations

import functools

import numpy as np

from .compiled import compiled
from .device import SIM, cuda, inline_device
from .intrinsics import fmaxf, fminf, ld4, ldc32, ldc64, ldx, stx
from .kernels import SMEM_ALIGN, certificate
from .launch import Launch, prepare
from .plan import PackLayout, SumsLayout

if cuda is not None:
    from numba import float32, float64, int32, int64


#: the kernel's register cap where four blocks fit in shared memory: 64 keeps four blocks of 256
#: threads on a multiprocessor (72 without a cap: three); a few spilled bytes cost less than the warps
#: gained (H100: 5e6 x 100, K = 50 full step 4.76 -> 4.13 ms f32, 6.11 -> 5.02 ms f64; 1e8 x 8,
#: K = 16: 4.38 -> 4.13, 6.40 -> 6.18).  Where shared memory holds fewer blocks, the cap is what
#: those blocks leave (:func:`register_cap`)
SUMS_MAXREG = 64

#: rows a thread adds per batch of the walk (``tune={"sums_wb": B}``): the batch's sums are loaded
#: together and stored together, so a batch costs one shared-memory round trip, not B chained ones
SUMS_WALK_BATCH = 4

#: the register cap at least, where the kernel assigns the rows (their distances in registers)
SUMS_ASSIGN_MAXREG = 80


def register_cap(limits, lay: SumsLayout) -> int:
    """The sums kernel's register cap: the most registers a thread may have while as many blocks as
    shared memory holds stay resident, and at least :data:`SUMS_MAXREG`.

    A cap under what the resident blocks leave only spills (5e6 x 100, K = 50 float64: 66 KB a
    block, three resident; cap 80 against 64: 3.97 against 4.24 ms a full step on the H100,
    ``bench/results/fullstep_H100_2026-11-26_tiles_a.log``).
    """
    blocks = max(1, min(limits.smem_sm // (lay.smem + 1024), 2048 // lay.nt))
    return max(SUMS_MAXREG, min(255, limits.regs_sm // (blocks * lay.nt) // 8 * 8))


@functools.lru_cache(maxsize=None)
def sums_kernel(storage: str, weighted: bool, k_c: int, m_c: int, pack_c: tuple, lay_c: tuple, maxreg: int = 0,
                idx32: bool = False, wb: int = SUMS_WALK_BATCH, assign_tc: int = 0):
    """Build the summing kernel for K x M, the step buffer's layout ``pack_c`` and ``lay_c``
    (a :class:`.plan.SumsLayout`).

    Kernel arguments: x, n, ld, p32, p64, ctr, labels, newlab, w, flags, fslot (as the fused
    kernel's; ``newlab`` int32 (n,), pass 1's certified labels, -1 for a flagged row).  ``maxreg``:
    a register cap (0: the compiler's choice).  ``idx32``: the rows array has fewer than ``2**31``
    elements, so its indices are computed on 32 bits (:func:`.intrinsics.ldc32`).  ``wb``: rows a
    thread adds per batch of its walk (at most; a power of two dividing its rows per tile).
    ``assign_tc`` (a layout with ``cf >= 0``, the step buffer's centres in one tile of that many):
    no pass 1 ran; the kernel finds each row's label itself with pass 1's float32 screen and
    certificate (:func:`.kernels.certificate`), hands the rows it cannot certify to the exact
    kernel (``flags``, counted in ``ctr[fslot]``) and reads no ``newlab``.
    """
    DT = float64 if storage == "float64" else float32
    WEIGHTED = weighted
    LDC = ldc32 if idx32 else ldc64
    K, M = int(k_c), int(m_c)
    L = PackLayout(*pack_c)
    P_C64, P_SUMS, P_CNT, P_SSE = int(L.p64_c64), int(L.p64_sums), int(L.p64_cnt), int(L.p64_sse)
    P_CM, P_CC, P_SH32, P_SH64, P_ZL = int(L.p32_cm), int(L.p32_cc), int(L.p32_sh), int(L.p64_sh), int(L.p32_zl)
    I_CHG = int(L.i64_chg)
    S = SumsLayout(*lay_c)
    G, COLS, NT, TR, PITCH = int(S.groups), int(S.cols), int(S.nt), int(S.rows), int(S.pitch)
    O_S, O_CNT, O_W, O_RED, O_XS, O_LAB, O_TMP = (int(v) for v in (S.sums, S.cnt, S.w, S.red, S.xs, S.lab,
                                                                    S.tmp))
    CEN = int(S.cen) >= 0  # the centres staged in shared memory
    O_CEN = max(0, int(S.cen))
    KM = K * M
    TCA = int(assign_tc)  # > 0: the kernel assigns the rows (one tile of TCA centres)
    ASG = TCA > 0
    if ASG and (int(S.cf) < 0 or TR % NT):
        raise ValueError("sums_kernel: assigning needs a layout with whole rows a thread (SumsLayout.cf)")
    O_CF, O_SH = max(0, int(S.cf)), max(0, int(S.sh))
    TOLF, TINY, BIG = certificate(M)
    F32_INF = np.float32(np.inf)
    # staging: thread t loads rows t % RT (+ RT, ... when the tile has more rows than the
    # block threads) of attributes t // RT, + JS, ...: fixed rows, so the index arithmetic
    # is a base and constant steps, and a warp reads 32 consecutive rows of one attribute
    RT = min(TR, NT)
    JS = NT // RT
    UJ = -(-M // JS)  # attributes per thread and pass over the rows
    PASSES = TR // RT  # passes over the rows
    NV = PASSES * UJ  # values a thread loads per tile (plan.prefetch_values)
    FULLJ = M % JS == 0
    LA = -(-TR // NT)  # the tile's labels: rows per thread
    NR = TR // G  # rows per group and tile, a multiple of 4 (plan.sums_layout)
    NACC = LA * TCA if ASG else 1  # the assigned rows' float32 distances
    WB = max(1, int(wb))
    while NR % WB:
        WB //= 2

    @inline_device
    def assign_rows(v, smf, smx, acc, yy, labl, row0, n, zlim, ctr, flags, fslot):
        """Pass 1 on the thread's rows (row tid + b NT of the tile at ``row0``: ``v[b M:(b + 1) M]``):
        float32 distances to the one tile of centres, the nearest kept where the certificate holds,
        else the row is flagged for the exact kernel; labels into ``labl`` (-1: flagged or past ``n``)."""
        tid = cuda.threadIdx.x
        for b in range(LA):
            yy[b] = float32(0.0)
            for cc in range(TCA):
                acc[b * TCA + cc] = smf[O_CF + TCA * M + cc]
        for j in range(M):
            sj = ldx(smx, O_SH + j)
            base = O_CF + j * TCA
            for c4 in range(TCA // 4):
                w0, w1, w2, w3 = ld4(smf, base + 4 * c4)
                for b in range(LA):
                    yv = float32(v[b * UJ + j] - sj)
                    if c4 == 0:
                        yy[b] += yv * yv
                    o = b * TCA + 4 * c4
                    acc[o] += yv * w0
                    acc[o + 1] += yv * w1
                    acc[o + 2] += yv * w2
                    acc[o + 3] += yv * w3
        for b in range(LA):
            b1 = F32_INF
            b2 = F32_INF
            i1 = 0
            # best, second best, and the lowest index of the best: a tie leaves a gap of 0 (flagged)
            for cc in range(TCA):
                d = acc[b * TCA + cc]
                i1 = cc if d < b1 else i1
                b2 = fminf(b2, fmaxf(b1, d))
                b1 = fminf(b1, d)
            i = row0 + tid + b * NT
            scale = yy[b] + zlim
            lab = -1
            if i < n:
                if b2 - b1 > TOLF * scale + TINY and scale < BIG:
                    lab = i1
                else:
                    p = cuda.atomic.add(ctr, fslot, 1)
                    stx(flags, p, int32(i))
            labl[b] = lab

    def km_sums(x, n, ld, p32, p64, ctr, labels, newlab, w, flags, fslot):
        smd = cuda.shared.array(0, dtype=float64)
        smx = cuda.shared.array(0, dtype=DT)
        smi = cuda.shared.array(0, dtype=int32)
        smf = cuda.shared.array(0, dtype=float32, alignment=SMEM_ALIGN)
        tid = cuda.threadIdx.x
        g = tid // COLS
        c = tid - g * COLS
        r0 = tid % RT
        j0 = tid // RT
        # how many of this thread's attributes j0, j0 + JS, ... exist, on 32 bits: each staged value then
        # tests one 32-bit compare, not a 64-bit sum and compare per value and tile
        nj = int32((M - j0 + JS - 1) // JS)
        for q in range(tid, G * KM, NT):
            stx(smd, O_S + q, 0.0)
        for q in range(tid, G * K, NT):
            stx(smd, O_CNT + q, 0.0)
        if CEN:
            for q in range(tid, KM, NT):
                stx(smd, O_CEN + q, ldx(p64, P_C64 + q))
        if ASG:
            # the screen's centres (-2 (c - s) by attribute, |c - s|^2) and shift, as pass 1 stages them
            for q in range(tid, TCA * (M + 1), NT):
                stx(smf, O_CF + q, ldx(p32, P_CM + q) if q < TCA * M else ldx(p32, P_CC + q - TCA * M))
            for q in range(tid, M, NT):
                stx(smx, O_SH + q, ldx(p32, P_SH32 + q) if DT == float32 else ldx(p64, P_SH64 + q))
        if tid == 0:
            smd[O_RED] = 0.0
            smi[O_TMP] = 0
        zlim = p32[P_ZL] if ASG else float32(0.0)
        sse_t = 0.0
        chg_t = 0
        v = cuda.local.array(NV, dtype=DT)
        labv = cuda.local.array(WB, dtype=int32)
        keep = cuda.local.array(WB, dtype=int32)
        tv = cuda.local.array(WB, dtype=float64)
        sv = cuda.local.array(WB, dtype=float64)
        labl = cuda.local.array(LA, dtype=int32)
        oldl = cuda.local.array(LA, dtype=int32)
        wl = cuda.local.array(LA, dtype=float64)
        acc = cuda.local.array(NACC, dtype=float32)
        yy = cuda.local.array(LA, dtype=float32)
        # this thread's rows in its group (a runtime count: the walk stays a loop, not unrolled)
        nr = NR if g < G else 0
        so = O_S + g * KM + c  # its sums (the centres: cb)
        cb = (O_CEN if CEN else P_C64) + c
        ntiles = (n + TR - 1) // TR
        first = cuda.blockIdx.x
        stride = cuda.gridDim.x
        mine = (ntiles - first + stride - 1) // stride if first < ntiles else 0
        # Round ``it`` stages and sums tile it - 1 while the loads of tile it are in flight: they are
        # issued before the walk and waited for only when staged, one round later (the last round's
        # tile is past the rows: nothing is loaded)
        for it in range(mine + 1):
            if it > 0:
                cuda.syncthreads()  # the last tile is summed (and, the first time, the copies are zero)
                row0 = (first + (it - 1) * stride) * TR
                if ASG:
                    assign_rows(v, smf, smx, acc, yy, labl, row0, n, zlim, ctr, flags, fslot)
                for a in range(PASSES):
                    sb = O_XS + (r0 + a * RT) * PITCH + j0
                    for uj in range(UJ):
                        if FULLJ or int32(uj) < nj:
                            stx(smx, sb + uj * JS, v[a * UJ + uj])
                for a in range(LA):
                    r = tid + a * NT
                    if r < TR:
                        i = row0 + r
                        lab = labl[a]
                        if lab >= 0:
                            if oldl[a] != lab:
                                chg_t += 1
                                stx(labels, i, lab)
                            # the row's count, into the copy of the group that sums it (row r: group r % G):
                            # one atomic per row here instead of a read-modify-write per row in the walk
                            cuda.atomic.add(smd, O_CNT + (r % G) * K + lab, wl[a] if WEIGHTED else 1.0)
                        if WEIGHTED:
                            stx(smd, O_W + r, wl[a])
                        stx(smi, O_LAB + r, lab)
            # the next tile's labels (pass 1's, unless the kernel finds them, and the last step's), weights
            # and values, into registers
            nrow0 = (first + it * stride) * TR
            for a in range(LA):
                r = tid + a * NT
                i = nrow0 + r
                inside = r < TR and i < n
                if not ASG:
                    labl[a] = ldx(newlab, i) if inside else -1
                oldl[a] = ldx(labels, i) if inside else -1
                if WEIGHTED:
                    wl[a] = ldx(w, i) if inside else 0.0
            for a in range(PASSES):
                i = nrow0 + r0 + a * RT
                inside = i < n
                for uj in range(UJ):
                    # attribute j0 + uj JS of row i, the index in 32 bits where the rows allow
                    v[a * UJ + uj] = LDC(x, j0 + uj * JS, ld, i) if inside and (FULLJ or int32(uj) < nj) else DT(0.0)
            if it > 0:
                cuda.syncthreads()
                # WB rows per batch: labels, values and centres loaded together; rows of the batch with
                # one cluster are added up first (into the first of them), so that the batch's sums are
                # all loaded, then all stored: no chain of read-modify-writes through shared memory.
                # Offsets advance by constants: the row r = g + s G is at xo + s G PITCH.  No branch on
                # a flagged row (label -1): it adds 0 to cluster 0, straight-line code (branches per
                # row cost more instructions than the additions, ncu: issue-bound)
                lo = O_LAB + g
                xo = O_XS + g * PITCH + c
                wo = O_W + g
                for s0 in range(0, nr, WB):
                    for u in range(WB):
                        lab = ldx(smi, lo + u * G)
                        ok = lab >= 0
                        la = lab if ok else 0
                        labv[u] = la
                        cv = ldx(smd, cb + la * M) if CEN else ldc32(p64, la, M, cb)
                        t = float64(ldx(smx, xo + u * G * PITCH)) - cv
                        t = t if ok else 0.0
                        if WEIGHTED:
                            # a flagged row's weight slot holds whatever its row's weight is: dropped too
                            wi = ldx(smd, wo + u * G)
                            wi = wi if ok else 0.0
                            tv[u] = wi * t
                            sse_t += wi * (t * t)
                        else:
                            tv[u] = t
                            sse_t += t * t
                    keep[0] = 1
                    for u in range(1, WB):
                        dup = 0
                        for q in range(u):
                            if dup == 0 and labv[q] == labv[u]:
                                tv[q] += tv[u]
                                dup = 1
                        keep[u] = 1 - dup
                    for u in range(WB):
                        sv[u] = ldx(smd, so + labv[u] * M)
                    for u in range(WB):
                        if keep[u] != 0:
                            stx(smd, so + labv[u] * M, sv[u] + tv[u])
                    lo += WB * G
                    xo += WB * G * PITCH
                    wo += WB * G
        cuda.syncthreads()
        # the copies added up, into the global sums (q < KM) and counts (the K after them)
        for q in range(tid, KM + K, NT):
            src, stride_q, dst = (O_S + q, KM, P_SUMS + q) if q < KM else (O_CNT + q - KM, K, P_CNT + q - KM)
            t = 0.0
            for gg in range(G):
                t += ldx(smd, src + gg * stride_q)
            if t != 0.0:
                cuda.atomic.add(p64, dst, t)
        cuda.atomic.add(smd, O_RED, sse_t)
        cuda.atomic.add(smi, O_TMP, chg_t)
        cuda.syncthreads()
        if tid == 0:
            cuda.atomic.add(p64, P_SSE, smd[O_RED])
            cuda.atomic.add(ctr, I_CHG, int64(smi[O_TMP]))

    if SIM:
        return cuda.jit(km_sums)
    return cuda.jit(km_sums, fastmath=False, max_registers=maxreg or None)


def sums_launch(limits, storage: str, weighted: bool, k: int, m: int, lay: SumsLayout, pack, x, rows: int, ld: int,
                labels, newlab, w, flags, fslot: int, assign_tc: int, stream, fast: bool, tune: dict) -> Launch:
    """The prepared launch of :func:`sums_kernel` for ``rows`` resident rows (``lay``: the plan's
    :func:`.plan.sums_layout`; ``assign_tc``: the kernel assigns the rows itself, :func:`sums_kernel`;
    ``tune["sums_maxreg"]`` overrides :func:`register_cap`, ``tune["sums_wb"]`` the walk's batch
    (:data:`SUMS_WALK_BATCH`), ``tune["idx64"]`` forces 64-bit row indices): a persistent grid of as
    many blocks as the multiprocessors hold."""
    maxreg = int(tune.get("sums_maxreg", max(register_cap(limits, lay), SUMS_ASSIGN_MAXREG if assign_tc else 0)))
    idx32 = int(m) * int(ld) < 2**31 and not tune.get("idx64")
    spec = (storage, weighted, int(k), int(m), tuple(pack.layout), tuple(lay), int(maxreg), bool(idx32),
            int(tune.get("sums_wb", SUMS_WALK_BATCH)), int(assign_tc))
    kern = sums_kernel(*spec)
    args = (x, int(rows), int(ld), pack.p32, pack.dev, pack.ctr, labels, newlab, w, flags, int(fslot))
    kobj = compiled("sums", spec, kern, args)
    per_sm = min(limits.smem_sm // (lay.smem + 1024), 2048 // lay.nt, 32)
    if kobj is not None:
        # resident blocks by registers too: a grid of more blocks than fit runs a second wave on
        # mostly idle multiprocessors (every block has the same share of tiles)
        regs = prepare(kobj, lay.smem) or 128
        per_sm = min(per_sm, limits.regs_sm // (-(-regs // 8) * 8 * lay.nt))
    grid = max(1, min(-(-rows // lay.rows), 2 if SIM else max(1, per_sm) * limits.sm_count))
    return Launch(kern, kobj, args, grid, lay.nt, lay.smem, stream, fast)
