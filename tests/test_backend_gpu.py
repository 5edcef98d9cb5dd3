"""The GPU backend (:mod:`mpikmeans.backends.gpu`) against the CPU backend: the same bits.

Labels are those of the exact float64 distances and the sums exact integers, so
on float64 data a GPU run through :func:`mpikmeans.lloyd.lloyd` gives the CPU's
labels, centres, SSE and per-iteration history to the last bit.  Two halves:

* simulator checks: every scenario runs once, in one child process with
  ``NUMBA_ENABLE_CUDASIM=1`` set before numba is imported (this pytest process
  has imported numba for the CPU tests, so the simulator cannot be switched on
  here: :func:`conftest.run_simulated`); the child prints one JSON object and the
  tests assert on it.  The child records each step's kind and layout
  (:mod:`.policy`), so a scenario that stops reaching the path it is there for
  fails.  Data stay tiny: the simulator runs every CUDA thread as a Python thread.
* ``@pytest.mark.gpu`` tests on a real GPU, with larger data, skipped without one.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from conftest import HANG_GUARD_S, needs_gpu, real_gpu, run_simulated
from mpikmeans.backends import BackendUnavailable

# --------------------------------------------------------------------------------------
# The child program: scenarios under the CUDA simulator
# --------------------------------------------------------------------------------------

_SIM_PROGRAM = textwrap.dedent(
    r"""
    import json, os, sys
    import numpy as np
    from mpikmeans.backends import Backend, BackendUnavailable, make_backend
    from mpikmeans.backends.cpu import CPUBackend
    from mpikmeans.backends import gpu as G
    from mpikmeans.backends.gpu import backend as GB, policy as P
    from mpikmeans.comm import SerialComm
    from mpikmeans.exact import fixed_scale
    from mpikmeans.fixedsums import Scales, decode
    from mpikmeans.lloyd import lloyd

    assert G.SIM, "the simulator is not on"
    SMEM = P.SMEM_BYTES

    # what the GPU steps decided: each step's kind, each layout (the tile's centres, whether the screen
    # stages the centres in chunks, the sums' copies (0: global atomics), column chunks), and how often the
    # GPU answered farthest() through the base class (the assignment) rather than from its step
    SEEN = {"kinds": [], "layouts": set(), "fallback_farthest": 0}
    _kind, _layout, _base_farthest = GB.step_kind, GB.step_layout, Backend.farthest

    def kind(sums_kept, bounds_kept=False, changed=0.0):
        k = _kind(sums_kept, bounds_kept, changed)
        SEEN["kinds"].append(k)
        return k

    def layout(k, m):
        lay = _layout(k, m)
        SEEN["layouts"].add((lay.tile[1], lay.chunk < lay.ntiles, lay.copies, -(-(m + 1) // lay.jc), lay.screen))
        return lay

    def base_farthest(self, centres, count):
        if isinstance(self, G.GPUBackend):
            SEEN["fallback_farthest"] += 1
        return _base_farthest(self, centres, count)

    GB.step_kind, GB.step_layout, Backend.farthest = kind, layout, base_farthest

    def blobs(n, m, k, seed, offset=0.0, noise=1.0):
        r = np.random.default_rng(seed)
        c = r.uniform(-10, 10, size=(k, m)) + offset
        x = c[r.integers(0, k, n)] + noise * r.normal(size=(n, m))
        return x, c

    def hexes(a):
        return np.ascontiguousarray(a).tobytes().hex()

    def summary(res):
        # each iteration's numbers (the CPU also says how many rows its bounds searched; seconds differ)
        history = [[h["iteration"], h["sse"].hex(), h["shift"].hex(), h["changed"]] for h in res.history]
        return {"centres": hexes(res.centres), "labels": hexes(res.labels), "inertia": res.inertia.hex(),
                "sizes": res.sizes.tolist(), "cluster_sse": hexes(res.cluster_sse), "history": history,
                "iterations": res.iterations, "stop_reason": res.stop_reason, "relocated": res.relocated,
                "dropped": res.dropped, "k": len(res.centres)}

    OUT = {}
    # this interpreter's share of the scenarios (conftest.run_simulated runs the parts side by side)
    PART, PARTS = (int(v) for v in os.environ.get("SIM_PART", "0/1").split("/"))
    ORDER = []

    def scenario(fn):
        ORDER.append(fn.__name__)
        if (len(ORDER) - 1) % PARTS != PART:
            return fn
        SEEN.update(kinds=[], layouts=set(), fallback_farthest=0)
        out = fn()
        out["seen"] = {"kinds": sorted(set(SEEN["kinds"])), "layouts": sorted(SEEN["layouts"]),
                       "fallback_farthest": SEEN["fallback_farthest"]}
        OUT[fn.__name__] = out
        return fn

    GEMM_MIN_K = P.GEMM_MIN_K

    def both(x, start, dtype="float64", chunk=None, weights=None, smem=None, gemm_from=None, **kw):
        # the same run on the CPU and on the GPU backend; smem: the policy's shared-memory budget; gemm_from:
        # the GEMM screen from this K (tiny shapes reach it)
        P.SMEM_BYTES = smem or SMEM
        P.GEMM_MIN_K = GEMM_MIN_K if gemm_from is None else gemm_from - 1
        try:
            out = {}
            for name in ("cpu", "gpu"):
                be = CPUBackend(threads=1) if name == "cpu" else G.GPUBackend(dtype=dtype, chunk_rows=chunk)
                be.load(x, weights)
                if name == "gpu":
                    out["streaming"] = be.rows.streaming
                res = lloyd(SerialComm(), be, x, 0, start, weights=weights, max_iter=30, **kw)
                out[name] = summary(res)
                if name == "gpu":
                    out["searched"] = [[h.get("searched"), len(x)] for h in res.history]
                be.close()
            return out
        finally:
            P.SMEM_BYTES = SMEM
            P.GEMM_MIN_K = GEMM_MIN_K

    # rows as starting centres: labels change for several steps (delta steps after the first)
    X8, _ = blobs(300, 6, 8, 1)
    W8 = np.random.default_rng(5).uniform(0.5, 2.0, len(X8))

    @scenario
    def small_tile():
        return both(X8, X8[:8].copy())

    @scenario
    def wide_tile():
        x, _ = blobs(400, 5, 40, 2)
        return both(x, x[:40].copy())

    @scenario
    def streamed():
        return both(X8, X8[:8].copy(), chunk=70)

    @scenario
    def weighted():
        return both(X8, X8[:8].copy(), weights=W8)

    @scenario
    def weighted_streamed_wide():
        x, _ = blobs(260, 4, 20, 3)
        w = np.random.default_rng(6).uniform(0.5, 2.0, len(x))
        return both(x, x[:20].copy(), chunk=100, weights=w)

    @scenario
    def staged_centres_global_sums():
        # 1 KB a block: three tiles of centres staged two at a time, the sums in the global limbs
        x, _ = blobs(300, 6, 40, 4)
        return both(x, x[:40].copy(), smem=1024)

    @scenario
    def column_chunks():
        # 4 KB a block: the 21 summed columns in two chunks (grid y), one copy of the sums
        x, _ = blobs(200, 20, 8, 5)
        return both(x, x[:8].copy(), smem=4096)

    @scenario
    def gemm_screen():
        # the GEMM screen on one tile of centres, the last of them padding
        x, _ = blobs(400, 5, 40, 2)
        return both(x, x[:40].copy(), gemm_from=17)

    @scenario
    def gemm_many_centres():
        # more centres than the register screen takes: several tiles of centres
        x, _ = blobs(330, 3, G.policy.GEMM_MIN_K + 22, 12)
        return both(x, x[:G.policy.GEMM_MIN_K + 22].copy())

    @scenario
    def gemm_streamed_weighted():
        # more attributes than a slice (three slices), few centres (a wide layout padded), rows streamed
        x, _ = blobs(260, 20, 6, 3)
        w = np.random.default_rng(6).uniform(0.5, 2.0, len(x))
        return both(x, x[:6].copy(), chunk=100, weights=w, gemm_from=2)

    @scenario
    def gemm_offset_float32():
        # far from the origin, float32 rows: the shift and the certificate as in the register screen
        x, _ = blobs(300, 6, 8, 10, offset=1.0e4, noise=0.3)
        return both(x.astype(np.float32).astype(np.float64), x[:20].copy(), dtype="float32", gemm_from=2)

    def far_start(*which):
        start = X8[:8].copy()
        for j in which:
            start[j] += 1000.0  # no row near it: its cluster is empty
        return start

    @scenario
    def relocated():
        return both(X8, far_start(5), empty_cluster="farthest")

    @scenario
    def relocated_streamed():
        return both(X8, far_start(5), chunk=70, empty_cluster="farthest")

    @scenario
    def float32_relocated():
        # a float32 store and a cluster emptied: the relocated row leaves its old cluster's sums with the
        # value the device summed (rounded once), so the run is the CPU's on the rounded rows, to the bit
        rounded = X8.astype(np.float32).astype(np.float64)
        out = {}
        for name in ("cpu", "gpu"):
            be = CPUBackend(threads=1) if name == "cpu" else G.GPUBackend(dtype="float32")
            rows = rounded if name == "cpu" else X8
            be.load(rows)
            out[name] = summary(lloyd(SerialComm(), be, rows, 0, far_start(5), max_iter=30))
            be.close()
        return out

    @scenario
    def dropped():
        return both(X8, far_start(2, 6), empty_cluster="drop")

    @scenario
    def ties():
        # integer rows, centres at half-integers: exact ties, the lowest index takes them; two equal
        # centres: the second one's cluster is empty (relocated)
        r = np.random.default_rng(7)
        x = r.integers(-3, 4, size=(240, 2)).astype(np.float64)
        return both(x, np.array([[0.5, 0.0], [-0.5, 0.0], [0.0, 0.5], [0.0, 0.5], [2.5, 2.5]]))

    @scenario
    def offset():
        # far from the origin: the screen's shift keeps its float32 distances certified
        x, _ = blobs(260, 4, 6, 8, offset=1.0e4)
        return both(x, x[:6].copy())

    @scenario
    def steps():
        # step by step, weighted: the step kinds as K, the scales and the labels change; the decoded sums,
        # SSE and changes; an assignment to other centres after each step (the step's labels stay); the
        # farthest rows from the step's centres after that assignment
        x, w = X8, W8
        s1 = Scales.of(np.abs(x).max(axis=0), float(w.max()))
        s2 = Scales.of(2 * np.abs(x).max(axis=0), float(w.max()))
        plan = [(x[:8], s1), (x[8:16], s1), (x[16:24], s1), (x[:12], s1), (x[12:24], s1), (x[:12], s2),
                (x[40:52], s2), ("forget", None), (x[40:52], s2)]
        out = {"kinds": []}
        for name in ("cpu", "gpu"):
            be = CPUBackend(threads=1) if name == "cpu" else G.GPUBackend()
            be.load(x, w)
            SEEN["kinds"].clear()
            rec = out[name] = {"steps": [], "farthest": []}
            for c, s in plan:
                if s is None:
                    be.forget_labels()
                    continue
                r = be.step(c, s)
                la, da = be.assign(x[60:60 + len(c)])
                rec["steps"].append([hexes(decode(r.sums, s.columns)), hexes(decode(r.sse, s.sse_exponent(c))),
                                     r.changed, hexes(la), hexes(da)])
                d2, rows, lab = be.farthest(c, 5)
                rec["farthest"].append([hexes(d2), rows.tolist(), lab.tolist()])
            if name == "gpu":
                out["kinds"] = list(SEEN["kinds"])
            be.close()
        return out

    @scenario
    def farthest_ties():
        # rows tied for farthest (duplicates far out, in each of the device's blocks of rows and twice in the
        # first): the lower row index first; counts from one row to more than a block, all rows, more than all
        x = X8.copy()
        x[[40, 7, 200, 120, 290, 131]] = x[0] + 50.0
        x[[60, 250]] = x[0] + 30.0
        c = X8[:8].copy()
        s = Scales.of(np.abs(x).max(axis=0))
        far = G.backend.FAR_ROWS
        counts = {"one": 1, "few": 6, "many": 12, "block": far + 3, "all": len(x), "more": len(x) + 5}
        out = {"blocks": -(-len(x) // far)}
        for name, be in (("cpu", CPUBackend(threads=1)), ("gpu", G.GPUBackend()),
                         ("gpu_streamed", G.GPUBackend(chunk_rows=64))):
            be.load(x)
            be.step(c, s)
            for case, count in counts.items():
                d2, rows, lab = be.farthest(c, count)
                out[f"{name}_{case}"] = [hexes(d2), rows.tolist(), lab.tolist()]
            be.close()
        return out

    @scenario
    def init_passes():
        # the initialisations' passes on the device against the CPU's, with and without weights
        x, _ = blobs(150, 5, 6, 9)
        w = np.random.default_rng(9).uniform(0.5, 2.0, len(x))
        cands = x[[3, 17, 29, 41, 58, 66, 77, 91, 103, 130]]  # more than MAX_TRIALS: two potentials passes
        out = {}
        for weights in (None, w):
            for name in ("cpu", "gpu"):
                be = CPUBackend(threads=1) if name == "cpu" else G.GPUBackend()
                be.load(x, weights)
                d2 = be.dist2_to(x[5])
                first = be.d2_host(d2).copy()
                vmax = be.d2_max(d2, weights)
                d2 = be.lower_d2(d2, x[88])
                lowered = be.d2_host(d2).copy()
                s = fixed_scale(be.d2_max(d2, weights))
                fixed = be.d2_fixed(d2, weights, s)
                total = int(fixed.total)
                lab, dist = be.nearest(cands[:5])
                found = [fixed.find(t) for t in (0, total // 7, total // 3, total // 2, total - 1)]
                pots = be.potentials(d2, cands, weights, s)
                # one pass (at most MAX_TRIALS): its candidates' D² are kept, and lower_d2 copies the chosen one
                few = be.potentials(d2, cands[:5], weights, s)
                kept = getattr(be, "_kept", None) is not None
                passes = []  # the device's lowering passes over the rows, counted after each lower_d2
                if name == "gpu":
                    real_pass = be._d2_pass
                    be._d2_pass = lambda *a, **k: (passes.append(1), real_pass(*a, **k))
                lowered_by = []
                d2 = be.lower_d2(d2, cands[2])
                lowered_by.append(len(passes))
                from_kept = hexes(be.d2_host(d2))
                d2 = be.lower_d2(d2, x[140])  # not a candidate: a pass over the rows
                lowered_by.append(len(passes))
                from_pass = hexes(be.d2_host(d2))
                # a candidate of that pass again, after D² was lowered since: what was kept is stale
                d2 = be.lower_d2(d2, cands[4])
                after = hexes(be.d2_host(d2))
                lowered_by.append(len(passes))
                # the whole of one pass (eight candidates, none padded), then one candidate alone
                eight = [[str(p), v.hex()] for p, v in be.potentials(d2, cands[:8], weights, s)]
                d2 = be.lower_d2(d2, cands[7])
                lowered_by.append(len(passes))
                eight_lowered = hexes(be.d2_host(d2))
                one = be.potentials(d2, cands[9:10], weights, s)
                out[("weighted_" if weights is not None else "plain_") + name] = {
                    "dist2_to": hexes(first), "d2_max": vmax.hex(), "lower_d2": hexes(lowered), "total": str(total),
                    "find": found,
                    "potentials": [[str(p), v.hex()] for p, v in pots], "few": [[str(p), v.hex()] for p, v in few],
                    "from_kept": from_kept, "from_pass": from_pass, "after": after, "kept": kept,
                    "lowered_by": lowered_by, "one": [[str(p), v.hex()] for p, v in one], "eight": eight,
                    "eight_lowered": eight_lowered,
                    "nearest": [hexes(lab.astype(np.int64)), hexes(dist)],
                    "on_device": not isinstance(d2, np.ndarray)}
                be.close()
        return out

    @scenario
    def float32_labels():
        # float32 storage, well-separated data: the labels of the float64 CPU run
        x, c = blobs(300, 6, 8, 10, noise=0.3)
        out = {}
        for name in ("cpu", "gpu"):
            be = CPUBackend(threads=1) if name == "cpu" else G.GPUBackend(dtype="float32")
            be.load(x)
            res = lloyd(SerialComm(), be, x, 0, x[:8].copy(), max_iter=30)
            out[name] = {"labels": hexes(res.labels), "changed": [h["changed"] for h in res.history],
                         "assign": hexes(be.assign(c)[0]), "dtype": be.info().dtype}
            be.close()
        return out

    @scenario
    def zero_rows_and_discovery():
        be = G.GPUBackend()
        be.load(np.empty((0, 3)))
        r = be.step(np.ones((4, 3)), Scales.of(np.ones(3)))
        lab, d2 = be.assign(np.ones((4, 3)))
        _, rows, _ = be.farthest(np.ones((4, 3)), 2)
        info = be.info()
        try:
            G.select_device_for(0, 2, False)
            refused = None
        except BackendUnavailable as exc:
            refused = str(exc)
        try:
            be.warmup(4, 5000)  # one tile of 8 centres x 5000 attributes: 160 KB, over the simulator's 48 KiB
            too_wide = None
        except BackendUnavailable as exc:
            too_wide = str(exc)
        return {"too_wide": too_wide, "sums_shape": list(r.sums.shape), "sums_zero": not r.sums.any(),
                "sse_shape": list(r.sse.shape),
                "sse_zero": not r.sse.any(), "changed": r.changed, "assign": [len(lab), len(d2)],
                "farthest": len(rows), "available": G.gpu_available(), "count": G.gpu_count(),
                "descriptions": G.device_descriptions(), "info": [info.name, info.devices, info.dtype],
                "shared": [G.select_device_for(q, 3, True) for q in range(3)], "refused": refused,
                "make_gpu": type(make_backend("gpu")).__name__, "make_auto": type(make_backend("auto")).__name__}

    print(json.dumps(OUT))
    """
)


@pytest.fixture(scope="module")
def sim():
    """Every simulator scenario, run once: scenario name -> its record."""
    pytest.importorskip("numba.cuda")
    return run_simulated(_SIM_PROGRAM, timeout=600, parts=2)


def _small_wide():
    from mpikmeans.backends.gpu.stepk import SCREEN_TILES

    return SCREEN_TILES[0][1], SCREEN_TILES[1][1]


#: the lloyd() scenarios and the path each is there for: the screen's tile ("small": K <= 16), whether the
#: centres are staged in chunks, how the sums use shared memory ("copies": every column in shared memory,
#: "columns": a chunk of columns a block, "global": atomics on the global limbs), streamed rows, and the
#: empty clusters moved or dropped
LLOYD = {
    "small_tile": dict(tile="small", staged=False, sums="copies", streaming=False),
    "wide_tile": dict(tile="wide", staged=False, sums="copies", streaming=False),
    "streamed": dict(tile="small", staged=False, sums="copies", streaming=True),
    "weighted": dict(tile="small", staged=False, sums="copies", streaming=False),
    "weighted_streamed_wide": dict(tile="wide", staged=False, sums="copies", streaming=True),
    "staged_centres_global_sums": dict(tile="wide", staged=True, sums="global", streaming=False, relocated=1),
    "column_chunks": dict(tile="small", staged=False, sums="columns", streaming=False),
    "relocated": dict(tile="small", staged=False, sums="copies", streaming=False, relocated=1),
    "relocated_streamed": dict(tile="small", staged=False, sums="copies", streaming=True, relocated=1),
    "dropped": dict(tile="small", staged=False, sums="copies", streaming=False, dropped=2),
    "ties": dict(tile="small", staged=False, sums="copies", streaming=False, relocated=1),
    "offset": dict(tile="small", staged=False, sums="copies", streaming=False),
    "gemm_screen": dict(tile="wide", staged=False, sums="copies", streaming=False, screen="gemm"),
    "gemm_many_centres": dict(tile="wide", staged=False, sums="copies", streaming=False, screen="gemm"),
    "gemm_streamed_weighted": dict(tile="wide", staged=False, sums="copies", streaming=True, screen="gemm"),
    "gemm_offset_float32": dict(tile="wide", staged=False, sums="copies", streaming=False, screen="gemm"),
}


@pytest.mark.parametrize("name", sorted(LLOYD))
def test_sim_lloyd_is_the_cpus_to_the_bit(sim, name):
    """Labels, centres, SSE (total and per cluster), sizes and every iteration's SSE, shift and changes."""
    rec = sim[name]
    cpu, gpu = rec["cpu"], rec["gpu"]
    for key in cpu:
        assert gpu[key] == cpu[key], (name, key)
    assert cpu["iterations"] >= 2 and cpu["stop_reason"] == "assignment unchanged", cpu


@pytest.mark.parametrize("name", sorted(LLOYD))
def test_sim_lloyd_scenarios_take_their_path(sim, name):
    """Each scenario reaches what it is there for: its tile, staging, sums and rows, full and delta steps,
    the empty clusters, and the farthest rows from the device's own distances."""
    want = LLOYD[name]
    rec = sim[name]
    small, wide = _small_wide()
    sums = {"copies": lambda copies, chunks: copies > 0 and chunks == 1,
            "columns": lambda copies, chunks: copies > 0 and chunks > 1,
            "global": lambda copies, chunks: copies == 0}[want["sums"]]
    layouts = rec["seen"]["layouts"]
    assert len(layouts) == 1, layouts
    tc, staged, copies, chunks, screen = layouts[0]
    assert tc == (small if want["tile"] == "small" else wide), layouts
    assert screen == want.get("screen", "register"), layouts
    assert staged == want["staged"] and sums(copies, chunks), layouts
    assert rec["streaming"] == want["streaming"]
    kinds = rec["seen"]["kinds"]
    if want["streaming"]:
        assert kinds == ["delta", "full"], rec["seen"]
    else:  # resident rows: bounded steps once few labels change
        assert "full" in kinds and set(kinds) <= {"bounded", "delta", "full"}, rec["seen"]
    assert rec["gpu"]["relocated"] == want.get("relocated", 0)
    assert rec["gpu"]["dropped"] == want.get("dropped", 0)
    assert rec["seen"]["fallback_farthest"] == 0  # relocation answered from the step's distances


def test_sim_float32_run_with_a_relocated_cluster_is_the_cpus_on_the_rounded_rows(sim):
    rec = sim["float32_relocated"]
    assert rec["gpu"]["relocated"] == 1
    assert rec["gpu"] == rec["cpu"]


def test_sim_bounded_steps_keep_rows_and_stay_the_cpus_bits(sim):
    """Where few labels change, resident rows take bounded steps, which search fewer rows than they hold; the
    scenarios' runs (test_sim_lloyd_is_the_cpus_to_the_bit) are still the CPU's to the bit."""
    bounded = [name for name in LLOYD if "bounded" in sim[name]["seen"]["kinds"]]
    assert len(bounded) >= 4, {name: sim[name]["seen"]["kinds"] for name in LLOYD}
    for name in bounded:
        assert any(s < n for s, n in sim[name]["searched"][1:]), (name, sim[name]["searched"])


def test_sim_step_kinds_follow_the_kept_sums(sim):
    """Full on the first step, on a new K, on other scales and after forget_labels; delta otherwise."""
    assert sim["steps"]["kinds"] == ["full", "delta", "delta", "full", "delta", "full", "delta", "full"]


def test_sim_steps_and_assignments_are_the_cpus(sim):
    """Each step's decoded sums and SSE, its changed labels, and an assignment to other centres after it."""
    rec = sim["steps"]
    assert len(rec["gpu"]["steps"]) == 8
    for i, (a, b) in enumerate(zip(rec["cpu"]["steps"], rec["gpu"]["steps"])):
        for what, x, y in zip(("sums", "sse", "changed", "assign labels", "assign dist2"), a, b):
            assert x == y, (i, what)


def test_sim_farthest_after_an_assignment_answers_for_the_step(sim):
    """farthest(step's centres) after an assign() to other centres: the step's distances, as the CPU's.

    The GPU backend's assign() writes its distances into the array that holds the
    last step's (backend.py, ``self._d2``), and farthest() then answers from them.
    """
    rec = sim["steps"]
    bad = [i for i, (a, b) in enumerate(zip(rec["cpu"]["farthest"], rec["gpu"]["farthest"])) if a != b]
    assert not bad, [(rec["cpu"]["farthest"][i][1], rec["gpu"]["farthest"][i][1]) for i in bad]


def test_sim_farthest_rows_are_the_cpus_for_every_count(sim):
    """The rows farthest from their centres (the empty clusters' new centres) from the device's distances: the
    same rows, distances and labels as the CPU's, in the same order, ties to the lower row, whether the
    count is one row, a few, more than a block of the device's rows, all of them or more; each count's
    rows begin with the smaller counts' rows."""
    rec = sim["farthest_ties"]
    assert rec["blocks"] >= 3
    assert rec["cpu_few"][1] == [7, 40, 120, 131, 200, 290]  # the six duplicates, by row index
    assert rec["cpu_many"][1][6:8] == [60, 250]
    cases = ("one", "few", "many", "block", "all", "more")
    for case in cases:
        assert rec[f"gpu_{case}"] == rec[f"cpu_{case}"], case
        assert rec[f"gpu_streamed_{case}"] == rec[f"cpu_{case}"], case
    assert len(rec["cpu_more"][1]) == len(rec["cpu_all"][1]) == 300
    for small, large in zip(cases, cases[1:]):
        assert rec[f"cpu_{large}"][1][:len(rec[f"cpu_{small}"][1])] == rec[f"cpu_{small}"][1], (small, large)


@pytest.mark.parametrize("weights", ["plain", "weighted"])
def test_sim_initialisation_passes_are_the_cpus(sim, weights):
    """dist2_to, lower_d2, d2_max, d2_fixed (total, draws), potentials (two passes) and nearest, on the device."""
    rec = sim["init_passes"]
    cpu, gpu = rec[f"{weights}_cpu"], rec[f"{weights}_gpu"]
    assert gpu["on_device"] and not cpu["on_device"]
    for key in ("dist2_to", "d2_max", "lower_d2", "total", "find", "potentials", "few", "from_kept", "from_pass",
                "after", "eight", "eight_lowered", "one", "nearest"):
        assert gpu[key] == cpu[key], key
    assert len(gpu["potentials"]) == 10 and len(gpu["few"]) == 5 and len(set(gpu["find"])) > 2
    assert gpu["kept"]  # the one-pass candidates' D² were kept on the device
    # a kept candidate's D² copied (the first and the last), the others a pass over the rows each
    assert gpu["lowered_by"] == [0, 1, 2, 2]


def test_sim_float32_storage_gives_the_float64_labels_on_separated_data(sim):
    rec = sim["float32_labels"]
    assert rec["gpu"]["dtype"] == "float32"
    assert rec["gpu"]["labels"] == rec["cpu"]["labels"]
    assert rec["gpu"]["assign"] == rec["cpu"]["assign"]
    assert rec["gpu"]["changed"] == rec["cpu"]["changed"] and len(rec["cpu"]["changed"]) >= 2


def test_sim_zero_rows(sim):
    rec = sim["zero_rows_and_discovery"]
    assert rec["sums_shape"] == [4, 4, 4] and rec["sums_zero"]
    assert rec["sse_shape"] == [4, 4] and rec["sse_zero"] and rec["changed"] == 0
    assert rec["assign"] == [0, 0] and rec["farthest"] == 0


def test_sim_discovery_and_device_choice(sim):
    rec = sim["zero_rows_and_discovery"]
    assert rec["available"] and rec["count"] == 1
    assert rec["descriptions"][0]["index"] == 0
    name, devices, dtype = rec["info"]
    assert name == "gpu" and devices[0].startswith("0: ") and dtype == "float64"
    assert rec["shared"] == [0, 0, 0]
    assert "--share-gpus" in rec["refused"]
    assert rec["make_gpu"] == "GPUBackend" and rec["make_auto"] == "GPUBackend"


def test_sim_too_many_attributes_for_shared_memory_is_refused_at_warmup(sim):
    """Wider rows than one tile of centres fits in a block's shared memory: a clear refusal naming the way out,
    before any kernel compiles or launches."""
    msg = sim["zero_rows_and_discovery"]["too_wide"]
    assert msg and "5000 attributes" in msg and "--backend cpu" in msg, msg


def test_no_gpu_is_refused_cleanly():
    """In this (non-simulator) process: either a real GPU is usable, or the backend says why."""
    pytest.importorskip("numba")
    from mpikmeans.backends import gpu as G

    if G.gpu_available():
        pytest.skip("a GPU is usable here")
    assert G.gpu_count() == 0 and G.device_descriptions() == []
    with pytest.raises(BackendUnavailable):
        G.select_device_for(0, 1, False)
    with pytest.raises(BackendUnavailable):
        G.GPUBackend()


_TYPES_PROGRAM = textwrap.dedent(
    r"""
    import json
    import numpy as np
    import numba.cuda.dispatcher as nd
    from numba import cuda, types
    from numba.cuda import compiler

    # no device: the example arguments are host arrays of the same types, a kernel is typed and lowered
    # for them (Numba's front end and the CUDA target's lowering; the device compiler is not needed) and
    # the kernel store is bypassed
    cuda.device_array = lambda n, dtype=np.float64, **kw: np.empty(n, dtype=dtype)

    class Device:
        compute_capability = (9, 0)

    nd.get_current_device = Device
    lowered = []

    class Kernel:
        class _codelibrary:
            get_cubin = get_cufunc = staticmethod(lambda: None)

    def lower(self, argtypes):
        compiler.compile_cuda(self.py_func, types.void, tuple(argtypes), cc=(9, 0))
        lowered.append(self.py_func.__name__)
        return Kernel()

    nd.CUDADispatcher.compile = lower
    from mpikmeans.backends.gpu import backend as GB, compiled as C
    assert not GB.SIM
    C.toolchain = lambda: ("no device",)

    class Store:
        get = staticmethod(lambda key: None)
        put = staticmethod(lambda *a, **k: None)

    C._store = Store
    for dtype in ("float64", "float32"):
        GB.compile_kernels(dtype)
        for weighted in (False, True):
            GB.initk_kernels(dtype, weighted)
    GB.score_kernel_set()
    print(json.dumps(sorted(set(lowered))))
    """)


def test_every_gpu_kernel_types_for_its_launch_arguments_without_a_gpu():
    """Every kernel a GPU run launches (the step's of both dtypes, the initialisations', the scores', the
    relocation's, the transpose) is typed and lowered by numba-cuda for its example arguments on this
    machine, with no GPU: what the simulator cannot catch (it runs the kernels as Python: a shared array's
    shape that is not a compile-time constant, a variable of two types) fails here rather than on a user's
    GPU."""
    pytest.importorskip("numba.cuda")
    env = {key: v for key, v in os.environ.items() if key != "NUMBA_ENABLE_CUDASIM"}
    r = subprocess.run([sys.executable, "-c", _TYPES_PROGRAM], capture_output=True, text=True, env=env,
                       timeout=HANG_GUARD_S * 4)
    assert r.returncode == 0, r.stderr[-3000:]
    names = set(json.loads(r.stdout.strip().splitlines()[-1]))
    assert {"km_screen", "km_gemm_screen", "km_recheck", "km_accumulate", "km_keep", "km_transpose", "km_block_max",
            "km_gather",
            "km_d2", "km_nearest", "km_fixed_blocks", "km_potentials", "km_own_dist2", "km_silhouette",
            "km_sample_pairs", "km_sample_sums", "km_sample_rows"} <= names, names


# --------------------------------------------------------------------------------------
# On a real GPU
# --------------------------------------------------------------------------------------




def _blobs(n, m, k, seed, offset=0.0, noise=1.0):
    r = np.random.default_rng(seed)
    c = r.uniform(-10, 10, size=(k, m)) + offset
    return c[r.integers(0, k, n)] + noise * r.normal(size=(n, m))


def _lloyd_record(backend, x, start, weights=None, **kw):
    from mpikmeans.comm import SerialComm
    from mpikmeans.lloyd import lloyd

    backend.load(x, weights)
    res = lloyd(SerialComm(), backend, x, 0, start, weights=weights, **kw)
    backend.close()
    return {"centres": res.centres.tobytes(), "labels": res.labels.tobytes(), "inertia": res.inertia.hex(),
            "sizes": res.sizes.tolist(), "cluster_sse": res.cluster_sse.tobytes(),
            "history": [(h["iteration"], h["sse"].hex(), h["shift"].hex(), h["changed"]) for h in res.history],
            "relocated": res.relocated, "dropped": res.dropped, "stop_reason": res.stop_reason}


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("n,m,k,chunk,weighted,smem", [
    (200_000, 20, 8, None, False, None),       # the small tile
    (200_000, 50, 50, None, False, None),      # the wide tile, every column in shared memory
    (100_000, 7, 300, None, False, None),      # many tiles of centres: the GEMM screen
    (120_000, 20, 160, 30_000, True, None),    # the GEMM screen, streamed and weighted
    (150_000, 30, 40, 40_000, False, None),    # streamed in chunks
    (150_000, 12, 20, 35_000, True, None),     # weighted and streamed
    (100_000, 16, 200, None, True, 4096),      # centres staged in chunks, sums in the global limbs
    (100_000, 100, 24, None, False, 8192),     # a chunk of columns a block
])
def test_gpu_lloyd_is_the_cpus_to_the_bit(n, m, k, chunk, weighted, smem, monkeypatch):
    from mpikmeans.backends.cpu import CPUBackend
    from mpikmeans.backends.gpu import policy

    G = real_gpu()
    if smem:
        monkeypatch.setattr(policy, "SMEM_BYTES", smem)
    x = _blobs(n, m, k, seed=k)
    w = np.random.default_rng(k).uniform(0.5, 2.0, n) if weighted else None
    start = x[:k].copy()
    cpu = _lloyd_record(CPUBackend(), x, start, w, max_iter=40)
    gpu = _lloyd_record(G.GPUBackend(chunk_rows=chunk), x, start, w, max_iter=40)
    for key in cpu:
        assert gpu[key] == cpu[key], key
    assert len(cpu["history"]) >= 3


@pytest.mark.gpu
@needs_gpu
def test_gpu_empty_clusters_relocated_and_dropped_as_the_cpu():
    from mpikmeans.backends.cpu import CPUBackend

    G = real_gpu()
    x = _blobs(120_000, 10, 12, seed=3)
    start = x[:12].copy()
    start[[4, 9]] += 1e4
    for policy_ in ("farthest", "drop"):
        cpu = _lloyd_record(CPUBackend(), x, start, empty_cluster=policy_, max_iter=40)
        gpu = _lloyd_record(G.GPUBackend(), x, start, empty_cluster=policy_, max_iter=40)
        assert gpu == cpu, policy_
        assert cpu["relocated" if policy_ == "farthest" else "dropped"] == 2


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("k", [16, 64, 200])
def test_gpu_float32_storage_is_the_cpus_run_on_the_float32_rows(k):
    """float32 storage rounds the rows once; everything after is exact: the run is the CPU's on the rounded
    rows, to the bit (centres started inside blobs split them, so rows near those boundaries take other
    labels than with the float64 rows: the test does not ask for the float64 labels)."""
    from mpikmeans.backends.cpu import CPUBackend

    G = real_gpu()
    x = _blobs(300_000, 10, k, seed=11, noise=0.2)
    start = x[:k].copy()
    cpu = _lloyd_record(CPUBackend(), x.astype(np.float32).astype(np.float64), start, max_iter=40)
    gpu = _lloyd_record(G.GPUBackend(dtype="float32"), x, start, max_iter=40)
    assert gpu == cpu


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("method", ["k-means++", "k-means||"])
@pytest.mark.parametrize("weighted", [False, True])
def test_gpu_init_equals_cpu_init(method, weighted):
    """On the device the initialisations' passes give the CPU's centres, bit for bit (no FMA)."""
    from mpikmeans.backends.cpu import CPUBackend
    from mpikmeans.comm import SerialComm
    from mpikmeans.init import initial_centres

    G = real_gpu()
    x = _blobs(120_000, 20, 16, seed=7, offset=50.0)
    w = np.random.default_rng(8).uniform(0.5, 2.0, len(x)) if weighted else None
    got = []
    for backend in (CPUBackend(), G.GPUBackend()):
        backend.load(x, w)
        got.append(initial_centres(SerialComm(), method, 16, x, 0, len(x), 3, weights=w, backend=backend))
        backend.close()
    assert got[0].tobytes() == got[1].tobytes()


@pytest.fixture
def empty_store(tmp_path, monkeypatch):
    """A kernel store of its own, empty, and none in memory: GPU kernels are compiled, not loaded."""
    from mpikmeans.backends.gpu import backend, compiled
    from mpikmeans.cache import KernelStore

    store = KernelStore(str(tmp_path / "cuda"))
    monkeypatch.setattr(compiled, "_store", lambda: store)
    monkeypatch.setattr(compiled, "_IN_PROCESS", {})
    backend.compile_kernels.cache_clear()
    backend.initk_kernels.cache_clear()
    yield store
    backend.compile_kernels.cache_clear()
    backend.initk_kernels.cache_clear()


@pytest.mark.gpu
@needs_gpu
def test_gpu_runs_at_any_shape_compile_nothing_after_warmup(empty_store):
    """One warm-up per dtype compiles every GPU kernel; then runs at several K, M and both dtypes,
    k-means++ included, compile none (the store's misses count the compiles)."""
    from mpikmeans.backends.gpu import compiled
    from mpikmeans.comm import SerialComm
    from mpikmeans.init import initial_centres
    from mpikmeans.lloyd import lloyd

    G = real_gpu()
    for dtype in ("float64", "float32"):
        be = G.GPUBackend(dtype=dtype)
        be.load(np.zeros((1, 1)))
        be.warmup(1, 1)
        be.close()
    warm = empty_store.misses, len(compiled.COMPILE_TIMES)
    assert warm[0] > 0
    for dtype in ("float64", "float32"):
        for k, m in ((2, 3), (7, 20), (33, 57), (300, 8)):
            x = _blobs(50_000, m, k, seed=k + m)
            w = np.random.default_rng(k).uniform(0.5, 2.0, len(x)) if k == 7 else None
            be = G.GPUBackend(dtype=dtype, chunk_rows=20_000 if k == 33 else None)
            be.load(x, w)
            c = initial_centres(SerialComm(), "k-means++", k, x, 0, len(x), 1, weights=w, backend=be)
            lloyd(SerialComm(), be, x, 0, c, weights=w, max_iter=5)
            be.close()
    assert (empty_store.misses, len(compiled.COMPILE_TIMES)) == warm


@pytest.mark.gpu
@needs_gpu
def test_gpu_kernels_load_from_the_store_and_a_damaged_entry_is_rebuilt(empty_store):
    import os

    from mpikmeans.backends.gpu import backend, compiled
    from mpikmeans.fixedsums import Scales

    G = real_gpu()
    x = _blobs(40_000, 23, 9, seed=6)
    c = x[:9].copy()
    scales = Scales.of(np.abs(x).max(axis=0))
    results = []
    for attempt in range(3):
        compiled._IN_PROCESS.clear()  # each attempt as a new process: only the store holds kernels
        backend.compile_kernels.cache_clear()
        backend.initk_kernels.cache_clear()
        if attempt == 2:  # damage every entry: each is refused, compiled again and rewritten
            for f in os.listdir(empty_store.path):
                path = os.path.join(empty_store.path, f)
                blob = open(path, "rb").read()
                open(path, "wb").write(blob[: len(blob) // 2])
        misses = empty_store.misses
        gpu = G.GPUBackend(dtype="float64")
        gpu.load(x)
        gpu.warmup(9, 23)
        r = gpu.step(c, scales)
        results.append((r.sums.tobytes(), r.sse.tobytes(), r.changed))
        gpu.close()
        if attempt == 1:
            assert empty_store.misses == misses, "a warm store compiled nothing"
        else:
            assert empty_store.misses > misses
    assert results[1] == results[0] and results[2] == results[0]


@pytest.mark.gpu
@needs_gpu
def test_gpu_zero_rows_and_info():
    from mpikmeans.fixedsums import Scales

    G = real_gpu()
    g = G.GPUBackend(dtype="float32")
    g.load(np.empty((0, 5)))
    r = g.step(np.ones((3, 5)), Scales.of(np.ones(5)))
    assert r.sums.shape == (3, 6, 4) and not r.sums.any() and r.changed == 0 and not r.sse.any()
    info = g.info()
    assert info.name == "gpu" and info.dtype == "float32"
    assert info.devices[0].startswith("0: ") and "unknown" not in info.devices[0]
    desc = G.device_descriptions()
    assert desc and desc[0]["total_memory"] > 0
