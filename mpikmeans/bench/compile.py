"""What compiling costs: every kernel's first compile on this machine, with empty caches.

A run on a machine whose caches are empty compiles the parser's, the writer's and
the backend's kernels (Numba) and, with a GPU, the GPU kernels of its shape
(numba-cuda).  :func:`compile_costs` does what ``mpikmeans warmup`` does, in a
child process whose caches point at a new, empty directory, and records how long
each dispatcher took to compile (Numba's ``numba:compile`` events; a kernel that
calls another includes the callee's compile, which is also listed on its own).
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile

from .harness import Launch, Progress, quiet

_CHILD = r"""
import json, sys, time
from collections import defaultdict
from numba.core import event as cpu_event

totals = defaultdict(float)
counts = defaultdict(int)


class Timer(cpu_event.Listener):
    def __init__(self):
        self.started = {}

    def on_start(self, ev):
        self.started[id(ev.data.get("dispatcher"))] = time.perf_counter()

    def on_end(self, ev):
        d = ev.data.get("dispatcher")
        t0 = self.started.pop(id(d), None)
        if t0 is not None:
            name = getattr(getattr(d, "py_func", d), "__module__", "?") + "." + getattr(d, "__qualname__", str(d))
            totals[name] += time.perf_counter() - t0
            counts[name] += 1


listener = Timer()
cpu_event.register("numba:compile", listener)
try:
    from numba.cuda.core import event as gpu_event
    gpu_event.register("numba:compile", listener)
except Exception:
    pass
from mpikmeans.warmup import warm_cpu, warm_gpu
out = {}
t0 = time.perf_counter()
out["cpu_s"] = warm_cpu(int(sys.argv[1]))
if sys.argv[2] != "0":
    k, m, dtype = int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    out["gpu_s"] = warm_gpu(k, m, dtype)
    from mpikmeans.backends.gpu.compiled import COMPILE_TIMES
    out["gpu_kernels"] = [{"kernel": n, "seconds": s} for n, s in COMPILE_TIMES]
out["total_s"] = time.perf_counter() - t0
out["kernels"] = sorted(({"kernel": n, "seconds": s, "compiles": counts[n]} for n, s in totals.items()),
                        key=lambda r: -r["seconds"])
print("RESULT " + json.dumps(out))
"""


def compile_costs(launch: Launch, threads: int = 1, gpu_shape: tuple | None = None,
                  progress: Progress = quiet) -> dict:
    """Compile every kernel of a run once, in a child process with empty caches; the times.

    Parameters
    ----------
    launch : Launch
    threads : int
        Threads of the CPU warm-up (the parallel kernels' thread pool).
    gpu_shape : (k, m, dtype), optional
        Also compile the GPU kernels of this shape.

    Returns
    -------
    dict
        ``cpu_s``, ``gpu_s`` (whole warm-ups), ``total_s`` and ``kernels``: per
        dispatcher, ``kernel``, ``seconds``, ``compiles``, longest first; with a
        GPU shape, ``gpu_kernels``: each GPU kernel compiled, ``kernel``, ``seconds``.
    """
    cache = tempfile.mkdtemp(prefix="mpikmeans-compile-")
    try:
        k, m, dtype = gpu_shape if gpu_shape else (0, 0, "float64")
        ran = launch.with_env(MPIKMEANS_CACHE_DIR=cache).python("-c", _CHILD, threads, k, m, dtype)
        line = next(ln for ln in ran.stdout.splitlines() if ln.startswith("RESULT "))
        result = json.loads(line[len("RESULT "):])
        result["wall_s"] = ran.wall_s
    finally:
        shutil.rmtree(cache, ignore_errors=True)
    for r in result["kernels"][:12]:
        progress(f"{r['seconds']:8.2f} s  {r['kernel']} ({r['compiles']} compile{'s' if r['compiles'] != 1 else ''})")
    for r in result.get("gpu_kernels", []):
        progress(f"{r['seconds']:8.2f} s  GPU kernel {r['kernel']}")
    progress(f"CPU warm-up {result['cpu_s']:.1f} s" + (f", GPU {result['gpu_s']:.1f} s" if "gpu_s" in result else "")
             + f"; whole child process {result['wall_s']:.1f} s ({os.cpu_count()} CPUs)")
    return result
