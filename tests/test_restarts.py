"""Tests for :mod:`mpikmeans.restarts`: seeds derived from one, the kept restart
is the lowest SSE with rounding treated as a tie, each restart is a fresh single
run, and the choice is the same whatever the number of (simulated) ranks."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from rankhelpers import blobs, on_ranks  # noqa: E402
from threadcomm import Serialised  # noqa: E402

from mpikmeans.backends.cpu import CPUBackend  # noqa: E402
from mpikmeans.comm import SerialComm  # noqa: E402
from mpikmeans.errors import UsageError  # noqa: E402
from mpikmeans.init import init_kmeanspp  # noqa: E402
from mpikmeans.lloyd import lloyd  # noqa: E402
from mpikmeans.restarts import best_restart, restart_seeds, run_restarts  # noqa: E402


@pytest.fixture(scope="module")
def overlapping():
    """50 blobs in 8-d whose nearest pairs touch: seeding decides the SSE."""
    return blobs(8, 1.0)


def test_restart_seeds():
    s5 = restart_seeds(42, 5)
    assert s5[0] == 42 and len(set(s5)) == 5 and all(0 <= s < 2**63 for s in s5)
    assert restart_seeds(42, 2) == s5[:2]  # more restarts only add seeds
    assert restart_seeds(43, 3) != s5[:3]
    with pytest.raises(UsageError):
        restart_seeds(1, 0)


def test_best_restart_treats_rounding_as_a_tie():
    assert best_restart([5.0, 4.0, 4.5]) == 1
    assert best_restart([4.0, 4.0 * (1 + 1e-12), 4.0 * (1 - 1e-12)]) == 0  # same partition: the earliest
    assert best_restart([float("nan"), 3.0, 2.0]) == 2
    assert best_restart([float("nan")]) == 0


def test_run_restarts_keeps_the_lowest_and_each_restart_is_a_fresh_run(overlapping):
    x = overlapping[:5000]
    n = len(x)
    backend = CPUBackend(threads=2)
    backend.load(x)
    out = run_restarts(SerialComm(), backend, x, 0, n, 20, init="k-means++", seed=3, n_init=4)
    seeds = restart_seeds(3, 4)
    assert [r["seed"] for r in out.restarts] == seeds
    singles = []
    for s in seeds:
        b = CPUBackend(threads=2)
        b.load(x)
        singles.append(lloyd(SerialComm(), b, x, 0, init_kmeanspp(SerialComm(), 20, x, 0, n, s)))
    for r, single in zip(out.restarts, singles):  # each restart = a fresh single run with its seed
        assert r["inertia"] == single.inertia and r["iterations"] == single.iterations
    assert out.best_index == best_restart([s.inertia for s in singles])
    assert out.best.centres.tobytes() == singles[out.best_index].centres.tobytes()
    assert np.array_equal(out.best.labels, singles[out.best_index].labels)
    assert len({r["inertia"] for r in out.restarts}) > 1  # the restarts did differ


def test_run_restarts_independent_of_ranks(overlapping):
    x = overlapping[:4000]

    def fn(comm, xl, off, _):
        return run_restarts(comm, Serialised(xl), xl, off, len(x), 12, init="k-means||", seed=8, n_init=3)

    ref = on_ranks(1, x, fn)[0]
    outs = on_ranks(3, x, fn, "uneven")
    for out in outs:  # exact sums: every restart's SSE and the kept centres are the same bits
        assert out.best_index == ref.best_index
        assert [r["inertia"] for r in out.restarts] == [r["inertia"] for r in ref.restarts]
        assert out.best.centres.tobytes() == ref.best.centres.tobytes()
    assert np.array_equal(np.concatenate([o.best.labels for o in outs]), ref.best.labels)


def test_run_restarts_refuses_restarts_without_randomness():
    x = np.zeros((4, 2))
    with pytest.raises(UsageError, match="n-init"):
        run_restarts(SerialComm(), None, x, 0, 4, 2, init=np.zeros((2, 2)), n_init=2)
