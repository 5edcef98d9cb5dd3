"""Host side of the GPU's kept bounds (mpikmeans/backends/gpu/bounds.py): the rule that decides where
bounds are kept.  The kernels (the centres' moves and drops, the test) run in the simulator scenarios of
tests/test_backend_gpu.py (every step against the CPU; the moves against the CPU bounds') and on a GPU in
its ``gpu`` tests; the test kernel also alone, under the simulator, below."""

import pytest
from conftest import run_simulated

bounds = pytest.importorskip("mpikmeans.backends.gpu.bounds")


@pytest.mark.parametrize("k,m,dtype,pays", [
    (50, 100, "float32", True),  # 5e6 x 100, K = 50: pass 1 1.7 ms of a 3.1 ms step
    (50, 100, "float64", True),
    (1000, 257, "float32", True),  # the GEMM path's shape
    (1000, 32, "float32", True),
    (16, 8, "float32", False),  # 1e8 x 8, K = 16: the test cost more than it saved (H200)
    (16, 8, "float64", False),
    (7, 3, "float64", False),
])
def test_bounds_are_kept_where_a_row_costs_pass_1_more_than_the_test(k, m, dtype, pays):
    assert bounds.bounds_pay(k, m, dtype) == pays


@pytest.mark.parametrize("want, k, m, wanted", [
    ("auto", 50, 100, True), ("auto", 16, 8, False),  # the rule
    (True, 16, 8, True),  # forced on (the simulator scenarios' small shapes)
    (False, 50, 100, False),  # switched off (bench fullstep --compare '[{"bounds": false}]')
])
def test_tune_bounds_forces_or_switches_off_the_rule(want, k, m, wanted):
    assert bounds.bounds_wanted(want, k, m, "float32") == wanted


_TEST_KERNEL_PROGRAM = r"""
import json, sys
import numpy as np
from numba import cuda
from mpikmeans.backends.gpu import bounds as B

rng = np.random.default_rng(3)
out = []
for n, rpt, write in ((300, 4, 1), (300, 1, 0), (1000, 8, 1), (5, 4, 1)):
    k = 5
    labels = rng.integers(-1, k, n).astype(np.int32)
    ub = rng.uniform(0.5, 1.5, n).astype(np.float32)
    lb = rng.uniform(0.5, 2.5, n).astype(np.float32)
    mv = np.concatenate([rng.uniform(0, 0.2, k), rng.uniform(0, 0.2, k)])
    u = ub.astype(np.float64) + mv[np.maximum(labels, 0)]
    lo = lb.astype(np.float64) - mv[k + np.maximum(labels, 0)]
    keep = (labels >= 0) & (u * (1 + B.MARGIN) < lo * (1 - B.MARGIN))
    d = [cuda.to_device(a) for a in (labels, ub, lb, mv)]
    idx = cuda.to_device(np.full(n, -1, np.int32))
    ctr = cuda.to_device(np.zeros(2, np.int64))
    newlab = cuda.to_device(np.full(n, -7, np.int32))
    B.test_kernel(rpt)[2, B.TEST_NT](*d, n, k, idx, ctr, 1, newlab, write)
    got = idx.copy_to_host()
    cnt = int(ctr.copy_to_host()[1])
    tile = B.TEST_NT * rpt
    # the list is each tile's failed rows in row order, the tiles in any order: runs of one tile each
    runs = []
    p = 0
    while p < cnt:
        t = got[p] // tile
        q = p
        while q < cnt and got[q] // tile == t:
            q += 1
        runs.append(got[p:q].tolist())
        p = q
    nl = newlab.copy_to_host()
    out.append(dict(n=n, rpt=rpt, count=cnt, failed=sorted(got[:cnt].tolist()),
                    want=np.flatnonzero(~keep).tolist(), rest=got[cnt:].tolist(),
                    runs_sorted=all(r == sorted(r) for r in runs),
                    tiles_once=len(runs) == len({r[0] // tile for r in runs}),
                    ub_kept=bool(np.all(d[1].copy_to_host()[keep] >= u[keep].astype(np.float32))),
                    lb_kept=bool(np.all(d[2].copy_to_host()[keep] <= lo[keep].astype(np.float32))),
                    newlab=bool(np.array_equal(nl[keep], labels[keep]) if write else np.all(nl == -7)),
                    untouched=bool(np.all(nl[~keep] == -7))))
print(json.dumps(out))
"""


def test_sim_bounds_test_lists_each_tiles_failed_rows_in_row_order():
    """The test kernel under the simulator: the rows whose bounds fail (label -1 among them), each
    tile's in row order; the kept rows' bounds widened by their centres' moves and their labels into
    ``newlab`` where asked; for 1, 4 and 8 rows a thread and a tile past the end of the rows."""
    for rec in run_simulated(_TEST_KERNEL_PROGRAM, timeout=300):
        assert rec["count"] == len(rec["want"]) and rec["failed"] == rec["want"], rec
        assert all(v == -1 for v in rec["rest"]), rec
        assert rec["runs_sorted"] and rec["tiles_once"], rec
        assert rec["ub_kept"] and rec["lb_kept"] and rec["newlab"] and rec["untouched"], rec


def test_bounds_test_rows_a_thread_fit_the_packed_scan():
    """Each of a thread's rows has a field of the test's scan wide enough for a block's count."""
    assert (1 << bounds.FIELD_BITS) > bounds.TEST_NT
    assert bounds.test_rows_max() * bounds.FIELD_BITS <= 63 and bounds.test_rows_max() >= bounds.TEST_RPT
    with pytest.raises(ValueError, match="rpt"):
        bounds.test_kernel(bounds.test_rows_max() + 1)
