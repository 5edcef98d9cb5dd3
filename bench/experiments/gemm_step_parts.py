"""Where the GEMM path's full step goes (issue 16): each launch of one step timed with CUDA events.

A D-shaped backend (3e5 x 257, K = 1000, noisy blobs as ``bench fullstep``), one step to
build the launches, then each launch of the step (centre data, screen, sums, recheck) timed
alone, the whole step, and the prototype screen (gemm_pass1.py) on the same rows.

    python3 bench/experiments/gemm_step_parts.py [N M K NOISE DTYPE]
"""

import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.dirname(__file__))


def ev_ms(fn, reps=10):
    from numba import cuda

    out = []
    for _ in range(reps):
        a, b = cuda.event(), cuda.event()
        a.record()
        fn()
        b.record()
        b.synchronize()
        out.append(a.elapsed_time(b))
    return float(np.median(out))


def main():
    n, m, k = (int(v) for v in sys.argv[1:4]) if len(sys.argv) > 3 else (300_000, 257, 1000)
    noise = float(sys.argv[4]) if len(sys.argv) > 4 else 4.0
    dtype = sys.argv[5] if len(sys.argv) > 5 else "float32"
    from numba import cuda

    from mpikmeans.backends.gpu import GPUBackend

    rng = np.random.default_rng(0)
    ctrue = rng.uniform(-10, 10, (k, m))
    x = ctrue[rng.integers(k, size=n)] + rng.normal(scale=noise, size=(n, m))
    start = ctrue + rng.normal(scale=0.5, size=(k, m))
    be = GPUBackend(dtype=dtype, tune={"gemm": True})
    be.load(x)
    be.step(start)
    st = be._state(k, False, False)
    steps, recheck = st.launches[0]
    parts = {}
    # the centre data, the screen, then the sums by label (:mod:`mpikmeans.backends.gpu.bylabel`)
    names = ["prep", "screen", "sums_count", "sums_offsets", "sums_place", "sums_walk"]
    for name, launch in zip(names, steps.launches):
        parts[name] = ev_ms(launch)
    parts["recheck"] = ev_ms(recheck)
    t = time.perf_counter()
    for _ in range(10):
        be.step(start)
    parts["step_wall"] = (time.perf_counter() - t) / 10 * 1e3
    parts["flagged"] = be.last_flagged
    parts["grid"] = steps.launches[1].grid
    parts["fast_launch"] = steps.fast
    import gemm_pass1 as g

    kp, s, cm, cc, zlim = g.pack(start, 128)
    kern = g.gemm_pass1_kernel(m, kp, 128, 16, 0)
    args = (be.rows.dx, n, be.rows.ld, cuda.to_device(cm), cuda.to_device(cc), cuda.to_device(s), zlim,
            cuda.device_array(n, dtype=np.int32), cuda.device_array(n, dtype=np.int32),
            cuda.to_device(np.zeros(1, dtype=np.int32)))
    if dtype == "float32":
        kern[264, 256](*args)
        cuda.synchronize()
        parts["prototype_screen"] = ev_ms(lambda: kern[264, 256](*args))
    # the screen through Numba's own launch path, same arguments
    sl = steps.launches[1]
    parts["screen_numba_launch"] = ev_ms(lambda: sl.kern[sl.grid, sl.block](*sl.args))
    print(parts)


if __name__ == "__main__":
    main()
