"""``GPUBackend``: the state of one rank's GPU between steps, and when a step is incremental.

The backend owns the rows on the device (:class:`.rows.DeviceRows`), one
:class:`_State` per number of centres (plan, step buffer, prepared launches), and
what an incremental step builds on (:class:`.kept.KeptSums`).  A step fills the step
buffer, launches, and while the GPU works carries the kept sums over to the new
centres on the host.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import numpy as np

from .. import Backend, BackendInfo, BackendUnavailable, StepResult
from ...cache import gpu_shape_key, mark_gpu_shape_warm
from . import tensor
from .bounds import bounds_wanted
from .device import SIM, DeviceLimits, cuda, device_descriptions, gpu_available, gpu_count
from .hostk import add_step, carry_kept
from .initpasses import DeviceInitPasses
from .kept import KeptSums
from .launch import Pack, StepGraph, cu, cucheck, fast_launch_wanted, graphs_wanted
from .launches import StepLaunches
from .plan import MODE_STEP_SPLIT, SPLIT_MIN_VALUES, Plan, choose_plan
from .rows import DeviceRows

log = logging.getLogger("mpikmeans.backends.gpu")

SUPPORTED_DTYPES = ("float64", "float32")

#: steps in a row that may be incremental before a full one (bounds rounding drift)
DELTA_REFRESH = 32
#: When an incremental step pays (H100, bench/GPU_NOTES.md, v5): each row that changed
#: label costs the exact kernel about MOVE_NS + MOVE_NS_PER_ELEM * K * M nanoseconds
#: (26 ns at K x M = 5000, 110 ns at 32000); a full step's pass 2, which an incremental
#: step saves, about PASS2_NS_PER_ELEM per element of the rows (0.005 measured, less a
#: margin).  The last step's change count predicts the next one's.
MOVE_NS = 10.5
MOVE_NS_PER_ELEM = 0.0031
PASS2_NS_PER_ELEM = 0.004


@dataclass
class _State:
    """Everything a step with k centres reuses: plan, step buffer, prepared launches."""

    plan: Plan
    pack: Pack
    launches: list  # [(fused, recheck)] per chunk (one when resident)
    # where the plan keeps bounds: (the moves and the bounds test, fused on the listed rows, the centres kept alone)
    bounds: tuple | None = None
    #: a resident step's copies and launches as one CUDA graph (:class:`.launch.StepGraph`), by whether
    #: the bounds are tested; None where it could not be made (the launches then go one by one)
    graphs: dict = field(default_factory=dict)

    def kernels(self, listed: bool) -> list:
        """A resident step's launches in order (each a :class:`.launch.Launch` or :class:`.launch.Steps`)."""
        fused, recheck = self.launches[0]
        if listed:  # the moves and the bounds test, the step on the rows it lists
            return [self.bounds[0], self.bounds[1], recheck]
        # the centres the bounds this step writes will hold for, the step
        return ([self.bounds[2]] if self.bounds is not None else []) + [fused, recheck]

    def parts(self, listed: bool) -> list:
        """The step's copies and launches in order, each part taking a stream handle (:class:`.launch.StepGraph`)."""
        return [self.pack.upload, *(k.on for k in self.kernels(listed)), self.pack.download]

    def close(self) -> None:  # the graphs freed
        for g in self.graphs.values():
            if g is not None:
                g.close()
        self.graphs.clear()


class GPUBackend(DeviceInitPasses, StepLaunches, Backend):
    """Lloyd iteration on one NVIDIA GPU with Numba CUDA kernels.

    Parameters
    ----------
    device : int, optional
        CUDA device index (default 0; the caller picks it with :func:`select_device_for`).
    dtype : {"float64", "float32"}
        Storage precision of the rows on the device.  Sums, counts and SSE are
        float64 either way; labels are those of the exact float64 distances of the
        stored values.
    chunk_rows : int, optional
        Stream the rows through the device in chunks of this many rows (pinned host
        memory, two streams) instead of keeping them resident.  Chosen automatically
        when the rows do not fit in device memory.
    tune : dict, optional
        Kernel overrides for benchmarks and tests: ``R``, ``TC``, ``NT``,
        ``sum_mode`` ("global"), ``centres_shared`` (bool), ``smem_budget`` (bytes),
        ``maxreg``, ``blocks``, ``JC``; ``launch="numba"`` launches through Numba's
        dispatcher instead of the prepared launches; ``profile`` sets :attr:`profile`;
        ``delta`` ("auto", "always", "never"), see below; ``split`` (bool) and
        ``sums_maxreg``: the split full step of :mod:`.sums` (taken with resident rows
        from :data:`.plan.SPLIT_MIN_VALUES` values on, or where it is one kernel) and its sums
        kernel's register cap; ``sums_assign`` (default true): the split step as one kernel, the sums
        kernel finding the labels itself, where its layout allows and no bounds are kept;
        ``bounds`` (true, false or the default "auto"): keep each row's bounds on the device
        (below; "auto": where :func:`.bounds.bounds_pay`); ``rowmajor`` (true, false, "auto"):
        pass 1 reads the rows the bounds test lists, and the GEMM path's sums by label all rows,
        from a row-major copy of the rows ("auto": where it leaves :data:`.launches.ROWMAJOR_MARGIN`
        free); ``sums_centres``, ``sums_wb``, ``sums_group_rows``, ``sums_stage_bytes``: the sums
        kernel's layout (:mod:`.sums`); ``bounds_rpt``: rows a thread of the bounds test;
        ``rc_blocks``: the exact kernel's blocks a multiprocessor; ``rc_threads``: its threads a
        flagged row (:func:`.recheck.row_threads`); ``centre_groups`` (default true): the GEMM path's
        float32 screen splits the centre tiles of few row tiles over its blocks (:func:`.gemm.centre_groups`);
        ``tf32`` (bool): the GEMM path's screen on the tensor cores from the first step, or never;
        ``tf32_cascade`` (default true): the rows the TF32 screen leaves go to the float32 screen, not
        straight to the exact kernel; ``graph`` (default true): a resident step's copies and prepared
        launches as one CUDA graph (:class:`.launch.StepGraph`), else launched one by one.

    Attributes
    ----------
    last_searched : int
        Rows the last step's pass 1 searched (``n`` unless the bounds test ran).
    last_bounds_tested : bool
        Whether the last step tested the kept bounds.
    last_kernels : int
        Kernels the last resident step launched before the exact kernel (the split step: 2, or 1
        where the sums kernel assigns the rows itself; 0 before a step, or streamed rows).
    profile : bool
        Record :attr:`last_kernel_ms`, the kernels' time in the last step or assignment
        (CUDA events around them; two event records per step; not when streaming).

    Notes
    -----
    Deviation sums.  The kernels sum ``x - c`` (``c`` the centre a row is assigned
    to), not ``x``; :meth:`step` returns ``sums = dev + counts c``.  Deviations are
    small where the data are far from the origin, so nothing cancels, and they are
    what an incremental step needs.

    Incremental steps.  After a step the backend keeps, in float64, each cluster's
    deviation sum and count, the total SSE and the centres used (:mod:`.kept`).
    When few labels changed in the last step (:meth:`_next_step_incremental`), the
    next step does no per-row work beyond the certified assignment (pass 1) for rows
    that keep their label: their deviation sums and SSE are carried over to the new
    centres exactly on the host (:meth:`.kept.Kept.carry_from`), O(K M) work.  Rows whose
    label changes leave the old cluster (``x - c_old`` and ``|x - c_old|^2`` taken
    away) and join the new one (global atomics).  The results equal a full step's up
    to float64 rounding.  A full step runs at least every ``DELTA_REFRESH`` steps,
    after a step that changed many labels, with weights (float weights summed and
    taken away need not return to 0 for an emptied cluster) and after :meth:`load`.

    Kept bounds.  Where pass 1 writes labels that a later kernel takes up (the split full
    step, an incremental step, the GEMM path's screens), on resident rows, it also writes
    each searched row's bounds (:mod:`.bounds`).
    The next step with the same K first tests them against the centres' moves, on the
    device: the rows that pass keep their label, and pass 1 searches only the others.
    A test that leaves more than :data:`.bounds.BACKOFF_SHARE` of the rows to pass 1, or a
    step that changed more than :data:`.bounds.CHANGED_SHARE` of the labels, is followed by
    a step without the test (a full pass 1 refreshes every bound).  Labels, sums and
    counts are those of a step without bounds.
    """

    name = "gpu"
    #: sums come from atomics, added in an order that changes from run to run (see lloyd.py)
    deterministic = False

    def __init__(self, device: int | None = None, dtype: str = "float64", chunk_rows: int | None = None,
                 *, tune: dict | None = None):
        if not gpu_available():
            raise BackendUnavailable("the GPU backend needs numba-cuda and a usable CUDA GPU")
        dtype = str(np.dtype(dtype))
        if dtype not in SUPPORTED_DTYPES:
            raise ValueError(f"GPU dtype must be one of {', '.join(SUPPORTED_DTYPES)}, not {dtype!r}")
        self.device_index = 0 if device is None else int(device)
        if SIM and self.device_index != 0:
            self.device_index = 0  # the simulator has one device
        count = gpu_count()
        if not 0 <= self.device_index < count:
            raise BackendUnavailable(f"CUDA device {self.device_index} does not exist ({count} visible)")
        cuda.select_device(self.device_index)
        self.dtype = dtype
        self.chunk_rows = int(chunk_rows) if chunk_rows else None
        if self.chunk_rows is not None and self.chunk_rows <= 0:
            raise ValueError("chunk_rows must be positive")
        self.tune = dict(tune or {})
        self.limits = DeviceLimits()
        self._tf32_allowed = tensor.wanted(self.limits, self.tune)
        # the GEMM path's first screen (_choose_screen decides the later ones): TF32 where the rows it leaves
        # go to the float32 screen (the cascade), else only with tune {"tf32": true}
        self._cascade = self._tf32_allowed and tensor.cascade_wanted(self.tune)
        self.tf32 = self._tf32_allowed and bool(self.tune.get("tf32", self._cascade))
        self._desc = device_descriptions()
        self.rows = DeviceRows(dtype, self.limits)
        self._dummy = None
        self._dummy32 = None
        self._dummyi = None
        self._bounds = None  # DeviceBounds, allocated with the first state that keeps bounds
        self.last_searched = 0
        self.last_bounds_tested = False
        self._alabels = None
        self._adist = None
        self._states = {}
        self._plans = {}
        self._fast = fast_launch_wanted(self.tune)
        self._graphs = graphs_wanted(self.tune, self._fast)
        self.profile = bool(self.tune.get("profile"))
        self._events = None
        self.last_flagged = 0
        #: rows the TF32 screen left to the float32 screen in the last step (its cascade, :mod:`.tensor`)
        self.last_cascaded = 0
        self.last_plan = None
        self.last_grid = 0
        self.last_kernels = 0
        self.last_regs = None
        self.last_fast_launch = None
        self._occupancy = {}
        self.last_kernel_ms = float("nan")
        self._kept = KeptSums()  # what an incremental step builds on
        self._forget_kept()
        self.last_delta = False

    @property
    def n(self) -> int:
        return self.rows.n

    @property
    def m(self) -> int:
        return self.rows.m

    # ------------------------------------------------------------------ load
    def load(self, x: np.ndarray, weights: np.ndarray | None = None) -> None:
        """Copy this rank's rows to the device (see :meth:`Backend.load`).

        Parameters
        ----------
        x : ndarray, shape (n_local, m), float64
            May have zero rows.
        weights : ndarray, shape (n_local,), float64, optional
            Instance weights; an empty or omitted array means unweighted.
        """
        self.close()
        x = np.ascontiguousarray(x, dtype=np.float64)
        if x.ndim != 2:
            raise ValueError(f"x must be 2-D (n, m), got shape {x.shape}")
        w = None
        if weights is not None and np.size(weights) > 0:
            w = np.ascontiguousarray(weights, dtype=np.float64).ravel()
            if w.shape[0] != x.shape[0]:
                raise ValueError(f"weights has {w.shape[0]} entries for {x.shape[0]} rows")
        self.rows.load(x, w, self.chunk_rows)

    def load_device(self, x_soa, weights: np.ndarray | None = None) -> None:
        """Take rows that are already on this device, column-major.

        For benchmarks that generate data on the GPU: no host copy, no transpose.

        Parameters
        ----------
        x_soa : device array (numba, CuPy, PyTorch...), shape (m, n), backend dtype
            C-contiguous, so that attribute ``j`` of row ``i`` is at ``j * n + i``.
        weights : ndarray, shape (n,), float64, optional
        """
        self.close()
        w = None if weights is None or np.size(weights) == 0 else np.ascontiguousarray(weights, np.float64)
        self.rows.load_device(x_soa, w)

    # ------------------------------------------------------------------ plans and launches
    def _plan(self, k: int, assign: bool, delta: bool = False) -> Plan:
        key = (k, assign, delta)
        plan = self._plans.get(key)
        if plan is None:
            plan = self._plan_for(k, assign, delta, self.n)
            self._plans[key] = plan
        return plan

    def _plan_for(self, k: int, assign: bool, delta: bool, n: int) -> Plan:
        """The plan this backend takes for ``n`` rows of its kind (resident or streamed, dtype, weights)."""
        limit = min(self.limits.smem_optin, 200 * 1024) if not SIM else 48 * 1024
        split = not self.rows.streaming and n * self.m >= SPLIT_MIN_VALUES  # the split full step's rule
        plan = choose_plan(k, self.m, self.dtype, assign, self.rows.weighted, limit, self.tune,
                           self.limits.smem_sm, delta, split)
        if not (split or self.rows.streaming or assign or delta or "split" in self.tune):
            # fewer rows: the split step where it is one kernel, the sums kernel finding the labels
            # itself (no second launch; H100, 2e6 x 3, K = 7: 0.099 against the fused kernel's 0.117 ms)
            one = choose_plan(k, self.m, self.dtype, False, self.rows.weighted, limit, self.tune,
                              self.limits.smem_sm, False, True)
            if (one.mode == MODE_STEP_SPLIT and self._sums_assign(one, k)
                    and not bounds_wanted(self.tune.get("bounds", "auto"), k, self.m, self.dtype)):
                plan = one
        return plan

    def _state(self, k: int, assign: bool, delta: bool = False) -> _State:
        """Plan, step buffer and prepared launches for k centres: built once, reused every step."""
        key = (k, assign, delta)
        st = self._states.get(key)
        if st is not None:
            return st
        plan = self._plan(k, assign, delta)
        rows = self.rows
        if self._dummy is None:
            self._dummy = cuda.device_array(1, dtype=np.float64)
            self._dummy32 = cuda.device_array(1, dtype=np.float32)
            self._dummyi = cuda.device_array(1, dtype=np.int32)
        if not rows.streaming:
            # the GEMM path makes the screen's centre data on the device (:mod:`.gemmcentres`)
            pack = Pack(k, self.m, plan.TC, plan.nct, self.dtype, 1, on_device=self.gemm_wanted(plan, assign, k))
            if assign:
                if self._alabels is None:
                    self._alabels = cuda.device_array(self.n, dtype=np.int32)
                    self._adist = cuda.device_array(self.n, dtype=np.float64)
                labels, dist2 = self._alabels, self._adist
            else:
                labels, dist2 = rows.labels, self._dummy
            w = rows.dw if rows.weighted else self._dummy
            fslot = pack.layout.i64_chg + 1
            fused, recheck, bounds = self._launches(plan, pack, k, assign, rows.dx, self.n, labels, rows.flags, w,
                                                    dist2, fslot, 0, delta)
            launches = [(fused, recheck)]
        else:
            pack = Pack(k, self.m, plan.TC, plan.nct, self.dtype, rows.nchunks)
            launches = []
            for c in range(rows.nchunks):
                s = c % 2
                w = rows.dwbuf[s] if rows.weighted else self._dummy
                # one flagged-row counter per chunk: the outputs' upload zeroes them all
                fslot = pack.layout.i64_chg + 1 + c
                launches.append(self._launches(plan, pack, k, assign, rows.dbuf[s], rows.chunk_rows(c),
                                               rows.dlab[s], rows.dflags[s], w, rows.ddist[s], fslot,
                                               rows.streams[s], delta)[:2])
            bounds = None  # streamed rows keep none
        st = _State(plan, pack, launches, bounds)
        if len(self._states) >= 8:
            # k-means|| assigns to a new number of candidates each round: keep the latest few
            self._states.pop(next(iter(self._states))).close()
        self._states[key] = st
        if self._graphs and not assign and not rows.streaming:
            for listed in (False, True) if bounds is not None else (False,):
                self._step_graph(st, listed)  # made with the state: in the warm-up, or after a change of screen
        return st

    def _step_graph(self, st: _State, listed: bool):
        """The state's step as one CUDA graph (made once), or None where it cannot be."""
        if listed not in st.graphs:
            graph = None
            try:
                graph = StepGraph(st.parts(listed)) if all(k.fast for k in st.kernels(listed)) else None
            except Exception as exc:  # pragma: no cover - driver or bindings without graph capture
                log.info("GPU backend: no CUDA graph for a step (%s); launches one by one", exc)
            st.graphs[listed] = graph
        return st.graphs[listed]

    # ------------------------------------------------------------------ one step on the device
    def _run(self, centres: np.ndarray, assign: bool, delta: bool = False, while_busy=None, test: bool = False):
        """One step (or assignment) on the device.

        Host work per call, once the state for this k exists: fill the pinned input
        buffer; one asynchronous copy in (centre data and zeroed outputs); the fused
        and recheck launches (per chunk when streaming); one asynchronous copy out of
        sums, counts, SSE and counters; ``while_busy()`` if given (host work that then
        overlaps the kernels); one synchronisation.  ``test``: the kept bounds hold; the centres'
        moves from those they hold for, the bounds test and pass 1 on the rows it lists, all on the
        device.  Where the state keeps bounds, the device keeps this step's centres for the next
        step's moves (:meth:`.bounds.DeviceBounds.moves_launch`).

        Returns
        -------
        (labels, dist2) for an assignment, else (StepResult, what ``while_busy`` returned)
        """
        centres = np.ascontiguousarray(centres, dtype=np.float64)
        if centres.ndim != 2 or centres.shape[1] != self.m:
            raise ValueError(f"centres must have shape (k, {self.m}), got {centres.shape}")
        k = centres.shape[0]
        n = self.n
        if k == 0:
            raise ValueError("at least one centre is needed")
        st = self._state(k, assign, delta)
        self.last_plan = st.plan
        pack = st.pack
        pack.fill(centres)
        listed = bool(test)
        labels_out = dist_out = None
        if assign:
            labels_out = np.empty(n, dtype=np.int32)
            dist_out = np.empty(n, dtype=np.float64)
        profile = self.profile and not self.rows.streaming and not SIM
        if profile and self._events is None:
            self._events = (cuda.event(), cuda.event())
        resident = not self.rows.streaming
        graph = self._step_graph(st, listed) if self._graphs and resident and not (assign or profile) else None
        if resident:
            # kernels of the step before the exact kernel's (the split step: 2, or 1 where the sums
            # kernel assigns the rows itself)
            fused = st.launches[0][0]
            self.last_kernels = len(getattr(fused, "launches", (fused,)))
        if graph is not None:
            graph()  # the upload, the kernels and the download in one launch
        elif resident:
            pack.upload()
            if profile:
                self._events[0].record()
            for launch in st.kernels(listed):
                launch()
            if profile:
                self._events[1].record()
            if assign:
                self._alabels.copy_to_host(labels_out)
                self._adist.copy_to_host(dist_out)
            pack.download()
        else:
            pack.upload()
            self.rows.stream_through(st.launches, assign, labels_out, dist_out)
            pack.download()
        busy = while_busy() if while_busy is not None else None
        if not SIM:
            cucheck(cu().cuStreamSynchronize(0), "cuStreamSynchronize")
        if profile:
            self.last_kernel_ms = cuda.event_elapsed_time(*self._events)
        ctr = pack.r_ctr
        self.last_flagged = int(ctr[1:].sum())
        self.last_cascaded = int(pack.r_cas[0])
        if assign:
            return labels_out, dist_out
        # views of the pinned output buffer: step() consumes them before the next step
        return StepResult(sums=pack.r_sums, counts=pack.r_cnt, sse=float(pack.hout[pack.r_sse]),
                          changed=int(ctr[0])), busy

    #: The kernel pairs of a run with k centres: the full step, the final assignment, the incremental step
    STEP_KINDS = ("full", "assign", "delta")

    def warmup(self, k: int, m: int, kinds: tuple = STEP_KINDS) -> None:
        """Compile the step's and the final assignment's kernels for k centres (see :meth:`Backend.warmup`).

        Building the per-k state prepares (so compiles) both launches: the first step and the
        closing assignment carry no JIT into the timed loop.  ``kinds`` (of :data:`STEP_KINDS`)
        chooses which: a cold run's helper processes compile them side by side.
        """
        if self.n == 0 or k < 1:
            return
        if "full" in kinds:  # and the host-side helpers (CPU kernels, cached on disk)
            st = self._state(k, False)
            zeros = np.zeros((k, self.m))
            st.pack.fill(zeros)  # overwritten by every step's fill
            add_step(zeros.copy(), np.zeros(k), zeros, np.zeros(k), zeros, zeros.copy())
            carry_kept(zeros, np.zeros(k), zeros, zeros, zeros.copy(), np.zeros(k))
            if self._tf32_allowed and self.gemm_wanted(self._plan(k, False), False, k):
                self._warm_other_screen(k, "delta" in kinds and self._delta_allowed())
        if "assign" in kinds:
            self._state(k, True)
        if "delta" in kinds and self._delta_allowed():
            self._state(k, False, True)
        if not SIM and set(kinds) >= set(self.STEP_KINDS):  # a helper's share leaves the marking to the run
            idx64 = bool(self.tune.get("idx64")) or self.m * self.rows.ld >= 2**31
            mark_gpu_shape_warm(gpu_shape_key(k, self.m, self.dtype, idx64))

    def _warm_other_screen(self, k: int, delta: bool) -> None:
        """Compile the GEMM screen (TF32 or float32) a later step may switch to (:meth:`_choose_screen`);
        states dropped."""
        first, graphs = self.tf32, self._graphs
        kept, self._states, self.tf32, self._graphs = self._states, {}, not first, False  # no graph: dropped
        try:
            for d in (False, True) if delta else (False,):
                self._state(k, False, d)
        finally:
            self._states, self.tf32, self._graphs = kept, first, graphs

    # ------------------------------------------------------------------ the step policy
    def _delta_allowed(self) -> bool:
        """Whether incremental steps may run at all: not when switched off, not with weights."""
        return self.tune.get("delta", "auto") != "never" and not self.rows.weighted

    def _moving_costs_less(self, k: int) -> bool:
        """Whether moving the last step's changed rows costs less than a full step's summing pass."""
        move_ns = self._last_changed * (MOVE_NS + MOVE_NS_PER_ELEM * k * self.m)
        return move_ns <= PASS2_NS_PER_ELEM * self.n * self.m

    def _next_step_incremental(self, k: int) -> bool:
        """Whether the next step with ``k`` centres is incremental (see the class notes)."""
        if not self._delta_allowed() or not self._kept.fits(k):
            return False
        if self.tune.get("delta", "auto") == "always":
            return True
        drift_bounded = self._delta_run < DELTA_REFRESH
        few_changed = self._last_changed * 16 <= self.n
        return drift_bounded and few_changed and self._moving_costs_less(k)

    def step(self, centres: np.ndarray) -> StepResult:
        """One Lloyd step on the device (see :meth:`Backend.step`), incremental where it pays.

        The returned ``sums`` array is the backend's own buffer (the step's kept slot, :mod:`.kept`):
        valid until the next step but one, as the Lloyd loop uses it (copied into its reduction
        buffer at once); a fresh K x M array every step cost its page faults every other step.
        """
        k = centres.shape[0]
        if self.n == 0:
            return StepResult(sums=np.zeros((k, self.m if self.m else centres.shape[1])),
                              counts=np.zeros(k), sse=0.0, changed=0)
        delta = self._next_step_incremental(k)
        centres = np.ascontiguousarray(centres, dtype=np.float64)
        # this step's sums go to the slot the last step's are not in; its copy of the centres is
        # taken, and the last step's sums carried over to them, on the host while the kernels run
        new = self._kept.spare(k, centres.shape[1])
        last = self._kept.last

        def busy():
            new.take(centres)
            return new.carry_from(last) if delta else 0.0

        st = self._state(k, False, delta)
        bd = self._bounds if st.bounds is not None else None
        # the bounds hold for the last step's centres, which its kept sums hold
        listed = bd is not None and last is not None and bd.wanted(k)
        try:
            res, carried = self._run(centres, assign=False, delta=delta, while_busy=busy, test=listed)
        except BaseException:
            if self._bounds is not None:
                self._bounds.invalidate()
            raise
        self.last_searched = int(st.pack.r_gat[0]) if listed else self.n
        self.last_bounds_tested = listed
        if bd is not None:
            bd.kept(k, self.last_searched, listed, res.changed)
        elif self._bounds is not None:
            self._bounds.invalidate()  # this step's labels came from a pass that keeps no bounds
        if delta:
            # then the rows that changed label: they left one cluster and joined another
            sse = carried + res.sse
            self._delta_run += 1
        else:
            sse = res.sse
            self._delta_run = 0
        # the device sums deviations from the centres (no cancellation far from the
        # origin, and what the carry-over above needs); the raw sums are dev + n c (a full
        # step's are the device's alone)
        sums = add_step(new.dev, new.counts, res.sums, res.counts, new.centres, new.sums, fresh=not delta)
        new.sse = sse
        self._kept.last = new
        self._last_changed = res.changed
        self.last_delta = delta
        if not delta:  # after the step buffer's views are consumed: a new screen drops the buffers
            self._choose_screen(k)
        return StepResult(sums=sums, counts=new.counts.copy(), sse=sse, changed=res.changed)

    def _choose_screen(self, k: int) -> None:
        """After a full step on the GEMM path: the screen of the steps to come (:func:`.tensor.next_screen`)."""
        if not self._tf32_allowed or not self.gemm_wanted(self._plan(k, False), False, k):
            return
        searched = self.last_searched
        left = self.last_cascaded if self.tf32 and self._cascade else self.last_flagged
        want = tensor.next_screen(self.tf32, left, searched, self._cascade)
        if want != self.tf32:
            log.info("GEMM screen: %d of %d rows searched left by the %s screen; the %s screen from now on",
                     left, searched, "TF32" if self.tf32 else "float32", "TF32" if want else "float32")
            self.tf32 = want
            self._drop_states()  # the launches are prepared again with it

    def forget_labels(self) -> None:
        """Start over: every label unknown, no kept sums (the next step is like a first one).

        For benchmarks that time several runs on one loaded backend.
        """
        self._forget_kept()
        self.rows.forget_labels()
        if self._bounds is not None:
            self._bounds.invalidate()

    def _forget_kept(self) -> None:
        """Drop the kept sums: the next step is a full one."""
        self._kept.forget()
        self._delta_run = 0
        self._last_changed = None

    def assign(self, centres: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Nearest centre and exact float64 squared distance for every local row (see :meth:`Backend.assign`)."""
        if self.n == 0:
            return np.empty(0, dtype=np.int32), np.empty(0, dtype=np.float64)
        return self._run(np.asarray(centres, dtype=np.float64), assign=True)

    def info(self) -> BackendInfo:
        d = next((d for d in self._desc if d["index"] == self.device_index), None)
        name = d["name"] if d else "unknown"
        return BackendInfo(name="gpu", devices=[f"{self.device_index}: {name}"], threads=1, dtype=self.dtype)

    def close(self) -> None:
        self._forget_kept()
        self.rows.close()
        self._bounds = None
        self._dummy = None
        self._alabels = None
        self._adist = None
        self._drop_states()
        self._plans = {}

    def _drop_states(self) -> None:
        """Forget every state (their graphs freed)."""
        for st in self._states.values():
            st.close()
        self._states = {}
