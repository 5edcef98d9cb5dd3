"""Launch plans: tiles, block size, summing mode and the two memory layouts of a step.

A :class:`Plan` is chosen once per (K, M, dtype, device) from the shared memory a
block may use and a few measured rules (``bench/GPU_NOTES.md``), and fixes
everything the fused kernel is specialised on.  Two layouts are computed here,
with one piece of arithmetic (:class:`_Arena`):

* :class:`SharedLayout`: where each region of a block's dynamic shared memory
  starts (centres, their norms, the shift, partial sums and counts, the
  counting-sort arrays, the staged tile), in units of each region's dtype;
* :class:`PackLayout`: the one device buffer a step copies in and out (centre
  data first, then sums, counts, SSE and counters), as element offsets into its
  float32, float64 and int64 views.

Nothing here touches a device: the plan is pure arithmetic on K, M, the dtype
and the device's limits, so it is tested without a GPU.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

from .device import SIM

# modes of the fused kernel
MODE_STEP_SHARED = 0  # step, per-block partial sums in shared memory
MODE_STEP_GLOBAL = 1  # step, sums straight into global memory with atomics
MODE_ASSIGN = 2  # labels and exact squared distances only
MODE_STEP_DELTA = 3  # step, only the changes of the sums (rows whose label changed)
MODE_STEP_SPLIT = 4  # step, pass 1 only (certified labels); the sums kernel of sums.py adds the rows

#: the split sums kernel (:mod:`.sums`): threads per block, bytes of all copies of the partial
#: sums at most, bytes of a staged tile about (at most STAGE_MAX), bytes of one copy at most
SUMS_NT = 64 if SIM else 256
SUMS_COPIES_BYTES = 48 * 1024
SUMS_STAGE_BYTES = 16 * 1024
SUMS_STAGE_MAX = 48 * 1024
SUMS_COPY_MAX = 96 * 1024
#: ... and at most this many rows per group in a tile (``tune={"sums_group_rows": R}`` overrides it):
#: 64 against 32 measured 2.08 against 2.34 ms a full step of 5e6 x 100, K = 50, float32 on the H100
#: (the tile is in flight while the block sums the last one: more bytes in flight a block;
#: ``bench/results/fullstep_H100_2026-11-26_s11_gr64.log``)
SUMS_GROUP_ROWS = 64
#: ... and at most this many bytes of the next tile a thread holds in registers while the block sums
#: the last one (:func:`prefetch_values`; 64 registers; under the simulator, whose blocks have a quarter
#: of the threads, four times as many bytes a thread: the same tiles)
SUMS_PREFETCH_MAX = 1024 if SIM else 256
#: ... and stages the centres only in a block of at most this many bytes: two blocks a multiprocessor
#: on sm_90 (228 KB, 1 KB of each block reserved); one block would have no other to overlap with
SUMS_CENTRES_BLOCK = 113 * 1024
#: the sums kernel finds the labels itself (no pass 1) where a thread's rows times the centres' tile
#: (``round_up(k, 4)``) are at most this many float32 distances in registers (tiles of fewer rows where
#: that makes them fit)
ASSIGN_TC_MAX = 32
#: the certificate's bound on the centres, ``zl``: twice the largest ``|z|^2`` times ``1 + ZL_MARGIN`` (the
#: float32 rounding of the norms), at most ``ZL_CAP`` (float32 stays finite); made on the host
#: (:func:`.hostk.fill_centres`) or on the device (:func:`.gemmcentres.prep_kernel`)
ZL_MARGIN = 1e-6
ZL_CAP = 3.0e38
#: a full step takes the split path from this many values of rows on (N x M): below it the second
#: launch and its barriers cost more than they save (H100, 2e6 x 3, K = 7: 0.12 -> 0.19 ms), unless the
#: split step is one kernel (the backend's rule, :meth:`.backend.GPUBackend._plan`)
SPLIT_MIN_VALUES = 1 << 24


def round_up(a: int, b: int) -> int:
    """``a`` rounded up to a multiple of ``b``."""
    return (a + b - 1) // b * b


class _Arena:
    """Consecutive regions of one buffer: each starts at an aligned byte offset."""

    def __init__(self):
        self.end = 0

    def take(self, nbytes: int, align: int = 16) -> int:
        """Byte offset of a new region of ``nbytes`` (0 bytes: a zero-length region)."""
        start = round_up(self.end, align)
        self.end = start + nbytes
        return start

    def total(self, align: int = 16) -> int:
        """Bytes of the whole buffer, rounded up to ``align``."""
        return round_up(self.end, align)


class SharedLayout(NamedTuple):
    """Offsets into a block's dynamic shared memory, in units of each view's dtype.

    ``cm`` (float32) centre data ``-2 z`` per tile; ``cc`` (float32) their norms;
    ``sh`` (storage dtype) the shift; ``sums``/``cnt`` (float64) per-block partial
    sums and counts; ``hist``/``start``/``perm``/``slab``/``lab`` (int32) the
    counting sort of a tile's rows by label; ``w`` (float64) the tile's weights;
    ``xs`` (storage dtype) the staged attributes; ``red`` (float64) and ``tmp``
    (int32) the block's SSE and change count.  Not offsets: ``jc``, attributes
    staged per pass-2 chunk, and ``brp``, the staged tile's row pitch.
    """

    cm: int
    cc: int
    sh: int
    sums: int
    cnt: int
    hist: int
    start: int
    perm: int
    slab: int
    lab: int
    w: int
    xs: int
    red: int
    jc: int
    brp: int
    tmp: int


class PackLayout(NamedTuple):
    """Element offsets into the float32 (``p32_*``), float64 (``p64_*``), int64 (``i64_*``) and int32
    (``i32_*``) views of a step's device buffer (see :func:`pack_layout`)."""

    p32_cm: int
    p32_cc: int
    p32_sh: int
    p32_zl: int
    p64_c64: int
    p64_sh: int
    p64_sums: int
    p64_cnt: int
    p64_sse: int
    i64_chg: int
    i32_hist: int


@dataclass(frozen=True)
class Plan:
    """One kernel configuration and its shared-memory layout.

    Attributes
    ----------
    mode : int
        One of the ``MODE_*`` constants.
    R, TC, NT : int
        Rows per thread, centres per register tile, threads per block.
    nct : int
        Centre tiles (``ceil(K / TC)``).
    centres_shared : bool
        Whether the centre data sit in shared memory (else they are read from global).
    offs : SharedLayout
    smem : int
        Dynamic shared memory per block, bytes.
    maxreg : int
        Register cap per thread (0: the compiler's choice).
    sums : SumsLayout or None
        The split step's summing kernel (:data:`MODE_STEP_SPLIT` only).
    """

    mode: int
    R: int
    TC: int
    NT: int
    nct: int
    centres_shared: bool
    offs: SharedLayout
    smem: int
    maxreg: int = 0
    sums: SumsLayout | None = None


class SumsLayout(NamedTuple):
    """Shape and shared memory of the split sums kernel (:func:`.sums.sums_kernel`).

    ``groups`` copies of the K x M partial sums (and K counts), each owned by a group of
    ``cols`` threads (thread ``c`` of a group owns attribute ``c``: no two threads add
    into one sum, so no atomics); ``nt`` threads per block, all of which stage, those past
    ``groups * cols`` only stage.  Tiles of ``rows`` rows: a multiple of 32 that divides
    ``nt`` or a multiple of ``nt`` (so each thread stages fixed rows: :func:`.sums.sums_kernel`),
    staged row-major with the odd ``pitch`` (no bank conflicts on either side of the
    transpose); group ``g`` sums rows ``g, g + groups, ...`` (a multiple of 4 of them;
    ``groups`` is a power of two).  Offsets in units of each
    view's dtype: ``sums``, ``cnt``, ``w``, ``red`` (float64), ``xs`` (storage dtype),
    ``lab``, ``tmp`` (int32); ``smem`` bytes in all; ``cen`` (float64): the K x M centres
    staged once a block, or -1 where the walk reads them from global memory.

    ``cf >= 0``: the kernel can find the rows' labels itself (one kernel a full step, no pass 1:
    :data:`ASSIGN_TC_MAX`): each thread holds whole rows (``rows`` a multiple of ``nt``), and the
    float32 screen's centres of one tile of ``round_up(k, 4)`` (``-2 (c - s)`` by attribute, then
    ``|c - s|^2``) are staged at ``cf`` (float32 units), the shift ``s`` at ``sh`` (storage units).
    """

    groups: int
    cols: int
    nt: int
    rows: int
    pitch: int
    sums: int
    cnt: int
    w: int
    red: int
    xs: int
    lab: int
    tmp: int
    smem: int
    cen: int = -1
    cf: int = -1
    sh: int = -1


def sums_layout(k: int, m: int, storage: str, weighted: bool, budget: int,
                group_rows: int = SUMS_GROUP_ROWS, stage_bytes: int = SUMS_STAGE_BYTES,
                centres: bool = True) -> SumsLayout | None:
    """The split sums kernel's layout for K x M, or None where it does not fit.

    As many copies as fill :data:`SUMS_COPIES_BYTES` (small K x M: every thread of a
    block busy on few attributes), rows per tile to stage about :data:`SUMS_STAGE_BYTES`.
    None where one copy takes more than :data:`SUMS_COPY_MAX`, M is more than a block's
    threads, the staged tile more than :data:`SUMS_STAGE_MAX` (or more than
    :data:`SUMS_PREFETCH_MAX` bytes a thread) or the block more than ``budget`` bytes.
    ``group_rows`` and ``stage_bytes`` (:data:`SUMS_GROUP_ROWS`,
    :data:`SUMS_STAGE_BYTES`; ``tune`` keys ``sums_group_rows``, ``sums_stage_bytes``): at most
    this many rows per group in a tile, and about this many bytes staged.  ``centres``
    (``tune`` key ``sums_centres``): stage the K x M float64 centres in the block where the
    budget and :data:`SUMS_CENTRES_BLOCK` allow (the walk reads one per value; from global
    memory they come from L2, as the staged tiles leave the L1 little room).  Tiles of whole rows a
    thread where the kernel can then find the rows' labels itself (``cf``, :data:`ASSIGN_TC_MAX`).
    """
    dsize = 8 if storage == "float64" else 4
    nt = SUMS_NT
    copy = (k * m + k) * 8
    pitch = m | 1
    if copy > SUMS_COPY_MAX or m > nt:
        return None
    # a power of two (it divides the block's threads), each group's rows a multiple of 4 (the walk's batches)
    groups = 1 << (max(1, min(nt // m, SUMS_COPIES_BYTES // copy)).bit_length() - 1)
    want = groups * max(4, min(int(group_rows), int(stage_bytes) // (groups * pitch * dsize)) // 4 * 4)
    # 32 d rows for d a divisor of nt / 32, or multiples of nt: the fewest at least ``want``
    shapes = [32 * d for d in range(1, nt // 32 + 1) if (nt // 32) % d == 0] + [nt * x for x in range(2, 9)]
    rows = min((r for r in shapes if r >= want and r % (4 * groups) == 0), default=nt * 8)
    tca = round_up(k, 4)
    if tca <= ASSIGN_TC_MAX and nt % (4 * groups) == 0 and nt * pitch * dsize <= SUMS_STAGE_MAX:
        # whole rows a thread, as many as its distances allow: the kernel can find their labels itself
        rows = max(nt, min(rows, nt * (ASSIGN_TC_MAX // tca)) // nt * nt)
    if rows * pitch * dsize > SUMS_STAGE_MAX or prefetch_values(rows, m, nt) * dsize > SUMS_PREFETCH_MAX:
        return None
    assign = rows % nt == 0 and rows // nt * tca <= ASSIGN_TC_MAX
    for cen in ([True, False] if centres else [False]):
        a = _Arena()
        sums = a.take(groups * k * m * 8)
        cnt = a.take(groups * k * 8)
        w = a.take(rows * 8 if weighted else 0)
        red = a.take(8)
        xs = a.take(rows * pitch * dsize)
        lab = a.take(rows * 4)
        tmp = a.take(4)
        cs = a.take(k * m * 8 if cen else 0)
        cf = a.take(tca * (m + 1) * 4 if assign else 0)
        sh = a.take(m * dsize if assign else 0)
        smem = a.total()
        if smem <= (min(budget, SUMS_CENTRES_BLOCK) if cen else budget):
            return SumsLayout(groups=groups, cols=m, nt=nt, rows=rows, pitch=pitch, sums=sums // 8, cnt=cnt // 8,
                              w=w // 8, red=red // 8, xs=xs // dsize, lab=lab // 4, tmp=tmp // 4, smem=smem,
                              cen=cs // 8 if cen else -1, cf=cf // 4 if assign else -1,
                              sh=sh // dsize if assign else -1)
    return None


def prefetch_values(rows: int, m: int, nt: int) -> int:
    """Values of a tile of ``rows`` x ``m`` that each of ``nt`` threads loads (and holds while the
    block sums the tile before): rows ``t % RT, + RT, ...`` of attributes ``t // RT, + nt / RT, ...``
    with ``RT = min(rows, nt)``."""
    rt = min(rows, nt)
    return (rows // rt) * -(-m // (nt // rt))


def shared_layout(k: int, m: int, storage: str, mode: int, R: int, TC: int, NT: int,
                  centres_shared: bool, weighted: bool, jc: int | None = None,
                  target: int | None = None) -> tuple[SharedLayout, int]:
    """Byte layout of the dynamic shared memory; offsets in units of each view's dtype.

    ``jc`` attributes are staged per pass-2 chunk; when not given, the widest chunk
    (at most 32) that keeps the block within ``target`` bytes, so that the wanted
    number of blocks stays resident on a multiprocessor.

    Returns
    -------
    layout : SharedLayout
    smem : int
        Bytes, a multiple of 16.
    """
    if jc is None:
        nchunks = max(1, -(-m // 32))
        while True:
            jc = -(-m // nchunks)
            offs, smem = shared_layout(k, m, storage, mode, R, TC, NT, centres_shared, weighted, jc)
            if target is None or smem <= target or jc == 1 or mode != MODE_STEP_SHARED:
                return offs, smem
            nchunks += 1
    # pass 2 maps a warp's lanes to the staged attributes: at most one per lane
    jc = max(1, min(int(jc), 32, NT))
    dsize = 8 if storage == "float64" else 4
    kp = round_up(k, TC)
    BR = NT * R
    brp = BR + 1
    a = _Arena()
    cm = a.take(kp * m * 4 if centres_shared else 0)
    cc = a.take(kp * 4)
    sh = a.take(m * dsize)
    red = a.take(16)
    tmp = a.take(16)
    sums = cnt = hist = start = perm = slab = w = xs = 0
    if mode == MODE_STEP_SHARED:
        sums = a.take(k * m * 8)
        cnt = a.take(k * 8)
        hist = a.take(k * 4)
        start = a.take((k + 1) * 4)
        perm = a.take(BR * 4)
        slab = a.take(BR * 4)
        w = a.take(BR * 8 if weighted else 0)
        xs = a.take(jc * brp * dsize)
    layout = SharedLayout(cm=cm // 4, cc=cc // 4, sh=sh // dsize, sums=sums // 8, cnt=cnt // 8, hist=hist // 4,
                          start=start // 4, perm=perm // 4, slab=slab // 4, lab=0, w=w // 8, xs=xs // dsize,
                          red=red // 8, jc=jc, brp=brp, tmp=tmp // 4)
    return layout, a.total()


def choose_plan(k: int, m: int, storage: str, assign: bool, weighted: bool,
                smem_limit: int, tune: dict, smem_sm: int = 228 * 1024, delta: bool = False,
                split: bool = False) -> Plan:
    """Pick rows per thread, centre tile, block size and the summing mode.

    Registers: each thread keeps ``R * TC`` float32 running distances; about 128 keeps
    the kernel near 170 registers.  ``K <= 64``: one tile of all centres.  Larger K:
    tiles of 32 or 64 centres with the rows re-read (from L1) per tile.

    Parameters
    ----------
    k, m : int
    storage : {"float64", "float32"}
    assign : bool
        A plan for the assignment only (no sums).
    weighted : bool
    smem_limit : int
        Dynamic shared memory a block may use, bytes.
    tune : dict
        Overrides (see :class:`~mpikmeans.backends.gpu.GPUBackend`).
    smem_sm : int
        Shared memory per multiprocessor, bytes.
    delta : bool
        A plan for incremental steps.
    split : bool
        A full step takes the split path (:data:`MODE_STEP_SPLIT`: the fused kernel's
        pass 1, then the sums kernel of :mod:`.sums`) where :func:`sums_layout` fits: the
        caller says whether the rows are resident and many enough
        (:data:`SPLIT_MIN_VALUES`); ``tune={"split": bool}`` decides instead where it fits.

    Returns
    -------
    Plan
    """
    kp4 = round_up(max(k, 1), 4)
    if "TC" in tune:
        TC = int(tune["TC"])
    elif kp4 <= 64:
        TC = kp4
    elif k <= 256:
        TC = 32
    else:
        TC = 64
    nct = -(-k // TC)
    if "R" in tune:
        R = int(tune["R"])
    else:
        # two rows per thread measured best for K = 16, 50 and 1000 (bench/GPU_NOTES.md)
        R = max(1, min(2, 128 // TC))
    NT = int(tune.get("NT", 256 if TC >= 64 else 128))
    if SIM:
        NT = int(tune.get("NT", 32))
    if NT % 32:
        raise ValueError(f"GPU tune NT={NT}: threads per block must be a multiple of 32")
    budget = int(tune.get("smem_budget", smem_limit))
    maxreg = int(tune.get("maxreg", 0))
    want_cs = tune.get("centres_shared")
    sum_mode = tune.get("sum_mode")
    sums = None  # the split step's summing kernel, where it is taken
    if assign:
        modes = [MODE_ASSIGN]
    elif sum_mode == "global":
        modes = [MODE_STEP_GLOBAL]
    elif sum_mode == "walk":
        modes = [MODE_STEP_SHARED, MODE_STEP_GLOBAL]
    elif delta:
        modes = [MODE_STEP_DELTA]
    else:
        modes = [MODE_STEP_SHARED, MODE_STEP_GLOBAL]
        sums = (sums_layout(k, m, storage, weighted, budget, int(tune.get("sums_group_rows", SUMS_GROUP_ROWS)),
                            int(tune.get("sums_stage_bytes", SUMS_STAGE_BYTES)), bool(tune.get("sums_centres", True)))
                if tune.get("split", split) else None)
        if sums is not None:
            modes.insert(0, MODE_STEP_SPLIT)
    blocks = int(tune.get("blocks", 2))
    target = None
    if not SIM:
        target = min(budget, smem_sm // blocks - 1024)
    jc = int(tune["JC"]) if "JC" in tune else None
    for mode in modes:
        for cs in ([want_cs] if want_cs is not None else [True, False]):
            offs, smem = shared_layout(k, m, storage, mode, R, TC, NT, cs, weighted, jc, target)
            if smem <= budget:
                return Plan(mode, R, TC, NT, nct, cs, offs, smem, maxreg, sums if mode == MODE_STEP_SPLIT else None)
    # the last resort always fits: no centres, no sums in shared memory
    mode = MODE_ASSIGN if assign else MODE_STEP_GLOBAL
    offs, smem = shared_layout(k, m, storage, mode, R, TC, NT, False, weighted)
    return Plan(mode, R, TC, NT, nct, False, offs, smem, maxreg)


#: copies of the per-centre row counters the GEMM path's sums by label count into (:mod:`.bylabel`): a
#: block counts into copy ``block % HIST_COPIES``, so each counter takes that many times fewer atomics
#: (D: 3e5 rows into 1000 counters, 4 KB)
HIST_COPIES = 2 if SIM else 8


def pack_layout(k: int, m: int, TC: int, nct: int, storage: str, nslots: int,
                tiles: bool = True) -> tuple[PackLayout, int, int]:
    """Layout of the per-step device buffer: inputs (centre data) first, then outputs.

    One allocation holds everything a step moves between host and device, so a step
    is one host-to-device copy (the inputs, and zeros for the outputs) and one
    device-to-host copy (the outputs).  The kernels get four views of it (float32,
    float64, int64, int32) and compile-time offsets into them.  ``tiles`` false: no centre
    tiles and norms (the GEMM path makes its own on the device, :func:`.gemmcentres.prep_kernel`).

    Returns
    -------
    layout : PackLayout
        Element offsets.  The int64 counters are last: ``changed`` at ``i64_chg``, then
        ``nslots`` flagged-row counters (one per chunk), then the rows the bounds test
        left to pass 1 (:mod:`.bounds`), then the rows the TF32 screen left to the float32
        one (:mod:`.tensor`'s cascade), so ``layout`` does not depend on ``nslots``.
    out0 : int
        Byte offset of the outputs (sums, counts, SSE, counters).
    total : int
        Bytes of the whole buffer (a multiple of 16).
    """
    kp = nct * TC
    f32 = storage == "float32"
    a = _Arena()
    # the centre tiles and norms (none where the device makes them: ``tiles`` false)
    cm = a.take(kp * m * 4 if tiles else 0)  # 16-byte aligned: read with 16-byte vector loads
    cc = a.take(kp * 4 if tiles else 0)
    sh32 = a.take(m * 4 if f32 else 0)
    zl = a.take(4)
    c64 = a.take(k * m * 8)
    sh64 = a.take(0 if f32 else m * 8)
    # int32 per centre and copy, zero on the device after every upload (never written on the host): the
    # rows a step's sums group by label count into it (:mod:`.bylabel`)
    hist = a.take(k * 4 * HIST_COPIES)
    out0 = a.take(0)
    sums = a.take(k * m * 8, 8)
    cnt = a.take(k * 8, 8)
    sse = a.take(8, 8)
    ctr = a.take((3 + max(1, nslots)) * 8, 8)
    layout = PackLayout(p32_cm=cm // 4, p32_cc=cc // 4, p32_sh=sh32 // 4, p32_zl=zl // 4, p64_c64=c64 // 8,
                        p64_sh=sh64 // 8, p64_sums=sums // 8, p64_cnt=cnt // 8, p64_sse=sse // 8,
                        i64_chg=ctr // 8, i32_hist=hist // 4)
    return layout, out0, a.total()
