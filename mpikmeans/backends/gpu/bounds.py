"""Bounds kept per row on the device: pass 1 searches only the rows whose bound fails.

Pass 1 (the certified float32 screen of :mod:`.kernels`) is most of a step's time
wherever K x M is large (5e6 x 100, K = 50: 1.7 of 3.1 ms a full step on the H100),
and once the centres settle almost every row keeps its centre.  As the CPU backend
does (:mod:`mpikmeans.backends.cpu.bounds`, after Hamerly, "Making k-means even faster",
SDM 2010), each row keeps two numbers from the step that last searched it:

* ``ub``, an upper bound on its distance to its own centre ``a``,
* ``lb``, a lower bound on its distance to every other centre,

both float32, ``ub`` rounded up and ``lb`` down.  When the centres move by at most
``delta_j`` (:func:`moves_kernel`, on the device), the triangle inequality gives ``ub + delta_a``
and ``lb - max_{j != a} delta_j`` as the new bounds, and a row whose new upper bound is
below its new lower bound, by a relative margin :data:`MARGIN`, keeps ``a``: the test
kernel (:func:`test_kernel`) writes its new bounds and, in a full step, its label for
the summing kernel; every other row goes into a list, in row order, that pass 1
searches instead of all rows (``gat`` in :func:`.kernels.fused_kernel`).  Unlike the
CPU's, the upper bound is not tightened by the exact distance to the own centre
(that would read the row, which is what pass 1's search costs on the device).

Rigour, so that a kept row has the label of the exact float64 kernels:

* pass 1 certifies a row when its float32 gap exceeds ``tol``, a bound on the error
  of two estimates and of ``|y|^2``; its bounds are ``sqrt(|y|^2 + b1 + 1.5 tol)`` and
  ``sqrt(|y|^2 + b2 - 1.5 tol)`` computed in float64 (:func:`row_bounds`), a row it
  does not certify gets ``ub = inf``, ``lb = 0`` (searched at the next step);
* a move is a rigorous upper bound, as the CPU backend's ``centre_moves``: the square root of the
  float64 sum of squared differences (any order: its relative error is under ``(m + 2) u``) times
  ``1 + 4 (m + 4) u``, plus what attributes below float64's normal range can add; made on the device
  from the centres the bounds hold for, which it keeps (:func:`moves_kernel`);
* ``MARGIN = 2^-20`` relative on either side covers the float64 arithmetic of the test
  and the exact kernels' own rounding (``(m + 3) 2^-53`` relative: far smaller for any
  M that fits a device), so ``fl(d_a) < fl(d_j)`` for every other ``j`` (no tie passes);
* stores round outward by ``2^-22`` (and ``ub`` adds ``2^-120``: a subnormal float32
  cannot round it to 0); a non-finite move or bound fails the test.

The bounds are valid only for the centres of the step that wrote them (with the
same K) and the labels that step left: the backend's kept sums hold those centres
(:mod:`.kept`), and :class:`DeviceBounds` is invalidated by anything else that touches
the labels.
"""

from __future__ import annotations

import functools
import math

import numpy as np

from ..cpu.bounds import LOWER_MIN, move_margins
from .device import SIM, cuda, inline_device
from .intrinsics import ldx, stx
from .launch import Launch, Steps

if cuda is not None:
    from numba import float32, float64, int32, int64

#: relative margin of the test on either side
MARGIN = 2.0 ** -20
#: outward rounding of a stored bound
STORE = 2.0 ** -22
#: added to an upper bound before it is stored (a subnormal float32 could round it to 0)
TINY_UP = 2.0 ** -120
#: lower bounds are stored at most this (float32 stays finite)
LB_MAX = 3.0e38
#: the certificate's tolerance covers two estimates; each bound takes this much of it
TOL_SHARE = 1.5
#: threads a block and rows a thread of the test kernel (a thread's rows a block apart; with them consecutive,
#: 8 and 16 rows measured no faster on the H100: ``bench/results/fullstep_H100_2026-11-26_s11_test_recheck.log``)
TEST_NT = 32 if SIM else 256
TEST_RPT = 4
#: bits of a field of the test's packed scan: a thread's failures counted for each of its rows, a field each
#: (a field's count is at most TEST_NT)
FIELD_BITS = TEST_NT.bit_length()


def test_rows_max() -> int:
    """The most rows a thread of the bounds test can take: fields of its packed scan in 63 bits."""
    return 63 // FIELD_BITS


#: threads a block of the moves kernel (a warp a centre) and of the drops kernel
MOVES_NT = 64 if SIM else 256
#: attributes a lane of the moves kernel loads together (its chain: one load and addition at a time)
MOVES_BATCH = 8


@functools.lru_cache(maxsize=None)
def moves_kernel():
    """Build the centres' moves (one compile: nothing is specialised).

    Kernel arguments: ``p64`` float64, the step buffer, whose centres (k, m) start at ``c0``;
    ``prev`` float64 (k m,), the centres the bounds hold for; ``mv`` float64 (2k,); ``k``, ``m``;
    ``eps`` and ``floor`` (the CPU bounds' :func:`~mpikmeans.backends.cpu.bounds.move_margins`); ``test``.
    Where ``test``, ``mv[i]`` becomes an upper bound on how far centre ``i`` moved from ``prev``:
    ``sqrt(s) (1 + eps) + floor`` with ``s`` the float64 sum of squared differences (a warp a centre,
    its lanes' partial sums added in lane order; ``inf`` where that is not finite), as the CPU
    backend's ``centre_moves`` but in another order of the additions, which its margin covers.  In
    every case ``prev`` then takes this step's centres: the bounds the step writes hold for them.
    The moves took the H100 host 0.15-0.2 ms a step at K x M = 257,000 (the GPU idle meanwhile,
    ``bench/experiments/host_profile.py``).
    """
    NT = MOVES_NT
    W = NT // 32
    MB = MOVES_BATCH
    F64_INF = np.float64(np.inf)

    def km_moves(p64, c0, prev, mv, k, m, eps, floor, test):
        part = cuda.shared.array(NT, dtype=float64)
        tid = cuda.threadIdx.x
        lane = tid % 32
        i = cuda.blockIdx.x * W + tid // 32
        s = 0.0
        cv = cuda.local.array(MB, dtype=float64)
        pv = cuda.local.array(MB, dtype=float64)
        if i < k:
            base = i * m
            for jb in range(lane, m, 32 * MB):
                # a lane's MB values (and the kept ones) loaded before any is used or overwritten: one
                # at a time, each waited for its load, behind the last store to ``prev``
                for q in range(MB):
                    j = jb + 32 * q
                    if j < m:
                        cv[q] = p64[c0 + base + j]
                        if test != 0:
                            pv[q] = prev[base + j]
                for q in range(MB):
                    j = jb + 32 * q
                    if j < m:
                        if test != 0:
                            d = cv[q] - pv[q]
                            s += d * d
                        prev[base + j] = cv[q]
        part[tid] = s
        cuda.syncthreads()
        if test != 0 and lane == 0 and i < k:
            t = 0.0
            for q in range(32):
                t += part[tid + q]
            v = math.sqrt(t) * (1.0 + eps) + floor
            mv[i] = v if v - v == 0.0 else F64_INF  # inf - inf and NaN - NaN are NaN

    return cuda.jit(km_moves)


@functools.lru_cache(maxsize=None)
def drops_kernel():
    """Build the bounds' drops, one block: ``mv[k + a]`` becomes the largest of ``mv[j]``, ``j != a``,
    plus ``lower_min`` (``lower_min`` alone for K = 1), as the CPU backend's ``bound_drops``.

    Kernel arguments: ``mv`` float64 (2k,), its first half the moves (:func:`moves_kernel`); ``k``;
    ``lower_min``.  The largest move and its lowest index, then the largest of the others, by
    reductions in shared memory.
    """
    NT = MOVES_NT

    def km_drops(mv, k, lower_min):
        top = cuda.shared.array(NT, dtype=float64)
        at = cuda.shared.array(NT, dtype=int64)
        tid = cuda.threadIdx.x
        best = -1.0
        bi = k
        for i in range(tid, k, NT):
            v = mv[i]
            if v > best:
                best = v
                bi = i
        top[tid] = best
        at[tid] = bi
        cuda.syncthreads()
        h = NT // 2
        while h > 0:
            if tid < h:
                v, i = top[tid + h], at[tid + h]
                if v > top[tid] or (v == top[tid] and i < at[tid]):
                    top[tid] = v
                    at[tid] = i
            cuda.syncthreads()
            h //= 2
        first = top[0]
        which = at[0]
        cuda.syncthreads()
        second = 0.0  # K = 1: no other centre (every move is at least 0)
        for i in range(tid, k, NT):
            if i != which:
                second = max(second, mv[i])
        top[tid] = second
        cuda.syncthreads()
        h = NT // 2
        while h > 0:
            if tid < h:
                top[tid] = max(top[tid], top[tid + h])
            cuda.syncthreads()
            h //= 2
        second = top[0]
        for a in range(tid, k, NT):
            mv[k + a] = (second if a == which else first) + lower_min

    return cuda.jit(km_drops)


@inline_device
def row_bounds(yy, b1, b2, tol):  # pragma: no cover - compiled
    """A certified row's ``(ub, lb)`` as float32 (see the module notes), from pass 1's float32 values:
    ``yy`` = ``|y|^2``, ``b1``/``b2`` the best and second-best estimates, ``tol`` the certificate."""
    t = float64(tol) * TOL_SHARE
    yd = float64(yy)
    up = yd + float64(b1) + t
    lo = yd + float64(b2) - t
    u = math.sqrt(up if up > 0.0 else 0.0) * (1.0 + MARGIN) + TINY_UP
    lv = math.sqrt(lo if lo > 0.0 else 0.0) * (1.0 - MARGIN)
    return float32(u), float32(lv if lv < LB_MAX else LB_MAX)


@inline_device
def listed_rows(n, ctr, gat, gslot):  # pragma: no cover - compiled
    """The rows pass 1 searches: all ``n``, or where ``gat`` the ``ctr[gslot]`` the bounds test listed."""
    return ctr[gslot] if gat != 0 else n


@inline_device
def tile_row(p, nrow, idx, gat):  # pragma: no cover - compiled
    """The row at position ``p`` of pass 1's rows (``idx[p]`` where ``gat``); past the end the last one
    (loaded and ignored)."""
    q = p if p < nrow else nrow - 1
    return int64(ldx(idx, q)) if gat != 0 else int64(q)


@inline_device
def store_row_bounds(ub, lb, i, certified, yy, b1, b2, tol):  # pragma: no cover - compiled
    """Row ``i``'s bounds into ``ub``, ``lb`` after pass 1: :func:`row_bounds` where it was certified, else
    ``inf`` and 0 (the test fails: searched again at the next step)."""
    if certified:
        u, lv = row_bounds(yy, b1, b2, tol)
    else:
        u = float32(np.inf)
        lv = float32(0.0)
    stx(ub, i, u)
    stx(lb, i, lv)


@functools.lru_cache(maxsize=None)
def test_kernel(rpt: int = TEST_RPT):
    """Build the bounds test for ``rpt`` rows a thread (one compile: nothing else is specialised;
    at most :func:`test_rows_max`).

    Kernel arguments: ``labels`` int32 (n,); ``ub``, ``lb`` float32 (n,), updated for kept
    rows; ``mv`` float64 (2k,): each centre's move (:func:`moves_kernel`), then the most the others
    moved (:func:`drops_kernel`); ``n``, ``k`` int64; ``idx``
    int32 (n,), the failed rows (in row order within each block's tile); ``ctr`` int64 and ``gslot``:
    ``ctr[gslot]`` counts them (zero on entry); ``newlab`` int32 (n,): a kept row's label where
    ``write_new`` (the split full step's input to the summing kernel).

    A block takes ``TEST_NT x rpt`` consecutive rows at a time, thread ``t`` rows ``t, t + TEST_NT,
    ...`` of them, so that a warp's loads and stores are 32 consecutive rows.  (With a thread's rows
    consecutive each store wrote ``rpt`` times the sectors it filled: A's late steps' test was L2-bound,
    87 % of its throughput at 34 % of DRAM's, 94 us,
    ``bench/results/ncu_step_kernels_A_f32_H100_2026-11-26_s11_late.txt``; now 55 us.)
    The failed rows are placed by one inclusive scan in shared memory (the simulator has no warp
    votes) of each thread's failures packed a field a row slot: field ``r`` of the scan counts the
    failed rows ``r TEST_NT + t'`` for ``t' <= t``, so the rows keep their order; one global atomic a tile.
    """
    NT = TEST_NT
    RPT = int(rpt)
    if not 1 <= RPT <= test_rows_max():
        raise ValueError(f"test_kernel: rpt must be 1 to {test_rows_max()}, not {rpt}")
    W = FIELD_BITS
    FMASK = (1 << W) - 1
    TILE = NT * RPT
    UP = 1.0 + MARGIN
    DOWN = 1.0 - MARGIN
    SUP = 1.0 + STORE
    SDOWN = 1.0 - STORE

    def km_bounds_test(labels, ub, lb, mv, n, k, idx, ctr, gslot, newlab, write_new):
        scan = cuda.shared.array(NT, dtype=int64)
        base_s = cuda.shared.array(1, dtype=int64)
        tid = cuda.threadIdx.x
        ntiles = (n + TILE - 1) // TILE
        for tile in range(cuda.blockIdx.x, ntiles, cuda.gridDim.x):
            t0 = tile * TILE
            packed = int64(0)  # field r: row t0 + r NT + tid failed
            for r in range(RPT):
                i = t0 + r * NT + tid
                if i < n:
                    a = labels[i]
                    keep = False
                    if a >= 0:
                        u = float64(ub[i]) + mv[a]
                        lo = float64(lb[i]) - mv[k + a]
                        if u * UP < lo * DOWN:
                            keep = True
                            ub[i] = float32(u * SUP + TINY_UP)
                            lb[i] = float32(lo * SDOWN)
                            if write_new != 0:
                                newlab[i] = a
                    if not keep:
                        packed += int64(1) << (W * r)
            # inclusive scan of the packed counts (Hillis-Steele; no field carries: each is at most NT)
            scan[tid] = packed
            cuda.syncthreads()
            off = 1
            while off < NT:
                v = scan[tid]
                if tid >= off:
                    v += scan[tid - off]
                cuda.syncthreads()
                scan[tid] = v
                cuda.syncthreads()
                off *= 2
            tot = scan[NT - 1]
            if tid == NT - 1:
                all_failed = int64(0)
                for r in range(RPT):
                    all_failed += (tot >> (W * r)) & FMASK
                base_s[0] = cuda.atomic.add(ctr, gslot, all_failed)
            cuda.syncthreads()
            if packed != 0:
                before = scan[tid] - packed  # this thread's exclusive prefix, field by field
                p0 = base_s[0]
                for r in range(RPT):
                    if (packed >> (W * r)) & 1:
                        idx[p0 + ((before >> (W * r)) & FMASK)] = int32(t0 + r * NT + tid)
                    p0 += (tot >> (W * r)) & FMASK
            cuda.syncthreads()

    return cuda.jit(km_bounds_test)


#: bytes a row of the kept bounds takes on the device (``ub``, ``lb``, the list's entry)
ROW_BYTES = 12
#: FMAs of pass 1 that cost about as much as reading a byte (H100: 33.5 TFMA/s FP32 against 3.35 TB/s)
FMA_PER_BYTE = 10
#: pass 1's cost of a row, in bytes read (its values, or its K x M FMAs at FMA_PER_BYTE), above which
#: the bounds pay: the test reads and writes ROW_BYTES and more a row, and a row it fails is read
#: again scattered.  H200, `bench fullstep` (bench/results/fullstep_H200_2026-11-26_bounds.*): 5e6 x 100,
#: K = 50 (400 B f32, 5000 FMAs) full step 3.08 -> 1.97 ms; 1e8 x 8, K = 16 (32 B, 128 FMAs) 4.08 -> 4.97
MIN_ROW_COST = 8 * ROW_BYTES


def bounds_pay(k: int, m: int, dtype: str) -> bool:
    """Whether keeping bounds pays for rows of ``m`` attributes stored as ``dtype`` and ``k`` centres."""
    return max(m * np.dtype(dtype).itemsize, k * m / FMA_PER_BYTE) >= MIN_ROW_COST


def bounds_wanted(want, k: int, m: int, dtype: str) -> bool:
    """Whether a step whose pass 1 can keep bounds keeps them: ``want`` is ``tune["bounds"]`` (True, False
    or "auto": where :func:`bounds_pay`)."""
    return want is not False and (want is True or bounds_pay(k, m, dtype))


#: a test that leaves more than this share of the rows to pass 1 is not run at the next step (a
#: full pass 1 then refreshes every bound, and the step after it tests again)
BACKOFF_SHARE = 0.75
#: ... nor after a step that changed more than this share of the labels: the centres still move
#: far (5e6 x 100, K = 50 from the first K rows: the second step's test kept no row)
CHANGED_SHARE = 0.2


class DeviceBounds:
    """The kept bounds of one backend's resident rows, and whether they hold for the next step.

    Parameters
    ----------
    n : int
        Rows on the device.

    Attributes
    ----------
    ub, lb : device arrays, float32 (n,)
    idx : device array, int32 (n,)
        The rows the last test left to pass 1.
    k : int or None
        The number of centres the bounds hold for, with the centres of the backend's last step
        (its kept sums', :mod:`.kept`); None: they hold for nothing.
    """

    def __init__(self, n: int):
        self.n = int(n)
        self.ub = cuda.device_array(max(1, self.n), dtype=np.float32)
        self.lb = cuda.device_array(max(1, self.n), dtype=np.float32)
        self.idx = cuda.device_array(max(1, self.n), dtype=np.int32)
        self.k = None
        self.skip_next = False
        self._mv = {}  # (k, m) -> the device's moves and kept centres (moves_buffers)

    def invalidate(self) -> None:
        """Nothing kept holds any more (labels reset, rows reloaded, a step that wrote no bounds)."""
        self.k = None
        self.skip_next = False

    def holds_for(self, k: int) -> bool:
        """Whether the kept bounds hold for a step with ``k`` centres."""
        return self.k == k

    def wanted(self, k: int) -> bool:
        """Whether the next step with ``k`` centres should test the bounds (they hold, no back-off)."""
        return self.holds_for(k) and not self.skip_next

    def test_launch(self, labels, k: int, m: int, pack, newlab, dummy_i32, limits, stream, fast: bool,
                    rpt: int = TEST_RPT) -> Steps:
        """The prepared bounds test of a state with ``k`` centres of ``m`` attributes and step buffer
        ``pack`` (a :class:`.launch.Pack`), after the centres' moves from those the bounds hold for
        (:func:`moves_kernel`, :func:`drops_kernel`); ``newlab``: the full step's label array, or None
        (incremental: the int32 ``dummy_i32`` stands in); ``rpt`` rows a thread (``tune={"bounds_rpt": R}``)."""
        from .compiled import compiled

        rpt = max(1, min(int(rpt), test_rows_max()))  # the fields of the test's packed scan
        kern = test_kernel(rpt)
        dmv, _ = self.moves_buffers(k, m)
        write = newlab is not None
        args = (labels, self.ub, self.lb, dmv, int(self.n), int(k), self.idx, pack.ctr, int(pack.gslot),
                newlab if write else dummy_i32, int(write))
        tiles = -(-self.n // (TEST_NT * rpt))
        grid = max(1, min(tiles, 2 if SIM else 8 * limits.sm_count))
        dk = drops_kernel()
        dargs = (dmv, int(k), float(LOWER_MIN))
        drops = Launch(dk, compiled("bounds_drops", (), dk, dargs), dargs, 1, MOVES_NT, 0, stream, fast)
        test = Launch(kern, compiled("bounds_test", (rpt,), kern, args), args, grid, TEST_NT, 0, stream, fast)
        return Steps([self.moves_launch(k, m, pack, stream, fast, True), drops, test], grid)

    def moves_launch(self, k: int, m: int, pack, stream, fast: bool, test: bool) -> Launch:
        """The prepared :func:`moves_kernel` of a state with ``k`` centres and step buffer ``pack``: the
        moves where ``test``, and in either case the kept centres set to the step's (every step that
        writes bounds launches it)."""
        from .compiled import compiled

        kern = moves_kernel()
        dmv, prev = self.moves_buffers(k, m)
        eps, floor = move_margins(int(m))
        args = (pack.dev, int(pack.layout.p64_c64), prev, dmv, int(k), int(m), eps, floor, int(test))
        w = MOVES_NT // 32
        return Launch(kern, compiled("bounds_moves", (), kern, args), args, -(-int(k) // w), MOVES_NT, 0, stream,
                      fast)

    def moves_buffers(self, k: int, m: int):
        """The device buffers of ``k`` centres of ``m`` attributes: the moves float64 (2k,) and the centres
        the bounds hold for, float64 (k m,)."""
        buf = self._mv.get((k, m))
        if buf is None:
            buf = (cuda.device_array(2 * k, dtype=np.float64), cuda.device_array(max(1, k * m), dtype=np.float64))
            self._mv[(k, m)] = buf
        return buf

    def kept(self, k: int, searched: int, tested: bool, changed: int = 0) -> None:
        """A step with ``k`` centres wrote every row's bounds (``searched`` rows by pass 1, ``changed``
        labels changed)."""
        self.k = k
        # a test that left most rows to pass 1 cost more than it saved, and after many changed labels
        # one would: skip one test
        self.skip_next = (tested and searched > BACKOFF_SHARE * self.n) or changed > CHANGED_SHARE * self.n
