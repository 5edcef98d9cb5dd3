"""Tests for :mod:`mpikmeans.comm`'s thread counts: ranks x threads per rank stay
within a node's CPUs by default (affinity masks, cgroup quotas, OMP_NUM_THREADS),
in-process and under ``mpirun`` with and without binding."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from conftest import _env, mpirun_path

from mpikmeans import comm as C

SAMPLE = os.path.join(os.path.dirname(__file__), os.pardir, "data", "sample.arff")
CORES = len(os.sched_getaffinity(0))


def cpus(*ids):
    return frozenset(ids)


@pytest.mark.parametrize("mine, others, node_size, quota, expected", [
    # unbound ranks share the whole mask
    (cpus(*range(16)), [cpus(*range(16))] * 4, 4, None, 4),
    (cpus(*range(16)), [cpus(*range(16))] * 16, 16, None, 1),
    (cpus(*range(16)), [cpus(*range(16))] * 32, 32, None, 1),  # more ranks than cores: still one thread
    # a cpuset smaller than the machine (a batch job's share): divided among its ranks
    (cpus(*range(8)), [cpus(*range(8))] * 8, 8, None, 1),
    (cpus(*range(8)), [cpus(*range(8))] * 2, 2, None, 4),
    # ranks bound to their own cores keep them
    (cpus(0), [cpus(0), cpus(1)], 2, None, 1),
    (cpus(0, 1, 2, 3), [cpus(0, 1, 2, 3), cpus(4, 5, 6, 7)], 2, None, 4),
    # bound to sockets: the ranks on one socket share it
    (cpus(*range(8)), [cpus(*range(8))] * 2 + [cpus(*range(8, 16))] * 2, 4, None, 4),
    # a CPU quota of 4 CPUs on a 16-core mask, 2 ranks: 2 each
    (cpus(*range(16)), [cpus(*range(16))] * 2, 2, 4.0, 2),
    (cpus(*range(16)), [cpus(*range(16))] * 4, 4, 1.5, 1),
])
def test_cpus_per_rank(mine, others, node_size, quota, expected):
    assert C.cpus_per_rank(mine, others, node_size, quota) == expected


def test_cgroup_quota_v2_and_v1(tmp_path):
    # v2: cpu.max "quota period" in the process's own cgroup
    (tmp_path / "job").mkdir()
    (tmp_path / "job" / "cpu.max").write_text("250000 100000\n")
    proc = tmp_path / "cgroup"
    proc.write_text("0::/job\n")
    assert C.cgroup_cpu_limit(str(proc), str(tmp_path)) == 2.5
    # "max": no quota
    (tmp_path / "job" / "cpu.max").write_text("max 100000\n")
    assert C.cgroup_cpu_limit(str(proc), str(tmp_path)) is None
    # v1: cpu.cfs_quota_us / cpu.cfs_period_us (-1: none)
    v1 = tmp_path / "v1"
    (v1 / "cpu" / "slurm").mkdir(parents=True)
    (v1 / "cpu" / "slurm" / "cpu.cfs_quota_us").write_text("300000\n")
    (v1 / "cpu" / "slurm" / "cpu.cfs_period_us").write_text("100000\n")
    (v1 / "cpu" / "cpu.cfs_quota_us").write_text("-1\n")
    (v1 / "cpu" / "cpu.cfs_period_us").write_text("100000\n")
    proc.write_text("4:memory:/x\n1:cpu,cpuacct:/slurm\n")
    assert C.cgroup_cpu_limit(str(proc), str(v1)) == 3.0
    # nothing readable: no limit
    assert C.cgroup_cpu_limit(str(tmp_path / "absent"), str(tmp_path / "absent")) is None


def test_default_threads(monkeypatch):
    class Stub:
        node_size = 3

    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.delenv("NUMBA_NUM_THREADS", raising=False)
    comm = C.SerialComm()
    quota = C.cgroup_cpu_limit()
    assert comm.cpus_per_rank == max(1, CORES if quota is None else min(CORES, int(quota)))
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


def _read_threads(tmp_path, np_, binding=("--bind-to", "none"), env=None):
    """``read_threads_per_rank`` of a run under ``mpirun -np np_`` with ``binding``."""
    out = tmp_path / f"o{np_}"
    cmd = [mpirun_path(), "-np", str(np_), "--oversubscribe", *binding, sys.executable, "-m", "mpikmeans", "run",
           SAMPLE, "-k", "2", "--max-iter", "1", "-o", str(out), "--overwrite", "-q"]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=90, env={**_env(), **(env or {})},
                       start_new_session=True)
    assert p.returncode == 0, p.stderr
    return json.loads((out / "summary.json").read_text())["read_threads_per_rank"]


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
