"""Bounds kept per row on the device: pass 1 searches only the rows whose bound fails.

Pass 1 (the certified float32 screen of :mod:`.kernels`) is most of a step's time
wherever K x M is large (5e6 x 100, K = 50: 1.7 of 3.1 ms a full step on the H100),
and once the centres settle almost every row keeps its centre.  As the CPU backend
does (:mod:`mpikmeans.backends.cpu.bounds`, after Hamerly, "Making k-means even faster",
SDM 2010), each row keeps two numbers from the step that last searched it:

* ``ub``, an upper bound on its distance to its own centre ``a``,
* ``lb``, a lower bound on its distance to every other centre,

both float32, ``ub`` rounded up and ``lb`` down.  When the centres move by at most
``delta_j`` (:func:`moves_and_others`), the triangle inequality gives ``ub + delta_a``
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
* a move is ``centre_moves``' rigorous upper bound (the CPU backend's);
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

from ..cpu.bounds import bound_drops, centre_moves
from .device import SIM, cuda, inline_device
from .intrinsics import ldx, stx

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
#: threads a block and rows a thread of the test kernel (a thread's rows are consecutive; 8 and 16 rows
#: measured no faster on the H100: ``bench/results/fullstep_H100_2026-11-26_s11_test_recheck.log``)
TEST_NT = 32 if SIM else 256
TEST_RPT = 4


def moves_and_others(old: np.ndarray, new: np.ndarray) -> np.ndarray:
    """How far each centre moved and the most any other centre moved.

    Parameters
    ----------
    old, new : ndarray, shape (k, m), float64

    Returns
    -------
    ndarray, shape (2 k,), float64
        ``[delta_0 .. delta_{k-1}, max_{j != 0} delta_j .. max_{j != k-1} delta_j]``, rigorous
        upper bounds (``inf`` where a move is not finite), the second half as the CPU's bounds
        drop (:func:`~mpikmeans.backends.cpu.bounds.bound_drops`: a further ``1e-140``; that alone
        for K = 1).
    """
    d = centre_moves(old, new)
    return np.concatenate([d, bound_drops(d)])


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
    """Build the bounds test for ``rpt`` rows a thread (one compile: nothing else is specialised).

    Kernel arguments: ``labels`` int32 (n,); ``ub``, ``lb`` float32 (n,), updated for kept
    rows; ``mv`` float64 (2k,) from :func:`moves_and_others`; ``n``, ``k`` int64; ``idx``
    int32 (n,), the failed rows in row order; ``ctr`` int64 and ``gslot``: ``ctr[gslot]``
    counts them (zero on entry); ``newlab`` int32 (n,): a kept row's label where
    ``write_new`` (the split full step's input to the summing kernel).

    A block takes ``TEST_NT x rpt`` consecutive rows at a time, each thread ``rpt``
    consecutive ones; an exclusive scan of the threads' failed counts in shared
    memory (the simulator has no warp votes) places them, one global atomic a block.
    """
    NT = TEST_NT
    RPT = int(rpt)
    TILE = NT * RPT
    UP = 1.0 + MARGIN
    DOWN = 1.0 - MARGIN
    SUP = 1.0 + STORE
    SDOWN = 1.0 - STORE

    def km_bounds_test(labels, ub, lb, mv, n, k, idx, ctr, gslot, newlab, write_new):
        scan = cuda.shared.array(NT, dtype=int32)
        base_s = cuda.shared.array(1, dtype=int64)
        tid = cuda.threadIdx.x
        ntiles = (n + TILE - 1) // TILE
        for tile in range(cuda.blockIdx.x, ntiles, cuda.gridDim.x):
            r0 = tile * TILE + tid * RPT
            fails = 0
            fmask = 0  # bit r: row r0 + r failed
            for r in range(RPT):
                i = r0 + r
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
                        fails += 1
                        fmask |= 1 << r
            # inclusive scan of the threads' counts (Hillis-Steele)
            scan[tid] = fails
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
            if tid == NT - 1:
                base_s[0] = cuda.atomic.add(ctr, gslot, int64(scan[tid]))
            cuda.syncthreads()
            if fails > 0:
                p = base_s[0] + scan[tid] - fails
                for r in range(RPT):
                    if fmask & (1 << r):
                        idx[p] = int32(r0 + r)
                        p += 1
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
        self._mv = {}  # k -> (pinned host, device) move buffers

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

    def test_launch(self, labels, k: int, pack, newlab, dummy_i32, limits, stream, fast: bool,
                    rpt: int = TEST_RPT):
        """The prepared bounds test of a state with ``k`` centres and step buffer ``pack`` (a
        :class:`.launch.Pack`); ``newlab``: the full step's label array, or None (incremental: the
        int32 ``dummy_i32`` stands in); ``rpt`` rows a thread (``tune={"bounds_rpt": R}``)."""
        from .compiled import compiled
        from .launch import Launch

        rpt = max(1, min(int(rpt), 32))  # the failed rows of a thread are bits of one int32
        kern = test_kernel(rpt)
        _, dmv = self.moves_buffer(k)
        write = newlab is not None
        args = (labels, self.ub, self.lb, dmv, int(self.n), int(k), self.idx, pack.ctr, int(pack.gslot),
                newlab if write else dummy_i32, int(write))
        tiles = -(-self.n // (TEST_NT * rpt))
        grid = max(1, min(tiles, 2 if SIM else 8 * limits.sm_count))
        return Launch(kern, compiled("bounds_test", (rpt,), kern, args), args, grid, TEST_NT, 0, stream, fast)

    def moves_buffer(self, k: int):
        """The pinned host and device (2k,) float64 buffers of the moves for ``k`` centres."""
        buf = self._mv.get(k)
        if buf is None:
            from .launch import pinned

            buf = (pinned(2 * k, np.float64), cuda.device_array(2 * k, dtype=np.float64))
            self._mv[k] = buf
        return buf

    def fill_moves(self, old: np.ndarray, new: np.ndarray) -> None:
        """Write the moves from the centres the bounds hold for, ``old``, to ``new`` into the pinned buffer."""
        host, _ = self.moves_buffer(new.shape[0])
        host[:] = moves_and_others(old, new)

    def upload_moves(self, k: int) -> None:
        """The moves to the device, asynchronously on the default stream."""
        host, dev = self.moves_buffer(k)
        if SIM:
            dev.copy_to_device(host)
            return
        from numba.cuda.cudadrv.driver import device_pointer

        from .launch import cu, cucheck

        cucheck(cu().cuMemcpyHtoDAsync(int(device_pointer(dev)), int(host.ctypes.data), host.nbytes, 0),
                "cuMemcpyHtoDAsync")

    def kept(self, k: int, searched: int, tested: bool, changed: int = 0) -> None:
        """A step with ``k`` centres wrote every row's bounds (``searched`` rows by pass 1, ``changed``
        labels changed)."""
        self.k = k
        # a test that left most rows to pass 1 cost more than it saved, and after many changed labels
        # one would: skip one test
        self.skip_next = (tested and searched > BACKOFF_SHARE * self.n) or changed > CHANGED_SHARE * self.n
