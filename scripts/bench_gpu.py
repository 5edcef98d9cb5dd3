#!/usr/bin/env python3
"""Benchmark the GPU backend's Lloyd iteration against PyTorch/cuBLAS and the floors.

For each case (N rows, M attributes, K centres) and storage dtype this script

* generates well-separated clusters directly on the GPU (column-major, the backend's
  device layout), so no host memory or PCIe time is spent on 6 GB inputs;
* times ``GPUBackend.step`` (assignment + float64 sums, counts, SSE, change count, the
  small host copies included) with CUDA events, after warm-up; the first call's extra
  time (Numba's JIT compile) is reported apart;
* times the same iteration written in PyTorch (distances by GEMM, argmin, index_add_)
  in the same process;
* measures, in the same run, the device copy bandwidth (memory floor = bytes of data
  / bandwidth) and an FP32 GEMM rate (FLOP floor = 2 N K M / rate), since the backend
  computes distances with float32 FMAs for either storage dtype.

Usage::

    python scripts/bench_gpu.py                              # all cases, both dtypes
    python scripts/bench_gpu.py --cases A --dtype float32 --repeats 5
    python scripts/bench_gpu.py --variants '[{}, {"maxreg": 168}]' --out bench/results/x.json

Cases: A = 5e6 x 100, K=50; B = 1e7 x 32, K=1000; C = 1e8 x 8, K=16 (or N,M,K as
``5000000x100x50``).  Prints a table; writes JSON (default
``bench/results/gpu_<device>_<date>.json``).
"""

from __future__ import annotations

import argparse
import datetime as _dt
import functools
import json
import platform
import re
import statistics
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

CASES = {"A": (5_000_000, 100, 50), "B": (10_000_000, 32, 1000), "C": (100_000_000, 8, 16)}


def parse_case(s: str):
    if s in CASES:
        return s, CASES[s]
    n, m, k = (int(float(v)) for v in s.lower().split("x"))
    return s, (n, m, k)


def make_data(torch, n, m, k, dtype, seed, noise=1.0):
    """Clusters on the GPU: x^T of shape (m, n), centres (k, m) float64 on the host.

    Centres uniform in [-10, 10]^m, rows at a centre plus normal noise of standard
    deviation ``noise`` per attribute (1: well separated).  The start is near the
    true centres, so labels settle at once even for noisy clusters (measured for
    A at noise 5 and 8); ``--start-rows`` gives a start they move from.
    """
    g = torch.Generator(device="cuda").manual_seed(seed)
    tdt = torch.float32 if dtype == "float32" else torch.float64
    ctrue = torch.rand(k, m, generator=g, device="cuda", dtype=torch.float64) * 20 - 10
    xt = torch.empty(m, n, device="cuda", dtype=tdt)
    step = max(1, (1 << 28) // (m * 8))
    for a in range(0, n, step):
        b = min(n, a + step)
        lab = torch.randint(0, k, (b - a,), generator=g, device="cuda")
        blk = ctrue.t()[:, lab] + noise * torch.randn(m, b - a, generator=g, device="cuda", dtype=torch.float64)
        xt[:, a:b] = blk.to(tdt)
        del blk, lab
    start = ctrue.cpu().numpy() + np.random.default_rng(seed).normal(scale=0.5, size=(k, m))
    return xt, start


def copy_bandwidth(torch, nbytes=2 << 30, reps=10):
    """Device-to-device copy, bytes read + written per second."""
    a = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    b = torch.empty_like(a)
    a.fill_(1)
    for _ in range(3):
        b.copy_(a)
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(reps):
        e0.record()
        b.copy_(a)
        e1.record()
        e1.synchronize()
        times.append(e0.elapsed_time(e1) / 1e3)
    del a, b
    return 2 * nbytes / statistics.median(times)


def sgemm_rate(torch, size=8192, reps=10):
    """FP32 (no TF32) matrix-product rate, FLOP/s: the float32 arithmetic ceiling we use."""
    old = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    a = torch.randn(size, size, device="cuda")
    b = torch.randn(size, size, device="cuda")
    for _ in range(3):
        a @ b
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(reps):
        e0.record()
        a @ b
        e1.record()
        e1.synchronize()
        times.append(e0.elapsed_time(e1) / 1e3)
    torch.backends.cuda.matmul.allow_tf32 = old
    del a, b
    return 2 * size**3 / statistics.median(times)


def time_events(torch, fn, iters, repeats):
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    per = []
    walls = []
    for _ in range(repeats):
        torch.cuda.synchronize()
        w0 = time.perf_counter()
        e0.record()
        for _ in range(iters):
            fn()
        e1.record()
        e1.synchronize()
        walls.append((time.perf_counter() - w0) * 1e3 / iters)
        per.append(e0.elapsed_time(e1) / iters)
    return statistics.median(per), per, statistics.median(walls)


def lloyd_run(torch, be, start, iters):
    """Time ``iters`` Lloyd iterations from ``start`` (each step timed with CUDA events).

    Unlike the repeated step above, the centres move, so labels change the way they
    do in a run: every row on the first step, then fewer.
    """
    be.forget_labels()
    c = np.array(start, dtype=np.float64, copy=True)
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    ms, changed, delta = [], [], []
    for _ in range(iters):
        torch.cuda.synchronize()
        e0.record()
        r = be.step(c)
        e1.record()
        e1.synchronize()
        ms.append(e0.elapsed_time(e1))
        changed.append(int(r.changed))
        delta.append(bool(be.last_delta))
        good = r.counts > 0
        c[good] = r.sums[good] / r.counts[good, None]
    full = [t for t, d in zip(ms, delta) if not d]
    inc = [t for t, d in zip(ms, delta) if d]
    nan = float("nan")
    return {"ms": ms, "changed": changed, "incremental": delta, "median_ms": statistics.median(ms),
            "mean_ms": statistics.fmean(ms), "full_steps": len(full), "delta_steps": len(inc),
            "full_median_ms": statistics.median(full) if full else nan,
            "delta_median_ms": statistics.median(inc) if inc else nan}


def host_breakdown(be, start, steps=100):
    """Microseconds per step of each host-side part of ``GPUBackend.step``.

    Wraps this backend's step buffers, prepared launches and the synchronisation in
    timers (the wrappers add well under a microsecond each): ``fill`` (centre data
    into the pinned buffer), ``upload``, ``launch`` (both kernels), ``download`` (the
    asynchronous copies issued), ``sync`` (waiting for the GPU), ``rest`` (everything
    else: the incremental policy, carrying the kept sums over, the result), and
    ``total``.  ``total - sync`` is host time; where the GPU waits for it is what
    ``wall - kernels`` in the table shows.
    """
    import types

    import mpikmeans.backends.gpu as G

    acc = dict.fromkeys(("fill", "upload", "launch", "download", "sync"), 0.0)

    def timed(name, fn):
        def wrapper(*a, **kw):
            t0 = time.perf_counter()
            out = fn(*a, **kw)
            acc[name] += time.perf_counter() - t0
            return out
        return wrapper

    be.step(start)  # the state for this k exists from here on
    states = list(be._states.values())
    launches = [st.launches for st in states]
    for st in states:
        for name in ("fill", "upload", "download"):
            setattr(st.pack, name, timed(name, getattr(st.pack, name)))
        st.launches = [(timed("launch", f), timed("launch", r)) for f, r in st.launches]
    real_cu = G._cu()
    proxy = types.SimpleNamespace(cuStreamSynchronize=timed("sync", real_cu.cuStreamSynchronize))
    saved = G._cu
    G._cu = lambda: proxy
    try:
        t0 = time.perf_counter()
        for _ in range(steps):
            be.step(start)
        total = time.perf_counter() - t0
    finally:
        # unwrapped again, so that later timings (the Lloyd run) carry no timers
        G._cu = saved
        for st, original in zip(states, launches):
            for name in ("fill", "upload", "download"):
                delattr(st.pack, name)  # the instance attribute hid the method
            st.launches = original
    out = {k: 1e6 * v / steps for k, v in acc.items()}
    out["total"] = 1e6 * total / steps
    out["rest"] = out["total"] - sum(v for k, v in out.items() if k != "total")
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cases", default="A,B,C", help="comma list of A,B,C or NxMxK")
    ap.add_argument("--dtype", default="float32,float64", help="comma list of float32,float64")
    ap.add_argument("--repeats", type=int, default=5, help="timed runs per measurement (median reported)")
    ap.add_argument("--iters", type=int, default=5, help="iterations per timed run")
    ap.add_argument("--variants", default="[{}]",
                    help='JSON list of kernel tune dicts to compare, or {"A": [...], "*": [...]} per case')
    ap.add_argument("--no-torch", action="store_true", help="skip the PyTorch comparison")
    ap.add_argument("--lloyd", type=int, default=20,
                    help="also time a real Lloyd run of this many iterations per variant (centres updated "
                         "every step, so labels change as they do in use); 0 to skip")
    ap.add_argument("--host-breakdown", action="store_true",
                    help="also time the host-side parts of a step (see host_breakdown)")
    ap.add_argument("--noise", type=float, default=1.0,
                    help="standard deviation of the rows around their centre, per attribute (default 1: "
                         "well separated; with --start-rows, 4 keeps A's labels changing for 40 iterations)")
    ap.add_argument("--start-rows", action="store_true",
                    help="start from the first K rows instead of near the true centres: with --noise, "
                         "labels keep changing for many iterations")
    ap.add_argument("--device", type=int, default=0)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--out", default=None, help="JSON path (default bench/results/gpu_<device>_<date>.json)")
    args = ap.parse_args(argv)

    import torch

    torch.cuda.set_device(args.device)

    from mpikmeans.backends.gpu import GPUBackend
    from mpikmeans.bench.references import torch_iteration

    props = torch.cuda.get_device_properties(args.device)
    devname = props.name
    print(f"device {args.device}: {devname}, {props.multi_processor_count} SMs, "
          f"{props.total_memory / 2**30:.1f} GiB; torch {torch.__version__}", flush=True)
    bw = copy_bandwidth(torch)
    rate = sgemm_rate(torch)
    print(f"copy bandwidth {bw / 1e12:.2f} TB/s (read+write); FP32 GEMM {rate / 1e12:.1f} TFLOP/s", flush=True)

    variants_arg = json.loads(args.variants)
    results = []
    for case in args.cases.split(","):
        cname, (n, m, k) = parse_case(case.strip())
        for dtype in args.dtype.split(","):
            dtype = dtype.strip()
            dsize = 4 if dtype == "float32" else 8
            t0 = time.perf_counter()
            xt, start = make_data(torch, n, m, k, dtype, args.seed, args.noise)
            if args.start_rows:
                start = xt[:, :k].t().double().cpu().numpy().copy()
            torch.cuda.synchronize()
            gen_s = time.perf_counter() - t0
            mem_ms = n * m * dsize / bw * 1e3
            flop_ms = 2.0 * n * k * m / rate * 1e3
            row = {"case": cname, "n": n, "m": m, "k": k, "dtype": dtype, "gen_s": gen_s,
                   "floor_mem_ms": mem_ms, "floor_flop_ms": flop_ms, "variants": []}
            ref_counts = None
            if isinstance(variants_arg, dict):  # per case: {"A": [...], "*": [...]}
                variants = variants_arg.get(cname, variants_arg.get("*", [{}]))
            else:
                variants = variants_arg
            for tune in variants:
                tune = dict(tune)
                be = GPUBackend(device=args.device, dtype=dtype, tune=tune)
                be.load_device(xt)
                w0 = time.perf_counter()
                r0 = be.step(start)
                first_ms = (time.perf_counter() - w0) * 1e3
                for _ in range(2):
                    be.step(start)
                med, per, wall = time_events(torch, functools.partial(be.step, start), args.iters, args.repeats)
                # the kernels alone, in separate steps (their events are not in the timing above)
                be.profile = True
                kms = []
                for _ in range(3):
                    be.step(start)
                    kms.append(be.last_kernel_ms)
                be.profile = False
                plan = be.last_plan
                v = {"tune": {kk: vv for kk, vv in tune.items() if kk != "profile"},
                     "ms": med, "ms_runs": per, "wall_ms": wall, "kernel_ms": statistics.median(kms),
                     "jit_ms": first_ms - med, "flagged": be.last_flagged, "changed_first": r0.changed,
                     "plan": {"mode": plan.mode, "R": plan.R, "TC": plan.TC, "NT": plan.NT, "nct": plan.nct,
                              "centres_shared": plan.centres_shared, "smem": plan.smem, "maxreg": plan.maxreg},
                     "regs": be.last_regs, "grid": be.last_grid, "sse": r0.sse}
                if ref_counts is None:
                    ref_counts = r0.counts
                v["counts_match_first_variant"] = bool(np.array_equal(ref_counts, r0.counts))
                if args.host_breakdown:
                    v["host_us"] = host_breakdown(be, start)
                if args.lloyd:
                    v["lloyd"] = lloyd_run(torch, be, start, args.lloyd)
                row["variants"].append(v)
                print(f"  {cname} {dtype} tune={v['tune']}: {med:.3f} ms/iter (kernels {v['kernel_ms']:.3f}, "
                      f"wall {wall:.3f}), jit {v['jit_ms'] / 1e3:.1f} s, regs {v['regs']}, grid {v['grid']}, "
                      f"flagged {v['flagged']}, incremental {be.last_delta}", flush=True)
                if args.host_breakdown:
                    print("    host per step (us): " + ", ".join(f"{kk} {vv:.1f}" for kk, vv in v["host_us"].items()),
                          flush=True)
                if args.lloyd:
                    lr = v["lloyd"]
                    print(f"    Lloyd run, {len(lr['ms'])} iterations: median {lr['median_ms']:.3f} ms, mean "
                          f"{lr['mean_ms']:.3f}, first {lr['ms'][0]:.3f}; full steps {lr['full_steps']} "
                          f"(median {lr['full_median_ms']:.3f} ms), incremental {lr['delta_steps']} "
                          f"(median {lr['delta_median_ms']:.3f} ms); changed {lr['changed']}", flush=True)
                be.close()
                del be
            best = min(row["variants"], key=lambda v: v["ms"])
            row["ms"] = best["ms"]
            row["best_tune"] = best["tune"]
            if not args.no_torch:
                tdt = xt.dtype
                cen_t = torch.tensor(start, device="cuda", dtype=tdt)
                xn = (xt * xt).sum(0)
                torch_iteration(torch, xt.t(), cen_t, xn)
                tmed, tper, _ = time_events(torch, functools.partial(torch_iteration, torch, xt.t(), cen_t, xn),
                                            max(1, args.iters // 2), args.repeats)
                ts, tc, tsse = torch_iteration(torch, xt.t(), cen_t, xn)
                del xn
                row["torch_ms"] = tmed
                row["torch_ms_runs"] = tper
                row["torch_counts_equal"] = bool(np.array_equal(tc.cpu().numpy().astype(np.float64), ref_counts))
                print(f"  {cname} {dtype} PyTorch: {tmed:.3f} ms/iter (counts equal to ours: "
                      f"{row['torch_counts_equal']})", flush=True)
            results.append(row)
            del xt
            torch.cuda.empty_cache()

    print()
    hdr = f"{'case':<5}{'N':>11}{'M':>5}{'K':>6} {'dtype':<8}{'ours ms':>9}{'kern ms':>9}{'torch ms':>10}{'mem floor':>11}{'flop floor':>11}{'jit s':>7}  best tune"
    print(f"device: {devname}")
    print(hdr)
    for r in results:
        best = min(r["variants"], key=lambda v: v["ms"])
        print(f"{r['case']:<5}{r['n']:>11}{r['m']:>5}{r['k']:>6} {r['dtype']:<8}{r['ms']:>9.3f}{best['kernel_ms']:>9.3f}"
              f"{r.get('torch_ms', float('nan')):>10.3f}{r['floor_mem_ms']:>11.3f}{r['floor_flop_ms']:>11.3f}"
              f"{best['jit_ms'] / 1e3:>7.1f}  {best['tune']}")
    doc = {
        "device": devname, "device_index": args.device, "sm_count": props.multi_processor_count,
        "date": _dt.datetime.now().isoformat(timespec="seconds"), "host": platform.node(),
        "torch": torch.__version__, "numpy": np.__version__,
        "copy_bandwidth_Bps": bw, "fp32_gemm_flops": rate,
        "repeats": args.repeats, "iters": args.iters, "noise": args.noise, "start_rows": args.start_rows,
        "results": results,
    }
    out = args.out
    if out is None:
        slug = re.sub(r"[^A-Za-z0-9]+", "_", devname).strip("_")
        out = ROOT / "bench" / "results" / f"gpu_{slug}_{_dt.date.today().isoformat()}.json"
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=1))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
