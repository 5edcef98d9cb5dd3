"""How many rows the TF32 screen leaves to the exact kernel, step by step, against the float32 screen.

The GEMM path's screen on the tensor cores (mpikmeans/backends/gpu/tensor.py) certifies a
label only when the gap between the best and second-best estimate beats a bound about 60x
wider than the float32 screen's (TF32 inputs: 2^-11 relative rounding); every other row
goes to the exact float64 kernel.  This times Lloyd steps of the GPU backend on
``bench fullstep``'s data (``gpu_blobs``: centres uniform in [-10, 10]^M, rows a centre plus
normal noise) with each screen, with the backend's fall-back rule switched off, and prints
per step: wall ms (the step returns after its stream is synchronised), rows flagged, labels
changed.

    python3 bench/experiments/tf32_flagged.py [N M K] [--noise 1,4] [--steps 8] [--start near,rows]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))

from mpikmeans.backends.gpu import backend as gb  # noqa: E402
from mpikmeans.bench.data import gpu_blobs  # noqa: E402


def run(xt, start: np.ndarray, dtype: str, tf32: bool, steps: int) -> list:
    be = gb.GPUBackend(dtype=dtype, tune={"tf32": tf32, "delta": "never"})
    be.load_device(xt)
    c = np.array(start, dtype=np.float64, copy=True)
    out = []
    for _ in range(steps):
        t = time.perf_counter()
        r = be.step(c)
        ms = 1e3 * (time.perf_counter() - t)
        out.append((ms, be.last_flagged, int(r.changed)))
        good = r.counts > 0
        c[good] = r.sums[good] / r.counts[good, None]
    be.close()
    return out


def main() -> None:
    import torch

    ap = argparse.ArgumentParser()
    ap.add_argument("shape", nargs="*", type=int, default=[300_000, 257, 1000])
    ap.add_argument("--noise", default="1,4")
    ap.add_argument("--start", default="near,rows", help="near: the fullstep start (true centres + 0.5 noise); "
                                                       "rows: the first K rows")
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--dtype", default="float32")
    a = ap.parse_args()
    n, m, k = a.shape
    gb.TF32_FLAG_LIMIT = 2.0  # the fall-back rule off: every step on the screen asked for
    for noise in (float(v) for v in a.noise.split(",")):
        xt, near = gpu_blobs(torch, n, m, k, a.dtype, 1, noise)
        for start_kind in a.start.split(","):
            start = near if start_kind == "near" else xt[:, :k].T.double().cpu().numpy()
            for tf32 in (True, False):
                run(xt, start, a.dtype, tf32, 2)  # compile and warm
                res = run(xt, start, a.dtype, tf32, a.steps)
                name = "tf32" if tf32 else "float32"
                print(f"{n}x{m} K={k} noise {noise} start {start_kind} {name}: median ms "
                      f"{statistics.median(r[0] for r in res[1:]):.2f}; per step (ms, flagged, changed) "
                      + " ".join(f"({r[0]:.1f},{r[1]},{r[2]})" for r in res), flush=True)
        del xt
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
