"""GPU launch plans (backends/gpu/plan.py): pure arithmetic on K, M, dtype and the device's limits.

The split full step's sums kernel gets its shape from :func:`sums_layout`; these tests pin the
invariants the kernel relies on (one owner per sum, whole groups per tile, regions that do not
overlap) and when :func:`choose_plan` takes the split step.
"""

from __future__ import annotations

import pytest

pytest.importorskip("numba")

from mpikmeans.backends.gpu import plan as P  # noqa: E402

LIMIT = 200 * 1024  # what the backend gives a block on an H100 (smem_optin 227 KB, capped)


def _regions(lay: P.SumsLayout, k: int, m: int, dsize: int, weighted: bool) -> list:
    """(start, end) byte ranges of the layout's regions."""
    out = [(lay.sums * 8, (lay.sums + lay.groups * k * m) * 8), (lay.cnt * 8, (lay.cnt + lay.groups * k) * 8),
           (lay.red * 8, lay.red * 8 + 8), (lay.xs * dsize, (lay.xs + lay.rows * lay.pitch) * dsize),
           (lay.lab * 4, (lay.lab + lay.rows) * 4), (lay.tmp * 4, lay.tmp * 4 + 4)]
    if weighted:
        out.append((lay.w * 8, (lay.w + lay.rows) * 8))
    if lay.cen >= 0:
        out.append((lay.cen * 8, (lay.cen + k * m) * 8))
    if lay.cf >= 0:  # the screen's centres (one tile of round_up(k, 4)) and shift
        tca = P.round_up(k, 4)
        out += [(lay.cf * 4, (lay.cf + tca * (m + 1)) * 4), (lay.sh * dsize, (lay.sh + m) * dsize)]
    return out


@pytest.mark.parametrize("k,m,storage,weighted", [
    (50, 100, "float32", False), (50, 100, "float64", True), (16, 8, "float32", False), (7, 3, "float64", False),
    (2, 1, "float32", True), (40, 250, "float32", False), (5, 180, "float64", True), (120, 90, "float64", False),
    (3, 33, "float32", False)])
def test_sums_layout_invariants(k, m, storage, weighted):
    lay = P.sums_layout(k, m, storage, weighted, LIMIT)
    assert lay is not None
    dsize = 8 if storage == "float64" else 4
    # every attribute has one owner in each group; the block's threads hold whole warps
    assert lay.cols == m and lay.nt == P.SUMS_NT and lay.groups * lay.cols <= lay.nt
    # a tile is whole warps of rows, and each thread stages fixed rows of it
    assert lay.rows % 32 == 0 and (lay.nt % lay.rows == 0 or lay.rows % lay.nt == 0)
    assert lay.rows >= lay.groups  # every group has rows
    # the staged pitch is odd and holds a row
    assert lay.pitch % 2 == 1 and lay.pitch >= m
    # the copies of the sums keep to their budget (one copy always allowed)
    copy = (k * m + k) * 8
    assert lay.groups == 1 or lay.groups * copy <= P.SUMS_COPIES_BYTES
    regions = sorted(_regions(lay, k, m, dsize, weighted))
    for (a0, a1), (b0, _b1) in zip(regions, regions[1:]):
        assert a1 <= b0, regions  # no overlap
    assert regions[-1][1] <= lay.smem <= LIMIT and lay.smem % 16 == 0
    # the next tile a thread holds in registers while the block sums the last one
    assert P.prefetch_values(lay.rows, m, lay.nt) * dsize <= P.SUMS_PREFETCH_MAX
    # every value of a tile is loaded by exactly one thread
    rt = min(lay.rows, lay.nt)
    assert P.prefetch_values(lay.rows, m, lay.nt) * lay.nt >= lay.rows * m and lay.nt % rt == 0
    # the kernel can assign the rows itself only where each thread holds whole rows of a tile
    if lay.cf >= 0:
        assert lay.rows % lay.nt == 0 and lay.rows // lay.nt * P.round_up(k, 4) <= P.ASSIGN_TC_MAX
        assert lay.cf * 4 % 16 == 0  # its 16-byte loads of four centres


def test_sums_layout_stages_the_centres_where_the_budget_allows():
    lay = P.sums_layout(50, 100, "float32", False, LIMIT)  # 40 KB of centres beside 53 KB
    assert lay.cen >= 0 and lay.smem >= (50 * 100 * 8) * 2
    off = P.sums_layout(50, 100, "float32", False, LIMIT, centres=False)
    assert off.cen == -1 and off.smem == lay.smem - 50 * 100 * 8
    # a budget that holds the block but not the centres too: read from global memory
    tight = P.sums_layout(50, 100, "float32", False, off.smem)
    assert tight == off
    # centres that would leave one block a multiprocessor: not staged (120 x 90: 86 KB of them)
    big = P.sums_layout(120, 90, "float32", False, LIMIT)
    assert big.cen == -1 and big.smem <= P.SUMS_CENTRES_BLOCK < big.smem + 120 * 90 * 8
    # the tile's values a thread prefetches: 32 rows of 100 attributes over 256 threads: 13
    assert P.prefetch_values(32, 100, 256) == 13 and P.prefetch_values(512, 8, 256) == 16


def test_sums_layout_spreads_small_shapes_over_groups():
    lay = P.sums_layout(16, 8, "float32", False, LIMIT)  # 1e8 x 8, K = 16: 1.1 KB a copy
    assert lay.groups == P.SUMS_NT // 8
    one = P.sums_layout(50, 100, "float32", False, LIMIT)  # 5e6 x 100, K = 50: 40 KB a copy
    assert one.groups == 1 and one.rows == 64
    # float64: 16 KB staged at most, 32 rows
    assert P.sums_layout(50, 100, "float64", False, LIMIT).rows == 32


def test_sums_layout_holds_whole_rows_where_the_kernel_can_assign_them():
    """1e8 x 8, K = 16 (and 2e6 x 3, K = 7): tiles of whole rows a thread (a multiple of the block's
    threads), the screen's centres staged, so a full step can be the sums kernel alone."""
    c32 = P.sums_layout(16, 8, "float32", False, LIMIT)
    assert c32.rows == 512 and c32.cf >= 0 and c32.sh >= 0
    # float64: 16 KB staged would be 128 rows; whole rows a thread take 256
    c64 = P.sums_layout(16, 8, "float64", True, LIMIT)
    assert c64.rows == P.SUMS_NT and c64.cf >= 0
    assert P.sums_layout(7, 3, "float32", False, LIMIT).cf >= 0
    # tiles of fewer rows where a thread's rows would hold more distances (48 KB staged: 1280 rows, 5 x 16)
    assert P.sums_layout(16, 8, "float32", False, LIMIT, 64, 48 * 1024).rows == 512
    # more than 32 distances for one row (5e6 x 100, K = 50; K = 40): the labels come from pass 1
    assert P.sums_layout(50, 100, "float32", False, LIMIT).cf == -1
    assert P.sums_layout(40, 33, "float32", False, LIMIT).cf == -1
    assert P.sums_layout(32, 33, "float32", False, LIMIT).cf >= 0


def test_sums_layout_refuses_what_does_not_fit():
    assert P.sums_layout(1000, 32, "float32", False, LIMIT) is None  # 264 KB of sums
    assert P.sums_layout(1000, 257, "float64", False, LIMIT) is None
    assert P.sums_layout(5, 2000, "float64", False, LIMIT) is None  # more attributes than threads
    assert P.sums_layout(50, 100, "float32", False, 32 * 1024) is None  # the block's budget
    assert P.sums_layout(50, 100, "float32", False, 72 * 1024) is not None  # 64 rows, centres from global


def test_choose_plan_takes_the_split_step_for_resident_full_steps():
    def mode(k, m, **kw):
        args = dict(assign=False, weighted=False, smem_limit=LIMIT, tune={}, split=True)
        args.update(kw)
        return P.choose_plan(k, m, "float32", args.pop("assign"), args.pop("weighted"), args.pop("smem_limit"),
                             args.pop("tune"), **args).mode

    assert mode(50, 100) == P.MODE_STEP_SPLIT
    assert mode(16, 8, weighted=True) == P.MODE_STEP_SPLIT
    assert mode(50, 100, split=False) == P.MODE_STEP_SHARED  # streamed rows, or few
    assert mode(50, 100, tune={"split": False}) == P.MODE_STEP_SHARED
    assert mode(50, 100, split=False, tune={"split": True}) == P.MODE_STEP_SPLIT
    assert mode(1000, 32, tune={"split": True}) == P.MODE_STEP_GLOBAL  # forced, but it does not fit
    assert mode(50, 100, tune={"sum_mode": "global"}) == P.MODE_STEP_GLOBAL
    assert mode(50, 100, assign=True) == P.MODE_ASSIGN
    assert mode(50, 100, delta=True) == P.MODE_STEP_DELTA
    assert mode(1000, 32) == P.MODE_STEP_GLOBAL  # the sums do not fit a block
    plan = P.choose_plan(50, 100, "float32", False, False, LIMIT, {}, split=True)
    assert plan.offs.sums == 0 and plan.offs.xs == 0  # pass 1 alone: no summing regions
    assert plan.sums == P.sums_layout(50, 100, "float32", False, LIMIT)  # the sums kernel's, carried by the plan
    assert P.choose_plan(50, 100, "float32", False, False, LIMIT, {}, split=False).sums is None


def test_sums_register_cap_keeps_what_shared_memory_allows_resident():
    """The sums kernel's register cap: 64 where four blocks fit in shared memory, else what the blocks
    shared memory holds leave (the H100: 228 KB and 64 K registers a multiprocessor)."""
    from types import SimpleNamespace

    from mpikmeans.backends.gpu import sums as S

    h100 = SimpleNamespace(smem_sm=228 * 1024, regs_sm=65536)
    a32 = P.sums_layout(50, 100, "float32", False, LIMIT, 32, centres=False)  # 53 KB: four blocks
    a64 = P.sums_layout(50, 100, "float64", False, LIMIT, centres=False)  # 66 KB: three
    assert S.register_cap(h100, a32) == S.SUMS_MAXREG == 64
    assert S.register_cap(h100, a64) == 80  # 65536 / (3 x 256) = 85, in steps of 8
    # 64 rows with the centres staged (106 KB): two blocks, 128 registers
    assert S.register_cap(h100, P.sums_layout(50, 100, "float32", False, LIMIT)) == 128
    # small blocks, many resident: never under the cap that keeps four
    assert S.register_cap(h100, P.sums_layout(7, 3, "float32", False, LIMIT)) == S.SUMS_MAXREG
    # one block a multiprocessor: at most 255
    assert S.register_cap(SimpleNamespace(smem_sm=60 * 1024, regs_sm=65536), a32) == 255
