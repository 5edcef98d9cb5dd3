"""Time to solution on this machine's cores: the whole job, against scikit-learn's default fit.

The issue's 2-core case: 200,000 x 100, k = 50, the CPU backend, from an ARFF file
and from the ``.npy`` that ``convert`` makes, every run with defaults.  Measured
in one test run, next to scikit-learn's ``KMeans(50).fit`` on the same cores:

- a second run's backend set-up takes at most 0.3 s (its kernels come from the cache);
- ``convert`` costs at most 1.5 times the ARFF read inside it (parse once, write the bytes),
  and not grossly more than a run's read;
- reading the ``.npy`` runs at least 3 times the ARFF's MB/s;
- the whole job from the ``.npy`` is no slower than scikit-learn's fit (the
  ratio is printed; the assertion allows the noise of a shared machine).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from conftest import _env, run_cli

pytestmark = pytest.mark.slow

N, M, K = 200_000, 100, 50


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    # in memory (tmpfs) where there is one, as the issue measured: on a virtual disk the
    # fsync that makes the .npy durable before its rename is the disk's time, not the tool's
    if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) and shutil.disk_usage("/dev/shm").free > 2 << 30:
        d = Path(tempfile.mkdtemp(prefix="mpikmeans-tts-", dir="/dev/shm"))
    else:
        d = tmp_path_factory.mktemp("tts")
    arff, npy = d / "d.arff", d / "d.npy"
    r = run_cli(["gen-data", arff, "-n", N, "-m", M, "-k", K, "--seed", 1, "-q"], np=2, timeout=600)
    assert r.code == 0, r.err
    out = {"dir": d, "arff": arff, "npy": npy, "converts": [], "arff_runs": [], "npy_runs": []}

    def run(data):
        r = run_cli(["run", data, "-k", K, "--backend", "cpu", "-o", d / "out", "--overwrite", "-q"], timeout=600)
        assert r.code == 0, r.err
        with open(d / "out" / "summary.json") as f:
            return {"wall_s": r.seconds, **json.load(f)}

    # Interleaved, and each convert between two ARFF runs.  On this virtual machine a process
    # that touches memory the previous one did not free just before pays the host's page
    # faults as system time (virtio-balloon free page reporting: the same parse took 0.26-0.78 s,
    # the difference all system time); a run from the .npy frees little (its rows are the
    # file's pages), so a convert after it paid them and the ARFF runs after a convert did not.
    # Here the convert and the reads it is compared with all follow a process that read the ARFF.
    run(arff)
    for i in range(4):
        r = run_cli(["convert", arff, npy, "--report", d / "convert.json", "-q"], timeout=600)
        assert r.code == 0, r.err
        with open(d / "convert.json") as f:
            out["converts"].append(json.load(f))
        out["arff_runs"].append(run(arff))
        if i == 0:
            run(npy)  # the first run from a .npy in this cache loads its kernels once
        out["npy_runs"].append(run(npy))
        out["arff_runs"].append(run(arff))
    code = ("import json, sys, time; t0 = time.perf_counter(); import numpy as np; "
            "from sklearn.cluster import KMeans; x = np.load(sys.argv[1]); t1 = time.perf_counter(); "
            "km = KMeans(int(sys.argv[2])).fit(x); t2 = time.perf_counter(); "
            "print(json.dumps({'fit_s': t2 - t1, 'import_load_s': t1 - t0, 'inertia': float(km.inertia_)}))")
    fits = []
    for _ in range(2):
        t0 = __import__("time").perf_counter()
        p = subprocess.run([sys.executable, "-c", code, str(npy), str(K)], capture_output=True, text=True,
                           timeout=600, env=_env())
        assert p.returncode == 0, p.stderr
        fits.append({"wall_s": __import__("time").perf_counter() - t0, **json.loads(p.stdout.strip().splitlines()[-1])})
    out["sklearn"] = fits
    yield out
    if str(d).startswith("/dev/shm"):
        shutil.rmtree(d, ignore_errors=True)


def _best(runs, key):
    return min(r["timings"][key] for r in runs)


def test_second_run_backend_setup(job):
    assert _best(job["arff_runs"], "setup_s") <= 0.3, [r["timings"] for r in job["arff_runs"]]
    assert _best(job["npy_runs"], "setup_s") <= 0.3, [r["timings"] for r in job["npy_runs"]]


def test_convert_costs_no_more_than_reading_and_writing(job):
    # The ARFF read a convert is held to is the one inside it: the same function on the same
    # file, in the same process.  Across processes this VM moves the same parse by 2x (the host's
    # page faults, above; in one suite run each convert's parse took 0.40-0.60 s and each run's
    # 0.33-0.89 s), so the runs' best read bounds convert only loosely, against gross regressions
    # (the issue measured 4.3x).
    ratios = [c["convert_s"] / c["read_s"] for c in job["converts"]]
    convert = min(c["convert_s"] for c in job["converts"])
    read = _best(job["arff_runs"], "read_s")
    print(f"convert / its read: best {min(ratios):.2f}x; convert {convert:.3f} s against the runs' best read "
          f"{read:.3f} s: {convert / read:.2f}x; each convert (read + write): "
          + ", ".join(f"{c['convert_s']:.3f} ({c['read_s']:.3f} + {c['write_s']:.3f})" for c in job["converts"])
          + "; each run's read: " + ", ".join(f"{r['timings']['read_s']:.3f}" for r in job["arff_runs"]))
    assert min(ratios) <= 1.5
    assert convert <= 2.5 * read


def test_npy_reads_at_least_three_times_faster(job):
    arff_mbs = os.path.getsize(job["arff"]) / 1e6 / _best(job["arff_runs"], "read_s")
    npy_mbs = os.path.getsize(job["npy"]) / 1e6 / _best(job["npy_runs"], "read_s")
    print(f"read: ARFF {arff_mbs:.0f} MB/s, .npy {npy_mbs:.0f} MB/s")
    assert npy_mbs >= 3 * arff_mbs


def test_time_to_solution_against_scikit_learn(job):
    ours = min(r["wall_s"] for r in job["npy_runs"])  # the whole command: start, MPI, read, ..., files
    ours_total = min(r["timings"]["total_s"] for r in job["npy_runs"])
    fit = min(f["fit_s"] for f in job["sklearn"])
    theirs = min(f["wall_s"] for f in job["sklearn"])  # the whole process: start, imports, load, fit
    print(f"mpikmeans from .npy: whole command {ours:.2f} s (job {ours_total:.2f} s); scikit-learn KMeans({K}).fit "
          f"{fit:.2f} s, whole process {theirs:.2f} s; ratio (whole) {ours / theirs:.2f}, (job / fit) "
          f"{ours_total / fit:.2f}")
    assert job["npy_runs"][0]["n"] == N and job["npy_runs"][0]["converged"]
    # noise on a shared 2-core machine moves either by a quarter: the bound allows it
    assert ours <= 1.25 * theirs
