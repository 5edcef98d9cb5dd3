"""Host side of the GPU's kept bounds (mpikmeans/backends/gpu/bounds.py): the rule that decides where
bounds are kept.  The kernels (the centres' moves and drops, the test) run in the simulator scenarios of
tests/test_backend_gpu.py (every step against the CPU; the moves against the CPU bounds') and on a GPU in
its ``gpu`` tests."""

import pytest

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
