"""Tests for the thread communicator (tests/threadcomm.py) that the library tests
use to simulate ranks: it has the communicator's interface, its collectives give
what MPI's would, and a failure or a mismatched collective never hangs."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from conftest import HANG_GUARD_S  # noqa: E402
from threadcomm import (  # noqa: E402
    Aborted,
    CollectiveMismatch,
    CollectiveTimeout,
    run_ranks,
)

from mpikmeans.comm import Comm, SerialComm  # noqa: E402
from mpikmeans.errors import InputError, RunError, UsageError  # noqa: E402


def test_threadcomm_has_the_communicator_interface():
    def body(comm):
        for name in ("rank", "size", "node_rank", "node_size", "host", "is_mpi"):
            assert hasattr(comm, name), name
        for name in ("allreduce", "allreduce_in_place", "allgather", "bcast", "barrier", "agree", "library",
                     "abort"):
            assert callable(getattr(comm, name)), name
            assert callable(getattr(SerialComm, name))
        return comm.rank, comm.size, comm.node_rank, comm.node_size

    assert run_ranks(3, body) == [(r, 3, r, 3) for r in range(3)]


def test_threadcomm_collectives():
    def body(comm):
        r = comm.rank
        # rank order: ((1 + 1e16) - 1e16) == 0, while (1e16 - 1e16) + 1 would be 1
        s = comm.allreduce(np.array([[1.0, 1e16, -1e16][r]]), "sum")
        mn = comm.allreduce(np.array([r, -r], dtype=np.int64), "min")
        mx = comm.allreduce(np.array([r, -r], dtype=np.int64), "max")
        into = np.array([[1.0, 1e16, -1e16][r], float(r)])
        comm.allreduce_in_place(into, "sum")
        assert into.tolist() == [0.0, 3.0]
        mine = {"rank": r, "list": [r]}
        got = comm.allgather(mine)
        got[r]["list"].append("mutated")  # a copy: must not leak to other ranks
        b = comm.bcast({"from": r} if r == 2 else None, root=2)
        comm.barrier()
        return s, mn, mx, got, b, mine

    for r, (s, mn, mx, got, b, mine) in enumerate(run_ranks(3, body)):
        assert s.tolist() == [0.0]
        assert mn.dtype == np.int64 and mn.tolist() == [0, -2] and mx.tolist() == [2, 0]
        assert [g["rank"] for g in got] == [0, 1, 2]
        assert mine == {"rank": r, "list": [r]}
        assert b == {"from": 2}


@pytest.mark.parametrize("ranks", [1, 2, 4])
def test_threadcomm_agree_matches_comm_agree(ranks):
    plans = [
        {},  # nobody fails
        {1: (RunError("disk full on 1"), 0.0)},
        {0: (InputError("line 9"), 9.0), 3: (InputError("line 4"), 4.0)},
        {1: (UsageError("b"), 5.0), 2: (RunError("a"), 5.0)},  # equal keys: lower rank
    ]

    def outcome(fn):
        try:
            fn()
        except Exception as exc:  # noqa: BLE001
            return type(exc), exc.message, exc.collective
        return None

    def body(comm):
        results = []
        for plan in plans:
            err, key = plan.get(comm.rank, (None, 0.0))
            mine = outcome(lambda: comm.agree(None if err is None else type(err)(err.message), key))
            fake = SimpleNamespace(rank=comm.rank, _comm=SimpleNamespace(allgather=comm.allgather))
            ref = outcome(lambda: Comm.agree(fake, None if err is None else type(err)(err.message), key))
            results.append((mine, ref))
        return results

    for rank_results in run_ranks(ranks, body):
        for (mine, ref), plan in zip(rank_results, plans):
            assert mine == ref
            active = {r: v for r, v in plan.items() if r < ranks}
            if not active:
                assert mine is None
            else:
                assert mine[2] is True


def test_threadcomm_failures_do_not_hang():
    def one_rank_raises(comm):
        if comm.rank == 1:
            raise KeyError("boom")
        comm.barrier()

    t0 = time.monotonic()
    with pytest.raises(KeyError):
        run_ranks(3, one_rank_raises)

    def finishes_early(comm):
        if comm.rank != 0:
            comm.barrier()

    with pytest.raises(CollectiveMismatch):
        run_ranks(3, finishes_early)

    def aborts(comm):
        if comm.rank == 2:
            comm.abort(3)
        comm.allgather(1)

    with pytest.raises(Aborted) as info:
        run_ranks(3, aborts)
    assert info.value.code == 3
    assert time.monotonic() - t0 < HANG_GUARD_S

    def slow(comm):
        if comm.rank == 0:
            time.sleep(1.0)
        comm.barrier()

    with pytest.raises(CollectiveTimeout):
        run_ranks(2, slow, timeout=0.2)


def test_threadcomm_return_exceptions():
    def body(comm):
        if comm.rank == 1:
            raise ValueError("one")
        return comm.rank

    out = run_ranks(2, body, return_exceptions=True)
    assert out[0] == 0 and isinstance(out[1], ValueError)
