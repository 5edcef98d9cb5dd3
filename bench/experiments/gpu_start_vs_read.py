"""Why is the ARFF read slower inside a GPU run than alone?  (issue 15, device experiment)

Runs ``mpikmeans run DATA -k K`` (warm caches) in fresh processes, interleaved,
under variants of when the GPU's one-time start happens, and prints each run's
read and set-up times from summary.json:

- ``cpu``: ``--backend cpu --init sample --max-iter 1``: no GPU start at all;
- ``gpu``: the current code (the start in a thread beside the read);
- ``gpu-after``: the GPU start only once the read is over (sequential);
- ``gpu-switch``: as ``gpu``, with ``sys.setswitchinterval(SWITCH)`` for the whole run;
- ``gpu-early``: the GPU start before the reader's start-up (``prepare_read``) instead of after it.

``--variants a,b`` picks some; ``--no-load`` leaves out the load measurement.

Then, in this process, the GPU's start alone (numba-cuda import, context) and the
parts of ``DeviceRows.load`` for the spec example's rows (device allocation, the
upload loop).

    python3 bench/experiments/gpu_start_vs_read.py DATA K REPEATS OUT_JSON
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time

SWITCH = 0.0002

PATCHES = {
    "cpu": "",
    "gpu": "",
    "gpu-switch": f"import sys; sys.setswitchinterval({SWITCH})\n",
    "gpu-after": """
import mpikmeans.runner as r
_Prep = r.DevicePreparation
class Later(_Prep):
    def __init__(self, comm, cfg):
        self._args = (comm, cfg)
        self._started = False
        self.device = None; self.error = None; self.reason = ""; self._thread = None
    def result(self):
        if not self._started:
            self._started = True
            _Prep.__init__(self, *self._args)
        return _Prep.result(self)
r.DevicePreparation = Later
""",
    "gpu-early": """
import mpikmeans.runner as r
_Prep, _prepare_read = r.DevicePreparation, r.prepare_read
_early = []
def prepare_read(comm, data, threads):
    _early.append(_Prep(comm, r._early_cfg))
    return _prepare_read(comm, data, threads)
_run_job = r.run_job
def run_job(comm, data, cfg, launched_at=None):
    r._early_cfg = cfg
    return _run_job(comm, data, cfg, launched_at)
r.run_job = run_job
r.prepare_read = prepare_read
r.DevicePreparation = lambda comm, cfg: _early.pop()
""",
}


def one(variant: str, data: str, k: int) -> dict:
    out = tempfile.mkdtemp(prefix="gsr-")
    args = ["run", data, "-k", str(k), "-o", out, "--overwrite", "-q"]
    if variant == "cpu":
        args += ["--backend", "cpu", "--init", "sample", "--max-iter", "1"]
    code = PATCHES[variant] + f"import sys; sys.argv = ['mpikmeans'] + {args!r}\nfrom mpikmeans.cli import main\nmain()\n"
    t = time.perf_counter()
    subprocess.run([sys.executable, "-c", code], check=True)
    wall = time.perf_counter() - t
    with open(os.path.join(out, "summary.json")) as f:
        s = json.load(f)
    tm = s["timings"]
    return {"variant": variant, "wall_s": wall, "read_s": tm["read_s"], "startup_s": tm["startup_s"],
            "setup_s": tm["setup_s"], "total_s": tm["total_s"], "setup_parts": tm["setup_parts"],
            "init_s": tm["init_s"], "compute_s": tm["compute_s"]}


def gpu_start_and_load(n: int, m: int) -> dict:
    import numpy as np

    t0 = time.perf_counter()
    from numba import cuda  # noqa: F401
    from mpikmeans.backends.gpu.device import select_device_for, DeviceLimits

    t1 = time.perf_counter()
    dev = select_device_for(0, 1, False)
    cuda.select_device(dev)
    t2 = time.perf_counter()
    x = np.random.default_rng(0).random((n, m))
    from mpikmeans.backends.gpu.rows import DeviceRows
    from mpikmeans.backends.gpu import launch

    res = {"import_s": t1 - t0, "context_s": t2 - t1}
    rows = DeviceRows("float64", DeviceLimits())
    rows.load(x[:1000], None, None)  # kernels loaded
    for rep in range(3):
        t = time.perf_counter()
        rows.load(x, None, None)
        cuda.synchronize()
        res.setdefault("load_s", []).append(time.perf_counter() - t)
    t = time.perf_counter()
    d = cuda.device_array(n * m, dtype=np.float64)
    cuda.synchronize()
    res["device_array_s"] = time.perf_counter() - t
    del d
    t = time.perf_counter()
    p = [launch.pinned((32 << 20) // 8, np.float64) for _ in range(2)]
    res["pinned_2x32MB_s"] = time.perf_counter() - t
    del p
    t = time.perf_counter()
    p = launch.pinned((256 << 20) // 8, np.float64)
    res["pinned_256MB_s"] = time.perf_counter() - t
    d = cuda.device_array(len(p), dtype=np.float64)
    for rep in range(3):
        t = time.perf_counter()
        d.copy_to_device(p)
        cuda.synchronize()
        res.setdefault("h2d_pinned_GBps", []).append(len(p) * 8 / (time.perf_counter() - t) / 1e9)
        t = time.perf_counter()
        d.copy_to_device(x.reshape(-1)[: len(p)])
        cuda.synchronize()
        res.setdefault("h2d_pageable_GBps", []).append(len(p) * 8 / (time.perf_counter() - t) / 1e9)
        t = time.perf_counter()
        np.copyto(p, x.reshape(-1)[: len(p)])
        res.setdefault("host_copy_1thread_GBps", []).append(len(p) * 8 / (time.perf_counter() - t) / 1e9)
    return res


def main() -> None:
    data, k, repeats, out = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    variants = ("cpu", "gpu", "gpu-after", "gpu-switch", "gpu-early")
    for a in sys.argv:
        if a.startswith("--variants="):
            variants = tuple(a.split("=", 1)[1].split(","))
    one("gpu", data, k)  # warm caches, page cache
    runs = []
    for rep in range(repeats):
        for v in variants:
            r = one(v, data, k)
            runs.append(r)
            print(f"{v:11s} read {r['read_s']:.3f}  startup {r['startup_s']:.3f}  setup {r['setup_s']:.3f} "
                  f"{ {a: round(b, 3) for a, b in r['setup_parts'].items()} }  init {r['init_s']:.3f}  "
                  f"compute {r['compute_s']:.3f}  total {r['total_s']:.3f}  wall {r['wall_s']:.3f}", flush=True)
    doc = {"runs": runs}
    if "--no-load" not in sys.argv:
        doc["gpu_start_and_load"] = gpu_start_and_load(5_000_000, 100)
        print(json.dumps(doc["gpu_start_and_load"], indent=1))
    from mpikmeans.bench.harness import result_document, write_result

    write_result(out, result_document("experiment", "python3 " + " ".join(sys.argv), {"variants": variants}, doc))


if __name__ == "__main__":
    main()
