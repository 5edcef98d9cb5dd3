"""Every interrupt a scheduler or a terminal sends ends in exit 75 with the checkpoint named
(issue 40, item 9): SIGINT to one process, SIGUSR1/SIGUSR2/SIGTERM to mpirun, SIGTERM to the job
script, a signal while the results are written, a signal before the first iteration.

What mpirun itself does with the signals it gets (measured, see mpikmeans/interrupt.py): SIGTERM
and SIGINT make Open MPI 4.1 and 5 send the ranks SIGCONT, SIGTERM and soon SIGKILL, drop their
output and exit 1; SIGUSR2 (both) and SIGUSR1 (Open MPI 5) reach the ranks as they are.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

from conftest import HANG_GUARD_S, _env, mpirun_path, run_cli

pytestmark = pytest.mark.mpi

REPO = Path(__file__).resolve().parents[1]
EXIT_CHECKPOINTED = 75


@pytest.fixture(scope="module")
def slow(tmp_path_factory):
    """Overlapping blobs: Lloyd needs many iterations, so a run can be caught mid-way."""
    path = tmp_path_factory.mktemp("signals") / "slow.arff"
    r = run_cli(["gen-data", path, "-n", 60000, "-m", 4, "-k", 30, "--seed", 4, "--spread", 6])
    assert r.code == 0, r.err
    return path


ARGS = ["-k", 30, "--init", "range", "--max-iter", 100000]


def _start(cmd: list, **kw) -> subprocess.Popen:
    return subprocess.Popen([str(c) for c in cmd], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=_env(), start_new_session=True, **kw)


def _wait_for(p: subprocess.Popen, needle: str) -> list:
    """The stderr lines up to the first holding ``needle`` (-v's iteration lines go to stderr)."""
    seen, deadline = [], time.monotonic() + HANG_GUARD_S
    for line in p.stderr:
        seen.append(line)
        if needle in line or time.monotonic() > deadline:
            break
    return seen


def _signal_mid_run(p: subprocess.Popen, sig) -> str:
    """Send ``sig`` once the run logs its 5th iteration; the stderr seen until then (a run that ended or
    failed before it is a failure of its own, with its output)."""
    seen = _wait_for(p, "iter    5")
    assert any("iter    5" in line for line in seen), "".join(seen)[-3000:]
    p.send_signal(sig)
    return "".join(seen)


def _finish(p: subprocess.Popen) -> tuple:
    try:
        out, err = p.communicate(timeout=HANG_GUARD_S)
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
    return p.returncode, out, err


def _mpirun(np_: int, args: list) -> list:
    mpirun = mpirun_path()
    if mpirun is None:
        pytest.skip("mpirun not found")
    return [mpirun, "-np", str(np_), "--oversubscribe", "--bind-to", "none", sys.executable, "-m", "mpikmeans",
            *args]


def _open_mpi_major() -> int | None:
    mpirun = mpirun_path()
    if mpirun is None:
        return None
    text = subprocess.run([mpirun, "--version"], capture_output=True, text=True, timeout=60).stdout
    for word in text.split():
        if word[:1].isdigit() and "Open MPI" in text:
            return int(word.split(".")[0])
    return None


@pytest.fixture(scope="module")
def uninterrupted(slow, tmp_path_factory):
    """The run the stopped ones are resumed to, uninterrupted (-np 2): one for the module, as every
    stopped run of these tests is this same run (it costs as much as the resumed run itself)."""
    ref = tmp_path_factory.mktemp("uninterrupted") / "ref"
    r = run_cli(["run", slow, *ARGS[:-2], "-o", ref, "-q"], np=2)
    assert r.code == 0, r.err
    return ref


def _resumes_to_the_uninterrupted_result(slow, ref, tmp_path, ckpt, np_=2):
    out = tmp_path / "resumed"
    r = run_cli(["run", slow, *ARGS[:-2], "-o", out, "--resume", ckpt, "-q"], np=np_)
    assert r.code == 0, r.err
    s = json.loads((out / "summary.json").read_text())
    assert s["resumed_at_iteration"] >= 1
    assert (out / "centers.csv").read_bytes() == (ref / "centers.csv").read_bytes()
    assert (out / "labels.txt").read_bytes() == (ref / "labels.txt").read_bytes()


# ------------------------------------------------------------------ the rank's side

SAVE_AT_ONCE = textwrap.dedent("""
    import sys
    from numba import njit
    from mpikmeans.interrupt import StopRequest

    @njit(nogil=True, cache=False)
    def spin(n):  # compiled code without the GIL: Python runs no signal handler until it returns
        x = 0.0
        for i in range(n):
            x = x * 0.999999 + 1.0
        return x

    def save(signum):
        with open(sys.argv[1], "w") as f:
            f.write(str(signum))

    spin(10)
    with StopRequest(on_signal=save) as stop:
        print("ready", flush=True)
        spin(20_000_000_000)
""")


def test_item09_stop_signal_saves_at_once_while_compiled_code_runs(tmp_path):
    """mpirun sends SIGKILL 0.25 s (Open MPI 5) or 1 s (4.1) after SIGTERM: the save cannot wait
    for the kernel in progress to return."""
    marker = tmp_path / "saved"
    p = subprocess.Popen([sys.executable, "-c", SAVE_AT_ONCE, str(marker)], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, cwd=REPO)
    try:
        assert p.stdout.readline().strip() == "ready", p.stderr.read()
        time.sleep(0.2)
        p.send_signal(signal.SIGTERM)
        time.sleep(0.25)  # Open MPI 5's grace
        p.kill()
        p.wait(timeout=HANG_GUARD_S)
    finally:
        if p.poll() is None:
            p.kill()
    assert marker.exists() and marker.read_text() == str(int(signal.SIGTERM))


# ------------------------------------------------------------------ one process: Ctrl-C

def test_item09_sigint_ends_in_75_with_checkpoint_named(slow, uninterrupted, tmp_path):
    out = tmp_path / "out"
    p = _start([sys.executable, "-m", "mpikmeans", "run", slow, *ARGS, "-v", "-o", out])
    seen = _signal_mid_run(p, signal.SIGINT)
    code, stdout, err = _finish(p)
    ckpt = out / "checkpoint.npz"
    assert code == EXIT_CHECKPOINTED, (code, seen[-2000:], err)
    assert f"stopped by SIGINT after iteration" in err and f"state saved to {ckpt}" in err, err
    assert "SSE nan" not in stdout + err
    assert sorted(x.name for x in out.iterdir()) == ["checkpoint.npz"]
    _resumes_to_the_uninterrupted_result(slow, uninterrupted, tmp_path, ckpt)


# ------------------------------------------------------------------ mpirun

@pytest.mark.parametrize("sig", ["SIGUSR2", "SIGUSR1"])
def test_item09_stop_signal_to_mpirun_ends_in_75_with_checkpoint_named(slow, uninterrupted, tmp_path, sig):
    """SIGUSR2 (and, with Open MPI 5, SIGUSR1) to mpirun: the gentle stop the job templates send."""
    if sig == "SIGUSR1" and _open_mpi_major() == 4:
        pytest.skip("Open MPI 4.1's mpirun does not pass SIGUSR1 on (measured: 4.1.6); the templates send SIGUSR2")
    out, ckpt = tmp_path / "out", tmp_path / "c.npz"
    p = _start(_mpirun(3, ["run", slow, *ARGS, "-v", "-o", out, "--checkpoint", ckpt]))
    seen = _signal_mid_run(p, getattr(signal, sig))
    code, _, err = _finish(p)
    assert code == EXIT_CHECKPOINTED, (code, seen[-2000:], err)
    assert f"stopped by {sig} after iteration" in err and f"state saved to {ckpt}" in err, err
    assert not out.exists()
    _resumes_to_the_uninterrupted_result(slow, uninterrupted, tmp_path, ckpt)


@pytest.mark.parametrize("sig", ["SIGTERM", "SIGINT"])
def test_item09_sigterm_or_sigint_to_mpirun_leaves_a_resumable_checkpoint(slow, uninterrupted, tmp_path, sig):
    """What Ctrl-C and most schedulers do.  mpirun's own exit code is then 1 whatever the ranks do
    (Open MPI 4.1 and 5: it kills them soon after); the job templates report the ranks' 75."""
    out, ckpt = tmp_path / "out", tmp_path / "c.npz"
    p = _start(_mpirun(3, ["run", slow, *ARGS, "-v", "-o", out, "--checkpoint", ckpt]))
    seen = _signal_mid_run(p, getattr(signal, sig))
    code, _, err = _finish(p)
    assert code in (EXIT_CHECKPOINTED, 1), (code, seen[-2000:], err)
    assert ckpt.exists() and not (out / "summary.json").exists()
    _resumes_to_the_uninterrupted_result(slow, uninterrupted, tmp_path, ckpt)


# ------------------------------------------------------------------ a signal while writing, or before iterating

@pytest.mark.parametrize("np_, rank", [(None, 0), (3, 0), (3, 2)])
def test_item09_sigterm_during_final_write_finishes_with_exit_0(slow, tmp_path, np_, rank):
    out = tmp_path / "out"
    r = run_cli(["run", slow, "-k", 30, "--max-iter", 5, "-o", out], np=np_,
                env={"MPIKMEANS_FAULT": f"{rank}:write:term"})
    assert r.code == 0, (r.out, r.err)
    assert "SIGTERM came as the run was finishing: its results were written in full" in r.err, r.err
    s = json.loads((out / "summary.json").read_text())
    assert s["iterations"] == 5 and len((out / "labels.txt").read_text().splitlines()) == 60000
    assert sorted(x.name for x in out.iterdir()) == ["centers.csv", "labels.txt", "model.json", "summary.json"]


@pytest.mark.parametrize("np_", [None, 3])
def test_item09_stop_before_first_iteration_ends_in_75(slow, tmp_path, np_):
    out = tmp_path / "out"
    r = run_cli(["run", slow, "-k", 30, "-o", out], np=np_, env={"MPIKMEANS_FAULT": "0:read:term"})
    assert r.code == EXIT_CHECKPOINTED, (r.out, r.err)
    assert "stopped by SIGTERM while reading the data" in r.err and "nothing to save" in r.err, r.err
    assert not out.exists()


def test_item09_restarts_stopped_say_they_cannot_resume(slow, tmp_path):
    out = tmp_path / "out"
    r = run_cli(["run", slow, "-k", 30, "--n-init", 3, "-o", out, "-v"], np=3,
                env={"MPIKMEANS_FAULT": "1:iteration:term:4"})
    assert r.code == EXIT_CHECKPOINTED, (r.out, r.err)
    assert "cannot be resumed" in r.err and "--resume" not in r.err, r.err
    assert "SSE nan" not in r.out + r.err
    assert not out.exists()


# ------------------------------------------------------------------ the job templates

def test_item09_job_sigterm_ends_in_75_with_the_ranks_message(tmp_path):
    """A scheduler's SIGTERM to the job script: the template stops mpirun with SIGUSR2, so the ranks
    finish their iteration, save, say so (mpirun keeps their output) and exit 75."""
    from test_pbs import BIN, PBS, submit, torque_env

    work = tmp_path / "work"
    work.mkdir()
    gen = subprocess.run([str(BIN / "mpikmeans"), "gen-data", str(work / "slow.arff"), "-n", "200000", "-m", "4",
                          "-k", "30", "--seed", "4", "--spread", "6", "-q"], capture_output=True, text=True)
    assert gen.returncode == 0, gen.stderr
    settings = dict(DATA="slow.arff", K="30", ARGS="--init range --max-iter 100000 -v")
    env = torque_env(tmp_path, work, slots=2, jobid="140", np=2, **settings)
    # to the job shell alone once the ranks iterate, as Torque's qdel and walltime do first
    job = submit(PBS / "mpi_run.pbs", tmp_path, env, term_when="iter    5", timeout=HANG_GUARD_S * 3)
    assert job.code == EXIT_CHECKPOINTED, job.out
    ckpts = list(work.glob("slow.k30.*.checkpoint.npz"))
    assert len(ckpts) == 1, job.out
    assert "mpikmeans: stopped by SIGUSR2 after iteration" in job.out, job.out
    assert f"state saved to {ckpts[0].name}" in job.out and "resumes from there" in job.out, job.out
    assert not list(work.glob(".mpikmeans-status*"))
