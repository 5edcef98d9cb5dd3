"""Where a warm GPU run's non-read time goes: init, the Lloyd loop and its closing passes (issue 15).

Reads DATA (16 threads), loads it on GPU 0, then times ``k-means++`` and
``lloyd`` (best of REPEATS), each kernel kind of the initialisation (synchronised
before and after: their device time), and prints a cProfile of one init and one
Lloyd run (host time by function).

    python3 bench/experiments/profile_gpu_phases.py DATA K REPEATS OUT_DIR
"""

from __future__ import annotations

import cProfile
import io
import json
import os
import pstats
import sys
import time
from collections import defaultdict

import numpy as np


def main() -> None:
    data, k, repeats, out = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    from numba import cuda

    from mpikmeans.backends import make_backend
    from mpikmeans.backends.gpu import backend as gb
    from mpikmeans.comm import SerialComm
    from mpikmeans.init import initial_centres
    from mpikmeans.io.arff import read_arff
    from mpikmeans.lloyd import lloyd

    comm = SerialComm()
    local = read_arff(data, comm, threads=16)
    x = local.x
    n, m = x.shape
    be = make_backend("gpu", device=0, dtype="float64", threads=16, chunk_rows=None)
    be.load(x, None)
    be.warmup(k, m)
    doc = {"n": n, "m": m, "k": k}

    def timed(fn):
        cuda.synchronize()
        t = time.perf_counter()
        r = fn()
        cuda.synchronize()
        return time.perf_counter() - t, r

    init = lambda: initial_centres(comm, "k-means++", k, x, 0, n, 0, backend=be)  # noqa: E731
    runs = [timed(init) for _ in range(repeats)]
    doc["init_s"] = [t for t, _ in runs]
    centres = runs[0][1]

    def run_lloyd():
        be.load(x, None)  # labels back to none, as a fresh run
        return lloyd(comm, be, x, 0, centres, max_iter=300)

    lruns = [timed(run_lloyd) for _ in range(repeats)]
    doc["lloyd_with_load_s"] = [t for t, _ in lruns]
    doc["iterations"] = lruns[0][1].iterations
    load_s = [timed(lambda: be.load(x, None))[0] for _ in range(repeats)]
    doc["load_s"] = load_s
    # the closing parts of lloyd on their own
    doc["assign_s"] = [timed(lambda: be.assign(centres))[0] for _ in range(repeats)]
    from mpikmeans.lloyd import _label_means

    labels, _ = be.assign(centres)
    doc["label_means_s"] = [timed(lambda: _label_means(comm, x, labels, None, centres))[0] for _ in range(repeats)]

    # each initialisation kernel kind's device time
    per = defaultdict(float)
    calls = defaultdict(int)
    orig_kernel = gb.GPUBackend._kernel

    def kernel(self, name, spec, kern, args, grid, block=None):
        cuda.synchronize()
        t = time.perf_counter()
        if block is None:
            orig_kernel(self, name, spec, kern, args, grid)
        else:
            orig_kernel(self, name, spec, kern, args, grid, block)
        cuda.synchronize()
        per[name] += time.perf_counter() - t
        calls[name] += 1

    gb.GPUBackend._kernel = kernel
    t_all, _ = timed(init)
    gb.GPUBackend._kernel = orig_kernel
    doc["init_kernels"] = {"total_s": t_all, "by_kernel_s": dict(per), "calls": dict(calls)}

    for name, fn in (("init", init), ("lloyd", run_lloyd)):
        prof = cProfile.Profile()
        prof.enable()
        fn()
        cuda.synchronize()
        prof.disable()
        s = io.StringIO()
        st = pstats.Stats(prof, stream=s)
        st.sort_stats("tottime").print_stats(25)
        st.sort_stats("cumulative").print_stats(40)
        with open(os.path.join(out, f"profile_{name}.txt"), "w") as f:
            f.write(s.getvalue())
    print(json.dumps(doc, indent=1))
    with open(os.path.join(out, "phases.json"), "w") as f:
        json.dump(doc, f, indent=1)


if __name__ == "__main__":
    main()
