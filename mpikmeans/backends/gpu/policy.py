"""Which GPU step runs, and with which tiles: pure functions of the shape, the dtype and the state.

Nothing here touches a device, so the whole policy is tested without a GPU.

:func:`step_kind` — the one decision a step makes:

===================================================  ===========  =============================================
state                                                kind         rows searched; what the sums add
===================================================  ===========  =============================================
no sums kept for this K (first step, new K, other    ``full``     every row; every row's ``w x_j`` and ``w`` to
scales, forgotten)
                                                                  its cluster
sums kept, bounds for the last step's centres, at    ``bounded``  the rows Hamerly's test cannot keep (below);
most a quarter of its labels changed
                                                                  only rows whose label changed: taken from the
                                                                  old cluster, added to the new (exact)
sums kept; no bounds (rows streamed, or an           ``delta``    every row; as ``bounded``
assignment since the step), or more of its labels
changed
===================================================  ===========  =============================================

Every kind adds every row's exact ``w d²`` to the SSE.  A searched row is
screened (float32, certified) and rechecked exactly where the screen cannot
certify it; both leave a lower bound on the row's distance to every centre but
its own.  ``bounded`` first runs the ``keep`` pass: a row whose exact distance
to its own (moved) centre is below that bound less the farthest any centre
moved keeps its label, as the exact search would give it; only the others are
searched.  While many labels change (the first steps) most rows fail the test,
and the pass would only add a read of every row.  Rows resident on the device and rows streamed through in chunks run
the same kernels; an assignment without a step
(:meth:`.backend.GPUBackend.assign`) runs the screen and the recheck.

:func:`step_layout` — the tiles, from K, M and the shared memory a block may use:

==========================================  ===============================================================
shape                                       layout
==========================================  ===============================================================
K <= 16                                     the register screen's small tile: 4 rows x 8 centres a thread
K > 16                                      the wide tile: 4 rows x 16 centres (a row read once per 16)
K > 128                                     the GEMM screen (:mod:`.gemmk`, :data:`GEMM_MIN_K`) instead,
                                            on the wide tiles' centres: a row read once per 128 centres
``ceil(K / TC) * M * TC * 4`` bytes fit     the register screen stages every centre once per block
otherwise                                   the register screen stages its centres a chunk of tiles at a time
``24 K (M + 2) + 16`` bytes fit             the sums take every column, in up to 8 copies (one per warp)
otherwise, while ``48 K + 16`` bytes fit    the sums take a chunk of columns per block (grid y)
larger K                                    the sums go straight into the global limbs with atomics
==========================================  ===============================================================

The sums' budget counts the kernel's 16 bytes of static shared memory beside its dynamic bytes.
"""

from __future__ import annotations

from dataclasses import dataclass

from . import gemmk
from .stepk import NT, SCREEN_TILES, SUM_ROWS, sum_layout, sum_shared_bytes

FULL = "full"
DELTA = "delta"
BOUNDED = "bounded"

#: dynamic shared memory the step's kernels use at most a block (bytes): the default limit, no opt-in,
#: so that two blocks share a multiprocessor
SMEM_BYTES = 48 * 1024


#: the largest share of labels the last step may have changed for a ``bounded`` step
BOUNDED_CHANGED = 0.25

#: the most centres the register screen takes; more go to the GEMM screen, which reads a row once per 128
#: centres rather than once per 16 (below, its tiles of 128 centres would be mostly padding)
GEMM_MIN_K = 128

REGISTER = "register"
GEMM = "gemm"


def step_kind(sums_kept: bool, bounds_kept: bool = False, changed: float = 0.0) -> str:
    """The step's kind (the module docstring's table).

    Parameters
    ----------
    sums_kept : bool
        The device keeps the sums of the last step's labels at this step's K and scales.
    bounds_kept : bool
        The device keeps lower bounds for the last step's centres, at this step's K.
    changed : float
        The share of its rows whose label the last step changed (0 .. 1).
    """
    if not sums_kept:
        return FULL
    return BOUNDED if bounds_kept and changed <= BOUNDED_CHANGED else DELTA


@dataclass(frozen=True)
class StepLayout:
    """The launch shapes of one step (see the module docstring).

    Attributes
    ----------
    screen : {"register", "gemm"}
        Which screen runs (:data:`REGISTER`: :func:`.stepk.step_kernels`'s; :data:`GEMM`: :mod:`.gemmk`'s).
    tile : tuple
        The register screen's tile ``(rows, centres)`` a thread (one of :data:`.stepk.SCREEN_TILES`); the
        centres' layout either screen reads is by tiles of ``tile[1]``.
    ntiles : int
        Register tiles of centres (the last one padded).
    chunk : int
        Tiles the screen stages in shared memory at once (``>= ntiles``: all, once).
    screen_smem : int
        The screen's dynamic shared memory, bytes.
    jc, copies : int
        The accumulation's columns per block and copies of its sums (:func:`.stepk.sum_layout`).
    sum_smem : int
        The accumulation's dynamic shared memory, bytes.
    """

    screen: str
    tile: tuple
    ntiles: int
    chunk: int
    screen_smem: int
    jc: int
    copies: int
    sum_smem: int

    def sum_grid(self, n: int, m: int) -> tuple:
        """The accumulation's grid for ``n`` rows of ``m`` attributes."""
        return max(1, -(-n // SUM_ROWS)), -(-(m + 1) // self.jc)

    def screen_grid(self, n: int, sm_count: int) -> int:
        """Blocks of the screen: every multiprocessor several times over, at most one per tile of rows."""
        if self.screen == GEMM:
            return gemmk.gemm_grid(n, sm_count)
        return max(1, min(-(-n // (NT * self.tile[0])), 8 * sm_count))

    @property
    def screen_threads(self) -> int:
        """Threads per block of the screen."""
        return gemmk.NT if self.screen == GEMM else NT


def step_layout(k: int, m: int) -> StepLayout:
    """The tiles of a step with ``k`` centres of ``m`` attributes, in :data:`SMEM_BYTES` of shared memory a block
    (the screen takes one tile at least: where that is more, the kernel opts in to it).

    Parameters
    ----------
    k, m : int
    """
    gemm = k > GEMM_MIN_K
    tile = SCREEN_TILES[1] if gemm or k > 16 else SCREEN_TILES[0]  # the GEMM screen reads the wide tiles' layout
    tc = tile[1]
    ntiles = -(-k // tc)
    jc, copies = sum_layout(k, m, SMEM_BYTES)
    sums = {"jc": jc, "copies": copies, "sum_smem": sum_shared_bytes(k, jc, copies)}
    if gemm:  # its shared memory is static: none dynamic, no chunks
        return StepLayout(screen=GEMM, tile=tile, ntiles=ntiles, chunk=ntiles, screen_smem=0, **sums)
    tile_bytes = m * tc * 4
    chunk = max(1, min(ntiles, SMEM_BYTES // tile_bytes))
    return StepLayout(screen=REGISTER, tile=tile, ntiles=ntiles, chunk=chunk, screen_smem=chunk * tile_bytes, **sums)
