"""Tests for :mod:`mpikmeans.cpus`: a process's CPUs (affinity mask, cgroup quota),
its share among a node's ranks, and the thread count without a communicator,
lowered (never raised) by OMP_NUM_THREADS / NUMBA_NUM_THREADS."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from mpikmeans import cpus as U

CORES = len(os.sched_getaffinity(0))
ROOT = str(Path(__file__).resolve().parent.parent)


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
    assert U.cpus_per_rank(mine, others, node_size, quota) == expected


def test_cgroup_quota_v2_and_v1(tmp_path):
    # v2: cpu.max "quota period" in the process's own cgroup
    (tmp_path / "job").mkdir()
    (tmp_path / "job" / "cpu.max").write_text("250000 100000\n")
    proc = tmp_path / "cgroup"
    proc.write_text("0::/job\n")
    assert U.cgroup_cpu_limit(str(proc), str(tmp_path)) == 2.5
    # "max": no quota
    (tmp_path / "job" / "cpu.max").write_text("max 100000\n")
    assert U.cgroup_cpu_limit(str(proc), str(tmp_path)) is None
    # v1: cpu.cfs_quota_us / cpu.cfs_period_us (-1: none)
    v1 = tmp_path / "v1"
    (v1 / "cpu" / "slurm").mkdir(parents=True)
    (v1 / "cpu" / "slurm" / "cpu.cfs_quota_us").write_text("300000\n")
    (v1 / "cpu" / "slurm" / "cpu.cfs_period_us").write_text("100000\n")
    (v1 / "cpu" / "cpu.cfs_quota_us").write_text("-1\n")
    (v1 / "cpu" / "cpu.cfs_period_us").write_text("100000\n")
    proc.write_text("4:memory:/x\n1:cpu,cpuacct:/slurm\n")
    assert U.cgroup_cpu_limit(str(proc), str(v1)) == 3.0
    # nothing readable: no limit
    assert U.cgroup_cpu_limit(str(tmp_path / "absent"), str(tmp_path / "absent")) is None


def test_env_thread_limit(monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.delenv("NUMBA_NUM_THREADS", raising=False)
    assert U.env_thread_limit() is None
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    assert U.env_thread_limit() == 3
    monkeypatch.setenv("OMP_NUM_THREADS", " 2,1")  # nested levels: the outer one
    assert U.env_thread_limit() == 2
    for bad in ("0", "", "many", "-2"):
        monkeypatch.setenv("OMP_NUM_THREADS", bad)
        assert U.env_thread_limit() is None
    monkeypatch.setenv("NUMBA_NUM_THREADS", "5")
    assert U.env_thread_limit() == 5
    monkeypatch.setenv("OMP_NUM_THREADS", "4")
    assert U.env_thread_limit() == 4  # the smaller of the two


def test_threads_for_share_only_lowered(monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.delenv("NUMBA_NUM_THREADS", raising=False)
    assert [U.threads_for_share(s) for s in (1, 7, 0)] == [1, 7, 1]  # at least 1
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    assert [U.threads_for_share(s) for s in (1, 7)] == [1, 3]


def test_process_threads_is_a_one_rank_share(monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.delenv("NUMBA_NUM_THREADS", raising=False)
    mine = U.usable_cpus()
    assert U.own_share() == U.cpus_per_rank(mine, [mine], 1, U.cgroup_cpu_limit())
    assert U.process_threads() == U.own_share()
    # a 16-CPU mask: all of it, unless a quota says less
    monkeypatch.setattr(U, "usable_cpus", lambda: frozenset(range(16)))
    monkeypatch.setattr(U, "cgroup_cpu_limit", lambda: None)
    assert U.process_threads() == 16
    monkeypatch.setattr(U, "cgroup_cpu_limit", lambda: 2.5)
    assert U.process_threads() == 2
    monkeypatch.setattr(U, "cgroup_cpu_limit", lambda: None)
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    assert U.process_threads() == 1
    monkeypatch.setenv("OMP_NUM_THREADS", "64")  # never raised above the mask
    assert U.process_threads() == 16
    monkeypatch.delenv("OMP_NUM_THREADS")
    monkeypatch.setattr(U, "usable_cpus", lambda: frozenset({3}))  # bound to one core
    assert U.process_threads() == 1


@pytest.mark.skipif(shutil.which("taskset") is None, reason="taskset not found")
def test_process_threads_follow_a_real_affinity_mask():
    # a launcher or a cpuset that leaves the process one CPU: one thread, also for the comm's figure
    code = ("from mpikmeans import cpus, comm; "
            "print(cpus.process_threads(), comm.default_threads(comm.SerialComm()))")
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "NUMBA_NUM_THREADS")}
    env["PYTHONPATH"] = ROOT
    p = subprocess.run(["taskset", "-c", "0", sys.executable, "-c", code], capture_output=True, text=True,
                       timeout=60, env=env)
    assert p.returncode == 0, p.stderr
    assert p.stdout.split() == ["1", "1"]
