"""The initialisations on the GPU backend give the CPU's centres, bit for bit, at any rank count.

k-means++ and k-means|| keep D² on the device and run their passes there
(mpikmeans/backends/gpu/initk.py), or on the host where the rows stream through the
device in chunks; the CPU backend runs its own kernels.  Each
rank count runs once under ``mpirun`` with the CUDA simulator (every rank its own
process, the real communicator); every rank computes the centres with both
backends, and rank 0 prints them.  The tests compare the two backends, and the
rank counts with each other.
"""

from __future__ import annotations

import json
import os
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from conftest import _env, mpirun_path, run_side_by_side

pytestmark = pytest.mark.mpi

ROOT = Path(__file__).resolve().parents[1]

_PROGRAM = textwrap.dedent(
    r"""
    import json
    import numpy as np
    from mpikmeans.backends.cpu import CPUBackend
    from mpikmeans.backends.gpu import SIM, GPUBackend
    from mpikmeans.comm import world
    from mpikmeans.init import initial_centres

    assert SIM
    comm = world()
    r = np.random.default_rng(3)
    # the simulator runs every thread of a block in Python, so its time goes with the blocks of 32
    # rows (240 rows took 40 s of mpirun launches): few rows, but two blocks or more on every rank at
    # every rank count (100 / 3: 33, 33 and 34, uneven shares), so that a draw on the device still
    # picks its block among several by their exact totals (exact.BlockFixed) before the row in it
    n, m, k = 100, 5, 6
    centres = r.uniform(-10, 10, size=(k, m))
    x = centres[r.integers(0, k, n)] + r.normal(size=(n, m))
    w = r.uniform(0.5, 2.0, n)
    lo, hi = n * comm.rank // comm.size, n * (comm.rank + 1) // comm.size
    out = {}
    for method in ("k-means++", "k-means||"):
        for weighted in (False, True):
            wl = w[lo:hi] if weighted else None
            got = {}
            for name, backend in (("cpu", CPUBackend(threads=1)), ("gpu", GPUBackend()),
                                  ("gpu_streamed", GPUBackend(chunk_rows=40))):
                backend.load(x[lo:hi], wl)
                c = initial_centres(comm, method, k, x[lo:hi], lo, n, 11, weights=wl, backend=backend, rounds=2)
                got[name] = c.tobytes().hex()
                backend.close()
            out[f"{method} weighted={weighted}"] = got
    if comm.rank == 0:
        print("RESULT " + json.dumps(out), flush=True)
    """
)


@pytest.fixture(scope="module")
def runs():
    """Centres per rank count: {ranks: {case: {"cpu": hex, "gpu": hex, "gpu_streamed": hex}}}."""
    mpirun = mpirun_path()
    if mpirun is None:
        pytest.skip("mpirun not found")
    pytest.importorskip("numba.cuda")
    env = _env()
    env["NUMBA_ENABLE_CUDASIM"] = "1"
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    # the three jobs side by side: each rank spends most of its time in the simulator, one core each
    cmds = [[mpirun, "-np", str(ranks), "--oversubscribe", "--bind-to", "none", sys.executable, "-c", _PROGRAM]
            for ranks in (1, 2, 3)]
    out = {}
    for ranks, stdout in zip((1, 2, 3), run_side_by_side(cmds, 600, str(ROOT), [env] * 3)):
        line = next(ln for ln in stdout.splitlines() if ln.startswith("RESULT "))
        out[ranks] = json.loads(line[len("RESULT "):])
    return out


def test_gpu_init_equals_cpu_init(runs):
    for ranks, cases in runs.items():
        for case, got in cases.items():
            assert got["gpu"] == got["cpu"], (ranks, case)
            assert got["gpu_streamed"] == got["cpu"], (ranks, case)  # rows streamed: the passes on the host


def test_init_centres_do_not_depend_on_the_rank_count(runs):
    for case in runs[1]:
        for ranks in (2, 3):
            assert runs[ranks][case] == runs[1][case], (ranks, case)
    c = np.frombuffer(bytes.fromhex(runs[1]["k-means++ weighted=False"]["gpu"]), dtype=np.float64)
    assert c.shape == (30,) and np.isfinite(c).all()
