"""``mpikmeans bench fullstep``: the GPU's full Lloyd step inside real runs whose labels keep changing.

A full step assigns every row and sums every row (an incremental step, once few
labels change, only assigns: see :class:`mpikmeans.backends.gpu.GPUBackend`).
For each case and storage dtype, on data generated on the GPU (noisy blobs,
started from the first K rows, so labels move for many iterations):

* a Lloyd run of ``iters`` iterations with every step full (``tune={"delta":
  "never"}``), each step timed with CUDA events: its median is the full-step
  figure, with the labels changed and the rows pass 1 searched at each step beside
  it (fewer than N where the rows' kept bounds held, :mod:`mpikmeans.backends.gpu.bounds`;
  ``--compare '[{"bounds": false}]'`` times the same run with every row searched);
* the same run under the default policy (full steps while many labels move,
  incremental ones after): its full and incremental medians;
* the same iteration written in PyTorch (GEMM distances, argmin, ``index_add_``)
  in the same process;
* the floor: the larger of reading the rows once at the measured device copy
  bandwidth and N K M fused multiply-adds at the datasheet FP32 rate (the
  distances are computed in float32 for either dtype, with a certified bound).

``--compare`` times the full-step run again with other kernel overrides (``tune``, e.g.
``[{"split": false}]`` for the fused kernel's own summing pass), in the same process.

Optionally one streamed case (``--stream NxMxK --chunk-rows R``): rows in pinned
host memory, copied in chunks on two streams, against the measured pinned
host-to-device bandwidth.

Cases: A = 5e6 x 100, K=50; B = 1e7 x 32, K=1000; C = 1e8 x 8, K=16;
D = 3e5 x 257, K=1000; E = 2e6 x 3, K=7; or NxMxK.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass

import numpy as np

from ..errors import UsageError
from .data import gpu_blobs
from .gpu import DTYPES, copy_bandwidth, lloyd_run, need_torch_gpu, parse_case, sgemm_rate
from .harness import Progress, quiet, time_cuda

CASES = {"A": (5_000_000, 100, 50), "B": (10_000_000, 32, 1000), "C": (100_000_000, 8, 16),
         "D": (300_000, 257, 1000), "E": (2_000_000, 3, 7)}

#: FP32 rates (FLOP/s, an FMA counts 2) from NVIDIA's datasheets, by a word of the device's name:
#: H100 SXM5 and H200 SXM, 66.9 TFLOP/s without the tensor cores
DATASHEET_FP32 = {"H100": 66.9e12, "H200": 66.9e12}

#: The issue's targets on the H100, ms per full step: (case, dtype) -> ms
TARGET_MS = {("A", "float32"): 1.5, ("A", "float64"): 2.5, ("D", "float32"): 6.0, ("D", "float64"): 9.0}
#: ... and for every shape: at most this many times its floor, at least this many times faster than PyTorch
FLOOR_FACTOR = 2.5
TORCH_FACTOR = 4.0


@dataclass
class FullStepSettings:
    """What ``bench fullstep`` measures (the command's options, same names and defaults)."""

    cases: str = "A,B,C,D,E"
    dtype: str = "float32,float64"
    iters: int = 20
    noise: float = 4.0
    repeats: int = 3
    stream: str = ""
    chunk_rows: int = 0
    no_torch: bool = False
    device: int = 0
    seed: int = 1
    compare: str = ""

    def variants(self) -> list:
        """The ``--compare`` kernel overrides: a JSON list of dicts (``[]`` when not given)."""
        if not self.compare:
            return []
        try:
            out = json.loads(self.compare)
        except ValueError as exc:
            raise UsageError(f"bench fullstep: --compare is not JSON: {exc}") from None
        if not isinstance(out, list) or not all(isinstance(v, dict) for v in out):
            raise UsageError("bench fullstep: --compare must be a JSON list of objects, e.g. '[{\"split\": false}]'")
        return out

    def check(self) -> tuple:
        """``(cases, dtypes, stream case or None)``; raises :class:`UsageError` for settings that cannot run."""
        self.variants()
        cases = [parse_case(c, CASES, "bench fullstep") for c in self.cases.split(",") if c.strip()]
        dtypes = [d.strip() for d in self.dtype.split(",") if d.strip()]
        if not dtypes or any(d not in DTYPES for d in dtypes):
            raise UsageError(f"bench fullstep: --dtype {self.dtype!r}: choose from {', '.join(DTYPES)}")
        if self.iters < 2 or self.repeats < 1 or self.noise <= 0:
            raise UsageError("bench fullstep: --iters must be at least 2, --repeats at least 1, --noise positive")
        stream = parse_case(self.stream, CASES, "bench fullstep", "--stream") if self.stream else None
        if stream is not None and not 0 < self.chunk_rows < stream[1][0]:
            raise UsageError("bench fullstep: --stream needs --chunk-rows between 1 and its N - 1")
        if not cases and stream is None:
            raise UsageError("bench fullstep: nothing to measure: give --cases or --stream")
        return cases, dtypes, stream


def fp32_rate(torch, name: str) -> tuple:
    """(FLOP/s, where it comes from): the datasheet's for a known device, else a measured SGEMM."""
    for word, rate in DATASHEET_FP32.items():
        if word in name:
            return rate, f"datasheet ({word}: {rate / 1e12:.1f} TFLOP/s FP32)"
    rate = sgemm_rate(torch)
    return rate, f"measured SGEMM ({rate / 1e12:.1f} TFLOP/s)"


def pinned_h2d_bandwidth(torch, nbytes: int = 1 << 30, reps: int = 5) -> float:
    """Host-to-device copy from pinned memory, bytes per second."""
    a = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
    a.fill_(1)
    b = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    ms = time_cuda(torch, lambda: b.copy_(a, non_blocking=True), 1, reps, warmup=1)["ms"]
    return nbytes / (ms / 1e3)


def _floors(n: int, m: int, k: int, dtype: str, bw: float, rate: float) -> dict:
    mem = n * m * np.dtype(dtype).itemsize / bw * 1e3
    fma = 2.0 * n * k * m / rate * 1e3
    return {"floor_mem_ms": mem, "floor_fma_ms": fma, "floor_ms": max(mem, fma),
            "bound_by": "memory" if mem >= fma else "arithmetic"}


def _lloyd(torch, device: int, dtype: str, load, start: np.ndarray, iters: int, tune: dict,
           chunk_rows: int | None = None) -> dict:
    """A warmed-up backend loaded by ``load(backend)``, then :func:`lloyd_run` from ``start``."""
    from ..backends.gpu import GPUBackend

    be = GPUBackend(device=device, dtype=dtype, chunk_rows=chunk_rows, tune=dict(tune))
    try:
        load(be)
        k, m = start.shape
        be.warmup(k, m)  # the compile stays out of the timed steps
        run = lloyd_run(torch, be, start, iters)
    finally:
        be.close()
    return run


def _verdict(row: dict) -> dict:
    ms = row["full_ms"]
    out = {"x_floor": ms / row["floor_ms"], "floor_met": ms <= FLOOR_FACTOR * row["floor_ms"]}
    if "torch_ms" in row:
        out["vs_torch"] = row["torch_ms"] / ms
        out["torch_met"] = row["torch_ms"] >= TORCH_FACTOR * ms
    target = TARGET_MS.get((row["case"], row["dtype"]))
    if target is not None:
        out["target_ms"] = target
        out["target_met"] = ms <= target
    return out


def run_fullstep(s: FullStepSettings, progress: Progress = quiet) -> dict:
    """Measure every case and dtype (and the streamed case); the results (``bench/results/fullstep_*.json``).

    Returns
    -------
    dict
        ``device``, ``copy_bandwidth_Bps``, ``fp32_flops`` and its ``fp32_source``,
        ``results`` (one dict per case and dtype: the floors, ``full_ms`` and the
        full run's ``full`` steps, the default policy's ``policy`` run, PyTorch's
        ``torch_ms``, and the verdicts), and ``stream`` (or None).

    Raises
    ------
    UsageError, RunError
    """
    from .references import torch_iteration

    cases, dtypes, stream = s.check()
    torch = need_torch_gpu(s.device, "bench fullstep")
    torch.cuda.set_device(s.device)
    props = torch.cuda.get_device_properties(s.device)
    bw = copy_bandwidth(torch)
    rate, source = fp32_rate(torch, props.name)
    progress(f"device {s.device}: {props.name}; copy bandwidth {bw / 1e12:.2f} TB/s (read+write); FP32 {source}")
    results = []
    for name, (n, m, k) in cases:
        for dtype in dtypes:
            t0 = time.perf_counter()
            xt, _ = gpu_blobs(torch, n, m, k, dtype, s.seed, s.noise)
            start = xt[:, :k].t().double().cpu().numpy().copy()  # the first K rows: labels move for long
            row = {"case": name, "n": n, "m": m, "k": k, "dtype": dtype, "gen_s": time.perf_counter() - t0,
                   **_floors(n, m, k, dtype, bw, rate)}
            full = _lloyd(torch, s.device, dtype, lambda be: be.load_device(xt), start, s.iters, {"delta": "never"})
            row["full"] = full
            row["full_ms"] = full["median_ms"]
            row["variants"] = []
            for tune in s.variants():
                other = _lloyd(torch, s.device, dtype, lambda be: be.load_device(xt), start, s.iters,
                               {**tune, "delta": "never"})
                row["variants"].append({"tune": tune, "median_ms": other["median_ms"], "ms": other["ms"],
                                        "searched": other["searched"], "cascaded": other["cascaded"],
                                        "same_changes": other["changed"] == full["changed"]})
                progress(f"{name} {dtype} with {json.dumps(tune)}: full step {other['median_ms']:.3f} ms "
                         f"(default {full['median_ms']:.3f}); labels changed the same: "
                         f"{other['changed'] == full['changed']}")
            row["policy"] = _lloyd(torch, s.device, dtype, lambda be: be.load_device(xt), start, s.iters, {})
            if not s.no_torch:
                cen = torch.tensor(start, device="cuda", dtype=xt.dtype)
                xn = (xt * xt).sum(0)
                t = time_cuda(torch, lambda: torch_iteration(torch, xt.t(), cen, xn), 1, s.repeats, warmup=1)
                row["torch_ms"] = t["ms"]
                del xn, cen
            row.update(_verdict(row))
            pol = row["policy"]
            progress(f"{name} {n}x{m} K={k} {dtype}: full step {row['full_ms']:.3f} ms "
                     f"({row['x_floor']:.2f}x the floor {row['floor_ms']:.3f} ms, {row['bound_by']}); "
                     f"PyTorch {row.get('torch_ms', float('nan')):.3f} ms; default policy: {pol['full_steps']} full "
                     f"(median {pol['full_median_ms']:.3f}), {pol['delta_steps']} incremental "
                     f"(median {pol['delta_median_ms']:.3f}); labels changed {full['changed']}; "
                     f"rows searched {full['searched']}; flagged {full['flagged']}"
                     + (f"; of those left by TF32 to float32 {full['cascaded']}" if any(full["cascaded"]) else ""))
            results.append(row)
            del xt
            torch.cuda.empty_cache()
    streamed = _stream(torch, s, stream, dtypes, bw, rate, progress) if stream else None
    return {"device": props.name, "device_index": s.device, "copy_bandwidth_Bps": bw, "fp32_flops": rate,
            "fp32_source": source, "floor_factor": FLOOR_FACTOR, "torch_factor": TORCH_FACTOR,
            "results": results, "stream": streamed}


def _stream(torch, s: FullStepSettings, stream: tuple, dtypes: list, bw: float, rate: float,
            progress: Progress) -> list:
    """The streamed case: full steps with the rows copied from pinned host memory in chunks."""
    name, (n, m, k) = stream
    h2d = pinned_h2d_bandwidth(torch)
    progress(f"stream {n}x{m} K={k}, chunks of {s.chunk_rows} rows; pinned host-to-device {h2d / 1e9:.1f} GB/s")
    xt, _ = gpu_blobs(torch, n, m, k, "float64", s.seed, s.noise)
    x = xt.t().contiguous().cpu().numpy()  # rows in host memory, as a rank holds them
    start = x[:k].copy()
    del xt
    torch.cuda.empty_cache()
    out = []
    for dtype in dtypes:
        run = _lloyd(torch, s.device, dtype, lambda be: be.load(x), start, s.iters, {"delta": "never"},
                     chunk_rows=s.chunk_rows)
        ms = run["median_ms"]
        moved = n * m * np.dtype(dtype).itemsize
        row = {"case": name, "n": n, "m": m, "k": k, "dtype": dtype, "chunk_rows": s.chunk_rows, "full": run,
               "full_ms": ms, "h2d_Bps": h2d, "streamed_Bps": moved / (ms / 1e3),
               "of_h2d": moved / (ms / 1e3) / h2d, **_floors(n, m, k, dtype, bw, rate)}
        progress(f"stream {dtype}: full step {ms:.2f} ms, {row['streamed_Bps'] / 1e9:.1f} GB/s streamed = "
                 f"{100 * row['of_h2d']:.0f} % of the pinned copy bandwidth")
        out.append(row)
    return out


def fullstep_table(doc: dict) -> list:
    """One line per case and dtype: the full step, its floor, PyTorch, the verdicts (printed at the end)."""
    yes = {True: "yes", False: "NO", None: "-"}
    lines = [f"device: {doc['device']}; floor = max(rows read once at {doc['copy_bandwidth_Bps'] / 1e12:.2f} TB/s, "
             f"N K M FMAs at {doc['fp32_source']})",
             f"{'case':<5}{'dtype':<8}{'full ms':>9}{'floor':>8}{'x floor':>8}{'torch ms':>10}{'x torch':>8}"
             f"{'policy full/incr ms':>22}  target  <=2.5x floor  >=4x torch"]
    for r in doc["results"]:
        p = r["policy"]
        target = f"{r['target_ms']:.1f}: {yes[r['target_met']]}" if "target_ms" in r else "-"
        lines.append(f"{r['case']:<5}{r['dtype']:<8}{r['full_ms']:>9.3f}{r['floor_ms']:>8.3f}{r['x_floor']:>8.2f}"
                     f"{r.get('torch_ms', float('nan')):>10.3f}{r.get('vs_torch', float('nan')):>8.1f}"
                     f"{p['full_median_ms']:>11.3f}/{p['delta_median_ms']:<10.3f}  {target:<7} "
                     f"{yes[r['floor_met']]:>12}  {yes[r.get('torch_met')]:>10}")
    for r in doc.get("stream") or []:
        lines.append(f"stream {r['case']} {r['dtype']}: {r['full_ms']:.2f} ms per full step, "
                     f"{100 * r['of_h2d']:.0f} % of pinned host-to-device ({'yes' if r['of_h2d'] >= 0.8 else 'NO'}"
                     " >= 80 %)")
    return lines
