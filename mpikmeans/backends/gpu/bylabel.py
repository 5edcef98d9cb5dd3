"""The GEMM path's sums with the rows grouped by label: one atomic per run of a cluster, not per value.

The GEMM path (:mod:`.gemm`) is taken where the K x M centres do not fit in shared
memory, so neither do K x M float64 sums: its first summing kernel added every value
with a float64 atomic into the global sums, 7.7e7 atomics a step at 3e5 x 257, K =
1000, about 3 of a 6 ms full step on the H100 once the kept bounds (:mod:`.bounds`)
had taken the screen out of most steps.  Here, after the screen:

1. :func:`hist_kernel` counts the certified rows of each label;
2. :func:`scan_kernel` (one block) turns the counts into each label's first position,
   and zeroes the counts for the next step;
3. :func:`scatter_kernel` writes each certified row's index at its label's next
   position (a cluster's rows in any order: the sums' order of addition varies from run
   to run, as the atomics' did);
4. :func:`sums_kernel`: each warp takes chunks of :data:`CHUNK` consecutive positions, its
   lanes ``ceil(M / 32)`` attributes each (at most :data:`APL` a pass), and adds
   ``w (x - c)`` of a run of rows of one label in float64 registers, then into the global
   sums with one atomic per attribute: about ``(n / CHUNK + K) M`` atomics.  It also
   counts and writes the changed labels and sums ``w |x - c|^2`` for the SSE, as the
   kernel it replaces did; flagged rows (label -1) are the exact kernel's.

The rows are read scattered (a row's values are ``ld`` apart): at most eight times the
bytes of a coalesced read, against the atomics they save.
"""

from __future__ import annotations

import functools

import numpy as np

from .device import SIM, cuda
from .intrinsics import ldx, stx
from .plan import PackLayout

if cuda is not None:
    from numba import float32, float64, int32, int64

#: threads per block of the count, scatter and sums kernels; of the scan kernel
NT = 128
NT_SCAN = 32 if SIM else 1024
#: consecutive positions a warp sums at a time
CHUNK = 64
#: attributes a lane holds per pass over a chunk (registers: two float64 per attribute)
APL = 12


@functools.lru_cache(maxsize=None)
def hist_kernel():
    """``(newlab, n, hist)``: ``hist[lab] += 1`` for every row whose ``newlab`` is a label (not -1)."""

    def km_label_hist(newlab, n, hist):
        for i in range(cuda.grid(1), n, cuda.gridsize(1)):
            lab = newlab[i]
            if lab >= 0:
                cuda.atomic.add(hist, lab, 1)

    return cuda.jit(km_label_hist)


@functools.lru_cache(maxsize=None)
def scan_kernel():
    """``(hist, k, start, cursor)``, one block: ``start[c]`` = rows of labels below ``c`` (``start[k]``: all),
    ``cursor`` a copy of ``start[:k]``; ``hist`` back to zeros."""
    T = NT_SCAN

    def km_label_scan(hist, k, start, cursor):
        part = cuda.shared.array(T, dtype=int64)
        tid = cuda.threadIdx.x
        per = (k + T - 1) // T
        lo = tid * per
        hi = min(lo + per, k)
        s = int64(0)
        for c in range(lo, hi):
            s += hist[c]
        part[tid] = s
        cuda.syncthreads()
        off = 1
        while off < T:  # inclusive scan of the threads' totals (Hillis-Steele)
            v = part[tid]
            if tid >= off:
                v += part[tid - off]
            cuda.syncthreads()
            part[tid] = v
            cuda.syncthreads()
            off *= 2
        run = part[tid] - s
        for c in range(lo, hi):
            start[c] = run
            cursor[c] = int32(run)
            run += hist[c]
            hist[c] = 0
        if tid == T - 1:
            start[k] = part[tid]

    return cuda.jit(km_label_scan)


@functools.lru_cache(maxsize=None)
def scatter_kernel():
    """``(newlab, n, cursor, order)``: each labelled row's index at its label's next position."""

    def km_label_scatter(newlab, n, cursor, order):
        for i in range(cuda.grid(1), n, cuda.gridsize(1)):
            lab = newlab[i]
            if lab >= 0:
                order[cuda.atomic.add(cursor, lab, 1)] = int32(i)

    return cuda.jit(km_label_scatter)


@functools.lru_cache(maxsize=None)
def sums_kernel(storage: str, weighted: bool, k_c: int, m_c: int, pack_c: tuple):
    """The sums of the rows grouped by label (see the module docstring).

    Arguments: x (m * ld,), ld, p64, ctr (the step buffer's views), labels (n,), newlab (n,),
    order (n,), start (k + 1,), w (n,) or (1,).  Adds into the step buffer's deviation sums,
    counts, SSE and changed count; writes the changed labels.
    """
    WEIGHTED = bool(weighted)
    K, M = int(k_c), int(m_c)
    L = PackLayout(*pack_c)
    P_C64, P_SUMS, P_CNT, P_SSE = int(L.p64_c64), int(L.p64_sums), int(L.p64_cnt), int(L.p64_sse)
    I_CHG = int(L.i64_chg)
    A = max(1, min(APL, -(-M // 32)))  # attributes a lane holds per pass
    SPAN = 32 * A
    WARPS = NT // 32

    def km_label_sums(x, ld, p64, ctr, labels, newlab, order, start, w):
        red = cuda.shared.array(1, dtype=float64)
        chg = cuda.shared.array(1, dtype=int32)
        acc = cuda.local.array(A, dtype=float64)
        cj = cuda.local.array(A, dtype=float64)
        tid = cuda.threadIdx.x
        lane = tid % 32
        wp = tid // 32
        if tid == 0:
            red[0] = 0.0
            chg[0] = 0
        cuda.syncthreads()
        total = start[K]
        sse = 0.0
        changed = 0
        nch = (total + CHUNK - 1) // CHUNK
        for ch in range(cuda.blockIdx.x * WARPS + wp, nch, cuda.gridDim.x * WARPS):
            p0 = ch * CHUNK
            p1 = min(p0 + CHUNK, total)
            for j0 in range(0, M, SPAN):
                first = j0 == 0 and lane == 0  # counts and labels once a row
                cur = -1
                cnt = 0.0
                for p in range(p0, p1):
                    i = int64(ldx(order, p))
                    lab = ldx(newlab, i)
                    if lab != cur:  # the same for the whole warp: one row at a time
                        if cur >= 0:
                            for a in range(A):
                                j = j0 + lane + 32 * a
                                if j < M:
                                    cuda.atomic.add(p64, P_SUMS + cur * M + j, acc[a])
                            if first:
                                cuda.atomic.add(p64, P_CNT + cur, cnt)
                        cur = lab
                        cnt = 0.0
                        for a in range(A):
                            j = j0 + lane + 32 * a
                            acc[a] = 0.0
                            cj[a] = ldx(p64, P_C64 + lab * M + j) if j < M else 0.0
                    wi = ldx(w, i) if WEIGHTED else 1.0
                    for a in range(A):
                        j = j0 + lane + 32 * a
                        if j < M:
                            t = float64(ldx(x, j * ld + i)) - cj[a]
                            acc[a] += wi * t
                            sse += wi * (t * t)
                    if first:
                        cnt += wi
                        if ldx(labels, i) != lab:
                            stx(labels, i, lab)
                            changed += 1
                if cur >= 0:
                    for a in range(A):
                        j = j0 + lane + 32 * a
                        if j < M:
                            cuda.atomic.add(p64, P_SUMS + cur * M + j, acc[a])
                    if first:
                        cuda.atomic.add(p64, P_CNT + cur, cnt)
        cuda.atomic.add(red, 0, sse)
        cuda.atomic.add(chg, 0, changed)
        cuda.syncthreads()
        if tid == 0:
            cuda.atomic.add(p64, P_SSE, red[0])
            cuda.atomic.add(ctr, I_CHG, int64(chg[0]))

    if SIM:
        return cuda.jit(km_label_sums)
    return cuda.jit(km_label_sums, fastmath=False)


class LabelOrder:
    """The device arrays of :mod:`.bylabel` for ``n`` rows and ``k`` labels (``hist`` starts at zero)."""

    def __init__(self, n: int, k: int):
        self.hist = cuda.to_device(np.zeros(k, dtype=np.int32))
        self.start = cuda.device_array(k + 1, dtype=np.int64)
        self.cursor = cuda.device_array(k, dtype=np.int32)
        self.order = cuda.device_array(max(1, n), dtype=np.int32)


def launches(limits, storage: str, weighted: bool, k: int, m: int, pack, x, rows: int, ld: int, labels, newlab, w,
             stream, fast: bool) -> list:
    """The four prepared launches that sum ``rows`` resident rows by label after the screen wrote ``newlab``."""
    from .compiled import compiled
    from .launch import Launch

    lo = LabelOrder(rows, k)
    grid = max(1, min(-(-rows // NT), 2 if SIM else 8 * limits.sm_count))
    out = []
    for name, kern, args, g, nt in (
            ("label_hist", hist_kernel(), (newlab, int(rows), lo.hist), grid, NT),
            ("label_scan", scan_kernel(), (lo.hist, int(k), lo.start, lo.cursor), 1, NT_SCAN),
            ("label_scatter", scatter_kernel(), (newlab, int(rows), lo.cursor, lo.order), grid, NT)):
        out.append(Launch(kern, compiled(name, (), kern, args), args, g, nt, 0, stream, fast))
    spec = (storage, bool(weighted), int(k), int(m), tuple(pack.layout))
    sk = sums_kernel(*spec)
    args = (x, int(ld), pack.dev, pack.ctr, labels, newlab, lo.order, lo.start, w)
    chunks = -(-rows // CHUNK)
    sgrid = max(1, min(-(-chunks // (NT // 32)), 2 if SIM else 16 * limits.sm_count))
    out.append(Launch(sk, compiled("label_sums", spec, sk, args), args, sgrid, NT, 0, stream, fast))
    out[-1].order = lo  # the arrays live as long as the launches
    return out
