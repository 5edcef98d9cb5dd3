"""The Lloyd step of a backend, timed alone on the five shapes, beside PyTorch's GEMM form.

A developer's measurement of the step kernels (a user's is ``mpikmeans bench
runs``), through the backends' public interface only: ``make_backend(name,
dtype=...)``, ``load(x)``, ``step(centres, scales)``, ``assign(centres)``.

For each shape and dtype: noisy blobs (labels keep moving for many
iterations), the first K rows as the start, and the Lloyd centres of
``--iters`` iterations computed once (PyTorch in float64 on the GPU where it
is there, else NumPy from the backend's labels).  The backend then steps
through those centres, each step timed with CUDA events (PyTorch's, on the
default stream, which the backend's streams wait for) and with the wall clock
(the step returns its sums on the host); the first step (kernels loaded or
compiled) is timed apart.  In the same call: PyTorch's iteration (GEMM
distances, argmin, ``index_add_``) on the same rows in the same dtype; the
floor (the rows read once at the measured copy bandwidth, or N K M
multiply-adds at the datasheet FP32 rate, whichever is larger); and, in
float64, whether the backend's labels equal the CPU backend's.  A full step
(every row summed: after ``forget_labels()``) is timed at the last centres.

``--runs``: a whole Lloyd run on the same backend as ``mpikmeans.KMeans``
makes it (from the first K rows, ``--iters`` iterations at most, ``tol=0``),
each iteration's seconds and changed rows from its ``history_``: the slowest
iteration against the median full step.  ``--run-parity F``: whole float64
runs on the first ``max(2000, F N)`` rows, the backend against the CPU's:
labels, centres, SSE and every iteration's SSE identical or not.

    python bench/fullstep.py --out fullstep.json                     # A-E, float32 and float64
    python bench/fullstep.py --shapes A,D --dtypes float32 --out a.json
    python bench/fullstep.py --backend cpu --shapes 20000x8x4 --out c.json   # no GPU: the CPU backend
    python bench/fullstep.py --runs --iters 12 --out runs.json       # and each shape's Lloyd run, iteration by iteration
    python bench/fullstep.py --shapes A,D --dtypes float64 --no-torch --run-parity 0.02 --out p.json

Shapes: A = 5e6 x 100 K=50, B = 1e7 x 32 K=1000, C = 1e8 x 8 K=16, D = 3e5 x 257 K=1000, E = 2e6 x 3 K=7.
"""

from __future__ import annotations

import argparse
import shlex
import statistics
import sys
import time

import numpy as np

SHAPES = {"A": (5_000_000, 100, 50), "B": (10_000_000, 32, 1000), "C": (100_000_000, 8, 16),
          "D": (300_000, 257, 1000), "E": (2_000_000, 3, 7)}
#: FP32 rates without the tensor cores (FLOP/s, an FMA counts 2), NVIDIA's datasheets, by a word of the name
DATASHEET_FP32 = {"H100": 66.9e12, "H200": 66.9e12}


def _torch():
    try:
        import torch
    except ImportError:
        return None
    return torch if torch.cuda.is_available() else None


def blobs(n: int, m: int, k: int, noise: float, seed: int, torch=None) -> np.ndarray:
    """(n, m) float64 rows around k centres uniform in [-10, 10]^m, normal noise of sd ``noise``."""
    if torch is not None:  # several GB are made in a second on the GPU
        g = torch.Generator(device="cuda").manual_seed(seed)
        c = torch.rand(k, m, generator=g, device="cuda", dtype=torch.float64) * 20 - 10
        out = np.empty((n, m))
        step = max(1, (1 << 28) // (8 * m))
        for a in range(0, n, step):
            lab = torch.randint(0, k, (min(n, a + step) - a,), generator=g, device="cuda")
            out[a:a + len(lab)] = (c[lab] + noise * torch.randn(len(lab), m, generator=g, device="cuda",
                                                                dtype=torch.float64)).cpu().numpy()
        return out
    rng = np.random.default_rng(seed)
    c = rng.uniform(-10, 10, size=(k, m))
    return c[rng.integers(0, k, size=n)] + noise * rng.standard_normal((n, m))


def _means(x: np.ndarray, labels: np.ndarray, c: np.ndarray) -> np.ndarray:
    counts = np.bincount(labels, minlength=len(c))
    sums = np.stack([np.bincount(labels, weights=x[:, j], minlength=len(c)) for j in range(x.shape[1])], axis=1)
    return np.where(counts[:, None] > 0, sums / np.maximum(counts, 1)[:, None], c)


def torch_iteration(torch, x, cent, chunk_bytes: int = 2 << 30):
    """One Lloyd iteration as a GPU user writes it: GEMM distances, argmin, ``index_add_``; the new centres."""
    n, m = x.shape
    k = cent.shape[0]
    cn = (cent * cent).sum(1)
    sums = torch.zeros(k, m, device=x.device, dtype=x.dtype)
    counts = torch.zeros(k, device=x.device, dtype=torch.int64)
    rows = max(1024, chunk_bytes // (k * x.element_size()))
    for a in range(0, n, rows):
        xa = x[a:a + rows]
        lab = torch.addmm(cn, xa, cent.t(), beta=1, alpha=-2).argmin(1)
        sums.index_add_(0, lab, xa)
        counts += torch.bincount(lab, minlength=k)
    return torch.where((counts > 0)[:, None], sums / counts.clamp(min=1)[:, None].to(x.dtype), cent)


def torch_run(torch, x: np.ndarray, c0: np.ndarray, iters: int, dtype: str) -> tuple:
    """PyTorch's Lloyd from ``c0``: the centres of every iteration (float64) and ms per iteration (events)."""
    from mpikmeans.bench.harness import CudaEvents

    tdt = torch.float32 if dtype == "float32" else torch.float64
    xd = torch.as_tensor(x, device="cuda").to(tdt)
    cent = torch.as_tensor(c0, device="cuda").to(tdt)
    timer = CudaEvents(torch)
    seq, ms = [c0], []
    for _ in range(iters):
        cent, event_ms, _ = timer.measure(lambda: torch_iteration(torch, xd, cent))
        seq.append(cent.double().cpu().numpy())
        ms.append(event_ms)
    del xd
    torch.cuda.empty_cache()
    return seq, ms


def copy_bandwidth(torch) -> float:
    """Device memory bandwidth, bytes read and written a second: a 2 GiB ``copy_``, the median of 10."""
    from mpikmeans.bench.harness import time_cuda

    a = torch.empty(1 << 28, device="cuda", dtype=torch.float64)
    b = torch.empty_like(a)
    t = time_cuda(torch, lambda: b.copy_(a), calls=1, repeats=10, warmup=2)
    del a, b
    return 2 * (1 << 31) / (t["ms"] / 1e3)


def stepper(be):
    """``centres -> StepResult`` for a loaded backend: ``step(centres, scales)`` with the run's fixed-point
    scales (:class:`mpikmeans.fixedsums.Scales` of the rows' magnitudes), or ``step(centres)`` where the
    backend's step takes the centres alone."""
    import inspect

    if len(inspect.signature(be.step).parameters) == 1:
        return be.step
    from mpikmeans.fixedsums import Scales

    scales = Scales.of(be.magnitudes())
    return lambda c: be.step(c, scales)


def lloyd_run(backend, x: np.ndarray, c0: np.ndarray, iters: int):
    """A whole Lloyd run from ``c0`` on ``backend`` (a name or a Backend), as :class:`mpikmeans.KMeans` makes
    it: at most ``iters`` iterations, ``tol=0``.  Returns the fitted estimator (``history_``: each iteration's
    ``seconds``, ``changed`` and ``sse``)."""
    from mpikmeans import KMeans

    return KMeans(len(c0), init=c0, max_iter=iters, tol=0.0, backend=backend).fit(x)


def run_parity(name: str, x: np.ndarray, k: int, iters: int, fraction: float) -> dict:
    """Whole float64 runs on the first ``max(2000, fraction n)`` rows: backend ``name`` against the CPU's."""
    from mpikmeans.backends import make_backend

    rows = x[:min(len(x), max(2000, int(fraction * len(x))))]
    c0 = rows[:k].copy()
    fits = []
    for backend in ("cpu", name):
        be = make_backend(backend, **({"dtype": "float64"} if backend == "gpu" else {}))
        try:
            t0 = time.perf_counter()
            fits.append((lloyd_run(be, rows, c0, iters), time.perf_counter() - t0))
        finally:
            be.close()
    (c, tc), (g, tg) = fits
    same = (np.array_equal(c.labels_, g.labels_) and np.array_equal(c.cluster_centers_, g.cluster_centers_)
            and c.inertia_ == g.inertia_ and [h["sse"] for h in c.history_] == [h["sse"] for h in g.history_])
    return {"rows": len(rows), "identical": bool(same), "iterations": int(g.n_iter_), "cpu_s": tc, "backend_s": tg,
            "changed": [int(h["changed"]) for h in g.history_]}


def measure_shape(name: str, n: int, m: int, k: int, a, torch, bandwidth: float | None, progress) -> list:
    """Every dtype of one shape: one dict each (see the module's notes)."""
    from mpikmeans.backends import make_backend

    x = blobs(n, m, k, a.noise, a.seed, torch)
    c0 = x[:k].copy()
    out = []
    seq = None
    for dtype in a.dtypes.split(","):
        r = {"shape": name, "n": n, "m": m, "k": k, "dtype": dtype, "backend": a.backend}
        if torch is not None and not a.no_torch:
            tseq, tms = torch_run(torch, x, c0, a.iters, dtype)
            seq = seq or tseq
            r["torch_ms"] = statistics.median(tms[1:] or tms)
        be = make_backend(a.backend, **({"dtype": dtype, "device": a.device} if a.backend == "gpu" else {}))
        try:
            be.load(x)
            step = stepper(be)
            if seq is None:  # the centres from the backend's own labels
                seq = [c0]
                for _ in range(a.iters):
                    seq.append(_means(x, be.assign(seq[-1])[0], seq[-1]))
            t0 = time.perf_counter()
            step(seq[0])
            r["first_step_s"] = time.perf_counter() - t0
            events = None if torch is None else (torch.cuda.Event(enable_timing=True),
                                                 torch.cuda.Event(enable_timing=True))
            ms, wall, changed = [], [], []
            for c in seq[1:]:
                if events:
                    torch.cuda.synchronize()
                    events[0].record()
                w0 = time.perf_counter()
                part = step(c)
                wall.append(1e3 * (time.perf_counter() - w0))
                if events:
                    events[1].record()
                    events[1].synchronize()
                    ms.append(events[0].elapsed_time(events[1]))
                changed.append(int(part.changed))
            r.update(step_ms=statistics.median(ms or wall), step_ms_min=min(ms or wall), step_ms_max=max(ms or wall),
                     step_wall_ms=statistics.median(wall), timed_by="CUDA events" if ms else "wall clock",
                     changed=changed, steps=len(wall))
            fulls = []
            for _ in range(5):  # every row summed: the step a first iteration or a new K takes
                be.forget_labels()
                w0 = time.perf_counter()
                step(seq[-1])
                fulls.append(1e3 * (time.perf_counter() - w0))
            r["full_step_wall_ms"] = statistics.median(fulls[1:])
            if a.runs:
                fit = lloyd_run(be, x, c0, a.iters)
                its = [1e3 * h["seconds"] for h in fit.history_]
                r.update(run_iter_ms=its, run_changed=[int(h["changed"]) for h in fit.history_],
                         run_median_iter_ms=statistics.median(its), run_max_iter_ms=max(its),
                         run_max_over_full=max(its) / r["full_step_wall_ms"])
            if a.run_parity and dtype == "float64" and a.backend != "cpu":
                r["run_parity"] = run_parity(a.backend, x, k, a.iters, a.run_parity)
            if a.parity and dtype == "float64" and a.backend != "cpu":
                cpu = make_backend("cpu")
                cpu.load(x)
                mine, ref = be.assign(seq[-1])[0], cpu.assign(seq[-1])[0]
                cpu.close()
                r["labels_equal_cpu"] = bool(np.array_equal(mine, ref))
                r["labels_differing_cpu"] = int((mine != ref).sum())
        finally:
            be.close()
        itemsize = 4 if dtype == "float32" else 8
        if bandwidth:
            peak = next((v for word, v in DATASHEET_FP32.items() if word in torch.cuda.get_device_name(a.device)), None)
            r["floor_ms"] = max(1e3 * n * m * itemsize / bandwidth, 1e3 * 2 * n * k * m / peak if peak else 0.0)
        progress(line(r))
        out.append(r)
    return out


def line(r: dict) -> str:
    """One measurement as a line of text."""
    s = (f"{r['shape']} {r['n']}x{r['m']} K={r['k']} {r['dtype']}: step {r['step_ms']:.3f} ms "
         f"(min {r['step_ms_min']:.3f}, max {r['step_ms_max']:.3f}, {r['timed_by']}; wall {r['step_wall_ms']:.3f}), "
         f"first step {r['first_step_s']:.2f} s")
    if "torch_ms" in r:
        s += f", PyTorch {r['torch_ms']:.3f} ms"
    if "floor_ms" in r:
        s += f", floor {r['floor_ms']:.3f} ms"
    s += f", full step {r['full_step_wall_ms']:.3f} ms (wall)"
    if "run_iter_ms" in r:
        s += (f"\n   run: {len(r['run_iter_ms'])} iterations, median {r['run_median_iter_ms']:.2f} ms, slowest "
              f"{r['run_max_iter_ms']:.2f} ms = {r['run_max_over_full']:.2f} x the full step; ms "
              + " ".join(f"{v:.1f}" for v in r["run_iter_ms"]) + f"; changed {r['run_changed'][:6]}")
    if "run_parity" in r:
        q = r["run_parity"]
        s += (f"\n   whole run on {q['rows']} rows against the CPU's: "
              f"{'IDENTICAL' if q['identical'] else 'DIFFERENT'} labels/centres/SSE/history after {q['iterations']} it")
    if "labels_equal_cpu" in r:
        s += f", labels = CPU's: {r['labels_equal_cpu']} ({r['labels_differing_cpu']} differ)"
    return s


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shapes", default="A,B,C,D,E", help="A-E or NxMxK, comma-separated  [%(default)s]")
    p.add_argument("--dtypes", default="float32,float64")
    p.add_argument("--iters", type=int, default=20, help="timed steps per shape and dtype  [%(default)s]")
    p.add_argument("--noise", type=float, default=4.0, help="sd of the rows around their blob  [%(default)s]")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--backend", choices=("gpu", "cpu"), default="gpu")
    p.add_argument("--device", type=int, default=0)
    p.add_argument("--no-torch", action="store_true", help="leave out PyTorch (and the CUDA events)")
    p.add_argument("--no-parity", dest="parity", action="store_false", help="leave out the labels against the CPU's")
    p.add_argument("--runs", action="store_true", help="and a whole Lloyd run per shape and dtype, timed by iteration")
    p.add_argument("--run-parity", type=float, default=0.0, metavar="F",
                   help="whole float64 runs on a fraction F of the rows against the CPU backend's  [off]")
    p.add_argument("--out", required=True, help="the JSON result")
    a = p.parse_args(argv)
    shapes = []
    for text in a.shapes.split(","):
        try:
            shapes.append((text, *SHAPES[text]) if text in SHAPES else (text, *(int(v) for v in text.split("x"))))
        except (TypeError, ValueError):
            p.error(f"shape {text!r}: A-E or NxMxK")
    if any(len(s) != 4 or s[3] > s[1] for s in shapes) or a.iters < 1:
        p.error("each shape NxMxK with K at most N; --iters at least 1")
    from mpikmeans.bench.harness import machine_description, result_document, write_result

    torch = None if a.no_torch or a.backend == "cpu" else _torch()
    bandwidth = copy_bandwidth(torch) if torch is not None else None
    rows = []
    for name, n, m, k in shapes:
        rows += measure_shape(name, n, m, k, a, torch, bandwidth, lambda s: print(s, flush=True))
    doc = result_document("fullstep", "python bench/fullstep.py " + shlex.join(argv),
                          {k: v for k, v in vars(a).items() if k != "out"},
                          {"copy_bandwidth_Bps": bandwidth, "rows": rows}, machine_description())
    write_result(a.out, doc)
    print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
