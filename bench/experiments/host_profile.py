"""Where a GPU step's host time goes inside a real Lloyd run: cProfile of ``bench fullstep``'s run.

``bench gpu --host-breakdown`` left most of D's steady step (3e5 x 257, K = 1000) to ``rest``:
0.58-0.86 ms of a 0.94-1.22 ms step on the H100 host (``bench/results/steady_D_H100_2026-11-26_s14_*``),
against 0.44-0.53 ms of kernels.  This runs the full-step case's Lloyd run (every step full, the
kept bounds on) after the warm-up: plain (each step's ms), with the host parts of every step timed
(:func:`mpikmeans.bench.gpu.host_timers`), under cProfile (the host functions by own time), and
plain again.

    python3 bench/experiments/host_profile.py --case D --dtype float32
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats

from mpikmeans.backends.gpu import GPUBackend
from mpikmeans.bench.data import gpu_blobs
from mpikmeans.bench.fullstep import CASES
from mpikmeans.bench.gpu import HOST_PARTS, host_timers, lloyd_run


def parts_by_step(torch, be, start, iters: int) -> None:
    """A Lloyd run as :func:`lloyd_run`'s, each step's host parts printed (microseconds)."""
    import time

    import numpy as np

    be.forget_labels()
    c = np.array(start, dtype=np.float64, copy=True)
    print("step   total " + " ".join(f"{p:>8}" for p in HOST_PARTS) + "     rest  searched")
    with host_timers(be) as acc:
        for it in range(iters):
            before = dict(acc)
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            r = be.step(c)
            total = time.perf_counter() - t0
            d = {p: 1e6 * (acc[p] - before[p]) for p in HOST_PARTS}
            rest = 1e6 * total - sum(d.values())
            print(f"{it:4d} {1e6 * total:7.0f} " + " ".join(f"{d[p]:8.0f}" for p in HOST_PARTS)
                  + f" {rest:8.0f}  {be.last_searched}")
            good = r.counts > 0
            c[good] = r.sums[good] / r.counts[good, None]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--case", default="D", choices=sorted(CASES))
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--top", type=int, default=35)
    ap.add_argument("--tune", default="{}", help="JSON tune overrides beside delta=never")
    a = ap.parse_args()
    import json

    import torch

    n, m, k = CASES[a.case]
    xt, _ = gpu_blobs(torch, n, m, k, a.dtype, 1, 4.0)  # bench fullstep's seed and noise
    start = xt[:, :k].t().double().cpu().numpy().copy()
    be = GPUBackend(device=0, dtype=a.dtype, tune={**json.loads(a.tune), "delta": "never"})
    be.load_device(xt)
    be.warmup(k, m)

    def show(tag, run):
        print(f"{tag}: median {run['median_ms']:.3f} ms; steps " + " ".join(f"{t:.2f}" for t in run["ms"]))
        print("  searched " + " ".join(str(s) for s in run["searched"]))

    show("plain", lloyd_run(torch, be, start, a.iters))
    parts_by_step(torch, be, start, a.iters)
    prof = cProfile.Profile()
    prof.enable()
    run = lloyd_run(torch, be, start, a.iters)
    prof.disable()
    show("profiled", run)
    for key in ("tottime",):
        buf = io.StringIO()
        pstats.Stats(prof, stream=buf).sort_stats(key).print_stats(a.top)
        print(f"--- by {key}, {a.iters} steps")
        print("\n".join(line for line in buf.getvalue().splitlines() if line.strip())[:12000])
    show("plain again", lloyd_run(torch, be, start, a.iters))
    be.close()


if __name__ == "__main__":
    main()
