"""The GEMM path's centre data, made on the device from the step buffer's centres.

Where a step takes the GEMM-shaped path (:mod:`.gemm`), the host copies the centres into the
step buffer and nothing else (:func:`.hostk.copy_centres`); two small kernels make the rest
before the screen: the shift (the centres' mean) and the screen's layout of the centres
(``-2 z`` attribute-major, padded to whole centre tiles, their norms and the certificate's
bound), as :func:`.hostk.fill_centres` makes them on the host for the other paths.
"""

from __future__ import annotations

import functools

import numpy as np

from .device import SIM, cuda
from .intrinsics import ldx, stx
from .plan import ZL_CAP, ZL_MARGIN, PackLayout

if cuda is not None:
    from numba import float32, float64, int32


#: centres and attribute lanes of a block of the prep kernel (the simulator runs a thread per thread:
#: fewer, and one block)
PREP_C, PREP_J = (16, 2) if SIM else (32, 8)
#: attributes a thread of the prep kernel loads (with the shift's) before it uses them, in attribute
#: order as before: one at a time, each a round trip to memory (D: 33 a thread, 13-17 us a step)
PREP_BATCH = 8
#: threads a block of the shift kernel: a warp an attribute
SHIFT_NT = 32 if SIM else 128
#: centres' values a lane of the shift kernel loads together before it adds them
SHIFT_BATCH = 16


def shift_grid(m: int) -> int:
    """Blocks of the shift kernel for ``m`` attributes (a warp each)."""
    return -(-int(m) // (SHIFT_NT // 32))


def lane_tree_mean(values: np.ndarray) -> float:
    """The shift kernel's mean of one attribute's centre values (k,), in its order of additions (for tests):
    lane ``l`` of a warp sums the values ``l, l + 32, ...`` in turn, then the lanes' sums are added at
    distances 16, 8, 4, 2 and 1 (a tree), and the total divided by k; float64 throughout."""
    lanes = [0.0] * 32
    for c, v in enumerate(np.asarray(values, dtype=np.float64)):
        lanes[c % 32] = lanes[c % 32] + float(v)
    off = 16
    while off:  # as the kernel: lane i < off takes lane i + off
        for i in range(off):
            lanes[i] = lanes[i] + lanes[i + off]
        off //= 2
    return lanes[0] / len(values)


@functools.lru_cache(maxsize=None)
def shift_kernel(storage: str, k_c: int, m_c: int, pack_c: tuple):
    """The shift ``s``, the mean of the centres, made on the device from the step buffer's centres.

    A warp an attribute: lane ``l`` sums the centres ``l, l + 32, ...`` in turn (loads
    :data:`SHIFT_BATCH` at a time), the lanes' sums are added pairwise in a tree and divided by
    ``k``, rounded to float32 for float32 rows (:func:`lane_tree_mean` gives the same bits).  A thread
    an attribute summing all K centres in turn (the host fill's order) was a chain of K / 16 round
    trips to memory: 25 us of D's every step (K = 1000) on three blocks
    (``bench/results/kernels_D_f32_H100_2026-11-27_s17_batch16.log``).
    Labels do not depend on the shift (the certificates hold for any), only which rows are flagged.

    Arguments: p32, p64 (the step buffer's float32 and float64 views); :func:`shift_grid` blocks of
    :data:`SHIFT_NT` threads.
    """
    F32 = storage == "float32"
    K_C, M_C = int(k_c), int(m_c)
    L = PackLayout(*pack_c)
    P_C64, P_SH32, P_SH64 = int(L.p64_c64), int(L.p32_sh), int(L.p64_sh)
    B = SHIFT_BATCH
    WPB = SHIFT_NT // 32

    def km_gemm_shift(p32, p64):
        part = cuda.shared.array(SHIFT_NT, dtype=float64)
        tid = cuda.threadIdx.x
        lane = tid % 32
        j = cuda.blockIdx.x * WPB + tid // 32
        cv = cuda.local.array(B, dtype=float64)
        t = 0.0
        if j < M_C:  # the same for the whole warp
            for cb in range(lane, K_C, 32 * B):
                for q in range(B):
                    if cb + 32 * q < K_C:
                        cv[q] = ldx(p64, P_C64 + (cb + 32 * q) * M_C + j)
                for q in range(B):
                    if cb + 32 * q < K_C:
                        t += cv[q]
        part[tid] = t
        cuda.syncthreads()
        off = 16
        while off > 0:  # the lanes' sums added at distances 16, 8, 4, 2, 1 (shared memory: the simulator
            if lane < off:  # has no warp shuffles)
                part[tid] = part[tid] + part[tid + off]
            cuda.syncthreads()
            off //= 2
        if lane == 0 and j < M_C:
            t = part[tid] / K_C
            if F32:
                stx(p32, P_SH32 + j, float32(t))
            else:
                stx(p64, P_SH64 + j, t)

    return cuda.jit(km_gemm_shift)


@functools.lru_cache(maxsize=None)
def prep_kernel(storage: str, k_c: int, m_c: int, kpg_c: int, pack_c: tuple):
    """The screen's centre data, made on the device from the step buffer's centres and shift.

    ``cmg[j * kpg + c] = -2 z[c, j]`` with ``z = float32(c - s)``, ``ccg[c] = |z_c|^2`` (padding
    centres: 0 and +inf) and the certificate's bound ``zl`` = twice the largest ``|z|^2`` (+inf
    where a centre is not finite), all as :func:`.hostk.fill_centres` computes them on the host for
    the other paths; the bound by an atomic maximum from the zero the step's upload leaves.  A
    block takes :data:`PREP_C` centres, each with :data:`PREP_J` threads on its attributes (the host's
    fill of 1000 x 257 centres took 0.25-0.4 ms a step, its tiles then repacked on the device).

    It also writes ``ct[j * kpg + c]``, the centres' float64 values attribute-major, which the exact
    kernel searches a flagged row's centres in (:func:`.recheck.recheck_kernel`'s ``ct_pitch``).

    Arguments: p32, p64 (the step buffer's float32 and float64 views), cmg (m * kpg,), ccg (kpg,),
    ct (float64, m * kpg).
    """
    F32 = storage == "float32"
    K_C, M_C, KPG = int(k_c), int(m_c), int(kpg_c)
    L = PackLayout(*pack_c)
    P_C64, P_SH32, P_SH64, P_ZL = int(L.p64_c64), int(L.p32_sh), int(L.p64_sh), int(L.p32_zl)
    INF = np.float32(np.inf)
    TWO = np.float32(-2.0)
    PB = PREP_BATCH

    def km_gemm_prep(p32, p64, cmg, ccg, ct):
        part = cuda.shared.array((PREP_J, PREP_C), dtype=float64)
        bad = cuda.shared.array((PREP_J, PREP_C), dtype=int32)
        tx = cuda.threadIdx.x % PREP_C
        ty = cuda.threadIdx.x // PREP_C
        vv = cuda.local.array(PB, dtype=float64)
        ss = cuda.local.array(PB, dtype=float64)
        for cb in range(cuda.blockIdx.x, KPG // PREP_C, cuda.gridDim.x):
            c = cb * PREP_C + tx
            norm = 0.0
            nonfinite = 0
            for jb in range(ty, M_C, PREP_J * PB):
                for q in range(PB):  # the batch's loads first (see PREP_BATCH)
                    j = jb + q * PREP_J
                    if c < K_C and j < M_C:
                        vv[q] = ldx(p64, P_C64 + c * M_C + j)
                        ss[q] = float64(ldx(p32, P_SH32 + j)) if F32 else ldx(p64, P_SH64 + j)
                for q in range(PB):
                    j = jb + q * PREP_J
                    if j < M_C:
                        z = float32(0.0)
                        if c < K_C:
                            v = vv[q]
                            if v - v != 0.0:  # inf - inf and NaN - NaN are NaN
                                nonfinite = 1
                            z = float32(v - ss[q])
                            norm += float64(z) * float64(z)
                            stx(ct, j * KPG + c, v)
                        stx(cmg, j * KPG + c, z * TWO)
            cuda.syncthreads()  # the last round's sums are read
            part[ty, tx] = norm
            bad[ty, tx] = nonfinite
            cuda.syncthreads()
            if ty == 0:
                if c < K_C:
                    tot = 0.0
                    nb = 0
                    for q in range(PREP_J):
                        tot += part[q, tx]
                        nb += bad[q, tx]
                    stx(ccg, c, float32(tot))
                    zc = INF if nb != 0 else float32(min(2.0 * tot * (1.0 + ZL_MARGIN), ZL_CAP))
                    cuda.atomic.max(p32, P_ZL, zc)
                else:
                    stx(ccg, c, INF)

    return cuda.jit(km_gemm_prep)
