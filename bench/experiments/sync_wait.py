"""Whether a GPU step's host parts run slower after the host waited for the GPU, by how it waited.

Session 19's host profile of case A (``host_profile_A_f32_H100_2026-11-27_s19.log``) had a late step's
fill 28-68 us, its add 21-26 and the rest of the step's Python 70-92 on the H100 host, where the same
calls take 9.7, 3.2 and about 7 us on a 2-core development VM, and E's (K x M = 21, a 44 us GPU wait)
the same Python 17.  The hypothesis: the time after a long wait inside ``cuStreamSynchronize``
(the driver spins with ``pause``; a KVM guest's vCPU may then be descheduled) is slow, not the host.

Part 1 times the host calls alone (:func:`fill_centres`, :func:`add_step` into pinned buffers, and a
fixed piece of pure Python), each right after one of these waits:

* ``none``: no wait (the calls back to back);
* ``cpu``: the host spins 1.4 ms on its clock;
* ``sync``: a 1.4 ms GPU sleep kernel, then ``cuStreamSynchronize`` (what a step does);
* ``poll``: the same kernel, then ``cuStreamQuery`` in a Python loop until it is done.

Part 2 runs case A's Lloyd run (:func:`mpikmeans.bench.gpu.lloyd_run`, every step full) with the
backend's synchronisation as it is and replaced by the poll, each step's host parts beside it.

    python3 bench/experiments/sync_wait.py [--case A] [--dtype float32] [--wait-ms 1.4]
"""

from __future__ import annotations

import argparse
import statistics
import time
import types

import numpy as np


def pure_python(n: int = 200) -> int:
    """A fixed piece of interpreter work (attribute lookups, calls, a dict): about a step's Python."""
    d = {}
    ns = types.SimpleNamespace(a=1, b=2)
    t = 0
    for i in range(n):
        d[i & 7] = ns.a + i
        t += len(d) + ns.b
    return t


def part1(torch, k: int, m: int, tc: int, wait_ms: float, repeats: int) -> None:
    from mpikmeans.backends.gpu.hostk import add_step, fill_centres
    from mpikmeans.backends.gpu.launch import cu, pinned

    cub = cu()
    tiles = -(-k // tc)
    rng = np.random.default_rng(0)
    c = rng.normal(size=(k, m))
    sh = pinned(m, np.float32)
    cc = pinned(tiles * tc, np.float32)
    cm = pinned(tiles * m * tc, np.float32).reshape(tiles, m, tc)
    c64 = pinned(k * m, np.float64).reshape(k, m)
    zl = pinned(1, np.float32)
    d_dev = pinned(k * m, np.float64).reshape(k, m)
    d_dev[:] = rng.normal(size=(k, m))
    d_cnt = pinned(k, np.float64)
    d_cnt[:] = 7.0
    dev, cnt, out = np.zeros((k, m)), np.zeros(k), np.zeros((k, m))
    calls = {
        "fill": lambda: fill_centres(c, True, sh, cc, cm, c64, zl),
        "add": lambda: add_step(dev, cnt, d_dev, d_cnt, c, out, True),
        "python": pure_python,
    }
    for f in calls.values():
        f()
    # the SM clock in kHz is cycles a millisecond (the H100's 1.98 GHz where torch does not report it)
    cycles = int(getattr(torch.cuda.get_device_properties(0), "clock_rate", 1.98e6) * wait_ms)

    def cpu_spin():
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < wait_ms * 1e-3:
            pass

    def gpu_sync():
        torch.cuda._sleep(cycles)
        cub.cuStreamSynchronize(0)

    def gpu_poll():
        torch.cuda._sleep(cycles)
        while int(cub.cuStreamQuery(0)[0]) != 0:
            pass

    waits = {"none": lambda: None, "cpu": cpu_spin, "sync": gpu_sync, "poll": gpu_poll}
    t0 = time.perf_counter()
    gpu_sync()
    print(f"part 1: K = {k}, M = {m}; the GPU sleep took {1e3 * (time.perf_counter() - t0):.2f} ms "
          f"(asked {wait_ms} ms); microseconds, median / min of {repeats}")
    print("wait    " + " ".join(f"{name:>15}" for name in calls))
    for wname, wait in waits.items():
        row = []
        for f in calls.values():
            ts = []
            for _ in range(repeats):
                wait()
                t = time.perf_counter()
                f()
                ts.append(1e6 * (time.perf_counter() - t))
            row.append(f"{statistics.median(ts):7.1f} /{min(ts):6.1f}")
        print(f"{wname:7} " + " ".join(f"{r:>15}" for r in row))


def part2(torch, case: str, dtype: str, iters: int) -> None:
    import mpikmeans.backends.gpu.backend as backend_module
    from mpikmeans.backends.gpu import GPUBackend
    from mpikmeans.bench.data import gpu_blobs
    from mpikmeans.bench.fullstep import CASES
    from mpikmeans.bench.gpu import lloyd_run

    import host_profile  # this folder's: the same Lloyd run, each step's host parts

    n, m, k = CASES[case]
    xt, _ = gpu_blobs(torch, n, m, k, dtype, 1, 4.0)
    start = xt[:, :k].t().double().cpu().numpy().copy()
    be = GPUBackend(device=0, dtype=dtype, tune={"delta": "never"})
    be.load_device(xt)
    be.warmup(k, m)
    saved = backend_module.cu
    real = saved()

    def poll(stream):
        while int(real.cuStreamQuery(stream)[0]) != 0:
            pass
        return real.cuStreamSynchronize(stream)  # the error a failed step left, if any

    polled = types.SimpleNamespace(cuStreamSynchronize=poll)
    for tag in ("sync", "poll", "sync again", "poll again"):
        backend_module.cu = (lambda: polled) if tag.startswith("poll") else saved
        try:
            run = lloyd_run(torch, be, start, iters)
            print(f"part 2, case {case} {dtype}, {tag}: median {run['median_ms']:.3f} ms; late steps "
                  + " ".join(f"{t:.2f}" for t in run["ms"][iters // 2:]))
            if not tag.endswith("again"):
                host_profile.parts_by_step(torch, be, start, iters)
        finally:
            backend_module.cu = saved
    be.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--case", default="A")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--wait-ms", type=float, default=1.4)
    ap.add_argument("--repeats", type=int, default=60)
    ap.add_argument("--tc", type=int, default=16, help="centres a tile of the step buffer (part 1)")
    a = ap.parse_args()
    import torch

    from mpikmeans.bench.fullstep import CASES

    _, m, k = CASES[a.case]
    part1(torch, k, m, a.tc, a.wait_ms, a.repeats)
    part2(torch, a.case, a.dtype, a.iters)


if __name__ == "__main__":
    main()
