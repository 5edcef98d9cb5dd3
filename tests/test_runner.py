"""Tests for :mod:`mpikmeans.runner`'s start of a run: what it starts beside the read.

- a CPU run starts no GPU preparation; the start of a GPU that cannot be had is
  reported where the backend is made, not lost in its thread;
- on cold caches helper processes compile the run's other kernels (one per
  cold part) and the run waits for them; on warm caches none is started; a run
  that fails stops them.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from mpikmeans import runner  # noqa: E402
from mpikmeans.backends import BackendUnavailable  # noqa: E402
from mpikmeans.comm import SerialComm  # noqa: E402
from mpikmeans.config import RunConfig  # noqa: E402


def test_a_cpu_run_starts_no_gpu():
    cfg = RunConfig(k=2, backend="cpu").validate()
    start = runner.DevicePreparation(SerialComm(), cfg)
    assert not runner.gpu_wanted(cfg) and start._thread is None and start.result() is None


def test_a_gpu_start_failure_is_raised_where_the_backend_is_made(monkeypatch):
    pytest.importorskip("numba.cuda")
    from mpikmeans.backends import gpu as G

    if G.gpu_available():
        pytest.skip("a GPU is usable here")
    start = runner.DevicePreparation(SerialComm(), RunConfig(k=2, backend="gpu").validate())
    assert start._thread is not None
    with pytest.raises(BackendUnavailable):
        start.result()


def test_cold_caches_compile_the_rest_in_helper_processes(monkeypatch, tmp_path):
    data = Path(__file__).resolve().parents[1] / "data" / "sample.arff"
    cfg = RunConfig(k=2, backend="cpu").validate()
    monkeypatch.setattr(runner.BackgroundCompile, "_cold", staticmethod(lambda *a: ["rest", "cpu-step"]))
    bg = runner.BackgroundCompile(SerialComm(), str(data), cfg, gpu=False)
    assert len(bg.procs) == 2
    bg.wait()
    for proc in bg.procs:
        assert proc.returncode == 0, proc.stderr
    assert sorted(bg.seconds) == ["cpu-step", "rest"] and all(v > 0 for v in bg.seconds.values())
    # a failed run stops them
    bg = runner.BackgroundCompile(SerialComm(), str(data), cfg, gpu=False)
    bg.stop()
    assert all(proc.returncode is not None for proc in bg.procs)


def test_the_cold_parts_of_a_run(monkeypatch):
    """A CPU run's helpers compile the rest and the CPU backend; a GPU run's the rest and its shape's GPU kernels."""
    import mpikmeans.cache as cache
    import mpikmeans.warmup as warmup

    data = str(Path(__file__).resolve().parents[1] / "data" / "sample.arff")
    cfg = RunConfig(k=2).validate()
    monkeypatch.delenv("NUMBA_ENABLE_CUDASIM", raising=False)
    for rest, cpu, shape in [(False, False, False), (True, True, True), (True, False, True)]:
        monkeypatch.setattr(warmup, "rest_warm", lambda: rest)
        monkeypatch.setattr(warmup, "cpu_backend_cold", lambda: [] if cpu else ["step", "init"])
        monkeypatch.setattr(cache, "gpu_shape_warm", lambda key: shape)
        cold = runner.BackgroundCompile._cold
        assert cold(data, cfg, False, 1) == ["rest"] * (not rest) + ["cpu-step", "cpu-init"] * (not cpu)
        gpu = ["gpu-full", "gpu-assign", "gpu-delta", "gpu-init", "gpu-fixed"]
        assert cold(data, cfg, True, 1) == ["rest"] * (not rest) + gpu * (not shape)


def test_the_simulator_starts_no_gpu_helpers(monkeypatch):
    """Under the CUDA simulator nothing is compiled for the GPU: a GPU run's helpers are the rest's alone."""
    import mpikmeans.cache as cache
    import mpikmeans.warmup as warmup

    data = str(Path(__file__).resolve().parents[1] / "data" / "sample.arff")
    monkeypatch.setenv("NUMBA_ENABLE_CUDASIM", "1")
    monkeypatch.setattr(warmup, "rest_warm", lambda: False)
    monkeypatch.setattr(cache, "gpu_shape_warm", lambda key: False)
    assert runner.BackgroundCompile._cold(data, RunConfig(k=2).validate(), True, 1) == ["rest"]


def test_warm_caches_start_nothing(monkeypatch):
    data = Path(__file__).resolve().parents[1] / "data" / "sample.arff"
    monkeypatch.setattr(runner.BackgroundCompile, "_cold", staticmethod(lambda *a: []))
    bg = runner.BackgroundCompile(SerialComm(), str(data), RunConfig(k=2).validate(), gpu=False)
    assert bg.proc is None
    bg.wait()


def test_after_a_cpu_run_the_rest_is_warm(tmp_path):
    from conftest import run_cli

    from mpikmeans.warmup import cpu_backend_cold, rest_warm

    data = Path(__file__).resolve().parents[1] / "data" / "sample.arff"
    r = run_cli(["run", data, "-k", 2, "--backend", "cpu", "-o", tmp_path / "o", "-q"])
    assert r.code == 0, r.err
    assert rest_warm() and cpu_backend_cold() == []
