"""The GEMM path's screen on TF32 tensor cores: the same certified labels, its products 2.3x faster.

The float32 screen of :mod:`.gemm` runs its register-blocked products at 41 % of the
H100's FP32 rate (3e5 x 257, K = 1000: 5.8 ms).  This screen computes the same
estimate ``|z_c|^2 - 2 y.z_c`` with warp-wide ``mma.sync.m16n8k8`` products on TF32
inputs (inline PTX; Numba has no tensor-core API) and keeps the same contract:
certified labels into ``newlab``; every other row goes to the float32 screen (the
cascade, the default: the float32 screen searches the list this one leaves and flags
what it cannot certify for the exact float64 kernel) or straight to the exact kernel,
so the labels stay those of exact float64 arithmetic
(``bench/experiments/tf32_pass1.py``: 2.5 against 5.8 ms on that shape, no
row flagged on its blobs, every checked label exact).

Certificate (:func:`certificate`).  Both operands are rounded to TF32 (``cvt.rna``,
relative error at most ``2^-11``): ``y = fl32(x - s)`` when staged, ``-2 z`` as the
centres are staged.  Their products are exact in float32, so for one centre the
rounding of the inputs adds at most ``2 (2^-10 + 2^-22) sum_j |y_j z_j| <= (2^-10 +
2^-22)(|y|^2 + |z|^2)``; for two centres, with ``zlim = 2 max |z|^2``, at most
``(2^-9 + 2^-21)(|y|^2 + zlim)``.  The tensor cores add in their own order and may
truncate rather than round: the float32 screen's bound for any summation order
(:func:`.kernels.certificate`) is taken twice for that.  A label is kept only
when the gap between the best and the second-best estimate exceeds
``tolf (|y|^2 + zlim) + tiny`` with ``tolf = 2^-9 (1 + 2^-12) + 2 tolf32``.

Layout.  256 threads, 8 warps: 2 along the rows x 4 along the centres; a block
computes 128 rows x 128 centres, each warp 64 x 32 as 4 x 4 products of 16 x 8,
64 float32 accumulators a lane.  Attributes go through shared memory in slices of
16 (two buffers, the next slice's loads in flight while this one is multiplied, one
barrier a slice), both operands attribute-major with a row pitch of 136 words, so
each fragment load hits 32 banks.  After each centre tile a lane folds its 8
columns of each of its 8 rows into its own slot (16 slots a row: warp along the
centres x lane in its quad), and :func:`.gemm.row_verdicts` merges the slots.

Under the CUDA simulator the tensor-core product is emulated through shared memory
(every lane's fragments, a barrier, the 16 x 8 x 8 product in float32, a barrier),
so the same kernel runs in CI on small shapes.
"""

from __future__ import annotations

import functools

import numpy as np

from .device import HAVE_NUMBA_CUDA, SIM, cuda
from .bounds import listed_rows, tile_row
from .gemm import BK, BM, BN, NT, centre_groups, row_verdicts, slice_loads, unit_merge
from .intrinsics import fmaxf, fminf, ldx, stx
from .kernels import certificate as float32_certificate
from .plan import PackLayout

if cuda is not None:
    from numba import float32, int32

#: the row pitch of the staged slices in words: (lane quad * 136 + group) mod 32 covers every bank
PITCH = BK * 8 + 8
#: warps along the centres; each lane of a quad keeps its own best / second best: slots a row
WN = 4
SLOTS = WN * 4
#: register cap: 124 registers without spills, two blocks of 256 threads a multiprocessor
#: (no cap: 130 registers, one block; H100, 3e5 x 257, K = 1000: 3.4 against 2.5 ms)
MAXREG = 128
#: the simulator's exchange area for the emulated product: 10 values in and 4 out a lane
_SCRATCH = NT * 14 if SIM else 1
#: static shared memory of the screen, bytes
SCREEN_SMEM = (4 * BK * PITCH + SLOTS * BM * 3 + BM + _SCRATCH) * 4
#: first compute capability with ``mma.sync ... .tf32`` and ``cvt.rna.tf32.f32``
MIN_CC = (8, 0)

#: Which screen the GEMM path takes (this one on TF32 tensor cores, or the float32 one), decided
#: after every full step from the rows it left.  The TF32 certificate is about 60x wider: where
#: centres are noisy rows it leaves 10-30 % of the rows, where they are means of clusters none
#: (bench/experiments/tf32_flagged.py: 3e5 x 257, K = 1000, H100: 5.7 against 9.0 ms a step then;
#: 23-62 against 11 when the centres are rows, every row it left going to the exact kernel).
#:
#: The cascade (the default): a row TF32 leaves goes to the float32 screen, and only what that one
#: leaves to the exact kernel, so the labels and the exact kernel's rows are the float32 screen's.
#: A row then costs TF32 about 0.43 of a float32 search, and one it leaves a float32 search more:
#: TF32 pays while it leaves under about half of the rows it searches.  On bench fullstep's D data
#: it left 1.7-8 % of all rows and about 13 % of the rows the bounds test lists on the H100 (the CPU
#: emulation, bench/experiments/tf32_cascade_on_fullstep_data.py on 1e5 rows: 0.4-8 % and 0-1.7 %;
#: bench/GPU_NOTES.md v21).  So: TF32 from the first step while it leaves at most
#: TF32_CASCADE_LIMIT of the rows it searched (+ TF32_FLAG_SLACK); from the float32 screen back when
#: its own flagged rows times TF32_FLAG_RATIO (TF32 flagged 49-190 times as many in tf32_flagged.py)
#: are within that limit.
#:
#: Without the cascade (``tune={"tf32_cascade": false}``) a flagged row costs the exact kernel
#: backend.MOVE_NS + MOVE_NS_PER_ELEM K M, the tensor cores save about 0.04 ps per K x M x row: past
#: 1.3 % of the rows (K x M = 257,000; 1.1 % at 16,000) TF32 loses.  Then: the first step on the
#: float32 screen; TF32 while it flags at most TF32_FLAG_LIMIT of the rows (+ TF32_FLAG_SLACK), back
#: from float32 as above with that limit.
TF32_CASCADE_LIMIT = 0.3
TF32_FLAG_LIMIT = 0.01
TF32_FLAG_SLACK = 16
TF32_FLAG_RATIO = 200


def next_screen(tf32: bool, left: int, searched: int, cascade: bool = False) -> bool:
    """Whether the GEMM path's next steps screen on TF32, after a full step that searched ``searched``
    rows: on TF32 (``tf32``) it left ``left`` of them (to the float32 screen with ``cascade``, else to
    the exact kernel); on the float32 screen it flagged ``left``."""
    limit = (TF32_CASCADE_LIMIT if cascade else TF32_FLAG_LIMIT) * searched + TF32_FLAG_SLACK
    return left <= limit if tf32 else left * TF32_FLAG_RATIO <= limit


def cascade_wanted(tune: dict) -> bool:
    """Whether a TF32 screen's uncertified rows go to the float32 screen (``tune={"tf32_cascade": bool}``,
    default true) rather than straight to the exact kernel."""
    return bool(tune.get("tf32_cascade", True))


def wanted(limits, tune: dict) -> bool:
    """Whether the GEMM path may screen on the tensor cores (:func:`next_screen` decides when): devices
    of compute capability 8.0 on, unless ``tune={"tf32": bool}`` decides (``true``: from the first step
    on, tests and benchmarks; ``false``: never)."""
    forced = tune.get("tf32")
    if forced is not None:
        return bool(forced)
    return tuple(limits.cc) >= MIN_CC


def certificate(m: int) -> tuple:
    """``(tolf, tiny, big)`` of the TF32 screen for rows of ``m`` attributes (see the module docstring)."""
    tolf32, tiny, big = float32_certificate(m)
    return np.float32(2.0 ** -9 * (1.0 + 2.0 ** -12) + 2.0 * float(tolf32)), tiny, big


if HAVE_NUMBA_CUDA and not SIM:
    from llvmlite import ir as _llir
    from numba import types as _nbtypes
    from numba.cuda.extending import intrinsic as _intrinsic

    @_intrinsic
    def tf32_rna(typingctx, v):
        """``v`` rounded to TF32 (to nearest, ties away from zero): a float32 with 13 zero low bits."""
        sig = _nbtypes.float32(_nbtypes.float32)

        def codegen(context, builder, signature, args):
            i32 = _llir.IntType(32)
            r = builder.asm(_llir.FunctionType(i32, [_llir.FloatType()]), "cvt.rna.tf32.f32 $0, $1;", "=r,f",
                            [args[0]], side_effect=False)
            return builder.bitcast(r, _llir.FloatType())

        return sig, codegen

    @_intrinsic
    def mma_tf32(typingctx, scratch, a0, a1, a2, a3, b0, b1, c0, c1, c2, c3):
        """One warp's ``D = A B + C`` (m16n8k8; A row-major, B column-major, TF32; C, D float32).

        Lane ``l`` (``g = l // 4``, ``t = l % 4``) holds ``a0..a3`` = A[g][t], A[g+8][t],
        A[g][t+4], A[g+8][t+4]; ``b0, b1`` = B[t][g], B[t+4][g]; ``c0..c3`` = C[g][2t],
        C[g][2t+1], C[g+8][2t], C[g+8][2t+1], and gets D's in the same places.
        ``scratch`` is the simulator's exchange area, unused here.
        """
        sig = _nbtypes.UniTuple(_nbtypes.float32, 4)(scratch, *([_nbtypes.float32] * 10))

        def codegen(context, builder, signature, args):
            f32, i32 = _llir.FloatType(), _llir.IntType(32)
            ins = [builder.bitcast(a, i32) for a in args[1:7]] + list(args[7:])
            fty = _llir.FunctionType(_llir.LiteralStructType([f32] * 4), [i32] * 6 + [f32] * 4)
            r = builder.asm(fty, "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 "
                                 "{$0,$1,$2,$3}, {$4,$5,$6,$7}, {$8,$9}, {$10,$11,$12,$13};",
                            "=f,=f,=f,=f,r,r,r,r,r,r,f,f,f,f", ins, side_effect=False)
            return context.make_tuple(builder, signature.return_type, [builder.extract_value(r, q) for q in range(4)])

        return sig, codegen

else:

    def tf32_rna(v):
        b = np.array([v], dtype=np.float32).view(np.uint32)
        if (b[0] & 0x7F800000) != 0x7F800000:
            b = (b + np.uint32(0x1000)) & np.uint32(0xFFFFE000)
        return np.float32(b.view(np.float32)[0])

    # the exchange area: 10 values a thread (a0..a3, b0, b1, c0..c3), then 4 a thread (its D).
    # A[r][k] is fragment (r // 8) + 2 (k // 4) of lane (r % 8) * 4 + k % 4; B[k][c] fragment
    # 4 + k // 4 of lane c * 4 + k % 4; C[r][c] value 6 + 2 (r // 8) + c % 2 of lane (r % 8) * 4 + c // 2
    _R, _K = np.meshgrid(np.arange(16), np.arange(8), indexing="ij")
    _A_AT = ((_R % 8) * 4 + _K % 4) * 10 + _R // 8 + 2 * (_K // 4)
    _B_AT = (_K[:8].T * 4 + _K[:8] % 4) * 10 + 4 + _K[:8] // 4
    _C_AT = ((_R % 8) * 4 + _K // 2) * 10 + 6 + 2 * (_R // 8) + _K % 2
    _LANE, _Q = np.meshgrid(np.arange(32), np.arange(4), indexing="ij")
    _D_ROW, _D_COL = _LANE // 4 + 8 * (_Q // 2), 2 * (_LANE % 4) + _Q % 2

    def mma_tf32(scratch, a0, a1, a2, a3, b0, b1, c0, c1, c2, c3):
        """The simulator's product: every lane's fragments into ``scratch``, lane 0 of the warp
        multiplies in float32, each lane takes its four values back (two barriers)."""
        tid = cuda.threadIdx.x
        lane = tid % 32
        warp0 = tid - lane
        o = tid * 10
        for q, v in enumerate((a0, a1, a2, a3, b0, b1, c0, c1, c2, c3)):
            scratch[o + q] = v
        cuda.syncthreads()
        if lane == 0:
            w = np.asarray(scratch[warp0 * 10:(warp0 + 32) * 10], dtype=np.float32)
            d = w[_A_AT] @ w[_B_AT.T] + w[_C_AT]
            scratch[NT * 10 + warp0 * 4:NT * 10 + (warp0 + 32) * 4] = d[_D_ROW, _D_COL].ravel()
        cuda.syncthreads()
        r = NT * 10 + tid * 4
        return (np.float32(scratch[r]), np.float32(scratch[r + 1]), np.float32(scratch[r + 2]),
                np.float32(scratch[r + 3]))


@functools.lru_cache(maxsize=None)
def screen_kernel(storage: str, m_c: int, kpg_c: int, pack_c: tuple, delta: bool, bounds: bool = False,
                  rowmajor: bool = False, cascade: bool = False, groups: bool = False):
    """Certified nearest centre of every row on the tensor cores: :func:`.gemm.screen_kernel`'s
    arguments and results (see the module docstring), with ``cas`` (int32, (n,)) and ``cslot`` after
    ``gslot``, before the split's scratch.

    With ``cascade`` a row the TF32 certificate leaves goes to ``cas`` (``ctr[cslot]`` of them) for
    the float32 screen (:func:`.gemm.screen_kernel` on that list), not to the exact kernel.  With
    ``groups`` few row tiles have their centre tiles split over the blocks as the float32 screen's
    (:func:`.gemm.centre_groups`, :func:`.gemm.unit_merge`): the rows the bounds test lists (D: 300 row
    tiles, two waves of 264 blocks, the second one of 36 tiles: 0.52 ms under ncu).
    """
    M_C, KPG = int(m_c), int(kpg_c)
    L = PackLayout(*pack_c)
    P_ZL = int(L.p32_zl)
    NCT = KPG // BN
    NST = -(-M_C // BK)
    XSTEP, CSTEP = NT // BM, NT // BN
    XQ, CQ = BK * BM // NT, BK * BN // NT
    BUF = BK * PITCH
    BUF2 = 2 * BUF
    SB = SLOTS * BM
    SCR = _SCRATCH
    verdicts = row_verdicts(SLOTS, *certificate(M_C), bool(delta), bool(bounds), bool(cascade))
    loads = slice_loads(storage, M_C, KPG, pack_c, rowmajor)
    INF = np.float32(np.inf)
    GMAX = min(NCT, SLOTS)  # a unit's candidates take one slot of the merging block
    GROUPS = bool(groups)
    merge_units = unit_merge(SLOTS)

    def km_tf32_screen(x, n, ld, p32, p64, cmg, ccg, ctr, labels, newlab, flags, fslot, idx, ub, lb, gat, gslot,
                       cas, cslot, gb1, gb2, gbi, tcount, ucap):
        xs = cuda.shared.array(BUF2, dtype=float32)
        cs = cuda.shared.array(BUF2, dtype=float32)
        sb1 = cuda.shared.array(SB, dtype=float32)
        sb2 = cuda.shared.array(SB, dtype=float32)
        si1 = cuda.shared.array(SB, dtype=int32)
        syy = cuda.shared.array(BM, dtype=float32)
        scr = cuda.shared.array(SCR, dtype=float32)
        last = cuda.shared.array(1, dtype=int32)
        tid = cuda.threadIdx.x
        lane = tid % 32
        warp = tid // 32
        wm = warp % 2
        wn = warp // 2
        gid = lane // 4
        tig = lane % 4
        slot = wn * 4 + tig
        xr = tid % BM  # the row this thread stages
        xk = tid // BM  # its first attribute of a slice (then every XSTEP)
        cr = tid % BN
        ck = tid // BN
        acc = cuda.local.array(64, dtype=float32)
        af = cuda.local.array(16, dtype=float32)
        bf = cuda.local.array(8, dtype=float32)
        px = cuda.local.array(XQ, dtype=float32)
        pc = cuda.local.array(CQ, dtype=float32)
        zlim = p32[P_ZL]
        nrow = listed_rows(n, ctr, gat, gslot)
        ntiles = (nrow + BM - 1) // BM
        ng = centre_groups(ntiles, cuda.gridDim.x, ucap, NCT, GMAX) if GROUPS else 1
        for unit in range(cuda.blockIdx.x, ntiles * ng, cuda.gridDim.x):
            tile = unit // ng
            grp = unit - tile * ng
            ct0 = grp * NCT // ng
            row0 = tile * BM
            for q in range(tid, SB, NT):
                stx(sb1, q, INF)
                stx(sb2, q, INF)
                stx(si1, q, 0)
            i = tile_row(row0 + xr, nrow, idx, gat)
            yp = float32(0.0)
            for ct in range(ct0, (grp + 1) * NCT // ng):
                # the accumulators start at |z_c|^2 (one more term of the sum, in its own order, as the
                # certificate allows): the fold then adds nothing
                cb = ct * BN + wn * 32 + 2 * tig
                for nt in range(4):
                    for e in range(2):
                        zc = ldx(ccg, cb + nt * 8 + e)
                        for mt in range(4):
                            for h in range(2):
                                acc[(mt * 4 + nt) * 4 + 2 * h + e] = zc
                for st in range(NST + 1):
                    # load slice st into registers, multiply slice st - 1, store slice st
                    if st < NST:
                        loads(x, ld, i, p32, p64, cmg, st * BK, ct, xk, ck, cr, px, pc)
                    if st > 0:
                        bo = ((st - 1) & 1) * BUF
                        for ks in range(BK // 8):
                            k0 = bo + (ks * 8 + tig) * PITCH
                            k4 = k0 + 4 * PITCH
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
                            stx(xs, bo + (xk + q * XSTEP) * PITCH + xr, tf32_rna(px[q]))
                            if ct == ct0:
                                yp += px[q] * px[q]
                        for q in range(CQ):
                            stx(cs, bo + (ck + q * CSTEP) * PITCH + cr, tf32_rna(pc[q]))
                    cuda.syncthreads()
                # this centre tile into the lane's slot of each of its rows (columns in increasing
                # order, strict '<': the lowest index on ties; an exact tie leaves a gap of 0, flagged;
                # so does a NaN estimate, m2 = min(m2, max(m1, d)) then being m1): a compare, a select
                # and three min/max a pair, where the selects of the old form took six instructions
                for mt in range(4):
                    for h in range(2):
                        q = slot * BM + wm * 64 + mt * 16 + gid + 8 * h
                        m1 = ldx(sb1, q)
                        m2 = ldx(sb2, q)
                        mi = ldx(si1, q)
                        for nt in range(4):
                            for e in range(2):
                                d = acc[(mt * 4 + nt) * 4 + 2 * h + e]
                                mi = cb + nt * 8 + e if d < m1 else mi
                                m2 = fminf(m2, fmaxf(m1, d))
                                m1 = fminf(m1, d)
                        stx(sb1, q, m1)
                        stx(sb2, q, m2)
                        stx(si1, q, mi)
            if ng == 1 or merge_units(sb1, sb2, si1, last, unit, tile, ng, gb1, gb2, gbi, tcount):
                verdicts(sb1, sb2, si1, syy, yp, zlim, row0, nrow, labels, newlab, flags, ctr, fslot, idx, ub, lb,
                         gat, cas, cslot)
            cuda.syncthreads()

    if SIM:
        return cuda.jit(km_tf32_screen)
    return cuda.jit(km_tf32_screen, fastmath=False, max_registers=MAXREG)
