"""Tests for :mod:`mpikmeans.startup`: what a run starts beside the read.

- a CPU run starts no GPU preparation; the start of a GPU that cannot be had is
  reported where the backend is made, not lost in its thread;
- on cold caches helper processes compile the parts the run needs (one per
  cold part, :mod:`mpikmeans.cache`), after one notice; the run waits for
  them; on warm caches none is started; a run that fails stops them.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from mpikmeans import startup  # noqa: E402
from mpikmeans.backends import BackendUnavailable  # noqa: E402
from mpikmeans.comm import SerialComm  # noqa: E402
from mpikmeans.config import RunConfig  # noqa: E402


def test_a_cpu_run_starts_no_gpu():
    cfg = RunConfig(k=2, backend="cpu").validate()
    start = startup.DevicePreparation(SerialComm(), cfg)
    assert not startup.gpu_wanted(cfg) and start._thread is None and start.result() is None


def test_a_gpu_start_failure_is_raised_where_the_backend_is_made(monkeypatch):
    pytest.importorskip("numba.cuda")
    from mpikmeans.backends import gpu as G

    if G.gpu_available():
        pytest.skip("a GPU is usable here")
    start = startup.DevicePreparation(SerialComm(), RunConfig(k=2, backend="gpu").validate())
    assert start._thread is not None
    with pytest.raises(BackendUnavailable):
        start.result()


class _FakeDriver:
    """libcuda's four entry points the early start calls, with ``count`` devices; records the calls."""

    def __init__(self, count=2, init=0):
        self.count, self.init, self.calls = count, init, []

    def cuInit(self, flags):
        self.calls.append(("init", flags))
        return self.init

    def cuDeviceGetCount(self, ref):
        ref._obj.value = self.count
        return 0

    def cuDeviceGet(self, ref, ordinal):
        self.calls.append(("device", ordinal))
        ref._obj.value = 100 + ordinal
        return 0

    def cuDevicePrimaryCtxRetain(self, ref, dev):
        self.calls.append(("retain", dev.value))
        return 0


@pytest.mark.parametrize("node_rank, node_size, share, device", [(0, 1, False, 0), (1, 2, False, 1),
                                                                 (3, 4, True, 1), (2, 3, False, None)])
def test_the_early_driver_start_makes_the_context_of_the_device_the_backend_takes(node_rank, node_size, share, device):
    # the device select_device_for gives (node_rank % count), and none where it would refuse (3 ranks, 2 GPUs)
    lib = _FakeDriver(count=2)
    made = startup.retain_primary_context(node_rank, node_size, share, load=lambda: lib)
    assert made == (device is not None)
    retained = [c for c in lib.calls if c[0] == "retain"]
    assert retained == ([] if device is None else [("retain", 100 + device)])


def test_the_early_driver_start_gives_up_quietly_without_a_driver():
    def missing():
        raise OSError("libcuda.so.1: cannot open shared object file")

    assert startup.retain_primary_context(0, 1, False, load=missing) is False
    lib = _FakeDriver(init=100)  # CUDA_ERROR_NO_DEVICE
    assert startup.retain_primary_context(0, 1, False, load=lambda: lib) is False
    assert lib.calls == [("init", 0)]
    lib = _FakeDriver(count=0)
    assert startup.retain_primary_context(0, 1, False, load=lambda: lib) is False


def test_a_cpu_run_starts_no_driver():
    assert startup.start_driver(SerialComm(), RunConfig(k=2, backend="cpu").validate()) is None


def _quick_helpers(monkeypatch, cold, seconds=0.2):
    """BackgroundCompile with ``cold`` parts cold, each helper a process that sleeps ``seconds``; the dtype
    each run asks cold_parts about is recorded."""
    asked = []
    monkeypatch.setattr(startup, "cold_parts", lambda gpu_dtype=None: asked.append(gpu_dtype) or list(cold))
    monkeypatch.setattr(startup, "warmup_command",
                        lambda part: [sys.executable, "-c", f"import time; time.sleep({seconds})"])
    return asked


def test_cold_caches_compile_in_one_helper_process_a_part(monkeypatch, caplog):
    asked = _quick_helpers(monkeypatch, ["cpu", "gpu-float64"])
    with caplog.at_level("WARNING", logger="mpikmeans"):
        bg = startup.BackgroundCompile(SerialComm(), RunConfig(k=2, backend="cpu").validate(), gpu=False)
    assert asked == [None] and len(bg.procs) == 2
    notices = [r.getMessage() for r in caplog.records if "compiling kernels for this machine, once" in r.getMessage()]
    assert len(notices) == 1 and "cpu, gpu-float64" in notices[0] and "mpikmeans warmup" in notices[0], notices
    bg.wait()
    assert all(proc.returncode == 0 for proc in bg.procs)
    assert sorted(bg.seconds) == ["cpu", "gpu-float64"] and all(v > 0 for v in bg.seconds.values())


def test_a_failed_run_stops_its_helpers(monkeypatch):
    _quick_helpers(monkeypatch, ["cpu"], seconds=600)
    bg = startup.BackgroundCompile(SerialComm(), RunConfig(k=2, backend="cpu").validate(), gpu=False)
    bg.stop()
    assert bg.procs and all(proc.returncode is not None for proc in bg.procs)


@pytest.mark.parametrize("dtype,gpu,sim,want", [
    ("float64", False, False, None), ("float64", True, False, "float64"), ("float32", True, False, "float32"),
    ("float32", True, True, None),  # the simulator compiles nothing for a GPU
])
def test_the_parts_a_run_needs(monkeypatch, dtype, gpu, sim, want):
    """A CPU run needs the CPU kernels; a GPU run those of its dtype too (none under the simulator)."""
    if sim:
        monkeypatch.setenv("NUMBA_ENABLE_CUDASIM", "1")
    else:
        monkeypatch.delenv("NUMBA_ENABLE_CUDASIM", raising=False)
    asked = _quick_helpers(monkeypatch, [])
    startup.BackgroundCompile(SerialComm(), RunConfig(k=2, dtype=dtype).validate(), gpu=gpu).wait()
    assert asked == [want]


def test_warm_caches_start_nothing_and_say_nothing(monkeypatch, caplog):
    _quick_helpers(monkeypatch, [])
    with caplog.at_level("INFO", logger="mpikmeans"):
        bg = startup.BackgroundCompile(SerialComm(), RunConfig(k=2).validate(), gpu=False)
    assert bg.procs == [] and not caplog.records
    bg.wait()


def test_a_warm_up_starts_no_helpers(monkeypatch):
    """A warm-up's own runs start no compiling processes (each would start more)."""
    import mpikmeans.cache as cache

    asked = _quick_helpers(monkeypatch, ["cpu"])
    monkeypatch.setattr(startup, "warming", lambda: True)
    assert startup.BackgroundCompile(SerialComm(), RunConfig(k=2).validate(), gpu=False).procs == []
    assert asked == [] and not cache.warming()


def test_after_a_cpu_run_the_cpu_part_is_warm(tmp_path):
    from conftest import run_cli

    from mpikmeans.cache import cold_parts, is_warm

    data = Path(__file__).resolve().parents[1] / "data" / "sample.arff"
    r = run_cli(["run", data, "-k", 2, "--backend", "cpu", "-o", tmp_path / "o", "-q"])
    assert r.code == 0, r.err
    assert is_warm("cpu") and cold_parts() == []
