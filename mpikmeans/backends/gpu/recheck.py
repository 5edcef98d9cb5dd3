"""The exact (recheck) kernel: float64 assignment of the rows the certified screens flagged.

Every screen (the fused kernel's pass 1 of :mod:`.kernels`, the GEMM path's of :mod:`.gemm`
and :mod:`.tensor`) lists the rows it cannot certify; this kernel gives them the label of
the exact float64 computation, as the CPU backend does, and adds them to the step's sums.
"""

from __future__ import annotations

import functools

import numpy as np

from .device import SIM, cuda
from .intrinsics import ldx
from .plan import PackLayout

if cuda is not None:
    from numba import float64, int32, int64


#: warps per block of the exact (recheck) kernel (the simulator runs a thread per thread: fewer)
RC_WARPS = 4 if SIM else 8
#: ... and its blocks per multiprocessor (``tune={"rc_blocks": B}``): 4 and 8 measured within the spread
#: of 2 on the H100 (A and D full steps, ``bench/results/fullstep_H100_2026-11-26_s11_test_recheck.log``)
RC_BLOCKS_SM = 2
#: attributes whose loads a lane issues together before it adds their squares (in attribute
#: order): a row's distances are a chain of M dependent additions, and with one load per
#: addition each waited for its load (a flagged row cost its warp M round trips to memory)
RC_BATCH = 8
#: where a block's flagged rows fit this many bytes of shared memory, the group stages its row there
#: first (the row's loads issued by all its threads at once) and a lane's chain waits on the centres'
#: loads alone, :data:`RC_BATCH_STAGED` at a time
RC_STAGE_BYTES = 16 * 1024
RC_BATCH_STAGED = 16
#: the register cap that keeps :data:`RC_BLOCKS_SM` blocks resident (a multiprocessor's 65536 registers):
#: ptxas gave the staged kernel 135 registers uncapped, 119-121 under it without spills (K = 1000, M = 257;
#: K = 50, M = 100), the kernel before the staging 114-121
RC_MAXREG = 65536 // (RC_BLOCKS_SM * 32 * RC_WARPS)


#: the most parts a flagged row's centres are split into (:func:`recheck_kernel`): where few rows are
#: flagged, a row's search was one block streaming all K x M centres through one multiprocessor (D's late
#: steps: 96 us for 64 rows, 16 % of the multiprocessors' cycles active, ncu
#: ``bench/results/ncu_recheck_D_f32_H100_2026-11-26_s16.txt``; split, 34-39 us,
#: ``kernels_D_f32_H100_2026-11-26_s16_split.log``)
RC_PARTS = 8


def part_scratch(slots: int) -> tuple:
    """The exact kernel's scratch for splitting rows over ``slots`` groups (the launch's blocks x groups a
    block): each part's best distance and index, the squared distance to the old centre, and the parts
    done of each row (zero; the kernel leaves them zero)."""
    n = max(1, int(slots))
    return (cuda.device_array(n, dtype=np.float64), cuda.device_array(n, dtype=np.int32),
            cuda.device_array(n, dtype=np.float64), cuda.to_device(np.zeros(n, dtype=np.int32)))


#: the simulator's groups are one warp unless ``tune={"rc_threads": T}`` asks for more (a thread per thread:
#: larger groups took its scenarios' flagged rows a third longer; one scenario tests them)
SIM_ROW_THREADS = 32


def row_threads(k: int, tune: dict | None = None) -> int:
    """Threads of the exact kernel that search one flagged row among ``k`` centres: a power of two of
    warps (so that the groups fill the block), at least as many threads as centres, at most a block
    (:data:`SIM_ROW_THREADS` under the simulator); ``tune["rc_threads"]`` chooses instead."""
    forced = (tune or {}).get("rc_threads")
    if forced is not None:
        t = int(forced)
        if t < 32 or t > 32 * RC_WARPS or t & (t - 1):
            raise ValueError(f"rc_threads must be a power of two from 32 to {32 * RC_WARPS}, not {forced!r}")
        return t
    warps = 1
    while warps * 32 < int(k) and warps < RC_WARPS:
        warps *= 2
    return min(32 * warps, SIM_ROW_THREADS) if SIM else 32 * warps


@functools.lru_cache(maxsize=None)
def recheck_kernel(storage: str, weighted: bool, assign: bool, k_c: int, m_c: int, pack_c: tuple,
                   delta: bool = False, threads: int = 32, ct_pitch: int = 0):
    """Exact float64 assignment of the flagged rows, a group of ``threads`` (:func:`row_threads`) per row.

    The group's threads split the centres; each computes ``sum_j (x_j - c_kj)^2`` in float64
    in attribute order, like the CPU backend, keeping the lowest index on ties; the group's
    first thread reduces over the group.  A row's search is a chain of ``K M / T``
    dependent loads and additions on each of its ``T`` threads: with a warp per row (``T`` =
    32) a flagged row of 3e5 x 257, K = 1000 kept the kernel 0.8-0.9 ms however few rows
    were flagged (``bench/results/ncu_D_steps_H100_2026-11-26_s13.log``).  Where the block's
    rows fit :data:`RC_STAGE_BYTES`, the group first stages its row in shared memory, so a
    lane's chain waits on the centres' loads alone (D with ``T`` = 256: 4 centres a lane, a
    round trip every 8 attributes kept the kernel at 0.14 ms with any row flagged; 0.10-0.12
    staged, ``bench/results/kernels_D_f32_H100_2026-11-26_s15_recheck.log``).

    For a step the row is then added to the global deviation
    sums (``x - c``), counts, SSE and change count (atomics: flagged rows are rare); with
    ``delta`` only a row whose label changed moves: ``x - c_old``, its count and its
    squared distance to the old centre leave, the same for the new one join.

    With ``ct_pitch`` the search reads the centres from ``ct``, their attribute-major float64 copy
    (``ct[j * ct_pitch + c]``, the GEMM path's :func:`.gemmcentres.prep_kernel` writes it): a warp's
    load is then 32 consecutive centres' values of one attribute (one 256-byte stretch), where from
    the step buffer's row-major centres each lane's load is a cache line of its own.  The same values
    are added in the same order: the distances' bits do not change.  (Alone it left D's late steps'
    kernel at 96 us: one block a row was bound by the bytes it keeps in flight; the split below is
    what shortened it.)

    Where the flagged rows leave groups of the launch idle (``nflag * P`` of its ``gridDim.x * G``
    groups, ``P`` the largest power of two up to :data:`RC_PARTS` that fits), a row's centres are
    split into ``P`` parts (centre ``c`` in part ``(c // T) % P``), each searched by a group of its
    own, which leaves its best distance and index in the scratch (:func:`part_scratch`); the
    row's last part to finish (a counter a row) takes the least (distance, index) of the parts,
    the lowest index on ties as before, and assigns and adds the row.

    Arguments: x, ld, p64, ctr, labels, flags, w, dist2, fslot (as in
    :func:`.kernels.fused_kernel`), ct (float64; a one-value stand-in without ``ct_pitch``), and
    the scratch pd, pi, pod, pcnt of :func:`part_scratch` for the launch's groups.  It is
    launched after every fused launch, with no host round trip: it reads the flagged count
    ``ctr[fslot]`` on the device, and with none flagged every block returns at once.
    """
    NT = 32 * RC_WARPS
    T = int(threads)
    G = NT // T  # rows a block takes at a time
    STAGED = G * int(m_c) * 8 <= RC_STAGE_BYTES
    XS = G * int(m_c) if STAGED else 1
    B = RC_BATCH_STAGED if STAGED else RC_BATCH
    WEIGHTED = weighted
    ASSIGN = assign
    DELTA = delta
    F64_INF = np.inf
    K_C, M_C = int(k_c), int(m_c)
    pack = PackLayout(*pack_c)
    P_C64, P_SUMS, P_CNT, P_SSE = int(pack.p64_c64), int(pack.p64_sums), int(pack.p64_cnt), int(pack.p64_sse)
    I_CHG = int(pack.i64_chg)
    CTP = int(ct_pitch)
    PMAX = RC_PARTS if K_C > T else 1  # a row's centres in more parts than groups of T: no use

    def km_recheck(x, ld, p64, ctr, labels, flags, w, dist2, fslot, ct, pd, pi, pod, pcnt):
        bd_s = cuda.shared.array(NT, dtype=float64)
        bi_s = cuda.shared.array(NT, dtype=int32)
        xs = cuda.shared.array(XS, dtype=float64)  # the group's row (STAGED)
        old_s = cuda.shared.array(G, dtype=int32)
        od_s = cuda.shared.array(G, dtype=float64)
        last_s = cuda.shared.array(G, dtype=int32)  # the group finished its row's last part
        tid = cuda.threadIdx.x
        lane = tid % T  # the thread's place in its row's group
        wib = tid // T  # the group
        m = M_C
        k = K_C
        nflag = ctr[fslot]
        xv = cuda.local.array(B, dtype=float64)
        cv = cuda.local.array(B, dtype=float64)
        xo = wib * m  # the group's row in xs
        sse_w = 0.0
        changed_w = 0
        step = cuda.gridDim.x * G
        # parts a row: the most (a power of two up to PMAX) whose work items all fit the launch's groups
        # at once (none of them then waits for a second round)
        parts = 1
        while parts < PMAX and nflag * parts * 2 <= step:
            parts *= 2
        for base in range(cuda.blockIdx.x * G, nflag * parts, step):
            u = base + wib
            f = u // parts
            part = u - f * parts
            bd = F64_INF
            bi = k
            i = flags[f] if f < nflag else 0
            if STAGED:
                if f < nflag:
                    for j in range(lane, m, T):
                        xs[xo + j] = float64(ldx(x, j * ld + i))
                cuda.syncthreads()
            if f < nflag:
                old = labels[i] if DELTA else -1
                for kk in range(part * T + lane, k, T * parts):
                    d = 0.0
                    cb = P_C64 + kk * m
                    for jb in range(0, m, B):
                        for q in range(B):
                            j = jb + q
                            if j < m:
                                if not STAGED:
                                    xv[q] = float64(ldx(x, j * ld + i))
                                cv[q] = ldx(ct, j * CTP + kk) if CTP else ldx(p64, cb + j)
                        for q in range(B):
                            if jb + q < m:
                                t = (xs[xo + jb + q] if STAGED else xv[q]) - cv[q]
                                d += t * t
                    if kk == old:
                        od_s[wib] = d  # the squared distance to the old centre
                    if d < bd:
                        bd = d
                        bi = kk
            bd_s[tid] = bd
            bi_s[tid] = bi
            cuda.syncthreads()
            if f < nflag and lane == 0:
                for q in range(1, T):
                    dq = bd_s[tid + q]
                    iq = bi_s[tid + q]
                    if dq < bd or (dq == bd and iq < bi):
                        bd = dq
                        bi = iq
                last = 1
                if parts > 1:
                    # this part's best for the row's last part to take (its stores seen before the count)
                    pd[u] = bd
                    pi[u] = bi
                    if DELTA and old >= 0 and (old // T) % parts == part:
                        pod[f] = od_s[wib]
                    cuda.threadfence()
                    last = 1 if cuda.atomic.add(pcnt, f, 1) == parts - 1 else 0
                    if last != 0:
                        pcnt[f] = 0  # ready for the next launch
                        bd = F64_INF
                        bi = k
                        for q in range(parts):  # every part's best, read through L2 (atomics)
                            dq = cuda.atomic.add(pd, f * parts + q, 0.0)
                            iq = cuda.atomic.add(pi, f * parts + q, 0)
                            if dq < bd or (dq == bd and iq < bi):
                                bd = dq
                                bi = iq
                        if DELTA and old >= 0:
                            od_s[wib] = cuda.atomic.add(pod, f, 0.0)
                last_s[wib] = last
                if last == 0:
                    bi_s[tid] = -1  # another part's group assigns and adds the row
            if f < nflag and lane == 0 and last_s[wib] != 0:
                if bi >= k:  # every distance NaN: label 0 and an infinite distance, as the CPU does
                    bi = 0
                    bd = F64_INF
                bi_s[tid] = bi
                bd_s[tid] = bd
                if ASSIGN:
                    labels[i] = bi
                    dist2[i] = bd
                else:
                    wi = w[i] if WEIGHTED else 1.0
                    old = labels[i]
                    if old != bi:
                        changed_w += 1
                        labels[i] = bi
                    if DELTA:
                        if old != bi:
                            sse_w += wi * (bd - (od_s[wib] if old >= 0 else 0.0))
                            cuda.atomic.add(p64, P_CNT + bi, wi)
                            if old >= 0:
                                cuda.atomic.add(p64, P_CNT + old, -wi)
                        else:
                            bi_s[tid] = -1  # unchanged: the kept sums and SSE hold it already
                        old_s[wib] = old
                    else:
                        sse_w += wi * bd
                        cuda.atomic.add(p64, P_CNT + bi, wi)
            cuda.syncthreads()
            if not ASSIGN and f < nflag:
                lab = bi_s[wib * T]
                old = old_s[wib] if DELTA else -1
                wi = w[i] if WEIGHTED else 1.0
                if lab >= 0:
                    for j in range(lane, m, T):
                        v = xs[xo + j] if STAGED else float64(ldx(x, j * ld + i))
                        cuda.atomic.add(p64, P_SUMS + lab * m + j, wi * (v - ldx(p64, P_C64 + lab * m + j)))
                        if old >= 0:
                            cuda.atomic.add(p64, P_SUMS + old * m + j, -(wi * (v - ldx(p64, P_C64 + old * m + j))))
            cuda.syncthreads()
        if not ASSIGN and lane == 0:
            if sse_w != 0.0:
                cuda.atomic.add(p64, P_SSE, sse_w)
            if changed_w != 0:
                cuda.atomic.add(ctr, I_CHG, int64(changed_w))

    if SIM:
        return cuda.jit(km_recheck)
    return cuda.jit(km_recheck, max_registers=RC_MAXREG)
