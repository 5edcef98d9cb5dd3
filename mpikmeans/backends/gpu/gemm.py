"""The GEMM-shaped full step, for shapes whose centres do not fit in shared memory (and, where the TF32
screen of :mod:`.tensor` is there, for many centres: :func:`wanted`).

The fused kernel's pass 1 (:mod:`.kernels`) keeps each thread's rows in registers and
streams the centres from shared memory; when K x M float32 values do not fit there
(3e5 x 257, K = 1000: 1 MB), every row tile reads them all from L2 and the step is
bound by those reads (22 ms on the H100 against a 2.3 ms floor).  Here the distance
screen is a register-blocked GEMM instead: a block of 256 threads computes the float32
``|z|^2 - 2 y.z`` of a tile of rows against a tile of centres, both staged through
shared memory in slices of attributes (double-buffered: the next slice's loads are in
flight while this one is multiplied), each thread an 8 x 8 block of the product, and
keeps each row's best and second-best centre across the centre tiles
(bench/experiments/gemm_pass1.py measured 5.75 ms for that shape).

The certificate is the fused kernel's: a row keeps its float32 winner only when the gap
to the second best exceeds ``TOLF (|y|^2 + 2 max|z|^2) + tiny``, a bound on the
float32 error of any summation order; every other row is flagged for the exact
float64 kernel (:func:`.recheck.recheck_kernel`), so the labels are those of exact
float64 arithmetic as on every other path.  The launches of a step:

1. :func:`.gemmcentres.shift_kernel` and :func:`.gemmcentres.prep_kernel`: the shift (the centres' mean) and the screen's
   centre data (``-2 z`` attribute-major, padded to a whole centre tile, their norms and the
   certificate's bound) from the step buffer's centres, which are all the host fills for this path;
2. :func:`screen_kernel`: certified labels into ``newlab`` (-1: flagged), flagged rows
   listed for the exact kernel; in an incremental step (``delta``) a certified row
   that keeps its label needs nothing and one that changes is flagged (the exact
   kernel moves it).  Or the TF32 screen (:func:`.tensor.screen_kernel`) with the same
   results, then this screen on the list of the rows it could not certify (the cascade);
3. (full steps) for every certified row, the changed count, its new label, and the float64
   deviation sums, count and SSE: the rows grouped by label first (:mod:`.bylabel`, four
   launches).
"""

from __future__ import annotations

import functools

import numpy as np

from . import bylabel
from .bounds import listed_rows, store_row_bounds, tile_row
from .compiled import compiled
from .device import SIM, cuda, inline_device
from .gemmcentres import PREP_C, PREP_J, SHIFT_NT, prep_kernel, shift_grid, shift_kernel
from .intrinsics import fmaxf, fminf, ld4, ldx, stx
from .kernels import certificate
from .launch import Launch, Steps
from .plan import PackLayout

if cuda is not None:
    from numba import float32, int32

#: threads per block of the screen
NT = 256
#: centres per tile (the block's columns), attributes per staged slice
BN = 128
BK = 16
#: rows per tile: 16 x 8 = 128 per block (NT / (BN / 8) threads along the rows, 8 rows each)
BM = 8 * NT // (BN // 8)
_ALIGN = None if SIM else 16  # the 16-byte shared loads need it; the simulator refuses the argument
#: the screen's register cap: two blocks of NT threads a multiprocessor (65,536 registers); the
#: centre groups' bookkeeping took it from 128 to 149-154 registers uncapped, one block, and the
#: full step's screen 5.4 -> 6.7 ms on the H100
MAXREG = 65536 // (2 * NT)
#: the screen's static shared memory, bytes (two slices of rows and centres, best / second best /
#: index per row and thread column, |y|^2 per row): more than the 48 KB every device gives a block
SCREEN_SMEM = (2 * BK * BM + 2 * BK * BN) * 4 + (BN // 8) * BM * 12 + BM * 4


#: where the screen runs on TF32 with the cascade (:mod:`.tensor`), the path is taken from this many
#: centres and attributes on, whether or not the centres fit in shared memory: 1e7 x 32, K = 1000 (bench
#: fullstep's B), H100, 17.1 / 17.8 ms a full step f32 / f64 against the fused kernel's 22.9 / 25.4
#: (``bench/results/fullstep_B_H100_2026-11-27_s17_gemm.*``); fewer centres fill less of the
#: 128-centre tiles, fewer attributes less of the 16-attribute slices (not measured)
TF32_MIN_K = 512
TF32_MIN_M = 32


def wanted(centres_shared: bool, m: int, limits, tune: dict, assign: bool, streaming: bool, k: int = 0,
           tf32: bool = False) -> bool:
    """Whether a step with ``k`` centres of ``m`` attributes takes this path instead of the fused kernel.

    Where the centres do not fit in shared memory and the rows are long enough for
    the tiles (M >= 64): there the fused kernel's pass 1 reads every centre from L2
    for every row tile (3e5 x 257, K = 1000: 22 ms a step on the H100, this screen
    5.5 ms); and where the screen may run on TF32 with the cascade (``tf32``), from
    :data:`TF32_MIN_K` centres and :data:`TF32_MIN_M` attributes on.  Resident rows,
    steps only (the final assignment keeps the fused kernel), on devices that give a
    block the screen's shared memory (:func:`device_fits`); ``tune={"gemm": bool}``
    decides instead (tests, benchmarks).
    """
    if assign or streaming:
        return False
    forced = tune.get("gemm")
    if forced is not None:
        return bool(forced)
    if not device_fits(limits.cc, limits.smem_optin):
        return False
    return (not centres_shared and m >= 64) or (bool(tf32) and k >= TF32_MIN_K and m >= TF32_MIN_M)


def device_fits(cc: tuple, smem_optin: int) -> bool:
    """Whether a device runs the screen: compute capability 8.0 or later (static shared memory above
    48 KB per block) with room for :data:`SCREEN_SMEM`."""
    return tuple(cc) >= (8, 0) and smem_optin >= SCREEN_SMEM


def padded_centres(kp: int) -> int:
    """Centre slots of the GEMM layout: ``kp`` rounded up to whole tiles of ``BN``."""
    return -(-kp // BN) * BN


def _merge_best(m1, m2, mi, o1, o2, oi):  # pragma: no cover - compiled
    """Best, second best and best centre of two candidate sets ``(m1, m2, mi)`` and ``(o1, o2, oi)``.

    Equal bests: the lower centre index wins and the other best becomes the second (a gap of 0,
    so the row is flagged).
    """
    take = o1 < m1 or (o1 == m1 and oi < mi)
    hi = m1 if take else o1  # the larger of the two bests
    s2 = m2 if m2 < o2 else o2
    return (o1 if take else m1), (hi if hi < s2 else s2), (oi if take else mi)


merge_best = inline_device(_merge_best)


def _merge_slots(sb1, sb2, si1, slots, r):  # pragma: no cover - compiled
    """Row ``r``'s best, second best and best centre over its ``slots`` slots of a screen's block (slot
    ``t`` at ``t * BM + r`` of ``sb1``, ``sb2``, ``si1``), merged in slot order by :func:`merge_best`."""
    m1 = ldx(sb1, r)
    m2 = ldx(sb2, r)
    mi = ldx(si1, r)
    for t in range(1, slots):
        m1, m2, mi = merge_best(m1, m2, mi, ldx(sb1, t * BM + r), ldx(sb2, t * BM + r), ldx(si1, t * BM + r))
    return m1, m2, mi


merge_slots = inline_device(_merge_slots)


def _half_index(t, q, half):  # pragma: no cover - compiled
    """The ``q``-th (0-7) of the eight rows or centres thread ``t`` of the float32 screen holds in a tile:
    four from ``4 t`` and four from ``half + 4 t`` (the two 16-byte loads of each operand)."""
    return t * 4 + q if q < 4 else half + t * 4 + q - 4


half_index = inline_device(_half_index)


@functools.lru_cache(maxsize=None)
def unit_merge(slots: int):
    """The device function that ends a unit of a screen split into centre groups (:func:`centre_groups`).

    ``km_unit_merge(sb1, sb2, si1, last, unit, tile, ng, gb1, gb2, gbi, tcount)``, called by every thread
    of the block: the unit's best, second best and best centre of each row of its tile (merged from its
    ``slots`` slots) go to the scratch ``gb1``, ``gb2``, ``gbi`` at ``unit * BM + row``; the tile's last
    unit to finish (a counter a tile in ``tcount``, set back to zero for the next launch; ``last`` a
    one-element shared array) loads every unit's candidates into its slots (the others at infinity) and
    returns true, the others false.  The candidates merge as one block's slots do, so the labels and
    flags do not depend on the split.
    """
    SLOTS = int(slots)
    INF = np.float32(np.inf)
    ZERO = np.float32(0.0)

    def km_unit_merge(sb1, sb2, si1, last, unit, tile, ng, gb1, gb2, gbi, tcount):
        tid = cuda.threadIdx.x
        cuda.syncthreads()  # every thread's slots written
        if tid < BM:  # this unit's candidates of each row, from its slots
            m1, m2, mi = merge_slots(sb1, sb2, si1, SLOTS, tid)
            stx(gb1, unit * BM + tid, m1)
            stx(gb2, unit * BM + tid, m2)
            stx(gbi, unit * BM + tid, mi)
        cuda.threadfence()  # the candidates are seen before the count that says they are there
        cuda.syncthreads()
        if tid == 0:
            done = cuda.atomic.add(tcount, tile, 1)
            last[0] = 1 if done == ng - 1 else 0
            if done == ng - 1:
                tcount[tile] = 0  # ready for the next launch
        cuda.syncthreads()
        if last[0] != 0 and tid < BM:  # every unit's candidates as the slots (read through L2: atomics)
            for t in range(SLOTS):
                u = tile * ng + t
                if t < ng:
                    stx(sb1, t * BM + tid, cuda.atomic.add(gb1, u * BM + tid, ZERO))
                    stx(sb2, t * BM + tid, cuda.atomic.add(gb2, u * BM + tid, ZERO))
                    stx(si1, t * BM + tid, cuda.atomic.add(gbi, u * BM + tid, 0))
                else:
                    stx(sb1, t * BM + tid, INF)
                    stx(sb2, t * BM + tid, INF)
                    stx(si1, t * BM + tid, 0)
        return last[0] != 0

    return inline_device(km_unit_merge)


def _centre_groups(ntiles, grid, ucap, nct, gmax):
    """Into how many groups of centre tiles the screen splits each row tile (1: not split).

    A block searches a row tile against all ``nct`` centre tiles; with fewer row tiles than the
    grid's blocks (the rows the bounds test lists in a late step: one tile of 64 rows took 0.41 ms
    of D's step on one block of 264) most of the device waits.  Split into ``g`` groups, the
    ``ntiles * g`` units go round the ``grid`` blocks in ``ceil(ntiles g / grid)`` waves of
    ``ceil(nct / g)`` centre tiles each, plus about a quarter of a centre tile a unit (its rows'
    merge and verdicts): the least such cost wins, the fewest groups on a tie, at most ``gmax``
    groups and ``ucap`` units (the merge's scratch).  Pure integer arithmetic: the kernel and the
    tests call the same function.
    """
    best = 1
    cost = (ntiles + grid - 1) // grid * (4 * nct + 1)
    for g in range(2, gmax + 1):
        if ntiles * g > ucap:
            break
        c = (ntiles * g + grid - 1) // grid * (4 * ((nct + g - 1) // g) + 1)
        if c < cost:
            best = g
            cost = c
    return best


centre_groups = inline_device(_centre_groups)


@functools.lru_cache(maxsize=None)
def slice_loads(storage: str, m_c: int, kpg_c: int, pack_c: tuple, rowmajor: bool = False):
    """The device function that loads a screen's next slice into registers (both screens stage alike).

    ``loads(x, ld, i, p32, p64, cmg, j0, ct, xk, ck, cr, px, pc)``: attributes ``j0 + xk +
    q NT/BM`` of row ``i`` less the shift (float32) into ``px`` (``BK BM / NT``), attributes ``j0 +
    ck + q NT/BN`` of centre ``ct BN + cr`` of the GEMM layout ``cmg`` into ``pc`` (``BK BN /
    NT``); zeros past the last attribute.  The rows column-major (``x[j ld + i]``), or with
    ``rowmajor`` the row-major copy (``x[i ld + j]``, ``ld = m``): the rows the bounds test lists are
    scattered, and column-major each of their values is a 32-byte sector of its own.
    """
    ROWMAJOR = bool(rowmajor)
    SH32 = storage == "float32"
    M_C, KPG = int(m_c), int(kpg_c)
    L = PackLayout(*pack_c)
    P_SH32, P_SH64 = int(L.p32_sh), int(L.p64_sh)
    XQ, CQ = BK * BM // NT, BK * BN // NT
    XSTEP, CSTEP = NT // BM, NT // BN

    def km_slice_loads(x, ld, i, p32, p64, cmg, j0, ct, xk, ck, cr, px, pc):
        for q in range(XQ):
            j = j0 + xk + q * XSTEP
            v = float32(0.0)
            if j < M_C:
                at = i * ld + j if ROWMAJOR else j * ld + i
                if SH32:
                    v = ldx(x, at) - ldx(p32, P_SH32 + j)
                else:
                    v = float32(ldx(x, at) - ldx(p64, P_SH64 + j))
            px[q] = v
        for q in range(CQ):
            j = j0 + ck + q * CSTEP
            v = float32(0.0)
            if j < M_C:
                v = ldx(cmg, j * KPG + ct * BN + cr)
            pc[q] = v

    return inline_device(km_slice_loads)


@functools.lru_cache(maxsize=None)
def row_verdicts(slots: int, tolf, tiny, big, delta: bool, bounds: bool = False, cascade: bool = False):
    """The device function that ends a row tile of a screen: each row's label, or its flag.

    Called by every thread of the block, after the tile's last centre tile:
    ``yp`` is the thread's part of ``|y|^2`` of the row it staged (rows ``tid % BM``,
    attribute groups ``tid // BM``); ``sb1``, ``sb2``, ``si1`` (``slots * BM``) hold
    each slot's best, second best and best centre of each row (slot ``t``, row ``r``
    at ``t * BM + r``).  Thread ``r < BM`` merges row ``r``'s slots and keeps the
    label where the gap beats ``tolf (|y|^2 + zlim) + tiny``: the float32 screen's
    certificate (:func:`.kernels.certificate`) or the tensor cores'
    (:func:`.tensor.certificate`).  Writes ``newlab`` and the flagged rows as the
    screens' docstrings say (``delta``: only changed certified rows are flagged).  The
    tile's rows are ``row0 ..`` of ``nrow``: rows ``idx[row0 ..]`` where ``gat`` (the rows the
    bounds test listed, or the TF32 screen left), else themselves; with ``bounds`` each row's
    kept bounds go to ``ub``, ``lb`` (:func:`.bounds.row_bounds`).  With ``cascade`` (the TF32
    screen's) a row the certificate leaves goes to ``cas`` (counted at ``ctr[cslot]``) for the
    float32 screen instead of the exact kernel's ``flags``.
    """
    SLOTS, DELTA, BOUNDS, CASCADE = int(slots), bool(delta), bool(bounds), bool(cascade)
    TOLF, TINY, BIG = np.float32(tolf), np.float32(tiny), np.float32(big)
    XSTEP = NT // BM

    def km_screen_verdicts(sb1, sb2, si1, syy, yp, zlim, row0, nrow, labels, newlab, flags, ctr, fslot, idx, ub, lb,
                           gat, cas, cslot):
        tid = cuda.threadIdx.x
        xr = tid % BM
        xk = tid // BM
        # |y|^2 of each row: the partial sums of the threads that staged its attributes
        if tid < BM:
            stx(syy, xr, yp)
        cuda.syncthreads()
        for h in range(1, XSTEP):
            if xk == h:
                stx(syy, xr, ldx(syy, xr) + yp)
            cuda.syncthreads()
        if tid < BM:
            m1, m2, mi = merge_slots(sb1, sb2, si1, SLOTS, tid)  # every slot's centres of this row
            p2 = row0 + tid
            if p2 < nrow:
                i2 = tile_row(p2, nrow, idx, gat)
                yy = ldx(syy, tid)
                scale = yy + zlim
                tol = TOLF * scale + TINY
                lab = -1
                certified = m2 - m1 > tol and scale < BIG
                if BOUNDS:
                    store_row_bounds(ub, lb, i2, certified, yy, m1, m2, tol)
                if certified:
                    lab = mi
                    if DELTA:
                        # unchanged: the kept sums hold it; changed: the exact kernel moves it
                        if ldx(labels, i2) != lab:
                            p = cuda.atomic.add(ctr, fslot, 1)
                            stx(flags, p, i2)
                        lab = -1
                elif CASCADE:
                    p = cuda.atomic.add(ctr, cslot, 1)
                    stx(cas, p, i2)
                else:
                    p = cuda.atomic.add(ctr, fslot, 1)
                    stx(flags, p, i2)
                stx(newlab, i2, lab)

    return inline_device(km_screen_verdicts)


@functools.lru_cache(maxsize=None)
def screen_kernel(storage: str, m_c: int, kpg_c: int, pack_c: tuple, delta: bool, bounds: bool = False,
                  rowmajor: bool = False, groups: bool = False):
    """Certified float32 nearest centre of every row, a register-blocked GEMM (see the module docstring).

    Arguments: x (m * ld,), n, ld, p32, p64 (step buffer views), cmg, ccg (from
    :func:`.gemmcentres.prep_kernel`), ctr, labels, newlab (n,), flags, fslot, then idx, ub, lb, gat,
    gslot as :func:`.kernels.fused_kernel` takes them (``bounds``: kept bounds written, and
    with ``gat`` only the listed rows searched), then the split's scratch: gb1, gb2 (float32),
    gbi (int32), each ``ucap * BM``, tcount (int32, ``ucap // 2 + 1``, zero between launches),
    ucap.  ``newlab[i]``: the certified label, or -1 (flagged, or in a ``delta`` step unchanged).
    ``rowmajor``: ``x`` is the row-major copy of the rows, ``ld = m`` (:func:`slice_loads`).

    With ``groups`` (the launch on the rows the bounds test lists) and fewer row tiles than
    blocks, each row tile's centre tiles are split into groups (:func:`centre_groups`), a unit
    of work each: a unit writes each row's best, second best and best centre among its
    centres to the scratch, and the tile's last unit to finish (a counter a tile, which it
    sets back to zero) merges them and gives the verdicts.  The candidates merge as the slots
    of one block do (lowest value, then lowest index; the second best the least of the rest):
    the same labels and flags whatever the split.
    """
    M_C, KPG = int(m_c), int(kpg_c)
    DELTA = delta
    L = PackLayout(*pack_c)
    P_ZL = int(L.p32_zl)
    TX = BN // 8
    HM, HN = BM // 2, BN // 2
    NCT = KPG // BN
    NST = -(-M_C // BK)
    XQ = BK * BM // NT
    CQ = BK * BN // NT
    XSN, CSN = BK * BM, BK * BN
    XS2, CS2, MN = 2 * XSN, 2 * CSN, TX * BM
    XSTEP, CSTEP = NT // BM, NT // BN
    BOUNDS = bool(bounds)
    verdicts = row_verdicts(TX, *certificate(M_C), DELTA, BOUNDS)  # the fused kernel's certificate, the same rows flagged
    loads = slice_loads(storage, M_C, KPG, pack_c, rowmajor)
    INF = np.float32(np.inf)
    GMAX = min(NCT, TX)  # a unit's candidates take one slot of the merging block
    GROUPS = bool(groups)
    merge_units = unit_merge(TX)

    def km_gemm_screen(x, n, ld, p32, p64, cmg, ccg, ctr, labels, newlab, flags, fslot, idx, ub, lb, gat, gslot,
                       gb1, gb2, gbi, tcount, ucap):
        xs = cuda.shared.array(XS2, dtype=float32, alignment=_ALIGN)
        cs = cuda.shared.array(CS2, dtype=float32, alignment=_ALIGN)
        sb1 = cuda.shared.array(MN, dtype=float32)
        sb2 = cuda.shared.array(MN, dtype=float32)
        si1 = cuda.shared.array(MN, dtype=int32)
        syy = cuda.shared.array(BM, dtype=float32)
        last = cuda.shared.array(1, dtype=int32)
        tid = cuda.threadIdx.x
        tx = tid % TX
        ty = tid // TX
        xr = tid % BM  # the row this thread stages
        xk = tid // BM  # its first attribute of a slice (then every XSTEP)
        cr = tid % BN
        ck = tid // BN
        acc = cuda.local.array(64, dtype=float32)
        av = cuda.local.array(8, dtype=float32)
        cv = cuda.local.array(8, dtype=float32)
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
            for r in range(8):
                rr = half_index(ty, r, HM)
                stx(sb1, tx * BM + rr, INF)
                stx(sb2, tx * BM + rr, INF)
                stx(si1, tx * BM + rr, 0)
            i = tile_row(row0 + xr, nrow, idx, gat)
            yp = float32(0.0)
            for ct in range(ct0, (grp + 1) * NCT // ng):
                cb = ct * BN  # the tile's first centre
                # the accumulators start at |z_c|^2 (one more term of the sum, in an order the certificate
                # allows): the fold adds nothing
                for c in range(8):
                    zc = ldx(ccg, cb + half_index(tx, c, HN))
                    for r in range(8):
                        acc[r * 8 + c] = zc
                for st in range(NST + 1):
                    # load slice st into registers, multiply slice st - 1, store slice st
                    if st < NST:
                        loads(x, ld, i, p32, p64, cmg, st * BK, ct, xk, ck, cr, px, pc)
                    if st > 0:
                        bx = ((st - 1) & 1) * XSN
                        bc = ((st - 1) & 1) * CSN
                        for kk in range(BK):
                            av[0], av[1], av[2], av[3] = ld4(xs, bx + kk * BM + ty * 4)
                            av[4], av[5], av[6], av[7] = ld4(xs, bx + kk * BM + HM + ty * 4)
                            cv[0], cv[1], cv[2], cv[3] = ld4(cs, bc + kk * BN + tx * 4)
                            cv[4], cv[5], cv[6], cv[7] = ld4(cs, bc + kk * BN + HN + tx * 4)
                            for r in range(8):
                                for c in range(8):
                                    acc[r * 8 + c] += av[r] * cv[c]
                    if st < NST:
                        bx = (st & 1) * XSN
                        bc = (st & 1) * CSN
                        for q in range(XQ):
                            stx(xs, bx + (xk + q * XSTEP) * BM + xr, px[q])
                            if ct == ct0:
                                yp += px[q] * px[q]
                        for q in range(CQ):
                            stx(cs, bc + (ck + q * CSTEP) * BN + cr, pc[q])
                    cuda.syncthreads()
                # this centre tile into each row's best and second best (strict '<': lowest index
                # on ties; an exact tie leaves a gap of 0 and is flagged, as does a NaN estimate:
                # m2 = min(m2, max(m1, d)) is then m1)
                for r in range(8):
                    rr = half_index(ty, r, HM)
                    m1 = ldx(sb1, tx * BM + rr)
                    m2 = ldx(sb2, tx * BM + rr)
                    mi = ldx(si1, tx * BM + rr)
                    for c in range(8):
                        d = acc[r * 8 + c]
                        mi = cb + half_index(tx, c, HN) if d < m1 else mi
                        m2 = fminf(m2, fmaxf(m1, d))
                        m1 = fminf(m1, d)
                    stx(sb1, tx * BM + rr, m1)
                    stx(sb2, tx * BM + rr, m2)
                    stx(si1, tx * BM + rr, mi)
            if ng == 1 or merge_units(sb1, sb2, si1, last, unit, tile, ng, gb1, gb2, gbi, tcount):
                verdicts(sb1, sb2, si1, syy, yp, zlim, row0, nrow, labels, newlab, flags, ctr, fslot, idx, ub, lb,
                         gat, flags, fslot)
            cuda.syncthreads()

    if SIM:
        return cuda.jit(km_gemm_screen)
    return cuda.jit(km_gemm_screen, fastmath=False, max_registers=MAXREG)


def split_scratch(grid: int, kpg: int, groups: bool = True) -> tuple:
    """The float32 screen's scratch for ``grid`` blocks and ``kpg`` centre slots: ``(gb1, gb2, gbi, tcount,
    ucap)`` (see :func:`screen_kernel`): room for two waves of units of the most groups (D: 6.5 MB), none
    where not ``groups`` (the screen then never splits)."""
    ucap = 2 * int(grid) * min(kpg // BN, BN // 8)
    if ucap < 2 or not groups:  # one centre tile: never split
        ucap = 0
    units = max(1, ucap) * BM
    return (cuda.device_array(units, dtype=np.float32), cuda.device_array(units, dtype=np.float32),
            cuda.device_array(units, dtype=np.int32), cuda.to_device(np.zeros(ucap // 2 + 1, dtype=np.int32)), ucap)


def _screen_grid(limits, smem: int, rows: int) -> int:
    """A screen's blocks: two a multiprocessor where their shared memory ``smem`` fits (at most 128 registers
    each), at most one a row tile."""
    per_sm = 2 if limits.smem_sm >= 2 * (smem + 1024) else 1
    return max(1, min(-(-rows // BM), 2 if SIM else per_sm * limits.sm_count))


def step_launches(limits, storage: str, weighted: bool, k: int, m: int, ld: int, plan, pack, x, xr, rows: int,
                  labels, flags, w, fslot: int, stream, delta: bool, fast: bool, tf32: bool, bounds=None,
                  dummies=None, groups: bool = True, cascade: bool = False) -> Steps:
    """The prepared launches of one step with ``k`` centres for ``rows`` rows: the shift and centre data,
    screen and (full steps) sums.

    ``plan`` and ``pack``: the step's plan and step buffer (:mod:`.plan`, :class:`.launch.Pack`);
    the screen on the tensor cores with ``tf32`` (:mod:`.tensor`), and with ``cascade`` the float32
    screen after it on the rows it leaves, else in float32; ``xr`` the
    rows' row-major copy (:meth:`.rows.DeviceRows.row_major`) or None, which a full step's sums and
    the screen of the listed rows read rows from where there is one; the other arguments as the
    fused kernel's launch takes them.
    ``bounds`` (a :class:`.bounds.DeviceBounds`, resident rows): the screen writes the kept bounds,
    and the result's ``listed`` launches search only the rows the bounds test lists; else
    ``dummies`` (int32, float32 device arrays) stand in for the bounds' arrays.  ``groups``: the screen
    of the listed rows (and the float32 screen of the rows TF32 left) may split the centre tiles of few
    row tiles over the blocks (:func:`centre_groups`; ``tune={"centre_groups": False}`` keeps a row tile
    on one block).
    """
    kp = plan.nct * plan.TC
    kpg = padded_centres(kp)
    layout = tuple(pack.layout)
    cmg = cuda.device_array(m * kpg, dtype=np.float32)
    ccg = cuda.device_array(kpg, dtype=np.float32)
    ct = cuda.device_array(m * kpg, dtype=np.float64)  # the exact kernel's centres, attribute-major
    newlab = cuda.device_array(max(1, rows), dtype=np.int32)
    out = []
    if not pack.on_device:
        raise ValueError("gemm.step_launches: the step buffer must leave the centre data to the device "
                         "(Pack on_device)")
    hspec = (storage, int(k), m, layout)
    hk = shift_kernel(*hspec)
    hargs = (pack.p32, pack.dev)
    out.append(Launch(hk, compiled("gemm_shift", hspec, hk, hargs), hargs, shift_grid(m), SHIFT_NT, 0, stream,
                      fast))
    rspec = (storage, int(k), m, kpg, layout)
    rk = prep_kernel(*rspec)
    rargs = (pack.p32, pack.dev, cmg, ccg, ct)
    out.append(Launch(rk, compiled("gemm_prep", rspec, rk, rargs), rargs, 1 if SIM else kpg // PREP_C,
                      PREP_C * PREP_J, 0, stream, fast))
    from . import tensor

    keeps = bounds is not None
    sspec = (storage, m, kpg, layout, delta, keeps)
    tail = (bounds.idx, bounds.ub, bounds.lb) if keeps else (dummies[0], dummies[1], dummies[1])
    head = (x, int(rows), int(ld), pack.p32, pack.dev, cmg, ccg, pack.ctr, labels, newlab, flags, int(fslot), *tail)
    # the listed rows (and the rows a cascading TF32 screen leaves) from the row-major copy where there is one
    lhead = (xr, int(rows), int(m)) + head[3:] if xr is not None else head
    f32_grid = _screen_grid(limits, SCREEN_SMEM, rows)
    if tf32:
        cascade = bool(cascade)
        grid = _screen_grid(limits, tensor.SCREEN_SMEM, rows)
        # without the cascade the list and its count are placeholders the kernel never touches
        cas = cuda.device_array(max(1, rows), dtype=np.int32) if cascade else dummies[0]
        ctail = (cas, int(pack.cslot))
        sspec1 = sspec + (False, cascade, False)
        sk = tensor.screen_kernel(*sspec1)
        sargs = head + (0, int(pack.gslot)) + ctail + split_scratch(grid, kpg, False)
        skobj = compiled("tf32_screen", sspec1, sk, sargs)
        screens = [Launch(sk, skobj, sargs, grid, NT, 0, stream, fast)]
        lscreens = None
        if keeps:
            # the listed rows: few row tiles have their centre tiles split over the blocks
            groups = bool(groups)
            lspec = sspec + (xr is not None, cascade, groups)
            lk = tensor.screen_kernel(*lspec)
            largs = lhead + (1, int(pack.gslot)) + ctail + split_scratch(grid, kpg, groups)
            lscreens = [Launch(lk, compiled("tf32_screen", lspec, lk, largs), largs, grid, NT, 0, stream, fast)]
        if cascade:
            # the float32 screen of the rows TF32 left (their count read on the device), its centre tiles in
            # groups where they are few; what it leaves goes to the exact kernel
            fspec = sspec + (xr is not None, bool(groups))
            fk = screen_kernel(*fspec)
            fargs = (lhead[:12] + (cas,) + tail[1:] + (1, int(pack.cslot))
                     + split_scratch(f32_grid, kpg, bool(groups)))
            follow = Launch(fk, compiled("gemm_screen", fspec, fk, fargs), fargs, f32_grid, NT, 0, stream, fast)
            screens.append(follow)
            if keeps:
                lscreens.append(follow)
    else:
        grid = f32_grid
        sk = screen_kernel(*sspec)
        # the float32 screen of the listed rows splits the centre tiles of few row tiles over the blocks
        groups = bool(groups) and keeps
        split = split_scratch(grid, kpg, groups)
        sargs = head + (0, int(pack.gslot)) + split
        skobj = compiled("gemm_screen", sspec, sk, sargs)
        screens = [Launch(sk, skobj, sargs, grid, NT, 0, stream, fast)]
        lscreens = None
        if keeps:
            extra = (xr is not None, groups)
            lk, lobj = sk, skobj
            largs = lhead + (1, int(pack.gslot)) + split
            if any(extra):
                lk = screen_kernel(*sspec, *extra)
                lobj = compiled("gemm_screen", sspec + extra, lk, largs)
            lscreens = [Launch(lk, lobj, largs, grid, NT, 0, stream, fast)]
    out.extend(screens)
    listed = out[:2] + lscreens if keeps else None
    if not delta:
        sums = bylabel.launches(limits, storage, weighted, k, m, ld, pack, x, xr, rows, labels, newlab, w, stream,
                                fast)
        out.extend(sums)
        if keeps:
            listed.extend(sums)
    steps = Steps(out, grid)
    steps.centres_t = (ct, kpg)
    if keeps:
        steps.listed = Steps(listed, grid)
        steps.newlab = None if delta else newlab
    return steps
