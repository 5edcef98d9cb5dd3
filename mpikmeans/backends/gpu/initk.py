"""The initialisations' kernels: D², candidate potentials and exact fixed-point block sums on the GPU.

k-means++ measures ``trials`` candidates against every row for each centre; these
kernels do it where the rows are, :data:`MAX_TRIALS` candidates a pass
(:func:`potentials_kernel`, which also keeps their lowered D² for the chosen one
where the device has room), with the CPU's arithmetic to the last bit: every
squared distance sums
``(x_j - c_j)^2`` in attribute order with one rounding per product and per sum
(:func:`~.intrinsics.dmul_rn`, :func:`~.intrinsics.dadd_rn`: no FMA), and every
sum that decides a draw is an exact integer sum of ``rint(v * 2**s)`` split in
two int64 limbs (:mod:`mpikmeans.exact`), so neither the grid nor the order of
the atomics changes a result.  The rows are read column-major (coalesced), in
the storage dtype, converted to float64 exactly.
"""

from __future__ import annotations

import functools

from .device import SIM, cuda
from .intrinsics import dadd_rn, dmul_rn, ld4, rint

if cuda is not None:
    from numba import float64, int64

#: threads per block of every kernel here
NT = 32 if SIM else 256
#: rows of a block of the draws' exact totals (:func:`fixed_blocks_kernel`), and the most blocks
DRAW_ROWS = 64 if SIM else 2048
MAX_DRAW_BLOCKS = 1 << 14
_LIMB_MASK = (1 << 27) - 1


@functools.lru_cache(maxsize=None)
def d2_kernel(lower: bool):
    """D² of every row to one point ``c`` (``lower``: ``D² = min(D², that)``).

    Arguments: x (m * ld,), n, ld, m, c (m,) float64, d2 (n,) float64.
    """
    LOWER = lower

    def km_d2(x, n, ld, m, c, d2):
        i = cuda.grid(1)
        if i < n:
            d = 0.0
            for j in range(m):
                t = float64(x[j * ld + i]) - c[j]
                d = dadd_rn(d, dmul_rn(t, t))
            if LOWER:
                if d < d2[i]:
                    d2[i] = d
            else:
                d2[i] = d

    return cuda.jit(km_d2)


#: candidates one pass of :func:`potentials_kernel` takes (fewer are padded; more go in several passes):
#: scikit-learn's 2 + ln(k) trials up to k = 1096
MAX_TRIALS = 8


@functools.lru_cache(maxsize=None)
def potentials_kernel(weighted: bool):
    """Per candidate: the exact fixed-point total of ``v = min(D², |x - c|²) (* w)`` and the largest ``v``.

    Arguments: x, n, ld, m, cands (m * MAX_TRIALS,) float64 (attribute-major:
    ``cands[j * MAX_TRIALS + q]``, padded to MAX_TRIALS candidates), t (the real
    ones), d2 (n,), w (n,) (any float64 array where the pass is not
    ``weighted``), f1, f2 (the scale ``2**s`` as two exact factors), acc
    (2 * MAX_TRIALS,) int64 (the high limbs, then the low) and vmax
    (MAX_TRIALS,) float64, accumulated (the caller zeroes them; the padded
    candidates' entries are not used), keep (0 or 1), kept (MAX_TRIALS * n,)
    float64 (any float64 array, never written, without ``keep``): with ``keep``,
    ``min(D², |x - c_q|²)`` of row ``i`` goes to ``kept[q * n + i]`` for the
    ``t`` real candidates, so the chosen one's D² needs no other pass over the
    rows.  The eight distances are named variables and the candidate loops run
    MAX_TRIALS times, a constant, so each row's distances stay in registers; a
    block adds its threads' limbs in shared memory, then into the outputs:
    integer atomics, so the order never matters.
    """
    T = MAX_TRIALS
    assert T == 8, "the pass names its eight candidates' distances"
    WEIGHTED = weighted

    @cuda.jit(device=True)
    def attribute(xj, cands, base, d0, d1, d2_, d3, d4, d5, d6, d7):
        # one attribute's term added to the eight candidates' distances; their values of it: two vector
        # loads, no index arithmetic a candidate
        c0, c1, c2, c3 = ld4(cands, base)
        c4, c5, c6, c7 = ld4(cands, base + 4)
        e = xj - c0
        d0 = dadd_rn(d0, dmul_rn(e, e))
        e = xj - c1
        d1 = dadd_rn(d1, dmul_rn(e, e))
        e = xj - c2
        d2_ = dadd_rn(d2_, dmul_rn(e, e))
        e = xj - c3
        d3 = dadd_rn(d3, dmul_rn(e, e))
        e = xj - c4
        d4 = dadd_rn(d4, dmul_rn(e, e))
        e = xj - c5
        d5 = dadd_rn(d5, dmul_rn(e, e))
        e = xj - c6
        d6 = dadd_rn(d6, dmul_rn(e, e))
        e = xj - c7
        d7 = dadd_rn(d7, dmul_rn(e, e))
        return d0, d1, d2_, d3, d4, d5, d6, d7

    def km_potentials(x, n, ld, m, cands, t, d2, w, f1, f2, acc, vmax, keep, kept):
        s_hi = cuda.shared.array(T, dtype=int64)
        s_lo = cuda.shared.array(T, dtype=int64)
        s_vm = cuda.shared.array(T, dtype=float64)
        tid = cuda.threadIdx.x
        if tid < T:
            s_hi[tid] = 0
            s_lo[tid] = 0
            s_vm[tid] = 0.0
        cuda.syncthreads()
        dd = cuda.local.array(T, dtype=float64)
        a_hi = cuda.local.array(T, dtype=int64)
        a_lo = cuda.local.array(T, dtype=int64)
        a_vm = cuda.local.array(T, dtype=float64)
        for q in range(T):
            a_hi[q] = 0
            a_lo[q] = 0
            a_vm[q] = 0.0
        for i in range(cuda.grid(1), n, cuda.gridsize(1)):
            d0 = d1 = d2_ = d3 = d4 = d5 = d6 = d7 = 0.0
            # four attributes' values requested before any is used: four loads in flight a thread
            j = 0
            while j + 4 <= m:
                xa = float64(x[j * ld + i])
                xb = float64(x[(j + 1) * ld + i])
                xc = float64(x[(j + 2) * ld + i])
                xd = float64(x[(j + 3) * ld + i])
                d0, d1, d2_, d3, d4, d5, d6, d7 = attribute(xa, cands, j * T, d0, d1, d2_, d3, d4, d5, d6, d7)
                d0, d1, d2_, d3, d4, d5, d6, d7 = attribute(xb, cands, (j + 1) * T, d0, d1, d2_, d3, d4, d5, d6, d7)
                d0, d1, d2_, d3, d4, d5, d6, d7 = attribute(xc, cands, (j + 2) * T, d0, d1, d2_, d3, d4, d5, d6, d7)
                d0, d1, d2_, d3, d4, d5, d6, d7 = attribute(xd, cands, (j + 3) * T, d0, d1, d2_, d3, d4, d5, d6, d7)
                j += 4
            while j < m:
                d0, d1, d2_, d3, d4, d5, d6, d7 = attribute(float64(x[j * ld + i]), cands, j * T,
                                                            d0, d1, d2_, d3, d4, d5, d6, d7)
                j += 1
            dd[0] = d0
            dd[1] = d1
            dd[2] = d2_
            dd[3] = d3
            dd[4] = d4
            dd[5] = d5
            dd[6] = d6
            dd[7] = d7
            di = d2[i]
            for q in range(T):
                v = min(di, dd[q])
                if keep and q < t:
                    kept[q * n + i] = v
                if WEIGHTED:
                    v = v * w[i]
                if v > a_vm[q]:
                    a_vm[q] = v
                iq = int64(rint(v * f1 * f2))
                a_hi[q] += iq >> 27
                a_lo[q] += iq & _LIMB_MASK
        for q in range(T):
            cuda.atomic.add(s_hi, q, a_hi[q])
            cuda.atomic.add(s_lo, q, a_lo[q])
            cuda.atomic.max(s_vm, q, a_vm[q])
        cuda.syncthreads()
        if tid < T:
            cuda.atomic.add(acc, tid, s_hi[tid])
            cuda.atomic.add(acc, T + tid, s_lo[tid])
            cuda.atomic.max(vmax, tid, s_vm[tid])

    return cuda.jit(km_potentials)


@functools.lru_cache(maxsize=None)
def fixed_blocks_kernel(weighted: bool):
    """Exact fixed-point sums of ``rint(w * D² * 2**s)`` over ``nb`` consecutive blocks of rows.

    Block ``b`` of rows is ``[n * b // nb, n * (b + 1) // nb)``, one CUDA block each
    (grid ``nb``).  Arguments: d2 (n,), w (n,) or (1,), n, nb, f1, f2, hi, lo (nb,)
    int64 (written).  Also the largest ``w * D²`` of each block into vmax (nb,).
    """
    WEIGHTED = weighted

    def km_fixed_blocks(d2, w, n, nb, f1, f2, hi, lo, vmax):
        s_hi = cuda.shared.array(1, dtype=int64)
        s_lo = cuda.shared.array(1, dtype=int64)
        s_vm = cuda.shared.array(1, dtype=float64)
        b = cuda.blockIdx.x
        tid = cuda.threadIdx.x
        if tid == 0:
            s_hi[0] = 0
            s_lo[0] = 0
            s_vm[0] = 0.0
        cuda.syncthreads()
        a_hi = int64(0)
        a_lo = int64(0)
        a_vm = 0.0
        for i in range(n * b // nb + tid, n * (b + 1) // nb, cuda.blockDim.x):
            v = d2[i]
            if WEIGHTED:
                v = v * w[i]
            if v > a_vm:
                a_vm = v
            iq = int64(rint(v * f1 * f2))
            a_hi += iq >> 27
            a_lo += iq & _LIMB_MASK
        cuda.atomic.add(s_hi, 0, a_hi)
        cuda.atomic.add(s_lo, 0, a_lo)
        cuda.atomic.max(s_vm, 0, a_vm)
        cuda.syncthreads()
        if tid == 0:
            hi[b] = s_hi[0]
            lo[b] = s_lo[0]
            vmax[b] = s_vm[0]

    return cuda.jit(km_fixed_blocks)


@functools.lru_cache(maxsize=None)
def nearest_kernel():
    """Nearest of ``p`` points (any number: not specialised on it) and the squared distance to it.

    For the initialisations' candidate sets, whose size changes from run to run:
    a kernel specialised on it (as the Lloyd step's) would be compiled every run.
    Ties go to the lowest index, as everywhere.  Arguments: x, n, ld, m, pts (p * m,)
    float64, p, labels (n,) int32, dist2 (n,) float64 (written).
    """

    def km_nearest(x, n, ld, m, pts, p, labels, dist2):
        i = cuda.grid(1)
        if i < n:
            best = 0
            best_d = 0.0
            for q in range(p):
                d = 0.0
                for j in range(m):
                    t = float64(x[j * ld + i]) - pts[q * m + j]
                    d = dadd_rn(d, dmul_rn(t, t))
                if q == 0 or d < best_d:
                    best_d = d
                    best = q
            labels[i] = best
            dist2[i] = best_d

    return cuda.jit(km_nearest)


def device_values(d2, weights):
    """For :class:`mpikmeans.exact.BlockFixed`: rows ``a .. z-1``' ``w * D²`` from D² on the device
    (one block's values, about :data:`DRAW_ROWS` of them, copied to the host for each draw)."""
    def block_values(a: int, z: int):
        v = d2[a:z].copy_to_host()
        return v if weights is None else v * weights[a:z]
    return block_values
