"""The Lloyd step's GPU kernels: a certified float32 screen, the exact recheck, the fixed-point sums.

Every kernel takes the shape (rows ``n``, attributes ``m``, centres ``k``) as
run-time arguments; only the storage dtype of the rows, the screen's register
tile (one of :data:`SCREEN_TILES`) and a few block sizes are fixed when a kernel
is compiled, so the set of compiled kernels is finite and known before any run
(:func:`step_kernels`: three kernels per dtype and tile).

The stages of a step, in launch order:

1. **screen** (:func:`step_kernels`'s ``screen``): every thread owns ``R`` rows
   and keeps ``R x TC`` running float32 distances in registers; the centres sit in
   shared memory as ``-2 z`` (``z = c - s``, ``s`` the centres' mean), read four at a
   time, so one 16-byte broadcast load feeds ``4 R`` FMAs.  Distances are the
   dot-product form ``|z|^2 - 2 y.z`` on ``y = x - s``.  A row keeps the best
   centre only when the gap to the second best exceeds a rigorous bound on the
   float32 rounding (:func:`certificate`); every other row is listed for step 2.
   A certified row's exact squared distance to its centre (float64, as step 2
   computes it) is written for the SSE.  Centres that do not fit in shared
   memory at once are staged there a chunk of tiles at a time.  With more than
   128 centres :mod:`.gemmk`'s GEMM screen takes this step's place, with the same
   arguments and results (:func:`.policy.step_layout` chooses).
2. **recheck**: one warp per listed row (its lanes take the centres in turn)
   computes the row's exact float64 distance to every centre (``(x - c)^2`` summed in attribute order, one rounding per
   operation, no FMA: the CPU backend's numbers) and takes the nearest, ties to
   the lowest index.  So the labels are those of the exact computation.
3. **accumulate**: each block takes :data:`SUM_ROWS` rows and a chunk of the
   summed columns; for every row it adds ``w d²`` to its cluster's SSE, and for
   every row whose label changed (or every row, in a full step) the fixed-point
   integers of ``w x_j`` and ``w`` (:func:`mpikmeans.fixedsums.encode_py`) to its
   new cluster and takes them from its old one.  The integers go into shared
   memory as six 20-bit limbs with native 32-bit atomics (64-bit shared atomics
   are compare-and-swap loops on sm_90), one copy per warp where K is small
   (against contention), then each block's totals into the global int64 limbs:
   no order of the atomics changes a bit.
"""

from __future__ import annotations

import functools
import math

import numpy as np

from ...fixedsums import LIMB, LIMB_MASK, encode_py
from .device import SIM, cuda
from .intrinsics import dadd_rn, dmul_rn, ld4

if cuda is not None:
    from numba import float32, float64, int32, int64, uint64

#: threads per block of the screen and the accumulation
NT = 64 if SIM else 256
#: the screen's register tiles, ``(rows per thread, centres per tile)``: few centres take the small
#: tile (no padding wasted), more the wide one (each row's values read once per 16 centres); 4 rows
#: a thread make each 16-byte shared load of centres feed 16 FMAs
SCREEN_TILES = ((4, 8), (4, 16))
#: attributes of its rows a screen thread has in flight while it computes the last ones, by tile
_PREFETCH = {(4, 8): 4, (4, 16): 2}
#: rows per accumulation block: each of a value's six 20-bit limbs is below ``2**20``, so a
#: block's int32 limb sums stay below ``2**31``
SUM_ROWS = 2048
#: threads per block of the recheck (a warp per listed row)
RC_NT = 64 if SIM else 128
#: int32 limbs a value takes in the accumulation's shared memory (20 bits each, of ``h`` and ``l``)
SMEM_LIMBS = 6
#: the accumulation's static shared memory (its changed-rows counter), which a launch adds to the
#: dynamic bytes: a block asking for exactly 48 KB of dynamic memory besides it is refused
SUM_STATIC_BYTES = 16
_L20 = (1 << 20) - 1
#: float32 unit roundoff; the certificate is written in multiples of it
_U32 = 2.0 ** -24
#: rows whose ``|y|^2 + 2 max|z|^2`` exceeds this go to the exact path (float32 overflow guard)
_BIG = 1.0e30
#: the 16-byte centre loads need an aligned shared base (the simulator refuses the argument)
_SMEM_ALIGN = None if SIM else 16
#: the bounds' relative slack is this plus a float64 distance's own rounding over M attributes (see
#: ``slack`` in :func:`row_functions`)
_LB_SLACK = 1e-12
#: float64 unit roundoff
_U64 = 2.0 ** -53


def certificate(m: int) -> tuple:
    """The float32 screen's certificate for rows of ``m`` attributes: ``(tolf, tiny, big)``.

    A row keeps its float32 winner when ``gap > tolf (|y|^2 + zlim) + tiny`` and
    ``|y|^2 + zlim < big``; every other row goes to the exact kernel.  The bound on
    ``|computed - exact|`` of ``|z|^2 - 2 y.z`` for one centre is
    ``(m + 4)(1 + eps) u (|y|^2 + 2 max|z|^2)`` in any summation order; two centres, a
    computed ``|y|^2`` and a computed gap need a little more: factor 2.1 and ``m + 5``.
    """
    return np.float32(2.1 * (int(m) + 5) * _U32), np.float32(1.0e-36), np.float32(_BIG)


def sum_layout(k: int, m: int, smem_bytes: int) -> tuple:
    """How the accumulation splits its shared memory: ``(jc, copies)``.

    ``jc`` summed columns per block (of ``m + 1``: the weights' column last) and
    ``copies`` of the block's sums in shared memory (warps take them in turn:
    fewer atomics on the same address where K is small); ``copies == 0``: the
    block adds into the global limbs directly (K too large for shared memory).

    Parameters
    ----------
    k, m : int
    smem_bytes : int
        Shared memory one block may use, its static bytes (:data:`SUM_STATIC_BYTES`) included.
    """
    slots = (smem_bytes - SUM_STATIC_BYTES) // 4
    mc = m + 1
    per_copy = k * SMEM_LIMBS * (mc + 1)
    if per_copy <= slots:
        return mc, int(max(1, min(8, slots // per_copy)))
    jc = (slots - SMEM_LIMBS * k) // (SMEM_LIMBS * k)
    if jc >= 1:
        return int(jc), 1
    return 1, 0


def sum_shared_bytes(k: int, jc: int, copies: int) -> int:
    """Bytes of dynamic shared memory the accumulation takes for :func:`sum_layout`'s ``(jc, copies)``."""
    return 4 * SMEM_LIMBS * copies * k * (jc + 1)


@functools.lru_cache(maxsize=None)
def row_functions() -> tuple:
    """The device functions every screen and the exact kernels share: ``(exact_d2, slack, verdict)``.

    ``exact_d2(x, ld, i, m, k, ct, c)``
        Row ``i``'s exact float64 squared distance to centre ``c`` (``(x - c)^2`` summed in
        attribute order, one rounding per operation: the CPU backend's number).
    ``slack(m)``
        The lower bounds' relative slack for ``m`` attributes.
    ``verdict(x, ld, i, m, k, ct, yy, b1, b2, i1, zlim, tolf, tiny, big, labels, d2, flags, counters, lb)``
        A screened row's end: where the gap between its float32 best ``b1`` (centre ``i1``) and
        second best ``b2`` beats the certificate (:func:`certificate`, ``yy`` its ``|y|^2``),
        its label, exact ``d2`` and lower bound are written; else it is listed in ``flags``
        (counted in ``counters[0]``) for the recheck.
    """

    @cuda.jit(device=True)
    def add_sq(d, a, b):
        t = a - b
        return dadd_rn(d, dmul_rn(t, t))

    @cuda.jit(device=True)
    def exact_d2(x, ld, i, m, k, ct, c):
        # four attributes' loads issued before their arithmetic (a thread's row has several reads in
        # flight, not one), the sum still taken in attribute order
        d = 0.0
        j = 0
        while j + 4 <= m:
            x0, x1 = float64(x[uint64(j * ld + i)]), float64(x[uint64((j + 1) * ld + i)])
            x2, x3 = float64(x[uint64((j + 2) * ld + i)]), float64(x[uint64((j + 3) * ld + i)])
            c0, c1, c2, c3 = ct[j * k + c], ct[(j + 1) * k + c], ct[(j + 2) * k + c], ct[(j + 3) * k + c]
            d = add_sq(add_sq(add_sq(add_sq(d, x0, c0), x1, c1), x2, c2), x3, c3)
            j += 4
        for jj in range(j, m):
            d = add_sq(d, float64(x[uint64(jj * ld + i)]), ct[jj * k + c])
        return d

    @cuda.jit(device=True)
    def slack(m):
        # a lower bound is shrunk by this much, and the bound test leaves it on each side: above the
        # rounding of a computed float64 distance against the true one (M products and sums), of a
        # square root, a difference and the host's drift, so a row kept by the test is nearest to its
        # centre by the computed distances too
        return _LB_SLACK + 4.0 * (m + 4) * _U64

    @cuda.jit(device=True)
    def verdict(x, ld, i, m, k, ct, yy, b1, b2, i1, zlim, tolf, tiny, big, labels, d2, flags, counters, lb):
        scale = yy + zlim
        if b2 - b1 > tolf * scale + tiny and scale < big:
            labels[i] = i1
            d2[i] = exact_d2(x, ld, i, m, k, ct, i1)
            # every other centre is at least this far: the second best less the screen's error
            lo2 = float64(yy) + float64(b2) - float64(tolf) * float64(scale) - float64(tiny)
            lb[i] = math.sqrt(lo2) * (1.0 - slack(m)) if lo2 > 0.0 else 0.0
        else:
            flags[cuda.atomic.add(counters, 0, 1)] = i

    return exact_d2, slack, verdict


@functools.lru_cache(maxsize=None)
def step_kernels(storage: str, tile: tuple = SCREEN_TILES[0]) -> dict:
    """The step's kernels for rows stored as ``storage`` (``float32`` or ``float64``), the screen's
    register tile ``tile`` (one of :data:`SCREEN_TILES`).

    Returns
    -------
    dict
        ``screen``, ``recheck`` and ``accumulate``: numba-cuda dispatchers
        (arguments below), compiled by :mod:`.compiled` for one signature each.

    Kernel arguments (arrays 1-D, C-contiguous, on the device; ``x[j * ld + i]``)
    ---------------------------------------------------------------------------
    screen(x, ld, n, m, k, ntiles, chunk, cm, cc, sh, zl, tolf, tiny, big, ct, labels, d2, flags, counters)
        ``cm`` float32 ``(ntiles * m * TC,)``: ``-2 z`` by tile, attribute, centre;
        ``cc`` float32 ``(ntiles * TC,)``: ``|z|^2`` (+inf for padding); ``sh`` ``(m,)``
        the shift ``s`` in the storage dtype; ``zl`` float32 ``(1,)``: twice the
        largest ``|z|^2``; ``chunk``: tiles that fit in shared memory at once
        (all: staged once); ``ct`` float64 ``(m * k,)``: the centres transposed,
        ``ct[j * k + c]``.  Writes the certified rows' ``labels`` and exact squared
        distances ``d2``, and lists the others in ``flags``, counting them in ``counters[0]``.
    recheck(x, ld, m, k, ct, flags, counters, labels, d2)
        The listed rows' exact labels and squared distances.
    accumulate(x, ld, n, m, k, labels, old, d2, w, weighted, full, f1, f2, sf1, sf2, jc, copies,
               sums, sse, counters)
        Grid ``(ceil(n / SUM_ROWS), ceil((m + 1) / jc))``; ``f1, f2`` float64 ``(m + 1,)`` each
        column's scale factors, ``sf1, sf2`` the SSE's; ``sums`` int64 ``(k * (m + 1) * 4,)``
        and ``sse`` int64 ``(k * 4,)`` limbs, added to; ``counters[1]`` += labels changed.
        Dynamic shared memory: :func:`sum_shared_bytes`.
    """
    DT = float64 if storage == "float64" else float32
    R, TC = tile
    JB = _PREFETCH[tile]
    JR = JB * R
    ACC = R * TC
    BR = NT * R
    TC4 = TC // 4
    F32_INF = np.float32(np.inf)
    encode = cuda.jit(device=True)(encode_py)

    exact_d2, slack, verdict = row_functions()

    @cuda.jit(device=True)
    def add32(sm, q, v):
        # a zero limb adds nothing: most are zero (a float32 value's 24 bits span two of the six), and an
        # atomic skipped is one less in the queue of an address the warp's other rows share
        if v != 0:
            cuda.atomic.add(sm, q, int32(v))

    @cuda.jit(device=True)
    def add6(sm, q, h, lo, sign):
        # a value's six 20-bit limbs into int32 shared sums (native 32-bit shared atomics)
        add32(sm, q, sign * (h & _L20))
        add32(sm, q + 1, sign * ((h >> 20) & _L20))
        add32(sm, q + 2, sign * (h >> 40))
        add32(sm, q + 3, sign * (lo & _L20))
        add32(sm, q + 4, sign * ((lo >> 20) & _L20))
        add32(sm, q + 5, sign * (lo >> 40))

    @cuda.jit(device=True)
    def add64(out, q, v):
        if v != 0:
            cuda.atomic.add(out, q, v)

    @cuda.jit(device=True)
    def add4(out, q, h, lo, sign):
        # a value, or a block's total, into the global int64 limbs (native 64-bit global atomics)
        add64(out, q, sign * (h >> LIMB))
        add64(out, q + 1, sign * (h & LIMB_MASK))
        add64(out, q + 2, sign * (lo >> LIMB))
        add64(out, q + 3, sign * (lo & LIMB_MASK))

    @cuda.jit(device=True)
    def flush6(sm, q0, stride, copies, out, q):
        # the copies' limb sums of one entry, recombined (exact in int64), into the global limbs
        s0 = int64(0)
        s1 = int64(0)
        s2 = int64(0)
        s3 = int64(0)
        s4 = int64(0)
        s5 = int64(0)
        for c in range(copies):
            p = q0 + c * stride
            s0 += sm[p]
            s1 += sm[p + 1]
            s2 += sm[p + 2]
            s3 += sm[p + 3]
            s4 += sm[p + 4]
            s5 += sm[p + 5]
        hs = (s2 << 40) + (s1 << 20) + s0
        ls = (s5 << 40) + (s4 << 20) + s3
        if hs != 0 or ls != 0:
            add4(out, q, hs, ls, 1)

    def km_screen(x, ld, n, m, k, ntiles, chunk, cm, cc, sh, zl, tolf, tiny, big, ct, labels, d2, flags, counters,
                  listed, idx, lb):
        smf = cuda.shared.array(0, dtype=float32, alignment=_SMEM_ALIGN)
        tid = cuda.threadIdx.x
        zlim = zl[0]
        if listed:
            n = counters[2]  # the rows the bounds could not keep, listed in idx
        resident = ntiles <= chunk
        if resident:
            for q in range(tid, ntiles * m * TC, NT):
                smf[q] = cm[q]
            cuda.syncthreads()
        acc = cuda.local.array(ACC, dtype=float32)
        yv = cuda.local.array(R, dtype=float32)
        yy = cuda.local.array(R, dtype=float32)
        b1 = cuda.local.array(R, dtype=float32)
        b2 = cuda.local.array(R, dtype=float32)
        i1 = cuda.local.array(R, dtype=int32)
        rows = cuda.local.array(R, dtype=int64)
        xb = cuda.local.array(JR, dtype=DT)
        xn = cuda.local.array(JR, dtype=DT)
        for tile in range(cuda.blockIdx.x, (n + BR - 1) // BR, cuda.gridDim.x):
            row0 = tile * BR
            for r in range(R):
                i = row0 + tid + r * NT
                i = i if i < n else n - 1  # past the end: the last row again, ignored
                rows[r] = idx[i] if listed else i
                yy[r] = float32(0.0)
                b1[r] = F32_INF
                b2[r] = F32_INF
                i1[r] = 0
            for c0 in range(0, ntiles, chunk):
                c1 = min(ntiles, c0 + chunk)
                if not resident:
                    cuda.syncthreads()
                    for q in range(tid, (c1 - c0) * m * TC, NT):
                        smf[q] = cm[c0 * m * TC + q]
                    cuda.syncthreads()
                for ct_ in range(c0, c1):
                    base = (ct_ if resident else ct_ - c0) * m * TC
                    for r in range(R):
                        for c in range(TC):
                            acc[r * TC + c] = cc[ct_ * TC + c]
                    # the values of the next JB attributes are in flight while this block's FMAs run
                    for q in range(JB):
                        for r in range(R):
                            xb[q * R + r] = x[uint64(q * ld + rows[r])] if q < m else DT(0.0)
                    for jb in range(0, m, JB):
                        for q in range(JB):
                            jn = jb + JB + q
                            for r in range(R):
                                xn[q * R + r] = x[uint64(jn * ld + rows[r])] if jn < m else DT(0.0)
                        for q in range(JB):
                            j = jb + q
                            if j < m:
                                s = sh[j]
                                for r in range(R):
                                    yv[r] = float32(xb[q * R + r] - s)
                                if ct_ == 0:
                                    for r in range(R):
                                        yy[r] += yv[r] * yv[r]
                                for c4 in range(TC4):
                                    w0, w1, w2, w3 = ld4(smf, base + j * TC + 4 * c4)
                                    for r in range(R):
                                        a = r * TC + 4 * c4
                                        acc[a] += yv[r] * w0
                                        acc[a + 1] += yv[r] * w1
                                        acc[a + 2] += yv[r] * w2
                                        acc[a + 3] += yv[r] * w3
                        for q in range(JB * R):
                            xb[q] = xn[q]
                    # best and second best; strict '<' keeps the lowest index on a tie, and a tie
                    # leaves gap 0, so the row is rechecked exactly
                    for c in range(TC):
                        kk = ct_ * TC + c
                        for r in range(R):
                            d = acc[r * TC + c]
                            o1 = b1[r]
                            lt1 = d < o1
                            b2[r] = o1 if lt1 else (d if d < b2[r] else b2[r])
                            b1[r] = d if lt1 else o1
                            i1[r] = kk if lt1 else i1[r]
            for r in range(R):
                if row0 + tid + r * NT < n:
                    verdict(x, ld, rows[r], m, k, ct, yy[r], b1[r], b2[r], i1[r], zlim, tolf, tiny, big, labels, d2,
                            flags, counters, lb)

    def km_recheck(x, ld, m, k, ct, flags, counters, labels, d2, lb):
        sd = cuda.shared.array(RC_NT, dtype=float64)
        si = cuda.shared.array(RC_NT, dtype=int64)
        s2 = cuda.shared.array(RC_NT, dtype=float64)
        tid = cuda.threadIdx.x
        lane = tid % 32
        wib = tid // 32
        wpb = RC_NT // 32
        nflag = counters[0]
        # rounds of one listed row per warp; every warp of a block runs every round (barriers)
        for base in range(cuda.blockIdx.x * wpb, nflag, cuda.gridDim.x * wpb):
            f = base + wib
            bd = np.inf
            bi = k
            sec = np.inf
            if f < nflag:
                i = flags[f]
                for c in range(lane, k, 32):
                    d = exact_d2(x, ld, i, m, k, ct, c)
                    if d < bd:
                        sec = bd
                        bd = d
                        bi = c
                    elif d < sec:
                        sec = d
            sd[tid] = bd
            si[tid] = bi
            s2[tid] = sec
            cuda.syncthreads()
            if lane == 0 and f < nflag:
                win = tid
                for q in range(tid + 1, tid + 32):
                    if sd[q] < bd or (sd[q] == bd and si[q] < bi):
                        bd = sd[q]
                        bi = si[q]
                        win = q
                # the second best: the other lanes' best, and every lane's second
                sec = np.inf
                for q in range(tid, tid + 32):
                    v = s2[q] if q == win else min(sd[q], s2[q])
                    sec = min(sec, v)
                i = flags[f]
                labels[i] = bi
                d2[i] = bd
                lb[i] = math.sqrt(sec) * (1.0 - slack(m))
            cuda.syncthreads()

    def km_accumulate(x, ld, n, m, k, labels, old, d2, w, weighted, full, f1, f2, sf1, sf2, jc, copies, sums, sse,
                      counters):
        sm = cuda.shared.array(0, dtype=int32)
        sc = cuda.shared.array(1, dtype=int64)
        tid = cuda.threadIdx.x
        if tid == 0:
            sc[0] = 0
        by = cuda.blockIdx.y
        mc = m + 1
        col0 = by * jc
        cols = min(jc, mc - col0)
        nsum = copies * k * jc * SMEM_LIMBS
        for q in range(tid, nsum + copies * k * SMEM_LIMBS, NT):
            sm[q] = 0
        cuda.syncthreads()
        cp = (tid // 32) % copies if copies > 0 else 0
        r0 = cuda.blockIdx.x * SUM_ROWS
        r1 = min(n, r0 + SUM_ROWS)
        changed = 0
        for i in range(r0 + tid, r1, NT):
            a = labels[i]
            b = old[i]
            wi = w[i] if weighted else 1.0
            if by == 0:
                changed += a != b
                v = d2[i]
                if weighted:
                    v = wi * v
                h, lo = encode(v, sf1, sf2)
                if copies > 0:
                    add6(sm, nsum + (cp * k + a) * SMEM_LIMBS, h, lo, 1)
                else:
                    add4(sse, a * 4, h, lo, 1)
            if full or a != b:
                for jj in range(cols):
                    j = col0 + jj
                    v = float64(x[uint64(j * ld + i)]) if j < m else 1.0
                    if weighted:
                        v = wi * v
                    h, lo = encode(v, f1[j], f2[j])
                    if copies > 0:
                        add6(sm, ((cp * k + a) * jc + jj) * SMEM_LIMBS, h, lo, 1)
                        if not full and b >= 0:
                            add6(sm, ((cp * k + b) * jc + jj) * SMEM_LIMBS, h, lo, -1)
                    else:
                        add4(sums, (a * mc + j) * 4, h, lo, 1)
                        if not full and b >= 0:
                            add4(sums, (b * mc + j) * 4, h, lo, -1)
        if by == 0 and changed > 0:
            cuda.atomic.add(sc, 0, changed)
        cuda.syncthreads()
        if by == 0 and tid == 0 and sc[0] > 0:
            cuda.atomic.add(counters, 1, sc[0])
        if copies > 0:
            # the block's totals (its copies added) into the global limbs, entries it touched only
            for e in range(tid, k * cols, NT):
                a = e // cols
                jj = e - a * cols
                flush6(sm, (a * jc + jj) * SMEM_LIMBS, k * jc * SMEM_LIMBS, copies, sums, (a * mc + col0 + jj) * 4)
            if by == 0:
                for a in range(tid, k, NT):
                    flush6(sm, nsum + a * SMEM_LIMBS, k * SMEM_LIMBS, copies, sse, a * 4)

    def km_keep(x, ld, n, m, k, ct, old, labels, d2, lb, drift, idx, counters):
        # Hamerly's test: the own centre's exact distance against the lower bound on every other
        # centre, that bound less the farthest any centre moved; a row that passes keeps its label
        # (with its exact d2), the others are listed for the screen, a block's in row order (one
        # atomic a block): the screen then reads runs of consecutive rows
        sl = cuda.shared.array(NT, dtype=int32)
        sb = cuda.shared.array(1, dtype=int64)
        tid = cuda.threadIdx.x
        i = cuda.grid(1)
        keep = True
        if i < n:
            a = old[i]
            keep = False
            if a >= 0:
                d = exact_d2(x, ld, i, m, k, ct, a)
                eps = slack(m)
                low = lb[i] - drift - eps * (lb[i] + drift)
                if math.sqrt(d) * (1.0 + eps) < low:
                    keep = True
                    labels[i] = a
                    d2[i] = d
                    lb[i] = low
        sl[tid] = 0 if keep else 1
        cuda.syncthreads()
        if tid == 0:
            run = 0
            for q in range(NT):
                v = sl[q]
                sl[q] = run
                run += v
            sb[0] = cuda.atomic.add(counters, 2, run) if run > 0 else 0
        cuda.syncthreads()
        if not keep:
            idx[sb[0] + sl[tid]] = i

    # two blocks a multiprocessor (128 registers a thread: the float64 rows' prefetched values would take more)
    bounds = {} if SIM else {"launch_bounds": (NT, 2)}
    return {"screen": cuda.jit(km_screen, **bounds), "recheck": cuda.jit(km_recheck),
            "accumulate": cuda.jit(km_accumulate), "keep": cuda.jit(km_keep)}


#: threads per block of :func:`farthest_kernels`
FAR_NT = 64 if SIM else 256
#: rows of the distances a block of :func:`farthest_kernels` takes
FAR_ROWS = 128 if SIM else 1024


@functools.lru_cache(maxsize=None)
def farthest_kernels() -> dict:
    """The empty-cluster relocation's passes over the last step's distances (:meth:`.backend.GPUBackend.farthest`).

    Kernel arguments (arrays 1-D on the device; block ``b`` takes rows ``b * FAR_ROWS .. (b + 1) * FAR_ROWS - 1``)
    ---------------------------------------------------------------------------------------------------------
    block_max(d2, n, bmax)
        Grid ``ceil(n / FAR_ROWS)``: ``bmax[b]`` the largest ``d2`` of block ``b``.
    gather(d2, labels, n, blocks, out_d2, out_labels)
        Grid ``len(blocks)``: the ``q``-th listed block's rows' ``d2`` and ``labels`` into
        ``out[q * FAR_ROWS ...]``; ``-1`` for the places past ``n``.
    """

    def km_block_max(d2, n, bmax):
        sd = cuda.shared.array(FAR_NT, dtype=float64)
        tid = cuda.threadIdx.x
        a = cuda.blockIdx.x * FAR_ROWS
        best = -1.0
        for i in range(a + tid, min(n, a + FAR_ROWS), FAR_NT):
            best = max(best, d2[i])
        sd[tid] = best
        cuda.syncthreads()
        half = FAR_NT // 2
        while half > 0:
            if tid < half:
                sd[tid] = max(sd[tid], sd[tid + half])
            cuda.syncthreads()
            half //= 2
        if tid == 0:
            bmax[cuda.blockIdx.x] = sd[0]

    def km_gather(d2, labels, n, blocks, out_d2, out_labels):
        q = cuda.blockIdx.x
        a = blocks[q] * FAR_ROWS
        for t in range(cuda.threadIdx.x, FAR_ROWS, FAR_NT):
            i = a + t
            if i < n:
                out_d2[q * FAR_ROWS + t] = d2[i]
                out_labels[q * FAR_ROWS + t] = labels[i]
            else:
                out_d2[q * FAR_ROWS + t] = -1.0
                out_labels[q * FAR_ROWS + t] = -1

    return {"block_max": cuda.jit(km_block_max), "gather": cuda.jit(km_gather)}
