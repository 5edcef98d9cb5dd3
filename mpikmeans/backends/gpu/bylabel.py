"""A full step's sums where they do not fit a block's shared memory: the rows grouped by label first.

The GEMM path's shapes (K x M large: 3e5 x 257, K = 1000) cannot keep a block's copy of
the K x M float64 sums in shared memory as the split step's sums kernel does
(:mod:`.sums`).  Its summing kernel added every certified row's ``w (x - c)`` into the
global sums with one float64 atomic a value: 7.7e7 atomics, 2.1 ms of a 3.5 ms steady full
step of that shape on the H100, the rest of the step's kernels 0.03 ms
(``bench/results/steady_D_H100_2026-11-26_s13_*``).  Here the certified rows are put in
label order first (a counting sort) and then summed in registers, one thread an attribute:

1. :func:`count_kernel` (a thread a row): each certified row (``newlab >= 0``) counts
   towards its cluster (``hist``: :data:`.plan.HIST_COPIES` copies of K int32 counters in
   the step buffer, which every step's upload zeroes; a block counts into copy
   ``block % HIST_COPIES``: one copy took D's 3e5 rows into 4 KB of counters, 35 us; up to
   :data:`LOCAL_LABELS_MAX` clusters a block counts in shared memory first and adds each
   cluster's total once: B's 1e7 rows in 1000 clusters 0.29 -> 0.055 ms; with weights also
   its float64 count), and a changed label is counted and stored;
2. :func:`offsets_kernel` (one block): each cluster's first place in label order, the
   exclusive prefix sum of the copies' totals, into ``start``, and each copy's first place
   within its cluster into ``cursor`` (a copy's rows after the lower copies'); unweighted
   counts from ``hist``;
3. :func:`place_kernel` (a thread a row, the count kernel's grid, so a row's block and
   copy are the same): each certified row's index and label at its place (``order``,
   ``slab``: the places within a cluster in whatever order the atomics hand them out);
4. :func:`walk_kernel`: a block takes :data:`SEG` places at a time, its threads on the
   attributes; each thread adds ``w (x - c)`` and ``w (x - c)^2`` of the segment's rows in
   float64 registers, batches of :data:`BATCH` rows of one cluster loaded together, and
   adds its sum into the global sums where the cluster changes: about ``M`` atomics a
   cluster and segment instead of ``M`` a row.  A segment is a fixed number of rows, so one
   large cluster spreads over many blocks.  A row's values come from the row-major copy of
   the rows where there is one (:meth:`.rows.DeviceRows.row_major`: M consecutive values),
   else from the column-major store.

Flagged rows (``newlab < 0``) are left to the exact kernel, which adds them afterwards
(stream order), as before.  The float64 sums are those of the same terms in another
order, as the atomics' order was never fixed.
"""

from __future__ import annotations

import functools

import numpy as np

from .device import SIM, cuda
from .intrinsics import ldx, stx
from .launch import Launch
from .compiled import compiled
from .plan import HIST_COPIES, PackLayout, round_up

if cuda is not None:
    from numba import float32, float64, int32, int64

#: threads a block of the row kernels (count, place)
NT_ROWS = 32 if SIM else 256
#: threads of the one-block prefix sum
NT_SCAN = 8 if SIM else 1024
#: places a block of the walk takes at a time (staged in shared memory)
SEG = 16 if SIM else 256
#: rows of one cluster a thread loads before adding them (their loads in flight together; 8 took D's
#: walk 195 us, 16 173-176 us: ``bench/results/kernels_D_f32_H100_2026-11-27_s17_batch16.log``; the
#: simulator's segments of 16 keep 8)
BATCH = 8 if SIM else 16
#: the most threads a block of the walk has (one an attribute; longer rows in several passes)
WALK_NT_MAX = 512


#: the most clusters whose counts the count kernel keeps in a block's shared memory (32 KB of int32
#: counters); beyond it each row's count is an atomic on global memory
LOCAL_LABELS_MAX = 8192


def local_labels(k: int) -> int:
    """Counters a block of the count kernel keeps in shared memory for ``k`` clusters: ``k``, or 0 (the
    global counters alone) beyond :data:`LOCAL_LABELS_MAX`."""
    return int(k) if 0 < int(k) <= LOCAL_LABELS_MAX else 0


def walk_threads(m: int) -> int:
    """Threads a block of the walk for rows of ``m`` attributes: the attributes in as few passes of at
    most :data:`WALK_NT_MAX` as they need, rounded up to whole warps."""
    passes = -(-m // WALK_NT_MAX)
    return round_up(-(-m // passes), 32)


@functools.lru_cache(maxsize=None)
def count_kernel(weighted: bool, pack_c: tuple, local_k: int = 0):
    """Arguments: n, k, newlab (n,) int32, labels (n,) int32, w (n,) float64, and the step buffer's float64,
    int64 and int32 views p64, ctr, i32.  ``local_k`` (:func:`local_labels`): the block counts its rows in
    shared memory first and adds each cluster's total into its copy once."""
    WEIGHTED = weighted
    L = PackLayout(*pack_c)
    P_CNT, I_CHG, H = int(L.p64_cnt), int(L.i64_chg), int(L.i32_hist)
    NT = NT_ROWS
    KL = int(local_k)
    LOCAL = KL > 0
    HS = max(1, KL)  # the shared counters' size, a constant of the kernel (one where there are none)

    def km_label_count(n, k, newlab, labels, w, p64, ctr, i32):
        chg = cuda.shared.array(1, dtype=int32)
        hist = cuda.shared.array(HS, dtype=int32)
        tid = cuda.threadIdx.x
        if tid == 0:
            chg[0] = 0
        if LOCAL:
            for c in range(tid, KL, NT):
                hist[c] = 0
        cuda.syncthreads()
        mine = 0
        hc = H + (cuda.blockIdx.x % HIST_COPIES) * k  # this block's copy of the counters
        for i in range(cuda.blockIdx.x * NT + tid, n, cuda.gridDim.x * NT):
            lab = ldx(newlab, i)
            if lab >= 0:
                if ldx(labels, i) != lab:
                    mine += 1
                    stx(labels, i, lab)
                if LOCAL:
                    cuda.atomic.add(hist, lab, 1)
                else:
                    cuda.atomic.add(i32, hc + lab, 1)
                if WEIGHTED:
                    cuda.atomic.add(p64, P_CNT + lab, ldx(w, i))
        if mine != 0:
            cuda.atomic.add(chg, 0, mine)
        cuda.syncthreads()
        if LOCAL:
            for c in range(tid, k, NT):
                v = hist[c]
                if v != 0:
                    cuda.atomic.add(i32, hc + c, v)
        if tid == 0 and chg[0] != 0:
            cuda.atomic.add(ctr, I_CHG, int64(chg[0]))

    return cuda.jit(km_label_count)


@functools.lru_cache(maxsize=None)
def offsets_kernel(weighted: bool, pack_c: tuple):
    """Arguments: k, start (k + 1,) int32, cursor (HIST_COPIES k,) int32, and the step buffer's views p64,
    i32.  One block."""
    WEIGHTED = weighted
    L = PackLayout(*pack_c)
    P_CNT, H = int(L.p64_cnt), int(L.i32_hist)
    NT = NT_SCAN

    def km_label_offsets(k, start, cursor, p64, i32):
        part = cuda.shared.array(NT, dtype=int32)
        tid = cuda.threadIdx.x
        per = (k + NT - 1) // NT
        a = min(tid * per, k)
        b = min(a + per, k)
        s = 0
        for c in range(a, b):
            for h in range(HIST_COPIES):
                s += ldx(i32, H + h * k + c)
        part[tid] = s
        cuda.syncthreads()
        off = 1
        while off < NT:  # inclusive prefix of the threads' totals (Hillis-Steele)
            v = part[tid - off] if tid >= off else 0
            cuda.syncthreads()
            part[tid] += v
            cuda.syncthreads()
            off *= 2
        base = part[tid] - s
        for c in range(a, b):
            first = base
            stx(start, c, first)
            for h in range(HIST_COPIES):  # each copy's rows of the cluster after the lower copies'
                stx(cursor, h * k + c, base)
                base += ldx(i32, H + h * k + c)
            if not WEIGHTED:
                p64[P_CNT + c] += float64(base - first)
        if tid == NT - 1:
            stx(start, k, part[NT - 1])

    return cuda.jit(km_label_offsets)


@functools.lru_cache(maxsize=None)
def place_kernel():
    """Arguments: n, k, newlab (n,) int32, cursor (HIST_COPIES k,) int32, order (n,) int32, slab (n,) int32;
    the count kernel's grid (a row's block takes the cursors of the copy it was counted in).

    A row's place is an atomic on its copy's cursor: rows of a cluster counted at about the same time get
    places next to each other, so the order and label stores fill whole sectors.  Runs of places taken a
    block and cluster at a time (the count kernel's shared counters) left each block's stores a sector
    apart over its whole run: B's place kernel 0.60 -> 1.05 ms (``bench/results/kernels_B_f32_H100_2026-11-27_s20_local_place.log``).
    """
    NT = NT_ROWS

    def km_label_place(n, k, newlab, cursor, order, slab):
        hc = (cuda.blockIdx.x % HIST_COPIES) * k
        for i in range(cuda.blockIdx.x * NT + cuda.threadIdx.x, n, cuda.gridDim.x * NT):
            lab = ldx(newlab, i)
            if lab >= 0:
                p = cuda.atomic.add(cursor, hc + lab, 1)
                stx(order, p, int32(i))
                stx(slab, p, lab)

    return cuda.jit(km_label_place)


@functools.lru_cache(maxsize=None)
def walk_kernel(storage: str, weighted: bool, m_c: int, pack_c: tuple, rowmajor: bool):
    """Arguments: x (the rows: row-major ``x[i m + j]`` where ``rowmajor``, else ``x[j ld + i]``), ld,
    k, p64, start (k + 1,), order (n,), slab (n,), w (n,)."""
    DT = float64 if storage == "float64" else float32
    WEIGHTED = weighted
    ROWMAJOR = rowmajor
    M_C = int(m_c)
    L = PackLayout(*pack_c)
    P_C64, P_SUMS, P_SSE = int(L.p64_c64), int(L.p64_sums), int(L.p64_sse)
    NT = walk_threads(M_C)
    S, B = SEG, BATCH

    def km_label_walk(x, ld, k, p64, start, order, slab, w):
        rows = cuda.shared.array(S, dtype=int32)
        labs = cuda.shared.array(S, dtype=int32)
        ws = cuda.shared.array(S if WEIGHTED else 1, dtype=float64)
        red = cuda.shared.array(1, dtype=float64)
        tid = cuda.threadIdx.x
        if tid == 0:
            red[0] = 0.0
        total = ldx(start, k)
        sse = 0.0
        vals = cuda.local.array(B, dtype=DT)
        for seg in range(cuda.blockIdx.x, (total + S - 1) // S, cuda.gridDim.x):
            p0 = seg * S
            cnt = min(S, total - p0)
            cuda.syncthreads()  # the last segment's readers are done
            for q in range(tid, cnt, NT):
                i = ldx(order, p0 + q)
                stx(rows, q, i)
                stx(labs, q, ldx(slab, p0 + q))
                if WEIGHTED:
                    stx(ws, q, ldx(w, i))
            cuda.syncthreads()
            for j in range(tid, M_C, NT):
                cur = labs[0]
                cj = ldx(p64, P_C64 + int64(cur) * M_C + j)
                acc = 0.0
                q = 0
                while q < cnt:
                    lab = labs[q]
                    if lab != cur:
                        cuda.atomic.add(p64, P_SUMS + int64(cur) * M_C + j, acc)
                        acc = 0.0
                        cur = lab
                        cj = ldx(p64, P_C64 + int64(cur) * M_C + j)
                    # places are in label order: B rows of one cluster when the B-th has its label,
                    # loaded together (a constant count: the loop unrolls, the values stay in registers)
                    if q + B <= cnt and labs[q + B - 1] == lab:
                        for b in range(B):
                            # always true here: the test puts each load in a branch of its own, so that the
                            # compiler issues the B loads before the first addition (unconditional, ptxas
                            # interleaved them with the additions: a round trip to memory a row)
                            if q + b < cnt:
                                i = int64(rows[q + b])
                                vals[b] = ldx(x, i * M_C + j) if ROWMAJOR else ldx(x, int64(j) * ld + i)
                        for b in range(B):
                            d = float64(vals[b]) - cj
                            wd = ws[q + b] * d if WEIGHTED else d
                            acc += wd
                            sse += wd * d
                        q += B
                    else:
                        i = int64(rows[q])
                        d = float64(ldx(x, i * M_C + j) if ROWMAJOR else ldx(x, int64(j) * ld + i)) - cj
                        wd = ws[q] * d if WEIGHTED else d
                        acc += wd
                        sse += wd * d
                        q += 1
                cuda.atomic.add(p64, P_SUMS + int64(cur) * M_C + j, acc)
        cuda.syncthreads()
        cuda.atomic.add(red, 0, sse)
        cuda.syncthreads()
        if tid == 0:
            cuda.atomic.add(p64, P_SSE, red[0])

    if SIM:
        return cuda.jit(km_label_walk)
    return cuda.jit(km_label_walk, fastmath=False)


def launches(limits, storage: str, weighted: bool, k: int, m: int, ld: int, pack, x, xr, rows: int, labels,
             newlab, w, stream, fast: bool) -> list:
    """The four prepared launches of a full step's sums (see the module notes) for ``rows`` rows.

    ``pack`` the step buffer (:class:`.launch.Pack`); ``x`` the column-major rows (``ld`` apart),
    ``xr`` their row-major copy or None; ``newlab`` the certified labels (-1: flagged).  The
    grouping's own device arrays (places and their labels, int32) are made here.
    """
    layout = tuple(pack.layout)
    start = cuda.device_array(k + 1, dtype=np.int32)
    cursor = cuda.device_array(HIST_COPIES * k, dtype=np.int32)
    order = cuda.device_array(max(1, rows), dtype=np.int32)
    slab = cuda.device_array(max(1, rows), dtype=np.int32)
    rgrid = max(1, min(-(-rows // NT_ROWS), 2 if SIM else 8 * limits.sm_count))
    kl = local_labels(k)
    ck = count_kernel(weighted, layout, kl)
    cargs = (int(rows), int(k), newlab, labels, w, pack.dev, pack.ctr, pack.i32)
    ok = offsets_kernel(weighted, layout)
    oargs = (int(k), start, cursor, pack.dev, pack.i32)
    pk = place_kernel()
    pargs = (int(rows), int(k), newlab, cursor, order, slab)
    rowmajor = xr is not None
    wspec = (storage, weighted, int(m), layout, rowmajor)
    wk = walk_kernel(*wspec)
    wargs = (xr if rowmajor else x, int(ld), int(k), pack.dev, start, order, slab, w)
    # a block of the walk leaves room for several more on a multiprocessor: enough segments in flight
    wgrid = max(1, min(-(-rows // SEG), 2 if SIM else 16 * limits.sm_count))
    return [Launch(ck, compiled("label_count", (weighted, layout, kl), ck, cargs), cargs, rgrid, NT_ROWS, 0,
                   stream, fast),
            Launch(ok, compiled("label_offsets", (weighted, layout), ok, oargs), oargs, 1, NT_SCAN, 0, stream,
                   fast),
            Launch(pk, compiled("label_place", (), pk, pargs), pargs, rgrid, NT_ROWS, 0, stream, fast),
            Launch(wk, compiled("label_walk", wspec, wk, wargs), wargs, wgrid, walk_threads(m), 0, stream, fast)]
