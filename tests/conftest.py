"""Shared fixtures: launching the real CLI, under mpirun or alone, with a timeout."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass

import pytest

from mpikmeans.bench.harness import MPI_START_FAILURE

BIN = os.path.dirname(sys.executable)

#: The one bound a test may put on a measured duration: it catches a hang, never a slow minute.
#: Ten times what the slowest command it guards takes on the busy 2-core machine (a failing
#: ``mpirun -np 3`` launch ends in 1-3.5 s idle, about 6 s with the suite's other processes).
#: Speed goals are benchmarks (``mpikmeans bench``, BENCHMARKS.md), not tests.
HANG_GUARD_S = 60

# Bytecode for the hundreds of processes the suite starts: where the environment sets
# PYTHONDONTWRITEBYTECODE (this project's machines do) each of them compiled the package's
# sources again, 0.2-0.3 s a process on the 2-core machine.  Written outside the tree.
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
os.environ.setdefault("PYTHONPYCACHEPREFIX", os.path.join(tempfile.gettempdir(),
                                                          f"mpikmeans-test-pycache-{os.getuid()}"))


def _env() -> dict:
    env = dict(os.environ)
    env.update({
        "OMPI_ALLOW_RUN_AS_ROOT": "1",
        "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
        "OMPI_MCA_rmaps_base_oversubscribe": "1",
        # no network interfaces to probe in a sandbox; loopback is enough
        "OMPI_MCA_btl_tcp_if_include": "lo",
        "OMPI_MCA_oob_tcp_if_include": "lo",
        "PYTHONUNBUFFERED": "1",
    })
    # Open MPI's libfabric transport (btl ofi) finds no provider in a sandbox, and its init fails
    # only after about 1 s of wall time (0.03 s of CPU) in MPI_Init: every rank of the suite's
    # mpirun launches waited that long, then went on with self, sm and tcp, as it does without it
    env.setdefault("OMPI_MCA_btl", "^ofi")
    env["PATH"] = BIN + os.pathsep + env.get("PATH", "")
    return env


def run_simulated(program: str, timeout: float = 600, parts: int = 1):
    """Run ``program`` (Python source) from the repository root in a fresh interpreter under the CUDA
    simulator (``NUMBA_ENABLE_CUDASIM=1`` set before numba is imported there); its last line of output,
    parsed as JSON.  A failed run fails the test with its error output.

    ``parts > 1``: that many interpreters side by side, each with ``SIM_PART=i/parts`` in its environment
    (the program does its share of the work by that variable), their JSON objects merged: the simulator
    runs on one core, and the CI machine has two.
    """
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    outs = run_side_by_side([[sys.executable, "-c", program]] * parts, timeout, cwd=root,
                            envs=[dict(os.environ, NUMBA_ENABLE_CUDASIM="1", SIM_PART=f"{i}/{parts}")
                                  for i in range(parts)])
    out = {}
    for stdout in outs:
        out.update(json.loads(stdout.strip().splitlines()[-1]))
    return out


def run_side_by_side(cmds: list, timeout: float, cwd: str, envs: list) -> list:
    """Run the commands at once (each in a session of its own), each with its environment; their standard
    outputs, in order.  A command that fails fails the test with its error output; none outlives the call."""
    procs = [subprocess.Popen(cmd, cwd=cwd, env=env, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              start_new_session=True) for cmd, env in zip(cmds, envs)]
    deadline = time.monotonic() + timeout
    outs = []
    try:
        for p in procs:
            stdout, stderr = p.communicate(timeout=max(1.0, deadline - time.monotonic()))
            assert p.returncode == 0, stderr[-3000:]
            outs.append(stdout)
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.communicate()
    return outs


def mpirun_path() -> str | None:
    return shutil.which("mpirun", path=BIN) or shutil.which("mpirun")


@dataclass
class Result:
    code: int
    out: str
    err: str
    seconds: float


def run_cli(args: list, np: int | None = None, timeout: float = 120, cwd=None, env: dict | None = None,
            prefix: list | None = None) -> Result:
    """Run ``mpikmeans ARGS`` (under ``mpirun -np NP`` when ``np`` is given).

    ``timeout`` kills the whole launch: a hang fails the test instead of the suite.
    ``env`` adds to (or, with None values, removes from) the environment;
    ``prefix`` goes before the command (e.g. ``["taskset", "-c", "0"]``).
    """
    exe = [sys.executable, "-m", "mpikmeans"]
    if np is not None:
        mpirun = mpirun_path()
        if mpirun is None:
            pytest.skip("mpirun not found")
        cmd = [mpirun, "-np", str(np), "--oversubscribe", "--bind-to", "none"] + exe + [str(a) for a in args]
    else:
        cmd = exe + [str(a) for a in args]
    cmd = list(prefix or []) + cmd
    full_env = _env()
    for key, value in (env or {}).items():
        if value is None:
            full_env.pop(key, None)
        else:
            full_env[key] = str(value)
    for attempt in range(2):
        t0 = time.monotonic()
        try:
            p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=full_env, cwd=cwd,
                               start_new_session=True)
        except subprocess.TimeoutExpired as exc:
            raise AssertionError(f"timed out after {timeout} s: {' '.join(cmd)}\n{exc.stdout}\n{exc.stderr}") from None
        # Open MPI's runtime failing to start (its PMIx server, now and then on a busy machine) ran none of
        # the tool: launched once more
        if np is None or MPI_START_FAILURE not in p.stderr or attempt:
            break
    if np is not None:  # job logs stay plain text: no escape codes from any rank (issue 18)
        assert "\x1b" not in p.stdout + p.stderr, f"escape codes in the output of {' '.join(cmd)}"
    return Result(p.returncode, p.stdout, p.stderr, time.monotonic() - t0)


@pytest.fixture(scope="session", autouse=True)
def warm_numba_cache(tmp_path_factory):
    """Compile every kernel once, in one process, before any timed test.

    Numba caches compiled code on disk; without this the first runs under
    mpirun compile the same kernels in every rank at once, and a test that
    checks a job ends within 10 s would be timing the compiler.
    """
    d = tmp_path_factory.mktemp("warm")
    sample = os.path.join(os.path.dirname(__file__), os.pardir, "data", "sample.arff")
    r = run_cli(["gen-data", d / "g.arff", "-n", 10, "-m", 2, "-k", 2, "-q"], timeout=600)
    assert r.code == 0, r.err
    r = run_cli(["run", sample, "-k", 2, "-o", d / "out", "-q"], timeout=600)
    assert r.code == 0, r.err


@pytest.fixture(scope="session")
def blobs(tmp_path_factory):
    """A 20,000 x 10 file of 8 well-separated blobs, made with gen-data."""
    path = tmp_path_factory.mktemp("blobs") / "blobs.arff"
    r = run_cli(["gen-data", path, "-n", 20000, "-m", 10, "-k", 8, "--seed", 3, "--spread", 0.5])
    assert r.code == 0, r.err
    return path


@pytest.fixture(scope="session")
def small_file(tmp_path_factory):
    """A 600 x 3 ARFF file of 5 blobs, written in-process (the initialisation and Lloyd tests)."""
    sys.path.insert(0, os.path.dirname(__file__))
    from threadcomm import run_ranks

    from mpikmeans.io.gen import GenSpec, write_blobs

    path = tmp_path_factory.mktemp("km") / "small.arff"
    run_ranks(1, lambda comm: write_blobs(GenSpec(n=600, m=3, k=5, seed=1, spread=1.0, decimals=6), str(path), comm))
    return path


@pytest.fixture(scope="session")
def small_x(small_file):
    """The rows of ``small_file``, as the reader gives them."""
    from threadcomm import run_ranks

    from mpikmeans.io.arff import read_arff

    return run_ranks(1, lambda comm: read_arff(str(small_file), comm))[0].x


def real_gpu():
    """The GPU backend's package where a real CUDA GPU answers (not the simulator), else None."""
    try:
        from mpikmeans.backends import gpu as G
    except Exception:
        return None
    if G.SIM or not G.gpu_available():
        return None
    return G


#: a test that needs a real CUDA GPU (the device machine runs these: ``-m gpu``)
needs_gpu = pytest.mark.skipif(real_gpu() is None, reason="needs a real CUDA GPU")


#: pytest's time limit of a test that sets up tests/test_backend_gpu.py's simulator fixture (every
#: scenario once, two processes side by side: 222-235 s on a 2-core machine, near the suite's 300 s
#: limit; the fixture's own processes stop at 600 s)
SIM_FIXTURE_TIMEOUT = 540


def pytest_collection_modifyitems(config, items):
    """The tests on the simulator fixture get :data:`SIM_FIXTURE_TIMEOUT`: whichever runs first waits for it."""
    for item in items:
        if "sim" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.timeout(SIM_FIXTURE_TIMEOUT))
