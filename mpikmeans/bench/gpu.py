"""``mpikmeans bench gpu``: the GPU backend's Lloyd step against PyTorch/cuBLAS and the hardware floors.

For each case (N rows, M attributes, K centres) and storage dtype:

* the data are generated directly on the GPU, column-major, the backend's device
  layout (:func:`mpikmeans.bench.data.gpu_blobs`), so no host memory or PCIe
  time is spent on 6 GB inputs;
* ``GPUBackend.step`` (assignment + float64 sums, counts, SSE, change count, the
  small host copies included) is timed with CUDA events after warm-up
  (:func:`mpikmeans.bench.harness.time_cuda`); the first call's extra time
  (Numba's JIT compile) is reported apart; the kernels alone are timed too;
* the same iteration written in PyTorch (distances by GEMM, argmin,
  ``index_add_``: :func:`mpikmeans.bench.references.torch_iteration`) is timed in
  the same process;
* the device copy bandwidth (memory floor = bytes of data / bandwidth) and an
  FP32 GEMM rate (FLOP floor = 2 N K M / rate) are measured in the same run,
  since the backend computes distances with float32 FMAs for either dtype;
* optionally a real Lloyd run per variant (centres updated every step, so labels
  change as they do in use) and the host-side parts of a step.

Cases: A = 5e6 x 100, K=50; B = 1e7 x 32, K=1000; C = 1e8 x 8, K=16, or N,M,K
as ``5000000x100x50``.  Needs PyTorch and a CUDA GPU.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import functools
import json
import os
import platform
import re
import statistics
import time
import types
from dataclasses import dataclass

import numpy as np

from ..errors import RunError, UsageError
from .data import gpu_blobs
from .harness import CudaEvents, Progress, quiet, time_cuda

CASES = {"A": (5_000_000, 100, 50), "B": (10_000_000, 32, 1000), "C": (100_000_000, 8, 16)}
DTYPES = ("float32", "float64")


def parse_case(text: str, cases: dict = CASES, mode: str = "bench gpu", what: str = "case") -> tuple:
    """A case name of ``cases`` or ``"NxMxK"`` to ``(name, (n, m, k))``.

    Raises
    ------
    UsageError
        Naming ``mode`` and ``what`` was given.
    """
    text = text.strip()
    if text in cases:
        return text, cases[text]
    try:
        n, m, k = (int(float(v)) for v in text.lower().split("x"))
    except ValueError:
        n = m = k = 0
    if min(n, m, k) < 1 or k > n:
        raise UsageError(f"{mode}: unknown {what} {text!r}: give {', '.join(cases)} or NxMxK "
                         "(e.g. 5000000x100x50, K <= N)")
    return text, (n, m, k)


@dataclass
class GpuSettings:
    """What ``bench gpu`` measures (the options of the command, same names and defaults)."""

    cases: str = "A,B,C"
    dtype: str = "float32,float64"
    repeats: int = 5
    iters: int = 5
    variants: str = "[{}]"
    no_torch: bool = False
    lloyd: int = 20
    host_breakdown: bool = False
    noise: float = 1.0
    start_rows: bool = False
    device: int = 0
    seed: int = 1

    def case_list(self) -> list:
        """``[(name, (n, m, k)), ...]``; raises :class:`UsageError`."""
        return [parse_case(c) for c in self.cases.split(",") if c.strip()] or [parse_case("")]

    def dtype_list(self) -> list:
        """The storage dtypes; raises :class:`UsageError`."""
        out = [d.strip() for d in self.dtype.split(",") if d.strip()]
        bad = [d for d in out if d not in DTYPES] or ([] if out else ["(none)"])
        if bad:
            raise UsageError(f"bench gpu: dtype {', '.join(bad)}: choose from {', '.join(DTYPES)}")
        return out

    def variant_spec(self):
        """The tunes to compare: a list of dicts, or ``{case: [dicts], "*": [dicts]}``; raises :class:`UsageError`."""
        try:
            spec = json.loads(self.variants)
        except ValueError as exc:
            raise UsageError(f"bench gpu: --variants is not JSON: {exc}") from None
        lists = list(spec.values()) if isinstance(spec, dict) else [spec]
        if not all(isinstance(v, list) and all(isinstance(t, dict) for t in v) for v in lists):
            raise UsageError('bench gpu: --variants must be a JSON list of tune dicts, or {"A": [...], "*": [...]}')
        return spec

    def check(self) -> None:
        """Raise :class:`UsageError` for settings that cannot run."""
        self.case_list()
        self.dtype_list()
        self.variant_spec()
        if self.repeats < 1 or self.iters < 1 or self.lloyd < 0 or self.device < 0:
            raise UsageError("bench gpu: --repeats and --iters must be at least 1, --lloyd and --device at least 0")


def variants_for(spec, case: str) -> list:
    """The tune dicts of ``case`` in a :meth:`GpuSettings.variant_spec`."""
    if isinstance(spec, dict):
        return spec.get(case, spec.get("*", [{}]))
    return spec


def need_torch_gpu(device: int, mode: str = "bench gpu"):
    """PyTorch on a usable CUDA GPU that numba-cuda also sees; the ``torch`` module.

    Raises
    ------
    RunError
        Which of them is missing.
    """
    try:
        import torch
    except ImportError:
        raise RunError(f"{mode} needs PyTorch (it makes the data on the GPU and is the reference): "
                       "pip install torch") from None
    from ..backends.gpu import SIM, gpu_available

    if SIM:
        raise RunError(f"{mode} times the real kernels: unset NUMBA_ENABLE_CUDASIM")
    if not torch.cuda.is_available() or not gpu_available():
        raise RunError(f"{mode} needs a CUDA GPU: none is usable here (PyTorch and numba-cuda must both see it)")
    if device >= torch.cuda.device_count():
        raise UsageError(f"{mode}: --device {device}: only {torch.cuda.device_count()} GPU(s) visible")
    return torch


def copy_bandwidth(torch, nbytes: int = 2 << 30, reps: int = 10) -> float:
    """Device-to-device copy, bytes read + written per second."""
    a = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    b = torch.empty_like(a)
    a.fill_(1)
    ms = time_cuda(torch, lambda: b.copy_(a), 1, reps, warmup=3)["ms"]
    return 2 * nbytes / (ms / 1e3)


def sgemm_rate(torch, size: int = 8192, reps: int = 10) -> float:
    """FP32 (no TF32) matrix-product rate, FLOP/s: the float32 arithmetic ceiling the kernels use."""
    old = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        a = torch.randn(size, size, device="cuda")
        b = torch.randn(size, size, device="cuda")
        ms = time_cuda(torch, lambda: a @ b, 1, reps, warmup=3)["ms"]
    finally:
        torch.backends.cuda.matmul.allow_tf32 = old
    return 2 * size**3 / (ms / 1e3)


def lloyd_run(torch, be, start: np.ndarray, iters: int) -> dict:
    """Time ``iters`` Lloyd iterations from ``start`` (k, m), each step with CUDA events.

    Unlike the repeated step, the centres move, so labels change the way they do
    in a run: every row on the first step, then fewer.  ``searched``: the rows each
    step's pass 1 searched (fewer than n where the kept bounds held); ``cascaded``: of those,
    the rows the TF32 screen left to the float32 screen.
    """
    be.forget_labels()
    c = np.array(start, dtype=np.float64, copy=True)
    timer = CudaEvents(torch)
    ms, changed, delta, searched, cascaded, flagged = [], [], [], [], [], []
    for _ in range(iters):
        r, step_ms, _ = timer.measure(lambda: be.step(c))
        ms.append(step_ms)
        changed.append(int(r.changed))
        delta.append(bool(be.last_delta))
        searched.append(int(getattr(be, "last_searched", be.n)))
        cascaded.append(int(getattr(be, "last_cascaded", 0)))
        flagged.append(int(getattr(be, "last_flagged", 0)))
        good = r.counts > 0
        c[good] = r.sums[good] / r.counts[good, None]
    full = [t for t, d in zip(ms, delta) if not d]
    inc = [t for t, d in zip(ms, delta) if d]
    nan = float("nan")
    return {"ms": ms, "changed": changed, "incremental": delta, "searched": searched, "cascaded": cascaded,
            "flagged": flagged,
            "median_ms": statistics.median(ms),
            "mean_ms": statistics.fmean(ms), "full_steps": len(full), "delta_steps": len(inc),
            "full_median_ms": statistics.median(full) if full else nan,
            "delta_median_ms": statistics.median(inc) if inc else nan}


#: the host-side parts :func:`host_timers` times, in a step's order
HOST_PARTS = ("fill", "upload", "launch", "download", "take", "sync", "add")


@contextlib.contextmanager
def host_timers(be):
    """Time the host-side parts of ``be``'s steps while the context is open; yields the seconds per part.

    Wraps this backend's step buffers, prepared launches, the kept centres' copy, the sums'
    addition and the synchronisation (``cu().cuStreamSynchronize`` in
    :mod:`mpikmeans.backends.gpu.backend`) in timers (well under a microsecond each), the
    parts of :data:`HOST_PARTS`: ``fill`` (centre data into the pinned buffer), ``upload``,
    ``launch`` (every kernel launch: the step's, the centres' moves and the bounds test, the
    listed rows'; or the step's one CUDA graph launch, :class:`~mpikmeans.backends.gpu.launch.StepGraph`,
    which also issues the copies: ``upload`` and ``download`` are then 0), ``download`` (the
    asynchronous copies issued), ``take`` (the kept copy of the centres, while the kernels run),
    ``sync`` (waiting for the GPU), ``add`` (the step's sums into the kept ones:
    :func:`~mpikmeans.backends.gpu.hostk.add_step`).  The states
    for the step's ``k`` must exist (one step before); states made while the context is open
    (a new screen's) go untimed.  Everything is unwrapped on exit, so later timings carry
    no timers.
    """
    import mpikmeans.backends.gpu.backend as backend_module
    from mpikmeans.backends.gpu.kept import Kept

    acc = dict.fromkeys(HOST_PARTS, 0.0)

    def timed(name, fn):
        def wrapper(*a, **kw):
            t0 = time.perf_counter()
            out = fn(*a, **kw)
            acc[name] += time.perf_counter() - t0
            return out
        return wrapper

    states = list(be._states.values())
    saved_launches = [(st.launches, st.bounds, st.graphs) for st in states]
    for st in states:
        st.graphs = {kind: timed("launch", g) if g is not None else None for kind, g in st.graphs.items()}
        for name in ("fill", "upload", "download"):
            setattr(st.pack, name, timed(name, getattr(st.pack, name)))
        st.launches = [(timed("launch", f), timed("launch", r)) for f, r in st.launches]
        if st.bounds is not None:
            st.bounds = tuple(timed("launch", b) for b in st.bounds)
    saved_cu, saved_add, saved_take = backend_module.cu, backend_module.add_step, Kept.take
    proxy = types.SimpleNamespace(cuStreamSynchronize=timed("sync", saved_cu().cuStreamSynchronize))
    backend_module.cu = lambda: proxy
    backend_module.add_step = timed("add", saved_add)
    Kept.take = timed("take", saved_take)
    try:
        yield acc
    finally:
        backend_module.cu, backend_module.add_step, Kept.take = saved_cu, saved_add, saved_take
        for st, (launches, bounds, graphs) in zip(states, saved_launches):
            for name in ("fill", "upload", "download"):
                delattr(st.pack, name)  # the instance attribute hid the method
            st.launches, st.bounds, st.graphs = launches, bounds, graphs


def host_breakdown(be, start: np.ndarray, steps: int = 100) -> dict:
    """Microseconds per step of each host-side part of ``GPUBackend.step`` (:func:`host_timers`), at
    fixed centres ``start``: the parts of :data:`HOST_PARTS`, ``total`` and ``rest`` (the step's own
    Python: the incremental policy, carrying the kept sums over, the result).  ``total - sync`` is
    host time."""
    be.step(start)  # the state for this k exists from here on
    with host_timers(be) as acc:
        t0 = time.perf_counter()
        for _ in range(steps):
            be.step(start)
        total = time.perf_counter() - t0
    out = {k: 1e6 * v / steps for k, v in acc.items()}
    out["total"] = 1e6 * total / steps
    out["rest"] = out["total"] - sum(v for k, v in out.items() if k != "total")
    return out


def measure_variant(torch, be, start: np.ndarray, tune: dict, s: GpuSettings) -> tuple:
    """One backend (one tune) on loaded data: its result entry, and the first step's result."""
    w0 = time.perf_counter()
    r0 = be.step(start)
    first_ms = (time.perf_counter() - w0) * 1e3
    t = time_cuda(torch, functools.partial(be.step, start), s.iters, s.repeats, warmup=2)
    # the kernels alone, in separate steps (their events are not in the timing above)
    be.profile = True
    kms = []
    for _ in range(3):
        be.step(start)
        kms.append(be.last_kernel_ms)
    be.profile = False
    plan = be.last_plan
    v = {"tune": {kk: vv for kk, vv in tune.items() if kk != "profile"},
         "ms": t["ms"], "ms_runs": t["ms_runs"], "wall_ms": t["wall_ms"], "kernel_ms": statistics.median(kms),
         "jit_ms": first_ms - t["ms"], "flagged": be.last_flagged, "changed_first": r0.changed,
         "plan": {"mode": plan.mode, "R": plan.R, "TC": plan.TC, "NT": plan.NT, "nct": plan.nct,
                  "centres_shared": plan.centres_shared, "smem": plan.smem, "maxreg": plan.maxreg},
         "regs": be.last_regs, "grid": be.last_grid, "sse": r0.sse}
    if s.host_breakdown:
        v["host_us"] = host_breakdown(be, start)
    if s.lloyd:
        v["lloyd"] = lloyd_run(torch, be, start, s.lloyd)
    return v, r0


def _variant_lines(name: str, dtype: str, v: dict, incremental: bool) -> list:
    lines = [f"  {name} {dtype} tune={v['tune']}: {v['ms']:.3f} ms/iter (kernels {v['kernel_ms']:.3f}, "
             f"wall {v['wall_ms']:.3f}), jit {v['jit_ms'] / 1e3:.1f} s, regs {v['regs']}, grid {v['grid']}, "
             f"flagged {v['flagged']}, incremental {incremental}"]
    if "host_us" in v:
        lines.append("    host per step (us): " + ", ".join(f"{kk} {vv:.1f}" for kk, vv in v["host_us"].items()))
    if "lloyd" in v:
        lr = v["lloyd"]
        lines.append(f"    Lloyd run, {len(lr['ms'])} iterations: median {lr['median_ms']:.3f} ms, mean "
                     f"{lr['mean_ms']:.3f}, first {lr['ms'][0]:.3f}; full steps {lr['full_steps']} "
                     f"(median {lr['full_median_ms']:.3f} ms), incremental {lr['delta_steps']} "
                     f"(median {lr['delta_median_ms']:.3f} ms); changed {lr['changed']}")
    return lines


def _torch_reference(torch, xt, start: np.ndarray, ref_counts, s: GpuSettings) -> dict:
    from .references import torch_iteration

    cen_t = torch.tensor(start, device="cuda", dtype=xt.dtype)
    xn = (xt * xt).sum(0)
    fn = functools.partial(torch_iteration, torch, xt.t(), cen_t, xn)
    t = time_cuda(torch, fn, max(1, s.iters // 2), s.repeats, warmup=1)
    _, tc, _ = fn()
    del xn
    return {"torch_ms": t["ms"], "torch_ms_runs": t["ms_runs"],
            "torch_counts_equal": bool(np.array_equal(tc.cpu().numpy().astype(np.float64), ref_counts))}


def run_gpu(s: GpuSettings, progress: Progress = quiet) -> dict:
    """Measure every case, dtype and variant; the results (the keys of ``bench/results/gpu_*.json``).

    Returns
    -------
    dict
        ``device``, ``device_index``, ``sm_count``, ``host``, ``torch``, ``numpy``,
        ``copy_bandwidth_Bps``, ``fp32_gemm_flops``, ``repeats``, ``iters``,
        ``noise``, ``start_rows`` and ``results``: one dict per (case, dtype) with
        the floors, ``variants`` (one entry per tune), the best ``ms`` and the
        PyTorch timing.

    Raises
    ------
    UsageError, RunError
        Bad settings (before anything runs); no PyTorch or no GPU.
    """
    s.check()
    spec = s.variant_spec()
    torch = need_torch_gpu(s.device)
    torch.cuda.set_device(s.device)
    from ..backends.gpu import GPUBackend

    props = torch.cuda.get_device_properties(s.device)
    progress(f"device {s.device}: {props.name}, {props.multi_processor_count} SMs, "
             f"{props.total_memory / 2**30:.1f} GiB; torch {torch.__version__}")
    bw, rate = copy_bandwidth(torch), sgemm_rate(torch)
    progress(f"copy bandwidth {bw / 1e12:.2f} TB/s (read+write); FP32 GEMM {rate / 1e12:.1f} TFLOP/s")
    results = []
    for cname, (n, m, k) in s.case_list():
        for dtype in s.dtype_list():
            t0 = time.perf_counter()
            xt, start = gpu_blobs(torch, n, m, k, dtype, s.seed, s.noise)
            if s.start_rows:
                start = xt[:, :k].t().double().cpu().numpy().copy()
            torch.cuda.synchronize()
            row = {"case": cname, "n": n, "m": m, "k": k, "dtype": dtype, "gen_s": time.perf_counter() - t0,
                   "floor_mem_ms": n * m * np.dtype(dtype).itemsize / bw * 1e3,
                   "floor_flop_ms": 2.0 * n * k * m / rate * 1e3, "variants": []}
            ref_counts = None
            for tune in variants_for(spec, cname):
                be = GPUBackend(device=s.device, dtype=dtype, tune=dict(tune))
                be.load_device(xt)
                v, r0 = measure_variant(torch, be, start, dict(tune), s)
                if ref_counts is None:
                    ref_counts = r0.counts.copy()
                v["counts_match_first_variant"] = bool(np.array_equal(ref_counts, r0.counts))
                row["variants"].append(v)
                for line in _variant_lines(cname, dtype, v, be.last_delta):
                    progress(line)
                be.close()
                del be
            best = min(row["variants"], key=lambda v: v["ms"])
            row["ms"], row["best_tune"] = best["ms"], best["tune"]
            if not s.no_torch:
                row.update(_torch_reference(torch, xt, start, ref_counts, s))
                progress(f"  {cname} {dtype} PyTorch: {row['torch_ms']:.3f} ms/iter (counts equal to ours: "
                         f"{row['torch_counts_equal']})")
            results.append(row)
            del xt
            torch.cuda.empty_cache()
    return {"device": props.name, "device_index": s.device, "sm_count": props.multi_processor_count,
            "host": platform.node(), "torch": torch.__version__, "numpy": np.__version__,
            "copy_bandwidth_Bps": bw, "fp32_gemm_flops": rate, "repeats": s.repeats, "iters": s.iters,
            "noise": s.noise, "start_rows": s.start_rows, "results": results}


def default_out(device_name: str, mode: str = "gpu") -> str:
    """``bench/results/<mode>_<device>_<date>.json`` (relative to the working directory)."""
    slug = re.sub(r"[^A-Za-z0-9]+", "_", device_name).strip("_")
    return os.path.join("bench", "results", f"{mode}_{slug}_{_dt.date.today().isoformat()}.json")


def gpu_table(doc: dict) -> list:
    """One line per case and dtype, best variant (what ``bench gpu`` prints at the end)."""
    lines = [f"device: {doc['device']}",
             f"{'case':<5}{'N':>11}{'M':>5}{'K':>6} {'dtype':<8}{'ours ms':>9}{'kern ms':>9}{'torch ms':>10}"
             f"{'mem floor':>11}{'flop floor':>11}{'jit s':>7}  best tune"]
    for r in doc["results"]:
        best = min(r["variants"], key=lambda v: v["ms"])
        lines.append(f"{r['case']:<5}{r['n']:>11}{r['m']:>5}{r['k']:>6} {r['dtype']:<8}{r['ms']:>9.3f}"
                     f"{best['kernel_ms']:>9.3f}{r.get('torch_ms', float('nan')):>10.3f}{r['floor_mem_ms']:>11.3f}"
                     f"{r['floor_flop_ms']:>11.3f}{best['jit_ms'] / 1e3:>7.1f}  {best['tune']}")
    return lines
