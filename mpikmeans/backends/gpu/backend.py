"""``GPUBackend``: one rank's rows on one GPU, a Lloyd step as named stages, and the initialisations' passes.

A step (:meth:`GPUBackend.step`) is, for every block of rows (one when the rows
are resident, each chunk when they stream):

1. ``centres``: the centre data (:func:`.hostk.fill_centres`) written into one
   pinned buffer and copied to the device in one copy;
2. ``keep`` (``bounded`` steps): the rows whose lower bounds prove their label
   keep it; the others are listed;
3. ``screen``: certified float32 nearest centre of every row, or of the listed
   ones (:mod:`.stepk`'s register screen, or for many centres :mod:`.gemmk`'s GEMM,
   as :func:`.policy.step_layout` chooses);
4. ``recheck``: exact float64 labels of the rows the screen could not certify;
5. ``accumulate``: every row's exact SSE and the fixed-point sums of the rows
   that changed label (``delta``, ``bounded``) or of every row (``full``), as
   :func:`.policy.step_kind` decides;
6. ``download``: the sums, SSE and counters in one copy, one synchronisation.

The device keeps the sums of the last step's labels between steps, so a
``delta`` step adds only what moved; integers make that exact.
"""

from __future__ import annotations

import functools
import logging

import numpy as np

from ...choices import DTYPES
from ...exact import BlockFixed, limbs_to_int
from ...fixedsums import Scales, column_magnitudes, scale_factors
from ..base import Backend, BackendInfo, BackendUnavailable, StepResult, farthest_rows
from . import initk
from .compiled import compiled
from .device import SIM, DeviceLimits, cuda, device_descriptions, gpu_available, gpu_count
from .buffers import StepCentres, StepOutputs
from .launch import allow_shared, launch, prepare
from . import gemmk
from .gemmk import gemm_screen
from .policy import BOUNDED, FULL, GEMM, step_kind, step_layout
from .rows import DeviceRows, transpose_args, transpose_kernel, upload_soa
from .scorek import NT as SCORE_NT
from .scorek import DeviceScoreRows, score_example_args, score_kernels
from .stepk import FAR_NT, FAR_ROWS, NT, RC_NT, SCREEN_TILES, SUM_ROWS, certificate, farthest_kernels, step_kernels

log = logging.getLogger("mpikmeans.backends.gpu")

#: what the step kernels are specialised on besides the dtype and the screen's tile (the store's key)
_SPEC = (NT, SUM_ROWS, RC_NT)


def _part(arr, a: int, b: int):
    """Rows ``a .. b-1`` of a device array: the array itself where that is all of it (a view costs the
    host more than a launch)."""
    return arr if a == 0 and b == arr.shape[0] else arr[a:b]


def _memset(arr, stream=0) -> None:
    """Zero a device array on ``stream`` (asynchronously)."""
    if arr.size == 0:
        return
    if SIM:
        arr.copy_to_device(np.zeros(arr.shape, dtype=arr.dtype))
        return
    from numba.cuda.cudadrv.driver import device_memset

    device_memset(arr, 0, arr.size * arr.dtype.itemsize, stream=stream)


def example_args(dtype: str) -> dict:
    """Arguments of the step kernels' types, for compiling them before any data is there."""
    d = lambda dt: cuda.device_array(1, dtype=dt)  # noqa: E731
    x, f32, f64, i32, i64 = d(dtype), d(np.float32), d(np.float64), d(np.int32), d(np.int64)
    one = np.float32(1.0)
    return {
        "screen": (x, 1, 1, 1, 1, 1, 1, f32, f32, x, f32, one, one, one, f64, i32, f64, i32, i64, False, i32, f64),
        "recheck": (x, 1, 1, 1, f64, i32, i64, i32, f64, f64),
        "keep": (x, 1, 1, 1, 1, f64, i32, i32, f64, f64, 1.0, i32, i64),
        "accumulate": (x, 1, 1, 1, 1, i32, i32, f64, f64, False, False, f64, f64, 1.0, 1.0, 1, 1, i64, i64, i64),
    }


@functools.lru_cache(maxsize=None)
def compile_kernels(dtype: str) -> dict:
    """Every step kernel for rows of ``dtype``, compiled or loaded from the store (:mod:`.compiled`).

    Returns
    -------
    dict
        ``(name, tile)`` (the register screen's tile, ``"gemm"`` for the GEMM screen; None for the others) ->
        (dispatcher, compiled kernel or None under the simulator)
    """
    args = example_args(dtype)
    out = {}
    for tile in SCREEN_TILES:
        disp = step_kernels(dtype, tile)
        for name in ("screen", "recheck", "accumulate", "keep"):
            if name == "screen" or tile == SCREEN_TILES[0]:
                key = (name, tile if name == "screen" else None)
                out[key] = (disp[name], compiled(name, (dtype, tile, *_SPEC), disp[name], args[name]))
    gk = gemm_screen(dtype)
    out[("screen", GEMM)] = (gk, compiled("gemm_screen", (dtype, gemmk.TXN, gemmk.TYN, gemmk.BK), gk, args["screen"]))
    tk = transpose_kernel(dtype)
    out[("transpose", None)] = (tk, compiled("transpose", (dtype,), tk, transpose_args(dtype)))
    f64, i32, i64 = (cuda.device_array(1, dtype=t) for t in (np.float64, np.int32, np.int64))
    far_args = {"block_max": (f64, 1, f64), "gather": (f64, i32, 1, i64, f64, i32)}
    for name, disp in farthest_kernels().items():
        out[(name, None)] = (disp, compiled(name, (FAR_NT, FAR_ROWS), disp, far_args[name]))
    return out


@functools.lru_cache(maxsize=None)
def score_kernel_set() -> dict:
    """The scores' kernels (:class:`.scorek.DeviceScoreRows`), for a run of either dtype: the scores read the rows
    in float64, so the step's ``accumulate`` and the rows' ``transpose`` come in their float64 form.

    Returns
    -------
    dict
        name -> (dispatcher, compiled kernel or None under the simulator)
    """
    tile = SCREEN_TILES[0]
    acc = step_kernels("float64", tile)["accumulate"]
    out = {"accumulate": (acc, compiled("accumulate", ("float64", tile, *_SPEC), acc,
                                        example_args("float64")["accumulate"]))}
    tk = transpose_kernel("float64")
    out["transpose"] = (tk, compiled("transpose", ("float64",), tk, transpose_args("float64")))
    score_args = score_example_args()
    for name, disp in score_kernels().items():
        out[name] = (disp, compiled(name, (SCORE_NT,), disp, score_args[name]))
    return out


class GPUBackend(Backend):
    """Lloyd iteration on one NVIDIA GPU with Numba CUDA kernels.

    Parameters
    ----------
    device : int, optional
        CUDA device index (default: the current one, 0).
    dtype : {"float64", "float32"}
        Storage precision of the rows on the device; distances that decide a
        label are exact float64 either way (of the stored values), sums are
        exact fixed point.
    chunk_rows : int, optional
        Stream the rows through the device in chunks of this many rows.
    """

    name = "gpu"

    def __init__(self, device: int | None = None, dtype: str = "float64", chunk_rows: int | None = None):
        if not gpu_available():
            raise BackendUnavailable("the GPU backend needs numba-cuda and a usable CUDA GPU")
        dtype = str(np.dtype(dtype))
        if dtype not in DTYPES:
            raise ValueError(f"GPU dtype must be one of {', '.join(DTYPES)}, not {dtype!r}")
        self.device = 0 if device is None or SIM else int(device)  # the simulator has one device
        count = gpu_count()
        if not 0 <= self.device < count:
            raise BackendUnavailable(f"CUDA device {self.device} does not exist ({count} visible)")
        cuda.select_device(self.device)
        self.dtype = dtype
        self.chunk_rows = int(chunk_rows) if chunk_rows else None
        if self.chunk_rows is not None and self.chunk_rows <= 0:
            raise ValueError("chunk_rows must be positive")
        self.limits = DeviceLimits()
        self.rows = DeviceRows(dtype, self.limits)
        self.n = self.m = 0
        self._weights = None
        self._kernels = None
        self._centres = None
        self._outputs = None
        self._flags = []
        self._d2 = self._lb = self._idx = None
        # (D², candidates) of the last potentials pass, whose lowered D² _kept_d2 holds: what the next lower_d2
        # may copy instead of a pass (any lowering of that D² makes the others stale)
        self._kept = None
        self._kept_d2 = None
        self._smalls = {}  # the initialisations' small device outputs, kept between passes (:meth:`_small`)
        self._host_x = None  # the rows as loaded (float64, row-major): a float32 run's scores read them
        self._score_x = None  # a float32 run's rows in float64 on the device, for the scores (:meth:`score_rows`)
        self._bounds_for = None  # the centres the lower bounds hold for
        self._changed = 0  # labels the last step changed
        self._step_centres = None  # the last step's centres (the device's labels and distances are for them)
        self._sums_for = None  # (k, scales) of the sums the device holds for its labels, or None

    # ------------------------------------------------------------------ set-up
    def load(self, x: np.ndarray, weights: np.ndarray | None = None, magnitudes: np.ndarray | None = None) -> None:
        x = np.ascontiguousarray(x, dtype=np.float64)
        self.n, self.m = x.shape
        self._host_x, self._score_x = x, None
        self._weights = None if weights is None else np.ascontiguousarray(weights, dtype=np.float64)
        self._magnitudes = column_magnitudes(x) if magnitudes is None else np.asarray(magnitudes, dtype=np.float64)
        self.rows.load(x, self._weights, self.chunk_rows)
        rows_per_pass = self.rows.chunk if self.rows.streaming else self.n
        self._flags = [cuda.device_array(max(1, rows_per_pass), dtype=np.int32)
                       for _ in range(2 if self.rows.streaming else 1)]
        self._d2 = cuda.device_array(max(1, self.n), dtype=np.float64)  # each row's exact squared distance
        # each row's lower bound on its distance to every centre but its own, and the rows the bounds
        # could not keep (resident rows only: :func:`.policy.step_kind`)
        self._lb = cuda.device_array(max(1, self.n), dtype=np.float64)
        self._idx = None if self.rows.streaming else cuda.device_array(max(1, self.n), dtype=np.int32)
        self._bounds_for = None  # the centres the lower bounds hold for
        self._sums_for = None
        self._step_centres = None
        self._centres = self._outputs = None
        self._kept = self._kept_d2 = None

    def kernels(self) -> dict:
        """The step kernels of this dtype: compiled once per machine type, loaded from the store after."""
        if self._kernels is None:
            self._kernels = compile_kernels(self.dtype)
        return self._kernels

    def warmup(self, k: int, m: int) -> None:
        """Compile (or load) every kernel a run with this dtype launches (none depends on ``k`` or ``m``), and
        once rows are loaded, make the step's buffers for ``k`` centres.

        Raises
        ------
        BackendUnavailable
            Where one tile of centres needs more shared memory than a block of this device may have.
        """
        need = step_layout(k, m).screen_smem
        if need > self.limits.smem_optin:
            raise BackendUnavailable(f"{m} attributes need {need // 1024} KiB of shared memory a block, more than this "
                                     f"GPU has ({self.limits.smem_optin // 1024} KiB): use --backend cpu")
        kernels = [*self.kernels().values(), *score_kernel_set().values()]
        for weighted in (False, True):
            kernels += initk_kernels(self.dtype, weighted).values()
        for _, compiled in kernels:
            if compiled is not None:
                prepare(compiled)
        if self._flags:  # rows loaded: the step's buffers for K now, not in the first iteration
            self._buffers(k)

    # ------------------------------------------------------------------ the step
    def _buffers(self, k: int) -> tuple:
        c = self._centres
        if c is None or c.k != k or c.m != self.m:
            self._centres = StepCentres(k, self.m, self.dtype, step_layout(k, self.m).tile[1])
            self._outputs = StepOutputs(k, self.m, len(self._flags))
            self._sums_for = None
        return self._centres, self._outputs

    def _assign_chunk(self, x, ld, a, b, stream, slot, labels, d2, lb, lay, k, listed=False) -> None:
        """The screen and the recheck on rows ``a .. b-1`` (``listed``: on the rows the keep pass listed): every
        row's exact label, squared distance and lower bound into ``labels``, ``d2`` and ``lb`` (that block's
        views)."""
        ks = self.kernels()
        c = self._centres.d
        tolf, tiny, big = certificate(self.m)
        flags, counters = self._flags[slot], self._outputs.counters[slot]
        _memset(self._outputs.listed[slot], stream)
        disp, kern = ks[("screen", GEMM if lay.screen == GEMM else lay.tile)]
        allow_shared(kern, lay.screen_smem)
        idx = self._idx if listed else flags
        launch(disp, kern, (x, ld, b - a, self.m, k, lay.ntiles, lay.chunk, c["cm"], c["cc"], c["sh"], c["zl"], tolf,
                            tiny, big, c["ct"], labels, d2, flags, counters, listed, idx, lb),
               lay.screen_grid(b - a, self.limits.sm_count), lay.screen_threads, stream, lay.screen_smem)
        disp, kern = ks[("recheck", None)]
        launch(disp, kern, (x, ld, self.m, k, c["ct"], flags, counters, labels, d2, lb),
               1 if SIM else 4 * self.limits.sm_count, RC_NT, stream)

    def _drift(self, centres: np.ndarray) -> float:
        """How far any centre moved since the step the bounds hold for, rounded up."""
        diff = np.subtract(centres, self._bounds_for)
        np.square(diff, out=diff)
        moved = np.sqrt(diff.sum(axis=1)).max()
        return float(moved) * (1.0 + 1e-12) + 1e-300

    def step(self, centres: np.ndarray, scales: Scales) -> StepResult:
        centres = np.ascontiguousarray(centres, dtype=np.float64)
        k, m = centres.shape
        if self.n == 0:
            return StepResult(np.zeros((k, m + 1, 4), dtype=np.int64), np.zeros((k, 4), dtype=np.int64), 0)
        # seeding is over: the candidates' D² it kept (MAX_TRIALS x n float64) are not held through the iterations
        self._kept = self._kept_d2 = None
        cen, out = self._buffers(k)
        key = (k, scales.columns.tobytes(), scales.wmax)
        bounds = self._bounds_for is not None and self._bounds_for.shape == centres.shape
        kind = step_kind(self._sums_for == key, bounds, self._changed / self.n)
        lay = step_layout(k, m)
        cen.upload(centres, self.dtype == "float32", scales)
        _memset(out.dev if kind == FULL else out.after_sums)
        self.rows.swap_labels()
        sf1, sf2 = scale_factors(scales.sse_exponent(centres))
        disp, kern = self.kernels()[("accumulate", None)]
        allow_shared(kern, lay.sum_smem)
        d2_all = self._d2
        w_all = self.rows.dw if self.rows.weighted else d2_all
        for s, (stream, x, ld, a, b) in enumerate(self.rows.chunks()):
            slot = s % len(self._flags)
            labels, old, d2, lb = (_part(v, a, b) for v in (self.rows.labels, self.rows.old, d2_all, self._lb))
            w = _part(w_all, a, b) if self.rows.weighted else w_all
            if kind == BOUNDED:
                keep_disp, keep_kern = self.kernels()[("keep", None)]
                launch(keep_disp, keep_kern, (x, ld, b - a, m, k, cen.d["ct"], old, labels, d2, lb,
                                              self._drift(centres), self._idx, out.counters[slot]),
                       max(1, -(-(b - a) // NT)), NT, stream)
            self._assign_chunk(x, ld, a, b, stream, slot, labels, d2, lb, lay, k,
                               listed=kind == BOUNDED)
            launch(disp, kern, (x, ld, b - a, m, k, labels, old, d2, w, self.rows.weighted, kind == FULL,
                                cen.d["f1"], cen.d["f2"], sf1, sf2, lay.jc, lay.copies, out.sums, out.sse,
                                out.counters[slot]),
                   lay.sum_grid(b - a, m), NT, stream, lay.sum_smem)
        out.dev.copy_to_host(out.host)  # the legacy default stream: after every chunk
        self._sums_for = key
        self._step_centres = centres.copy()
        self._bounds_for = None if self.rows.streaming else self._step_centres
        host = out.host
        changed = self._changed = int(host[out.ns + out.nsse + 1::3].sum())
        searched = int(host[out.ns + out.nsse + 2::3].sum()) if kind == BOUNDED else self.n
        return StepResult(sums=host[: out.ns].reshape(k, m + 1, 4).copy(),
                          sse=host[out.ns:out.ns + out.nsse].reshape(k, 4).copy(), changed=changed, searched=searched)

    def assign(self, centres: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Nearest centre and exact squared distance of every row; the step's labels and distances (which
        :meth:`farthest` answers from) are left alone."""
        centres = np.ascontiguousarray(centres, dtype=np.float64)
        k, m = centres.shape
        labels = np.empty(self.n, dtype=np.int32)
        dist2 = np.empty(self.n, dtype=np.float64)
        if self.n == 0:
            return labels, dist2
        cen, out = self._buffers(k)
        lay = step_layout(k, m)
        cen.upload(centres, self.dtype == "float32")
        dlab = cuda.device_array(self.n, dtype=np.int32)
        dd2 = cuda.device_array(self.n, dtype=np.float64)
        for s, (stream, x, ld, a, b) in enumerate(self.rows.chunks()):
            slot = s % len(self._flags)
            self._assign_chunk(x, ld, a, b, stream, slot, _part(dlab, a, b), _part(dd2, a, b), _part(self._lb, a, b),
                               lay, k)
        self._bounds_for = None  # the bounds now hold for these centres, not the step's
        dlab.copy_to_host(labels)
        dd2.copy_to_host(dist2)
        return labels, dist2

    def farthest(self, centres: np.ndarray, count: int) -> tuple:
        """The last step's distances answer for its own centres, on the device (see :meth:`Backend.farthest`).

        The ``count`` rows of largest distance (ties to the lower row) lie in the
        ``count`` blocks of :data:`.stepk.FAR_ROWS` rows whose largest distances
        are largest (ties to the lower block): a row outside them has ``count``
        blocks' largest rows before it.  So one pass takes each block's largest
        distance, the host selects the blocks, and only their rows cross.
        """
        last = self._step_centres
        if self.n == 0 or last is None or last.shape != centres.shape or not np.array_equal(last, centres):
            return super().farthest(centres, count)
        ks = self.kernels()
        nb = -(-self.n // FAR_ROWS)
        bmax = cuda.device_array(nb, dtype=np.float64)
        launch(*ks[("block_max", None)], (self._d2, self.n, bmax), nb, FAR_NT)
        blocks = np.sort(farthest_rows(bmax.copy_to_host(), count))  # ascending: ties stay in row order
        d2 = cuda.device_array(len(blocks) * FAR_ROWS, dtype=np.float64)
        labels = cuda.device_array(len(blocks) * FAR_ROWS, dtype=np.int32)
        launch(*ks[("gather", None)], (self._d2, self.rows.labels, self.n, cuda.to_device(blocks), d2, labels),
               len(blocks), FAR_NT)
        d2, labels = d2.copy_to_host(), labels.copy_to_host()
        rows = (blocks[:, None] * FAR_ROWS + np.arange(FAR_ROWS)).ravel()
        pick = farthest_rows(d2, min(count, self.n))  # the places past n hold -1: never picked
        return d2[pick], rows[pick], labels[pick]

    def score_rows(self, labels: np.ndarray, k: int):
        """The scores' passes on the device, over the rows in float64 (the values the run clustered).

        ==========================================  =================================================
        rows                                        the scores' passes read
        ==========================================  =================================================
        resident, float64                           the step's rows
        resident, float32, float64 copy fits in     a float64 copy made at the first call, kept for the
        half the free memory                        next K of a sweep
        streamed, or no room for the copy           the host's rows (returns None)
        ==========================================  =================================================
        """
        labels = np.asarray(labels)
        if self.n == 0 or self.rows.streaming or labels.shape != (self.n,) or labels.min() < 0:
            return None
        rows = self._score_rows_f64()
        if rows is None:
            return None
        return DeviceScoreRows(rows, self.rows.ld, self.n, self.m, self.rows.dw, labels, k, score_kernel_set())

    def _score_rows_f64(self):
        """The rows in float64 on the device (:meth:`score_rows`'s table), or None."""
        if self.dtype == "float64":
            return self.rows.dx
        if self._score_x is None:
            need = self.m * self.rows.ld * 8
            if self._host_x is None or need > 0.5 * self.limits.free_memory():
                return None
            self._score_x = cuda.device_array(self.m * self.rows.ld, dtype=np.float64)
            upload_soa(self._host_x, self._score_x, self.rows.ld)
        return self._score_x

    def forget_labels(self) -> None:
        self.rows.forget_labels()
        self._sums_for = None
        self._step_centres = None
        self._bounds_for = None

    # ------------------------------------------------------------------ the initialisations' passes
    def _on_device(self, d2) -> bool:
        return d2 is not None and not isinstance(d2, np.ndarray)

    def _init_launch(self, name: str, weighted, args: tuple, grid) -> None:
        disp, kern = initk_kernels(self.dtype, weighted)[name]
        launch(disp, kern, args, grid, initk.NT)

    def _d2_pass(self, d2, centre: np.ndarray, lower: bool) -> None:
        c = cuda.to_device(np.ascontiguousarray(centre, dtype=np.float64).ravel())
        self._init_launch("d2_lower" if lower else "d2", False, (self.rows.dx, self.n, self.rows.ld, self.m, c, d2),
                          -(-self.n // initk.NT))

    def dist2_to(self, centre: np.ndarray):
        """D² to one point, kept on the device (see :meth:`RowDistances.dist2_to`)."""
        if self.n == 0 or self.rows.streaming:
            return super().dist2_to(centre)
        d2 = cuda.device_array(self.n, dtype=np.float64)
        self._d2_pass(d2, centre, lower=False)
        return d2

    def lower_d2(self, d2, centre: np.ndarray):
        """``min(D², squared distance to centre)``, in place on the device: a copy of what the last potentials
        pass kept when ``centre`` was one of its candidates, else a pass over the rows."""
        if not self._on_device(d2):
            return super().lower_d2(d2, centre)
        kept, self._kept = self._kept, None
        if kept is not None and kept[0] is d2:
            row = np.ascontiguousarray(centre, dtype=np.float64).ravel().tobytes()
            for q, cand in enumerate(kept[1]):
                if cand.tobytes() == row:
                    d2.copy_to_device(self._kept_d2[q * self.n:(q + 1) * self.n])
                    return d2
        self._d2_pass(d2, centre, lower=True)
        return d2

    def nearest(self, points: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Nearest of a few points (the initialisations' candidates), on the device."""
        if self.n == 0 or self.rows.streaming:
            return super().nearest(points)
        pts = np.ascontiguousarray(points, dtype=np.float64)
        labels = cuda.device_array(self.n, dtype=np.int32)
        dist2 = cuda.device_array(self.n, dtype=np.float64)
        self._init_launch("nearest", False, (self.rows.dx, self.n, self.rows.ld, self.m, cuda.to_device(pts.ravel()),
                                             len(pts), labels, dist2), -(-self.n // initk.NT))
        return labels.copy_to_host(), dist2.copy_to_host()

    def d2_host(self, d2) -> np.ndarray:
        return d2.copy_to_host() if self._on_device(d2) else d2

    def _small(self, name: str, words: int, floats: int) -> tuple:
        """A device buffer kept for the initialisations' small outputs: ``words`` int64 then ``floats`` float64
        (views of one allocation, so one copy brings both back); returns (buffer, ints view, floats view)."""
        held = self._smalls.get(name)
        if held is None or held[0].size != words + floats:
            buf = cuda.device_array(words + floats, dtype=np.int64)
            held = self._smalls[name] = (buf, buf[:words], buf[words:].view(np.float64))
        return held

    def _fixed_blocks(self, d2, weights, s: int):
        """Exact limb sums and the largest ``w * D²`` of consecutive row blocks, on the host."""
        # blocks of about DRAW_ROWS rows: a draw copies one block's D² to the host and searches it there,
        # and the blocks' totals (3 words each) cross once a centre
        nb = max(1, min(initk.MAX_DRAW_BLOCKS, -(-self.n // initk.DRAW_ROWS)))
        buf, limbs, vmax = self._small("fixed_blocks", 2 * nb, nb)
        f1, f2 = scale_factors(s)
        weighted = weights is not None
        w = self.rows.dw if weighted else d2
        self._init_launch("fixed_blocks", weighted, (d2, w, self.n, nb, f1, f2, limbs[:nb], limbs[nb:], vmax), nb)
        host = buf.copy_to_host()
        return nb, host[:nb], host[nb:2 * nb], host[2 * nb:].view(np.float64)

    def d2_max(self, d2, weights: np.ndarray | None) -> float:
        if not self._on_device(d2):
            return super().d2_max(d2, weights)
        return float(self._fixed_blocks(d2, weights, 0)[3].max())

    def d2_fixed(self, d2, weights: np.ndarray | None, s: int):
        """Exact block totals on the device; a draw refines one block on the host (``exact.BlockFixed``)."""
        if not self._on_device(d2):
            return super().d2_fixed(d2, weights, s)
        nb, hi, lo, _ = self._fixed_blocks(d2, weights, s)
        return BlockFixed(initk.device_values(d2, weights), s, self.n, nb, hi, lo)

    def _kept_buffer(self):
        """MAX_TRIALS x n float64 for the candidates' lowered D² (kept from pass to pass), where it needs at most
        a quarter of the device's free memory; else None (lower_d2 then passes over the rows)."""
        if self._kept_d2 is None:
            need = initk.MAX_TRIALS * self.n * 8
            free, _ = cuda.current_context().get_memory_info()
            if 4 * need <= free:
                self._kept_d2 = cuda.device_array(initk.MAX_TRIALS * self.n, dtype=np.float64)
        return self._kept_d2

    def potentials(self, d2, cands: np.ndarray, weights: np.ndarray | None, s: int) -> list:
        """All candidates' exact potentials, :data:`.initk.MAX_TRIALS` candidates a pass over the rows; with
        one pass, each candidate's lowered D² is kept for :meth:`lower_d2`."""
        if not self._on_device(d2):
            return super().potentials(d2, cands, weights, s)
        cands = np.ascontiguousarray(cands, dtype=np.float64)
        f1, f2 = scale_factors(s)
        weighted = weights is not None
        w = self.rows.dw if weighted else d2
        T = initk.MAX_TRIALS
        grid = 2 if SIM else max(1, min(-(-self.n // initk.NT), 8 * self.limits.sm_count))
        kept = self._kept_buffer() if len(cands) <= T else None
        self._kept = None
        buf, acc, vmax = self._small("potentials", 2 * T, T)
        cbuf = self._small("candidates", 0, T * self.m)[2]
        out = []
        for a in range(0, len(cands), T):
            group = cands[a:a + T]
            t = len(group)
            padded = np.concatenate([group, np.repeat(group[-1:], T - t, axis=0)])
            cbuf.copy_to_device(np.ascontiguousarray(padded.T).ravel())  # attribute-major
            _memset(buf)
            self._init_launch("potentials", weighted, (self.rows.dx, self.n, self.rows.ld, self.m, cbuf, t, d2, w,
                                                       f1, f2, acc, vmax, int(kept is not None),
                                                       kept if kept is not None else d2), grid)
            host = buf.copy_to_host()
            v = host[2 * T:].view(np.float64)
            out += [(limbs_to_int(host[j], host[T + j]), float(v[j])) for j in range(t)]
        if kept is not None:
            self._kept = (d2, cands.copy())
        return out

    # ------------------------------------------------------------------ the rest
    def info(self) -> BackendInfo:
        d = next((d for d in device_descriptions() if d["index"] == self.device), None)
        return BackendInfo(name="gpu", devices=[f"{self.device}: {d['name'] if d else 'unknown'}"], threads=1,
                           dtype=self.dtype)

    def close(self) -> None:
        self.rows.close()
        self._centres = self._outputs = self._d2 = self._lb = self._idx = None
        self._bounds_for = self._kept = self._kept_d2 = self._host_x = self._score_x = None
        self._smalls = {}
        self._flags = []


@functools.lru_cache(maxsize=None)
def initk_kernels(dtype: str, weighted: bool) -> dict:
    """The initialisations' kernels for rows of ``dtype``, compiled or loaded: name -> (dispatcher, kernel)."""
    d = lambda dt: cuda.device_array(1, dtype=dt)  # noqa: E731
    x, f64, i32, i64 = d(dtype), d(np.float64), d(np.int32), d(np.int64)
    specs = {
        "d2": (initk.d2_kernel(False), (x, 1, 1, 1, f64, f64)),
        "d2_lower": (initk.d2_kernel(True), (x, 1, 1, 1, f64, f64)),
        "nearest": (initk.nearest_kernel(), (x, 1, 1, 1, f64, 1, i32, f64)),
        "fixed_blocks": (initk.fixed_blocks_kernel(weighted), (f64, f64, 1, 1, 1.0, 1.0, i64, i64, f64)),
        "potentials": (initk.potentials_kernel(weighted), (x, 1, 1, 1, f64, 1, f64, f64, 1.0, 1.0, i64, f64, 1, f64)),
    }
    return {name: (disp, compiled(name, (dtype, weighted), disp, args)) for name, (disp, args) in specs.items()}
