"""What the GPU warm-up compiles (warmup.py): the plans of the coming run, not of its own few rows.

A warm-up builds the backend on a few rows; without the hints of :func:`gpu_warm_tune` it would
compile the fused kernel's summing plan, while a run on millions of resident rows takes the split
step (pass 1, the sums kernel) and keeps bounds (the test kernel, pass 1 on the listed rows from the
row-major copy): those would then compile inside the run.
"""

from __future__ import annotations

import textwrap

import pytest
from conftest import run_simulated

pytest.importorskip("numba")

from mpikmeans.warmup import gpu_warm_tune  # noqa: E402

GIB = 1 << 30


def test_warm_tune_takes_the_split_step_for_many_resident_rows():
    assert gpu_warm_tune(100, 5_000_000, "float64", 80 * GIB) == {"idx64": False, "split": True}
    # few values: the backend's own rule, as in the run (plan.SPLIT_MIN_VALUES = 2**24: the split step only
    # where it is one kernel, else the fused kernel's own sums)
    assert "split" not in gpu_warm_tune(3, 2_000_000, "float64", 80 * GIB)
    assert gpu_warm_tune(8, 1 << 21, "float32", 80 * GIB)["split"] is True  # exactly 2**24 values


def test_warm_tune_follows_where_the_rows_live():
    # rows that do not fit in 80 % of the free memory stream in chunks: no split step
    assert gpu_warm_tune(100, 5_000_000, "float64", 4 * GIB)["split"] is False
    assert gpu_warm_tune(100, 5_000_000, "float32", 4 * GIB)["split"] is True  # half the bytes
    # 64-bit indices from 2**31 elements of the column-major store on
    assert gpu_warm_tune(1000, 3_000_000, "float32", 80 * GIB)["idx64"] is True


_PROGRAM = textwrap.dedent(
    r"""
    import json
    import numpy as np
    from mpikmeans.backends.gpu import GPUBackend
    from mpikmeans.warmup import gpu_warm_tune

    out = {}
    # 40 attributes, 8 centres (the simulator's sums kernel has 64 threads a block: M <= 64)
    for name, rows in (("big", 5_000_000), ("small", 2_000)):
        be = GPUBackend(dtype="float32")
        be.tune.update(gpu_warm_tune(40, rows, "float32", be.limits.free_memory()))
        be.load(np.random.default_rng(0).normal(size=(64, 40)))
        be.warmup(8, 40)
        st = be._states[(8, False, False)]
        out[name] = {"mode": int(st.plan.mode), "bounds": st.bounds is not None}
        be.close()
    # 3 attributes, 7 centres (2e6 x 3, K = 7): few rows, no bounds, whole rows a thread: one kernel
    be = GPUBackend(dtype="float32")
    be.tune.update(gpu_warm_tune(3, 2_000_000, "float32", be.limits.free_memory()))
    be.load(np.random.default_rng(0).normal(size=(64, 3)))
    be.warmup(7, 3)
    st = be._states[(7, False, False)]
    out["one_kernel"] = {"mode": int(st.plan.mode), "kernels": len(st.launches[0][0].launches)}
    be.close()
    print(json.dumps(out))
    """
)


def test_warm_up_on_few_rows_builds_the_runs_split_step_with_bounds():
    out = run_simulated(_PROGRAM)
    from mpikmeans.backends.gpu.plan import MODE_STEP_SHARED, MODE_STEP_SPLIT

    assert out["big"] == {"mode": MODE_STEP_SPLIT, "bounds": True}, out
    assert out["small"]["mode"] == MODE_STEP_SHARED and not out["small"]["bounds"], out
    assert out["one_kernel"] == {"mode": MODE_STEP_SPLIT, "kernels": 1}, out


_FIXED_PROGRAM = textwrap.dedent(
    r"""
    import json
    from mpikmeans import warmup
    from mpikmeans.backends import cpu
    from mpikmeans.backends import gpu
    from mpikmeans.backends.cpu import partials

    calls = []
    real_reduce, real_sums = partials.compile_reductions, cpu.label_sums

    def reductions(*args):
        calls.append("reductions")
        return real_reduce(*args)

    def sums(*args):
        calls.append("label_sums")
        return real_sums(*args)

    class NoBackend:
        def __init__(self, *a, **k):
            raise AssertionError("the fixed part needs no GPU backend")

    partials.compile_reductions, cpu.label_sums, gpu.GPUBackend = reductions, sums, NoBackend
    warmup.warm_gpu(8, 40, "float32", rows=64, parts=("fixed",))
    print(json.dumps(calls))
    """
)


def test_the_fixed_part_compiles_the_fixed_point_sums_without_a_gpu():
    """A GPU run's last centres are summed again on the CPU (lloyd._label_means): the rows' sums by
    label, compiled by the warm-up's ``fixed`` part in a helper of its own and with no GPU context (in the
    rest, the longest helper of a cold run, they were about a third of it; their parallel reduction is the
    assignment part's, below)."""
    assert run_simulated(_FIXED_PROGRAM) == ["label_sums"]


_ASSIGN_PROGRAM = textwrap.dedent(
    r"""
    import json
    from mpikmeans import warmup
    from mpikmeans.backends.cpu import partials

    shapes = []
    real = partials.compile_reductions

    def recording(part_sums, *rest):
        shapes.append(list(part_sums.shape[1:]))
        return real(part_sums, *rest)

    partials.compile_reductions = recording
    warmup.warm_gpu(8, 40, "float32", rows=64, parts=("assign",))
    print(json.dumps(shapes))
    """
)


def test_the_assignment_part_compiles_the_fixed_point_sums_reductions():
    """A GPU run's last centres are summed again on the CPU (lloyd._label_means), from K x M =
    partials.REDUCE_CHUNK on by the parallel reduction (the specification's example: 50 x 100). The
    warm-up's assignment part compiles both reductions for the run's K x M (a cold run compiled the
    parallel one inside its Lloyd phase: 4.1 of its 4.3 s, bench/GPU_NOTES.md v15)."""
    assert run_simulated(_ASSIGN_PROGRAM) == [[8, 40]]
