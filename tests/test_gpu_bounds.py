"""Host side of the GPU's kept bounds (mpikmeans/backends/gpu/bounds.py): the moves the test kernel
takes and the rule that decides where bounds are kept.  The kernels run in the simulator scenarios of
tests/test_backend_gpu.py (every step against the CPU) and on a GPU in its ``gpu`` tests."""

import numpy as np
import pytest

bounds = pytest.importorskip("mpikmeans.backends.gpu.bounds")


def _exact_moves(old, new):
    return np.sqrt(((new - old) ** 2).sum(1))


def test_moves_bound_each_centre_and_the_others():
    rng = np.random.default_rng(0)
    old = rng.normal(size=(6, 9))
    new = old + rng.normal(scale=[[0.1], [2.0], [0.3], [0.0], [1.5], [0.2]], size=old.shape)
    mv = bounds.moves_and_others(old, new)
    d = _exact_moves(old, new)
    assert mv.shape == (12,)
    assert np.all(mv[:6] >= d) and np.allclose(mv[:6], d, rtol=1e-12, atol=1e-140)  # plus the subnormal allowance
    for a in range(6):  # the most any other centre moved (and the CPU bounds' 1e-140 more)
        assert mv[:6][np.arange(6) != a].max() <= mv[6 + a] <= mv[:6][np.arange(6) != a].max() + 1e-139
    assert mv[6 + 1] >= mv[4] and mv[6 + 4] >= mv[1]  # the two largest: each other's


def test_moves_tied_largest_and_one_centre():
    old = np.zeros((3, 2))
    new = np.array([[3.0, 4.0], [0.0, 5.0], [0.0, 0.0]])
    mv = bounds.moves_and_others(old, new)
    assert mv[3] >= mv[1] and mv[4] >= mv[0]  # two equal largest moves: each sees the other
    assert mv[5] >= max(mv[0], mv[1])
    one = bounds.moves_and_others(old[:1], new[:1])
    assert one[1] <= 1e-139 and one[0] >= 5.0  # K = 1: no other centre


def test_a_move_that_is_not_finite_fails_every_test():
    old = np.zeros((3, 2))
    new = np.array([[1.0, 0.0], [np.nan, 0.0], [0.0, 1e308]])
    mv = bounds.moves_and_others(old, new)
    assert np.isinf(mv[1]) and np.isinf(mv[2])  # NaN and an overflowing square
    assert np.all(np.isinf(mv[3:]))  # every row's other centres include one that moved without bound


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
