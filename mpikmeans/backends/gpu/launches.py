"""A step's prepared kernel launches for :class:`.backend.GPUBackend`: the fused kernel (or the GEMM
path's launches), the exact recheck kernel, and where the plan keeps bounds the bounds test with
pass 1 on the rows it lists (from the row-major copy of the rows where there is one).

A mixin: it reads the backend's rows, limits, tune, kept bounds and launch settings.
"""

from __future__ import annotations

import numpy as np

from . import gemm
from .bounds import ROW_BYTES, TEST_RPT, DeviceBounds, bounds_wanted
from .compiled import compiled
from .device import SIM, cuda
from .kernels import fused_kernel
from .launch import Launch, Pack, Steps, prepare
from .plan import MODE_ASSIGN, MODE_STEP_DELTA, MODE_STEP_SPLIT, Plan, round_up
from .recheck import RC_BLOCKS_SM, RC_WARPS, part_scratch, recheck_kernel, row_threads
from .sums import sums_launch

#: the row-major copy of the rows for pass 1 on listed rows is made only where it leaves this many
#: bytes of device memory free
ROWMAJOR_MARGIN = 1 << 30


class StepLaunches:
    """Building a step's launches (mixed into :class:`.backend.GPUBackend`)."""

    def _blocks_per_sm(self, compiled, spec: tuple, plan: Plan) -> int:
        """Resident blocks per multiprocessor (registers, shared memory, threads), cached per kernel."""
        if spec not in self._occupancy:
            if compiled is None:  # the simulator
                self._occupancy[spec] = 1
            else:
                regs = prepare(compiled, plan.smem) or 128
                self.last_regs = regs
                regs_alloc = round_up(regs, 8) * plan.NT
                by_regs = self.limits.regs_sm // max(1, regs_alloc)
                by_smem = self.limits.smem_sm // max(1, plan.smem + 1024)
                by_thr = 2048 // plan.NT
                self._occupancy[spec] = max(1, min(by_regs, by_smem, by_thr, 32))
        return self._occupancy[spec]

    def fused_spec(self, plan: Plan, pack: Pack, k: int) -> tuple:
        """Everything the fused kernel for ``plan`` is specialised on (:func:`.kernels.fused_kernel`'s arguments)."""
        idx32 = self.m * self.rows.ld < 2**31 and not self.tune.get("idx64")
        return (self.dtype, plan.R, plan.TC, plan.NT, self.rows.weighted, plan.mode, plan.centres_shared,
                plan.maxreg, k, self.m, plan.nct, tuple(plan.offs), tuple(pack.layout), idx32,
                bool(self.tune.get("diag_skip_pass2")), bool(self.tune.get("lineinfo")),
                plan.mode != MODE_ASSIGN and self._keeps_bounds(plan, k))

    def _keeps_bounds(self, plan: Plan, k: int) -> bool:
        """Whether steps with ``plan`` keep bounds (:mod:`.bounds`).

        Where pass 1 writes labels that a summing kernel (or, incremental, the exact kernel)
        takes up: the split full step, an incremental step or the GEMM path, on resident rows;
        where a row costs pass 1 more than the test (:func:`.bounds.bounds_pay`) unless ``tune``
        says ``bounds`` (true or false); and where the device has room for them.
        """
        if self.rows.streaming or self.n == 0 or not bounds_wanted(self.tune.get("bounds", "auto"), k, self.m,
                                                                   self.dtype):
            return False
        if not (self.gemm_wanted(plan, False, k) or plan.mode in (MODE_STEP_SPLIT, MODE_STEP_DELTA)):
            return False
        if self._bounds is None:
            if self.limits.free_memory() < self.n * ROW_BYTES + (256 << 20):
                return False
            self._bounds = DeviceBounds(self.n)
        return True

    def _row_major(self):
        """The row-major copy of the rows (:meth:`.rows.DeviceRows.row_major`) where ``tune["rowmajor"]``
        (default "auto": where the copy leaves :data:`ROWMAJOR_MARGIN` bytes free) allows, else None."""
        want = self.tune.get("rowmajor", "auto")
        return self.rows.row_major(ROWMAJOR_MARGIN) if want in ("auto", True) else None

    def _listed_launch(self, spec: tuple, kern, kobj, args: tuple, grid: int, plan: Plan, pack: Pack,
                       stream) -> Launch:
        """The fused kernel's launch on the rows the bounds test listed: compiled for the row-major
        copy of the rows where there is one (:meth:`_row_major`), else ``kern`` itself."""
        tail = (1, int(pack.gslot))
        xr = self._row_major()
        if xr is None:
            return Launch(kern, kobj, args[:-2] + tail, grid, plan.NT, plan.smem, stream, self._fast)
        rspec = spec + (True,)
        rk = fused_kernel(*rspec)
        rargs = (xr, args[1], int(self.m)) + args[3:-2] + tail
        rkobj = compiled("fused", rspec, rk, rargs)
        prepare(rkobj, plan.smem)
        return Launch(rk, rkobj, rargs, grid, plan.NT, plan.smem, stream, self._fast)

    def _sums_assign(self, plan: Plan, k: int) -> bool:
        """Whether a split step with ``plan`` (and no bounds) is the sums kernel alone, which finds the
        labels itself (:func:`.sums.sums_kernel`'s ``assign_tc``): where its layout holds whole rows a thread
        and the centres are one tile of ``round_up(k, 4)`` (``tune["sums_assign"]``, default true)."""
        return (bool(self.tune.get("sums_assign", True)) and plan.sums.cf >= 0 and plan.nct == 1
                and plan.TC == round_up(k, 4))

    def _sums(self, plan: Plan, pack: Pack, k: int, x, rows: int, labels, newlab, w, flags, fslot: int,
              assign_tc: int, stream) -> Launch:
        """The split step's sums kernel launch (:func:`.sums.sums_launch`)."""
        return sums_launch(self.limits, self.dtype, self.rows.weighted, k, self.m, plan.sums, pack, x, rows,
                           int(self.rows.ld), labels, newlab, w, flags, fslot, assign_tc, stream, self._fast,
                           self.tune)

    def gemm_wanted(self, plan: Plan, assign: bool, k: int) -> bool:
        """Whether a step with ``plan`` for ``k`` centres takes the GEMM-shaped path (:func:`.gemm.wanted`)."""
        return gemm.wanted(plan.centres_shared, self.m, self.limits, self.tune, assign, self.rows.streaming, k,
                           self._cascade)

    def _launches(self, plan: Plan, pack: Pack, k: int, assign: bool, x, rows: int, labels, flags, w,
                  dist2, fslot: int, stream, delta: bool = False):
        """The prepared (fused, recheck) pair for one block of rows (``fused``: the GEMM path's launches
        where :meth:`gemm_wanted`), and where the plan keeps bounds the (centres' moves and bounds test, fused
        on the rows it lists, the centres kept for the next step's moves alone) triple, else None."""
        keeps = not assign and self._keeps_bounds(plan, k)
        ct, ct_pitch = self._dummy, 0  # the exact kernel reads the step buffer's centres
        if self.gemm_wanted(plan, assign, k):
            # a full step's sums (:mod:`.bylabel`) and the screen of the rows the bounds test lists read the
            # rows from the row-major copy where there is one
            xr = self._row_major() if keeps or not delta else None
            fused = gemm.step_launches(self.limits, self.dtype, self.rows.weighted, k, self.m, int(self.rows.ld),
                                       plan, pack, x, xr, rows, labels, flags, w, fslot, stream, delta, self._fast,
                                       self.tf32, self._bounds if keeps else None, (self._dummyi, self._dummy32),
                                       bool(self.tune.get("centre_groups", True)), self._cascade)
            self.last_grid = fused.grid
            newlab, listed = fused.newlab, fused.listed
            ct, ct_pitch = fused.centres_t
        elif plan.mode == MODE_STEP_SPLIT and not keeps and self._sums_assign(plan, k):
            # a split step without bounds on a shape whose sums kernel finds the labels itself: one kernel
            # (pass 1 is neither compiled nor launched)
            add = self._sums(plan, pack, k, x, rows, labels, self._dummyi, w, flags, fslot, plan.TC, stream)
            fused = Steps([add], add.grid)
            self.last_grid = add.grid
            newlab = listed = None
        else:
            spec = self.fused_spec(plan, pack, k)
            kern = fused_kernel(*spec)
            split = plan.mode == MODE_STEP_SPLIT
            newlab = cuda.device_array(max(1, rows), dtype=np.int32) if split else None  # pass 1's labels
            bd = self._bounds
            tail = (bd.idx, bd.ub, bd.lb) if keeps else (self._dummyi, self._dummy32, self._dummy32)
            args = (x, int(rows), int(self.rows.ld), pack.p32, pack.dev, pack.ctr, labels, flags, w,
                    newlab if split else dist2, int(fslot), *tail, 0, int(pack.gslot))
            kobj = compiled("fused", spec, kern, args)
            per_sm = self._blocks_per_sm(kobj, spec, plan)
            ntiles = -(-rows // (plan.NT * plan.R))
            grid = max(1, min(ntiles, 2 if SIM else per_sm * self.limits.sm_count))
            self.last_grid = grid
            fused = Launch(kern, kobj, args, grid, plan.NT, plan.smem, stream, self._fast)
            # the same kernel on the rows the bounds test listed (their count is read on the device),
            # from the row-major copy of the rows where there is one
            listed = self._listed_launch(spec, kern, kobj, args, grid, plan, pack, stream) if keeps else None
            if split:  # then the sums kernel adds the rows pass 1 certified
                add = self._sums(plan, pack, k, x, rows, labels, newlab, w, flags, fslot, 0, stream)
                fused = Steps([fused, add], grid)
                if keeps:
                    listed = Steps([listed, add], grid)
        # the bounds test writes a kept row's label into the full step's label array (``newlab``; None:
        # an incremental step), then pass 1 runs on the rows it lists
        bounds = None
        if keeps:
            rpt = int(self.tune.get("bounds_rpt", TEST_RPT))
            bd = self._bounds
            bounds = (bd.test_launch(labels, k, self.m, pack, newlab, self._dummyi, self.limits, stream, self._fast,
                                     rpt), listed, bd.moves_launch(k, self.m, pack, stream, self._fast, False))
        group = row_threads(k, self.tune)
        rspec = (self.dtype, self.rows.weighted, assign, k, self.m, tuple(pack.layout), delta, group, int(ct_pitch))
        rk = recheck_kernel(*rspec)
        # a group of threads per flagged row (or part of one); with none flagged each block reads the count
        # and returns
        per_block = 32 * RC_WARPS // group
        rgrid = 1 if SIM else max(1, min(int(self.tune.get("rc_blocks", RC_BLOCKS_SM)) * self.limits.sm_count,
                                         -(-rows // per_block)))
        rargs = (x, int(self.rows.ld), pack.dev, pack.ctr, labels, flags, w, dist2, int(fslot), ct,
                 *part_scratch(rgrid * per_block))
        recheck = Launch(rk, compiled("recheck", rspec, rk, rargs), rargs, rgrid, 32 * RC_WARPS, 0, stream,
                         self._fast)
        self.last_fast_launch = fused.fast and recheck.fast
        return fused, recheck, bounds
