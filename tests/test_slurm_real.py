"""pbs/slurm_run.sbatch submitted with a real sbatch to a one-node Slurm on localhost.

scripts/start_local_slurm.sh starts slurmctld and slurmd (Debian's slurm-wlm packages,
auth/none, no systemd, no munge) in a temporary directory on free ports; every test
submits the unmodified template from a directory that is not the checkout (sbatch runs
a spool copy: the template is self-contained, it sources nothing). Skipped unless running as root with slurmctld, slurmd and sbatch installed:
    apt-get install --no-install-recommends slurmctld slurmd slurm-client libpmix-dev
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import HANG_GUARD_S, run_cli

REPO = Path(__file__).resolve().parents[1]
TEMPLATE = REPO / "pbs" / "slurm_run.sbatch"
START = REPO / "scripts" / "start_local_slurm.sh"
BIN = Path(sys.executable).parent
ROWS, K = 3000, 3
FINAL = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "PREEMPTED", "BOOT_FAIL",
         "DEADLINE"}

_SBIN = os.pathsep.join([os.environ.get("PATH", ""), "/usr/sbin", "/sbin"])  # daemons live in sbin
_missing = [b for b in ("slurmctld", "slurmd", "sbatch", "scontrol") if shutil.which(b, path=_SBIN) is None]
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(bool(_missing), reason=f"Slurm not installed ({', '.join(_missing)} missing): "
                       "apt-get install --no-install-recommends slurmctld slurmd slurm-client libpmix-dev"),
    pytest.mark.skipif(os.geteuid() != 0, reason="a local slurmd must run as root"),
]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def slurm(tmp_path_factory):
    """A running one-node Slurm: the environment to talk to it, and whether srun --mpi=pmix works."""
    d = tmp_path_factory.mktemp("slurm")
    env = dict(os.environ)
    env.update({"SLURMCTLD_PORT": str(_free_port()), "SLURMD_PORT": str(_free_port()), "PATH": _SBIN})
    p = subprocess.run(["bash", str(START), "start", str(d)], env=env, capture_output=True, text=True, timeout=90)
    if p.returncode != 0:
        pytest.fail(f"local Slurm did not start:\n{p.stdout}\n{p.stderr}")
    env = dict(os.environ)
    env.update({
        "SLURM_CONF": str(d / "slurm.conf"),
        "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '/usr/bin:/bin')}",
        # only LAUNCHER=mpirun needs these (Open MPI refuses root; no network to probe)
        "OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
        "OMPI_MCA_btl_tcp_if_include": "lo", "OMPI_MCA_oob_tcp_if_include": "lo",
        "PYTHONUNBUFFERED": "1",
    })
    for var in list(env):  # a test run from inside another Slurm job must not leak into this one
        if var.startswith(("SLURM_", "SBATCH_", "SRUN_")) and var != "SLURM_CONF":
            del env[var]
    try:
        yield {"env": env, "pmix": (d / "pmix_ok").exists(), "dir": d}
    finally:
        subprocess.run(["bash", str(START), "stop", str(d)], env=env, capture_output=True, timeout=60)


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    d = tmp_path_factory.mktemp("slurm_inputs")
    good = d / "blobs.arff"
    r = run_cli(["gen-data", good, "-n", ROWS, "-m", 4, "-k", K, "--seed", 8, "--spread", 0.3])
    assert r.code == 0, r.err
    lines = good.read_text().splitlines(keepends=True)
    lines[-100] = "1.0,2.0,oops,4.0\n"
    bad = d / "bad.arff"
    bad.write_text("".join(lines))
    return good, bad, len(lines) - 99


def sbatch(slurm, workdir: Path, settings: dict, timeout: float = 120) -> tuple[str, int, str, str]:
    """Submit the template from ``workdir``, wait for the end; (job id, exit code, state, .o file)."""
    export = ",".join(["ALL"] + [f"{k}={v}" for k, v in settings.items()])
    cmd = ["sbatch", "--parsable", "--nodes=1", "--ntasks-per-node=2", "--cpus-per-task=1",
           "--mem-per-cpu=500M", "--time=5", f"--export={export}", str(TEMPLATE)]
    p = subprocess.run(cmd, cwd=workdir, env=slurm["env"], capture_output=True, text=True, timeout=30)
    assert p.returncode == 0, p.stderr
    job = p.stdout.strip().split(";")[0]
    deadline = time.monotonic() + timeout
    state, code = "", -1
    while time.monotonic() < deadline:
        info = subprocess.run(["scontrol", "show", "job", "-o", job], env=slurm["env"], capture_output=True,
                              text=True, timeout=30).stdout
        m = re.search(r"JobState=(\S+)", info)
        state = m.group(1) if m else ""
        if state in FINAL:
            code = int(re.search(r"ExitCode=(\d+):", info).group(1))
            break
        time.sleep(0.5)
    else:
        subprocess.run(["scancel", job], env=slurm["env"], capture_output=True, timeout=30)
        log = (workdir / f"mpikmeans.o{job}")
        pytest.fail(f"job {job} still {state} after {timeout} s\n{log.read_text() if log.exists() else ''}")
    out = (workdir / f"mpikmeans.o{job}").read_text()
    return job, code, state, out


def _workdir(tmp_path: Path, data: Path) -> Path:
    work = tmp_path / "submit"
    work.mkdir()
    shutil.copy(data, work / data.name)
    return work


def _check(work: Path, job: str, code: int, state: str, out: str) -> None:
    assert (code, state) == (0, "COMPLETED"), out
    summary = json.loads((work / f"blobs.{job}.mpikmeans" / "summary.json").read_text())
    assert summary["ranks"] == 2 and summary["n"] == ROWS and summary["k"] == K, out
    assert len((work / f"blobs.{job}.mpikmeans" / "labels.txt").read_text().splitlines()) == ROWS
    assert "mpikmeans-job: finished" in out


def test_sbatch_srun(slurm, inputs, tmp_path):
    if not slurm["pmix"]:
        pytest.skip("srun --mpi=pmix does not work on this Slurm (libpmix-dev missing?)")
    good, _, _ = inputs
    work = _workdir(tmp_path, good)
    job, code, state, out = sbatch(slurm, work, {"DATA": good.name, "K": K})
    _check(work, job, code, state, out)
    assert "srun --mpi=pmix --ntasks=2" in out


def test_sbatch_srun_bad_input(slurm, inputs, tmp_path):
    if not slurm["pmix"]:
        pytest.skip("srun --mpi=pmix does not work on this Slurm (libpmix-dev missing?)")
    _, bad, line = inputs
    work = _workdir(tmp_path, bad)
    t0 = time.monotonic()
    job, code, state, out = sbatch(slurm, work, {"DATA": bad.name, "K": K})
    assert (code, state) == (3, "FAILED"), out
    assert f"bad.arff:{line}" in out and "bad input data" in out
    assert time.monotonic() - t0 < HANG_GUARD_S, out


def test_sbatch_mpirun(slurm, inputs, tmp_path):
    """LAUNCHER=mpirun: Open MPI's mpirun takes the hosts and slots from the Slurm allocation."""
    good, _, _ = inputs
    work = _workdir(tmp_path, good)
    job, code, state, out = sbatch(slurm, work, {"DATA": good.name, "K": K, "LAUNCHER": "mpirun"})
    _check(work, job, code, state, out)
    command = next(line for line in out.splitlines() if line.startswith("mpikmeans-job: command: "))
    assert command.startswith("mpikmeans-job: command: mpirun -np 2 ") and " mpikmeans run blobs.arff " in command, out
