"""Tests for :mod:`mpikmeans.comm`'s thread counts: ranks x threads per rank stay
within a node's CPUs by default (affinity masks, cgroup quotas, OMP_NUM_THREADS),
in-process and under ``mpirun`` with and without binding; a run reads and
computes with the same count (the pure parts: tests/test_cpus.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from conftest import _env, mpirun_path

from mpikmeans import comm as C
from mpikmeans.cpus import process_threads

SAMPLE = os.path.join(os.path.dirname(__file__), os.pardir, "data", "sample.arff")
CORES = len(os.sched_getaffinity(0))


def test_default_threads(monkeypatch):
    class Stub:
        node_size = 3

    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.delenv("NUMBA_NUM_THREADS", raising=False)
    comm = C.SerialComm()
    quota = C.cgroup_cpu_limit()
    assert comm.cpus_per_rank == max(1, CORES if quota is None else min(CORES, int(quota)))
    # one process alone: the figure a CPUBackend made without a communicator uses
    assert C.default_threads(comm) == process_threads()
    comm.cpus_per_rank = 7
    assert C.default_threads(comm) == 7
    # a communicator that does not know the node's masks (the tests' thread ranks):
    # its node's ranks share this process's mask
    assert C.default_threads(Stub()) == C.cpus_per_rank(C.usable_cpus(), [C.usable_cpus()] * 3, 3, quota)
    # OMP_NUM_THREADS and NUMBA_NUM_THREADS lower the share, never raise it
    # (PBS may set OMP_NUM_THREADS to a chunk's CPUs for each of its ranks)
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    assert C.default_threads(comm) == 3
    monkeypatch.setenv("OMP_NUM_THREADS", "2,1")  # nested levels: the outer one
    assert C.default_threads(comm) == 2
    monkeypatch.setenv("OMP_NUM_THREADS", "16")
    assert C.default_threads(comm) == 7
    for bad in ("0", "", "many", "-2"):
        monkeypatch.setenv("OMP_NUM_THREADS", bad)
        assert C.default_threads(comm) == 7
    monkeypatch.setenv("NUMBA_NUM_THREADS", "5")
    assert C.default_threads(comm) == 5
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    assert C.default_threads(C.SerialComm()) == process_threads() == 1


def _read_threads(tmp_path, np_, binding=("--bind-to", "none"), env=None):
    """``read_threads_per_rank`` of a run under ``mpirun -np np_`` with ``binding``.

    Checks that the CPU backend computed with as many threads as the reader read with.
    """
    out = tmp_path / f"o{np_}"
    cmd = [mpirun_path(), "-np", str(np_), "--oversubscribe", *binding, sys.executable, "-m", "mpikmeans", "run",
           SAMPLE, "-k", "2", "--max-iter", "1", "-o", str(out), "--overwrite", "-q", "--backend", "cpu"]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=90, env={**_env(), **(env or {})},
                       start_new_session=True)
    assert p.returncode == 0, p.stderr
    summary = json.loads((out / "summary.json").read_text())
    assert summary["backend"] == "cpu"
    assert summary["threads_per_rank"] == summary["read_threads_per_rank"], summary
    return summary["read_threads_per_rank"]


@pytest.mark.skipif(mpirun_path() is None, reason="mpirun not found")
@pytest.mark.parametrize("np_", [1, 2, 3])
def test_threads_under_mpirun_unbound(tmp_path, monkeypatch, np_):
    # ranks on one node, unbound: they share its cores, at least one thread each
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    assert _read_threads(tmp_path, np_) == max(1, CORES // np_)


@pytest.mark.skipif(mpirun_path() is None, reason="mpirun not found")
def test_threads_under_mpirun_bound_and_omp(tmp_path, monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    # one rank bound to one core: one thread, not the node's cores
    assert _read_threads(tmp_path, 1, ("--bind-to", "core")) == 1
    # OMP_NUM_THREADS lowers it, never raises it
    assert _read_threads(tmp_path, 1, env={"OMP_NUM_THREADS": "1"}) == 1
    assert _read_threads(tmp_path, 3, env={"OMP_NUM_THREADS": "8"}) == max(1, CORES // 3)
