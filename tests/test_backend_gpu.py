"""GPU backend against the CPU reference.

Two halves:

* simulator checks: every scenario runs once, in one child process with
  ``NUMBA_ENABLE_CUDASIM=1`` set before numba is imported (this pytest process has
  already imported numba for the CPU tests, so the simulator cannot be switched on
  here); the child prints one JSON line per scenario and the tests below assert on
  them.  Data stay tiny: the simulator runs every CUDA thread as a Python thread.
* ``@pytest.mark.gpu`` tests on a real GPU, skipped cleanly without one.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from mpikmeans.backends import BackendUnavailable

ROOT = Path(__file__).resolve().parents[1]

# --------------------------------------------------------------------------------------
# The child program: scenarios under the CUDA simulator
# --------------------------------------------------------------------------------------

_SIM_PROGRAM = textwrap.dedent(
    r"""
    import json, sys
    import numpy as np
    from mpikmeans.backends import BackendUnavailable, make_backend
    from mpikmeans.backends.cpu import CPUBackend
    from mpikmeans.backends import gpu as G

    assert G.SIM, "the simulator is not on"

    # this process's share of the scenarios (the fixture runs the parts side by side)
    PART, PARTS = (int(sys.argv[1]), int(sys.argv[2])) if len(sys.argv) > 2 else (0, 1)
    _count = [0]

    def blobs(n, m, k, seed, offset=0.0, noise=1.0):
        r = np.random.default_rng(seed)
        c = r.uniform(-10, 10, size=(k, m)) + offset
        lab = r.integers(0, k, n)
        x = c[lab] + noise * r.normal(size=(n, m))
        start = c + r.normal(scale=0.7, size=c.shape)
        return x, start

    def near_ties(n, m, k, seed):
        # blobs and their centres, the first n // 2 rows moved near the midpoint of centres 0 and 1: their two
        # nearest squared distances differ by less than the TF32 screen's certificate allows, by more than the
        # float32 screen's (tensor.py's cascade)
        x, c = blobs(n, m, k, seed)
        r = np.random.default_rng(seed)
        half = n // 2
        x[:half] = (c[0] + c[1]) / 2 + r.normal(size=(half, m)) * 0.01 + np.outer(r.uniform(-1e-3, 1e-3, half),
                                                                                 c[1] - c[0])
        return x, c

    def compare(name, x, cent, dtype="float64", chunk=None, weights=None, tune=None, iters=2):
        _count[0] += 1
        if (_count[0] - 1) % PARTS != PART:
            return
        cpu = CPUBackend(threads=1)
        cpu.load(x, weights)
        gpu = G.GPUBackend(dtype=dtype, chunk_rows=chunk, tune=tune or {})
        gpu.load(x, weights)
        out = {"name": name, "steps": [], "plans": []}
        for _ in range(iters):
            a = cpu.step(cent)
            b = gpu.step(cent)
            cascaded = gpu.last_cascaded  # before the assignment below launches its own kernels
            out["plans"].append([gpu.last_plan.mode, gpu.last_plan.R, gpu.last_plan.TC,
                                 gpu.last_plan.nct, gpu.last_plan.centres_shared, gpu.last_kernels])
            flagged = gpu.last_flagged
            la, da = cpu.assign(cent)
            lb, db = gpu.assign(cent)
            scale = max(np.abs(a.sums).max(), 1e-300)
            out["steps"].append({
                "labels_equal": bool(np.array_equal(la, lb)),
                "labels_dtype": str(lb.dtype),
                "sums_rel": float(np.abs(a.sums - b.sums).max() / scale),
                "sums_shape": list(b.sums.shape),
                "counts_equal": bool(np.array_equal(a.counts, b.counts)),
                "counts_rel": float(np.abs(a.counts - b.counts).max() / max(a.counts.max(), 1e-300)),
                "sse_rel": float(abs(a.sse - b.sse) / max(abs(a.sse), 1e-300)),
                "changed": [a.changed, b.changed],
                "dist2_rel": float(np.abs(da - db).max() / max(da.max(), 1e-300)),
                "flagged": flagged,
                "cascaded": cascaded,  # rows the TF32 screen left to the float32 screen (tensor.py)
                "searched": gpu.last_searched,  # rows pass 1 searched (bounds.py)
                "tested": gpu.last_bounds_tested,
                "tf32": bool(getattr(gpu, "tf32", False)),  # the GEMM screen of the steps to come
            })
            good = a.counts > 0
            cent = cent.copy()
            cent[good] = a.sums[good] / a.counts[good, None]
        out["n"] = len(x)
        gpu.close()
        print(json.dumps(out), flush=True)

    x, c = blobs(300, 6, 8, 1)
    compare("f64", x, c)
    compare("f32", x, c, dtype="float32")
    compare("chunked", x, c, chunk=70)
    w = np.random.default_rng(5).uniform(0.5, 2.0, x.shape[0])
    compare("weighted", x, c, weights=w)
    compare("chunked_f32_weighted", x, c, dtype="float32", chunk=64, weights=w, iters=1)
    # K x M sums too big for the shared-memory budget: global atomics, centres from global
    compare("no_shared_room", x, c, tune={"smem_budget": 256}, iters=1)
    # the split full step (pass 1, then the sums kernel of sums.py): the fused kernel's own
    # summing pass for comparison; five tiles of 32 rows over two blocks (each block sums
    # one tile after the other); m=50, threads that only stage (64 per block here), weighted
    # float32
    # (the split is forced: by default it is taken from 2**24 values of rows on)
    sp = {"split": True}
    compare("fused_walk", x, c, tune={"split": False}, iters=1)
    xs_, cs_ = blobs(150, 40, 4, 11)
    compare("split_tiles", xs_, cs_, tune=sp, iters=2)
    xw_, cw_ = blobs(120, 50, 3, 12)
    ww_ = np.random.default_rng(12).uniform(0.5, 2.0, xw_.shape[0])
    compare("split_wide_weighted_f32", xw_, cw_, dtype="float32", weights=ww_, tune=sp, iters=1)
    compare("split_f64", x, c, tune=sp, iters=2)
    # m=45 over tiles of 32 rows: two attributes a staging thread and pass, the last one short
    # (M not a multiple of the staging stride), five tiles with a partial last one
    xu_, cu_ = blobs(130, 45, 4, 14)
    compare("split_uneven_f32", xu_, cu_, dtype="float32", tune=dict(sp, sums_assign=False), iters=2)
    # the walk's batches of 8 rows (rows of one cluster in a batch added up first) with the centres
    # read from global memory, weighted
    compare("split_wb8_global_centres_weighted", xw_, cw_, weights=ww_, tune={"split": True, "sums_centres": False,
                                                                     "sums_wb": 8, "sums_assign": False}, iters=1)
    # one kernel a full step (the sums kernel finds the labels itself): duplicate centres (flagged rows, the
    # exact kernel adds them), eight groups, two rows a thread, the centres read from global memory
    compare("split_one_kernel_duplicate_centres", x, np.vstack([c[:3], c[2:3], c[3:]]),
            tune={"split": True, "sums_centres": False}, iters=1)
    # several centre tiles with padding (k=10, tiles of 4)
    x2, c2 = blobs(250, 5, 10, 2)
    compare("centre_tiles", x2, c2, tune={"TC": 4, "centres_shared": False}, iters=1)
    # far from the origin: the shift keeps the float32 distances certified
    x3, c3 = blobs(260, 4, 6, 3, offset=1.0e4)
    compare("offset", x3, c3, iters=1)
    # exact ties: integer points, centres at half-integers -> the exact kernel decides
    r = np.random.default_rng(7)
    xt = r.integers(-3, 4, size=(240, 2)).astype(np.float64)
    ct = np.array([[0.5, 0.0], [-0.5, 0.0], [0.0, 0.5], [0.0, -0.5], [2.5, 2.5]])
    compare("ties", xt, ct, iters=1)
    compare("split_ties", xt, ct, tune={"split": True}, iters=1)
    # two identical centres: every row nearest to them is a tie, lowest index wins
    cd = np.vstack([c[:3], c[2:3], c[3:]])
    compare("duplicate_centres", x, cd, iters=1)
    compare("split_duplicate_centres_chunked", x, cd, chunk=70, tune={"split": True}, iters=1)
    compare("k1", x, c[:1], iters=1)
    # the flagged-row counters are per chunk when streaming
    compare("ties_chunked", xt, ct, chunk=70, iters=1)
    # m=33: staged attribute chunks of 17 (the last one short) and a partial prefetch block
    x4, c4 = blobs(150, 33, 5, 4)
    compare("wide_uneven", x4, c4, iters=1)
    # m=12: whole prefetch blocks, staged chunks of 5 (the last one short)
    x5, c5 = blobs(140, 12, 6, 5)
    compare("uneven_chunks", x5, c5, tune={"JC": 5}, iters=1)
    # three warps per block: pass 2 splits each tile's sorted rows into three slices, so
    # clusters straddle slices (atomic adds) or lie inside one (plain adds); k=2 and
    # k=40 give long and short segments, weights take the weighted path
    x6, c6 = blobs(400, 7, 40, 6)
    walk = {"NT": 96, "sum_mode": "walk"}
    compare("three_slices", x6, c6, tune=walk, iters=2)
    compare("three_slices_long", x6, c6[:2], tune=walk, iters=1)
    w6 = np.random.default_rng(6).uniform(0.5, 2.0, x6.shape[0])
    compare("three_slices_weighted_f32", x6, c6, dtype="float32", weights=w6, tune=dict(walk, R=1), iters=1)
    # incremental steps: after the first (full) step only rows whose label changed move
    # (rows as the starting centres: labels keep changing for several steps)
    always = {"delta": "always"}
    compare("delta_f64", x6, x6[:40].copy(), tune=always, iters=4)
    compare("delta_f32", x6, x6[:40].copy(), dtype="float32", tune=dict(always, NT=64), iters=4)
    compare("delta_chunked", x6, x6[:40].copy(), chunk=90, tune=always, iters=3)
    compare("delta_global_centres", x6, x6[:40].copy(), tune=dict(always, smem_budget=2048), iters=3)
    # far from the origin (1e4, unit spread): the carried-over SSE and sums keep their digits
    x7, _c7 = blobs(300, 5, 12, 8, offset=1.0e4)
    compare("delta_offset", x7, x7[:12].copy(), tune=always, iters=5)
    # the exact kernel's groups of two warps a flagged row (one warp by default in the simulator): moved
    # rows in incremental steps, and ties in a full step
    compare("delta_offset_groups", x7, x7[:12].copy(), tune=dict(always, rc_threads=64), iters=3)
    compare("delta_weighted_is_full", x6, c6, weights=w6, tune=always, iters=2)
    # the GEMM-shaped screen (gemm.py), forced on small shapes: one attribute slice, three
    # (m=33, the last one short), two centre tiles (k=130), weights and float32, exact
    # ties (flagged, decided by the exact kernel), and incremental steps
    g = {"gemm": True}
    compare("gemm_f64", x, c, tune=g, iters=2)
    compare("gemm_f32_weighted", x, c, dtype="float32", weights=w, tune=g, iters=1)
    compare("gemm_wide_ties", x4, np.vstack([c4, c4[:1]]), tune=g, iters=1)
    compare("gemm_wide_ties_groups", x4, np.vstack([c4, c4[:1]]), tune=dict(g, rc_threads=128), iters=1)
    # two centre tiles, with kept bounds: the screen of every row (two row tiles), then of the 52 rows the
    # bounds test lists (one row tile: its two centre tiles on the simulator's two blocks, centre_groups)
    x8, c8 = blobs(200, 3, 129, 9, noise=0.5)
    compare("gemm_centre_tiles", x8, c8, tune=dict(g, bounds=True, delta="never"), iters=3)
    compare("gemm_delta", x6, x6[:40].copy(), tune=dict(g, delta="always"), iters=3)
    # the sums by label reading the rows from the column-major store (no row-major copy), weighted
    w5 = np.random.default_rng(5).uniform(0.5, 2.0, x5.shape[0])
    compare("gemm_colmajor_weighted", x5, c5, weights=w5, tune=dict(g, rowmajor=False), iters=1)
    # the count kernel with every row's count an atomic on global memory (more clusters than a block's
    # shared-memory counters hold, bylabel.LOCAL_LABELS_MAX): the same sums
    from mpikmeans.backends.gpu import bylabel
    local_max, bylabel.LOCAL_LABELS_MAX = bylabel.LOCAL_LABELS_MAX, 0
    compare("gemm_global_counters", x5, c5, tune=g, iters=2)
    bylabel.LOCAL_LABELS_MAX = local_max
    # the same on the tensor cores (tensor.py; the simulator emulates the warp's product, slowly:
    # two row tiles, one of them short)
    t = {"gemm": True, "tf32": True}
    compare("tf32_f64", x[:130], c, tune=t, iters=2)
    compare("tf32_f32_weighted", x[:130], c, dtype="float32", weights=w[:130], tune=t, iters=1)
    compare("tf32_wide_ties", x4, np.vstack([c4, c4[:1]]), tune=t, iters=1)
    compare("tf32_centre_tiles", x8[:130], c8, tune=t, iters=1)
    compare("tf32_delta", x6[:130], x6[:40].copy(), tune=dict(t, delta="always"), iters=3)
    # the cascade (tensor.py, the default with TF32): rows near a midpoint go to the float32 screen, none to
    # the exact kernel; without it the same rows go to the exact kernel (one attribute slice, one row tile:
    # the simulator's emulated products are slow)
    xn, cn = near_ties(100, 16, 6, 21)
    compare("tf32_cascade", xn, cn, tune=t, iters=1)
    compare("tf32_no_cascade", xn, cn, tune=dict(t, tf32_cascade=False), iters=1)
    # kept bounds on TF32: the listed rows' one row tile, its two centre tiles on the simulator's two blocks
    compare("tf32_centre_groups", x8[:130], c8, tune=dict(t, bounds=True, delta="never"), iters=3)
    # the listed rows read from the row-major copy over three attribute slices (m = 33, the last one short),
    # and the same run with them read column-major
    lb_ = dict(bounds=True, delta="never")
    compare("gemm_listed_slices", x4, x4[:5].copy(), tune=dict(g, **lb_), iters=3)
    compare("gemm_listed_slices_colmajor", x4, x4[:5].copy(), tune=dict(g, rowmajor=False, **lb_), iters=3)

    # kept bounds (bounds.py), forced on (these shapes are below the rule that takes them): from
    # rows as centres labels move for several steps, then pass 1 searches only the rows whose
    # bounds fail; float32 on values float32 holds (the CPU sees what the GPU stores)
    bo = {"bounds": True}
    xb, _cb = blobs(300, 6, 8, 15)
    xb32 = xb.astype(np.float32).astype(np.float64)
    wb = np.random.default_rng(15).uniform(0.5, 2.0, xb.shape[0])
    compare("bounds_split", xb, xb[:8].copy(), tune=dict(bo, split=True, delta="never"), iters=4)
    compare("bounds_delta_f32", xb32, xb32[:8].copy(), dtype="float32", tune=dict(bo, delta="always"), iters=4)
    compare("bounds_gemm_weighted", xb, xb[:8].copy(), weights=wb, tune=dict(bo, gemm=True, delta="never"),
            iters=3)
    compare("bounds_ties", xt, ct, tune=dict(bo, split=True, delta="never"), iters=3)
    compare("bounds_off", xb, xb[:8].copy(), tune={"split": True, "delta": "never", "bounds": False}, iters=2)
    # the listed rows read from the column-major store (by default from the row-major copy); the test
    # kernel with 8 rows a thread
    compare("bounds_split_colmajor_rpt8", xb, xb[:8].copy(),
            tune=dict(bo, split=True, delta="never", rowmajor=False, bounds_rpt=8), iters=4)

    if PART != PARTS - 1:
        # the scenarios below run in the last part only: the round robin above gives part 0 the heavier
        # half (on the 2-core machine 210 against 161 s of scenarios; these add about 35 s)
        sys.exit(0)

    # kept bounds against moves: the same centres three times (the second step follows one that
    # changed every label: no test; the third keeps every certified row without a search), then
    # centres 0 and 1 swapped (their rows must be searched), then back
    cpu = CPUBackend(threads=1)
    cpu.load(xb)
    gb = G.GPUBackend(tune=dict(bo, split=True, delta="never"))
    gb.load(xb)
    cs_ = xb[:8].copy()
    recs = []
    for cc in (cs_, cs_, cs_, cs_[[1, 0, 2, 3, 4, 5, 6, 7]], cs_):
        a = cpu.step(cc)
        b = gb.step(cc)
        recs.append({"searched": gb.last_searched, "tested": gb.last_bounds_tested, "flagged": gb.last_flagged,
                     "labels_equal": bool(np.array_equal(cpu.assign(cc)[0], gb.assign(cc)[0])),
                     "counts_equal": bool(np.array_equal(a.counts, b.counts)), "changed": [a.changed, b.changed],
                     "sums_abs": float(np.abs(a.sums - b.sums).max())})
    print(json.dumps({"name": "bounds_moves", "n": len(xb), "steps": recs}), flush=True)

    # incremental steps through the exact kernel: tied rows flagged with their label
    # kept (same centres again), then moved (centres 0 and 1 swapped), then back
    cpu = CPUBackend(threads=1)
    cpu.load(xt)
    gd = G.GPUBackend(tune=always)
    gd.load(xt)
    sw = ct[[1, 0, 2, 3, 4]]
    recs = []
    for cc in (ct, ct, sw, ct):
        a = cpu.step(cc)
        b = gd.step(cc)
        recs.append({"delta": gd.last_delta, "flagged": gd.last_flagged, "changed": [a.changed, b.changed],
                     "counts_equal": bool(np.array_equal(a.counts, b.counts)),
                     "sums_abs": float(np.abs(a.sums - b.sums).max()),
                     "sse_rel": float(abs(a.sse - b.sse) / a.sse)})
    print(json.dumps({"name": "delta_ties", "steps": recs}), flush=True)

    # one backend, k changing between steps: each k has its own buffers and launches
    cpu = CPUBackend(threads=1)
    cpu.load(x)
    g2 = G.GPUBackend()
    g2.load(x)
    ok = []
    for cc in (c, c[:5], c, c[:5]):
        a = cpu.step(cc)
        b = g2.step(cc)
        ok.append(bool(np.array_equal(a.counts, b.counts)) and a.changed == b.changed
                  and float(np.abs(a.sums - b.sums).max()) <= 1e-12 * float(np.abs(a.sums).max()))
    print(json.dumps({"name": "k_change", "ok": ok, "states": len(g2._states)}), flush=True)

    # the GEMM path's shift made on the device (gemmcentres.shift_kernel): a warp an attribute, the bits of
    # gemmcentres.lane_tree_mean; 600 centres: two rounds of a lane's batched loads
    from mpikmeans.backends.gpu import gemmcentres as GM
    from mpikmeans.backends.gpu.launch import Pack
    shifts = []
    for dt, kk in (("float64", 37), ("float32", 37), ("float64", 600)):
        cs = np.random.default_rng(3).normal(size=(kk, 5)) * 10 + 3
        pk = Pack(kk, 5, 64, -(-kk // 64), dt, 1, on_device=True)
        pk.fill(cs)
        pk.upload()
        GM.shift_kernel(dt, kk, 5, tuple(pk.layout))[GM.shift_grid(5), GM.SHIFT_NT](pk.p32, pk.dev)
        want = np.array([GM.lane_tree_mean(cs[:, j]) for j in range(5)])
        lay = pk.layout
        if dt == "float32":
            got, want = pk.p32.copy_to_host()[lay.p32_sh: lay.p32_sh + 5], want.astype(np.float32)
        else:
            got = pk.dev.copy_to_host()[lay.p64_sh: lay.p64_sh + 5]
        shifts.append(bool(np.array_equal(got, want)) and bool(np.array_equal(pk.c64, cs))
                      and bool(np.allclose(got, cs.mean(0), rtol=1e-6)))
    print(json.dumps({"name": "device_shift", "equal": shifts}), flush=True)

    # the centres' moves and the bounds' drops made on the device (bounds.moves_kernel, drops_kernel) against
    # the CPU bounds' centre_moves and bound_drops: a spread of moves, two equal largest, K = 1, moves that are
    # not finite, and several blocks with rows longer than a warp
    from numba import cuda as SC
    from mpikmeans.backends.gpu import bounds as GB
    from mpikmeans.backends.cpu.bounds import LOWER_MIN, bound_drops, centre_moves, move_margins
    rm = np.random.default_rng(0)
    o6 = rm.normal(size=(6, 9))
    mcases = [(o6, o6 + rm.normal(scale=[[0.1], [2.0], [0.3], [0.0], [1.5], [0.2]], size=o6.shape)),
              (np.zeros((3, 2)), np.array([[3.0, 4.0], [0.0, 5.0], [0.0, 0.0]])),
              (np.zeros((1, 2)), np.array([[3.0, 4.0]])),
              (np.zeros((3, 2)), np.array([[1.0, 0.0], [np.nan, 0.0], [0.0, 1e308]])),
              (rm.normal(size=(9, 70)), rm.normal(size=(9, 70)))]
    mrecs = []
    for old, new in mcases:
        km_, mm_ = new.shape
        want = centre_moves(old, new)
        rec = {}
        for test in (1, 0):
            mvd = SC.to_device(np.full(2 * km_, -1.0))
            prev = SC.to_device(old.ravel().copy())
            p64 = SC.to_device(np.concatenate([[7.0, 7.0], new.ravel()]))  # the centres from offset 2
            GB.moves_kernel()[-(-km_ // (GB.MOVES_NT // 32)), GB.MOVES_NT](
                p64, 2, prev, mvd, km_, mm_, *move_margins(mm_), test)
            if test:
                GB.drops_kernel()[1, GB.MOVES_NT](mvd, km_, LOWER_MIN)
            got = mvd.copy_to_host()
            kept = bool(np.array_equal(prev.copy_to_host(), new.ravel(), equal_nan=True))
            if test:
                fin = np.isfinite(want)
                rec.update(moves_close=bool(np.array_equal(np.isfinite(got[:km_]), fin)
                                            and np.allclose(got[:km_][fin], want[fin], rtol=1e-14, atol=0)),
                           moves_upper=[float(v) for v in got[:km_] - np.sqrt(((new - old) ** 2).sum(1))],
                           drops_equal=bool(np.array_equal(got[km_:], bound_drops(got[:km_]))),
                           drops=[float(v) for v in got[km_:]], kept=kept)
            else:
                rec.update(copy_only_untouched=bool((got == -1.0).all()), copy_only_kept=kept)
        mrecs.append(rec)
    print(json.dumps({"name": "device_moves", "cases": mrecs}), flush=True)

    # the exact kernel with a flagged row's centres split over groups (recheck.RC_PARTS): K = 100 > the
    # simulator's group of 32 threads, one or two rows flagged (its four groups: four or two parts a row,
    # centre c in part (c // 32) % parts): rows at the exact midpoint of a centre in 32-63 (part 1) and its
    # nearest one in 64-95 (part 0 or 2), first with the higher centre nudged towards the row (it takes
    # the row), then with the centres as they were: a tie, flagged, the lower index, which only the merge
    # of the parts finds; in an incremental step the exact kernel moves the row from one part's centre to
    # another's
    rs = np.random.default_rng(21)
    cs = np.round(rs.uniform(-10, 10, size=(100, 4)))
    dcc = ((cs[:, None] - cs[None]) ** 2).sum(2)
    np.fill_diagonal(dcc, np.inf)
    mids = []
    for a in range(len(cs)):
        b = int(np.argmin(dcc[a]))
        row = (cs[a] + cs[b]) / 2
        e = np.sort(((cs - row) ** 2).sum(1))
        if a // 32 == 1 and b // 32 == 2 and e[0] == e[1] < e[2]:
            mids.append((a, b, row))
    xs = cs[rs.integers(0, 100, 60)] + 0.05 * rs.normal(size=(60, 4))
    srecs = []
    for count, tune in ((1, {"delta": "always"}), (2, {"gemm": True, "delta": "always"}), (2, {"split": True})):
        xx = np.vstack([[r for _a, _b, r in mids[:count]], xs])
        cpu = CPUBackend(threads=1)
        cpu.load(xx)
        gs = G.GPUBackend(tune=tune)
        gs.load(xx)
        moved = cs.copy()
        for _a, b, r in mids[:count]:
            moved[b] += 1e-3 * (r - moved[b])
        for cc in (moved, cs):
            a = cpu.step(cc)
            b = gs.step(cc)
            la, da = cpu.assign(cc)
            lb, db = gs.assign(cc)
            srecs.append({"count": count, "tune": tune, "flagged": gs.last_flagged, "delta": gs.last_delta,
                          "labels_equal": bool(np.array_equal(la, lb)), "dist2_equal": bool(np.array_equal(da, db)),
                          "changed": [a.changed, b.changed], "counts_equal": bool(np.array_equal(a.counts, b.counts)),
                          "sums_abs": float(np.abs(a.sums - b.sums).max()), "sse_abs": float(abs(a.sse - b.sse)),
                          "tie_labels": [int(v) for v in la[:count]]})
        gs.close()
    print(json.dumps({"name": "split_rows", "pairs": [[a, b] for a, b, _r in mids[:2]], "steps": srecs}), flush=True)

    # bench gpu's host timers (mpikmeans.bench.gpu.host_timers through host_breakdown) on a step that keeps
    # bounds: every part counted, the backend as it was afterwards (its module's functions, Kept.take, the
    # states' packs and launches)
    import mpikmeans.backends.gpu.backend as BM
    from mpikmeans.backends.gpu.kept import Kept
    from mpikmeans.bench import gpu as BG
    gh = G.GPUBackend(tune={"bounds": True, "split": True, "delta": "never"})
    gh.load(xb)
    before = (BM.add_step, BM.cu, Kept.take)
    hb = BG.host_breakdown(gh, xb[:8].copy(), steps=3)
    sts = list(gh._states.values())
    restored = ((BM.add_step, BM.cu, Kept.take) == before
                and all("fill" not in vars(st.pack) and "upload" not in vars(st.pack) for st in sts)
                and all(type(f).__name__ != "function" for st in sts for f in st.launches[0]))
    r2 = gh.step(xb[:8].copy())  # the backend steps on without the timers
    print(json.dumps({"name": "host_timers", "parts": sorted(hb), "us": hb, "restored": bool(restored),
                      "tested_after": bool(gh.last_bounds_tested), "changed_after": r2.changed}), flush=True)

    # zero-row rank
    g = G.GPUBackend()
    g.load(np.empty((0, 6)))
    res = g.step(c)
    lab, d2 = g.assign(c)
    print(json.dumps({"name": "empty", "sums_shape": list(res.sums.shape), "sums_zero": bool(not res.sums.any()),
                      "counts_zero": bool(not res.counts.any()), "sse": res.sse, "changed": res.changed,
                      "labels": lab.shape[0], "dist2": d2.shape[0]}), flush=True)

    # discovery and device choice
    info = g.info()
    choices = {"share": [G.select_device_for(r_, 3, True) for r_ in range(3)]}
    try:
        G.select_device_for(0, 2, False)
        choices["refused"] = None
    except BackendUnavailable as exc:
        choices["refused"] = str(exc)
    print(json.dumps({"name": "discovery", "available": G.gpu_available(), "count": G.gpu_count(),
                      "descriptions": G.device_descriptions(), "info_name": info.name,
                      "info_devices": info.devices, "info_dtype": info.dtype,
                      "one_rank": G.select_device_for(0, 1, False), "choices": choices,
                      "make_gpu": type(make_backend("gpu")).__name__,
                      "make_auto": type(make_backend("auto")).__name__}), flush=True)
    """
)


@pytest.fixture(scope="module")
def sim():
    """Run every simulator scenario once; map scenario name -> its JSON record."""
    env = dict(os.environ)
    env["NUMBA_ENABLE_CUDASIM"] = "1"
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    # the scenarios in two processes side by side: the simulator runs on one core each
    parts = 2
    procs = [subprocess.Popen([sys.executable, "-c", _SIM_PROGRAM, str(i), str(parts)], env=env, cwd=ROOT,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for i in range(parts)]
    records = {}
    try:
        outs = [p.communicate(timeout=600) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    for proc, (stdout, stderr) in zip(procs, outs):
        if proc.returncode != 0:
            if "No module named 'numba.cuda'" in stderr or "numba_cuda" in stderr and "ModuleNotFound" in stderr:
                pytest.skip("numba-cuda is not installed")
            raise AssertionError(f"simulator run failed:\n{stdout}\n{stderr[-4000:]}")
        for line in stdout.splitlines():
            if line.startswith("{"):
                rec = json.loads(line)
                records[rec["name"]] = rec
    return records


def _assert_parity(rec, sums_tol=1e-12, exact_counts=True, labels=True):
    assert rec["steps"], rec
    for st in rec["steps"]:
        if labels:
            assert st["labels_equal"], st
        assert st["labels_dtype"] == "int32"
        assert st["sums_rel"] <= sums_tol, st
        if exact_counts:
            assert st["counts_equal"], st
        else:
            assert st["counts_rel"] <= 1e-12, st
        assert st["sse_rel"] <= max(sums_tol, 1e-12), st
        assert st["changed"][0] == st["changed"][1], st
        assert st["dist2_rel"] <= max(sums_tol, 1e-12), st


@pytest.mark.parametrize("screen", ["gemm", "tf32"])
@pytest.mark.parametrize("case", ["f64", "f32_weighted", "wide_ties", "centre_tiles", "delta"])
def test_sim_gemm_screen_matches_cpu(sim, screen, case):
    """The GEMM-shaped screen, in float32 and on the tensor cores, gives the CPU's labels, counts, sums
    and SSE (ties go to the exact kernel)."""
    rec = sim[f"{screen}_{case}"]
    if case == "f32_weighted":  # rows rounded to float32 on the device, weighted counts
        _assert_parity(rec, sums_tol=1e-6, exact_counts=False)
    else:
        _assert_parity(rec)
    if case == "wide_ties":  # the duplicated centre's rows are exact ties: flagged, lowest index
        assert rec["steps"][0]["flagged"] > 0, rec
    if screen == "tf32":  # the rows TF32 left to the float32 screen decide the next screen (backend.py)
        from mpikmeans.backends.gpu.tensor import next_screen

        first = rec["steps"][0]
        assert first["tf32"] is next_screen(True, first["cascaded"], first["searched"], True), rec
        # a full step's rows for the exact kernel are among those the float32 screen took
        assert first["flagged"] <= first["cascaded"], rec
        if case == "wide_ties":
            assert first["cascaded"] > 0, rec
    else:
        assert all(st["cascaded"] == 0 for st in rec["steps"]), rec


def test_sim_tf32_cascade_sends_uncertified_rows_to_the_float32_screen(sim):
    """Rows whose nearest two centres TF32 cannot tell apart go to the float32 screen, which certifies them:
    none reaches the exact kernel, and the labels, counts, sums and SSE are the CPU's.  Without the cascade the
    same rows go to the exact kernel (and the float32 screen takes over the next steps)."""
    on, off = sim["tf32_cascade"], sim["tf32_no_cascade"]
    _assert_parity(on)
    _assert_parity(off)
    a, b = on["steps"][0], off["steps"][0]
    assert a["cascaded"] >= 50 and a["flagged"] == 0, a  # the 50 rows moved near the midpoint at least
    assert b["cascaded"] == 0 and b["flagged"] == a["cascaded"], b
    assert a["tf32"] is False and b["tf32"] is False  # more than 30 % (cascade) or 1 % (not) of the rows left


def test_sim_tf32_screen_in_centre_groups(sim):
    """The TF32 screen of the listed rows split into groups of centre tiles as the float32 screen's
    (gemm.centre_groups, gemm.unit_merge): the last step's one row tile on the simulator's two blocks, one
    centre tile each, the CPU's results, on the TF32 screen throughout."""
    from mpikmeans.backends.gpu.gemm import BM

    rec = sim["tf32_centre_groups"]
    _assert_parity(rec)
    last = rec["steps"][-1]
    assert last["tested"] and 0 < last["searched"] <= BM, rec["steps"]
    assert all(st["tf32"] for st in rec["steps"]), rec["steps"]


def test_sim_listed_rows_over_several_slices_row_and_column_major(sim):
    """The float32 screen of the rows the bounds test lists, read from the row-major copy and from the
    column-major store, over three attribute slices: the CPU's results either way, the third step searching
    only the listed rows, and the same rows searched and flagged at every step."""
    rec, col = sim["gemm_listed_slices"], sim["gemm_listed_slices_colmajor"]
    for r in (rec, col):
        _assert_parity(r)
        last = r["steps"][-1]
        assert last["tested"] and 0 < last["searched"] < r["n"], r["steps"]
    assert [(st["searched"], st["flagged"]) for st in rec["steps"]] == \
        [(st["searched"], st["flagged"]) for st in col["steps"]]


def test_sim_gemm_shift_made_on_the_device_is_the_lane_tree_mean(sim):
    """The GEMM path's shift (gemmcentres.shift_kernel): each attribute's mean, a warp's lanes summing every 32nd
    centre and a tree adding the lanes, bit for bit gemmcentres.lane_tree_mean's (float32-rounded for
    float32 rows), the centres' mean to rounding; the host copies the centres alone."""
    assert sim["device_shift"]["equal"] == [True, True, True]


def test_sim_moves_and_drops_made_on_the_device_are_the_cpu_bounds(sim):
    """The centres' moves (bounds.moves_kernel): the CPU bounds' centre_moves up to the order of the additions
    (an upper bound on the exact move, infinite where it is not finite), the drops (drops_kernel) bound_drops'
    of them (two equal largest moves see each other, K = 1 only the 1e-140); every launch leaves this step's
    centres kept on the device, the copy-only launch touching no move."""
    cases = sim["device_moves"]["cases"]
    assert len(cases) == 5
    for rec in cases:
        assert rec["moves_close"] and rec["drops_equal"] and rec["kept"], rec
        assert rec["copy_only_untouched"] and rec["copy_only_kept"], rec
        assert all(v >= 0.0 or v != v for v in rec["moves_upper"]), rec  # NaN: the move that is not finite
    assert cases[1]["drops"][0] >= 5.0 and cases[1]["drops"][1] >= 5.0  # two equal largest: each sees the other
    assert cases[2]["drops"] == [1e-140]  # K = 1: no other centre
    assert all(v == float("inf") for v in cases[3]["drops"])  # another centre moved without bound


def test_sim_exact_kernel_splits_a_flagged_rows_centres(sim):
    """The exact kernel with one or two flagged rows and K = 100 centres (recheck.RC_PARTS: the rows' centres in
    four or two parts, each part's best merged by the row's last part): with a pair's higher centre nudged
    towards the row it takes the row, then the tie at the pair's midpoint gets the lower index, which is in
    another part than the higher one (an incremental step moves the row through the exact kernel); labels,
    distances, counts, sums and SSE as the CPU's."""
    rec = sim["split_rows"]
    assert len(rec["pairs"]) == 2, rec
    for st in rec["steps"]:
        assert st["labels_equal"] and st["dist2_equal"] and st["counts_equal"], st
        assert st["changed"][0] == st["changed"][1], st
        assert st["sums_abs"] <= 1e-12 and st["sse_abs"] <= 1e-12, st
    lows = [a for a, _b in rec["pairs"]]
    highs = [b for _a, b in rec["pairs"]]
    for first, second in zip(rec["steps"][::2], rec["steps"][1::2]):
        n = first["count"]
        assert first["tie_labels"] == highs[:n], first  # the nudged centre took the row
        assert second["tie_labels"] == lows[:n], second  # the tie: the lower index
        # the ties flagged, no more than the simulator's four groups split (two rows at most)
        assert second["flagged"] == n, second
        assert second["changed"][1] == n, second
    # the first two backends' second steps are incremental: the exact kernel moved the rows
    assert [st["delta"] for st in rec["steps"][:4]] == [False, True, False, True], rec["steps"]


def test_sim_bench_host_timers_count_every_part_and_unwrap(sim):
    """``bench gpu --host-breakdown``'s timers (bench.gpu.host_timers): every host part of a step that keeps
    bounds counted (the launches include the moves and the bounds test), and afterwards the backend's own
    functions, packs and launches again, the next step testing its bounds."""
    from mpikmeans.bench.gpu import HOST_PARTS

    rec = sim["host_timers"]
    assert rec["parts"] == sorted((*HOST_PARTS, "total", "rest")), rec
    us = rec["us"]
    assert all(us[p] > 0.0 for p in ("fill", "upload", "launch", "download", "take", "add", "total")), us
    assert us["total"] >= sum(us[p] for p in HOST_PARTS), us
    assert rec["restored"] and rec["tested_after"] and rec["changed_after"] == 0, rec


def test_sim_gemm_screen_in_centre_groups(sim):
    """The listed rows' screen split into groups of centre tiles (gemm.centre_groups): the last step's
    one row tile of listed rows on the simulator's two blocks, one centre tile each, the CPU's results."""
    from mpikmeans.backends.gpu.gemm import BM, _centre_groups

    rec = sim["gemm_centre_tiles"]
    _assert_parity(rec)
    last = rec["steps"][-1]
    assert last["tested"] and 0 < last["searched"] <= BM, rec["steps"]
    assert _centre_groups(1, 2, 8, 2, 2) == 2


def test_sim_exact_kernel_groups_of_several_warps(sim):
    """Flagged rows searched by groups of 64 and 128 threads: moved rows (incremental steps) and ties."""
    _assert_parity(sim["delta_offset_groups"])
    ties = sim["gemm_wide_ties_groups"]
    _assert_parity(ties)
    assert ties["steps"][0]["flagged"] > 0, ties


def test_sim_gemm_sums_from_the_column_major_rows(sim):
    """The GEMM path's sums by label where there is no row-major copy of the rows: the same sums."""
    _assert_parity(sim["gemm_colmajor_weighted"], exact_counts=False)


def test_sim_gemm_sums_with_global_counters(sim):
    """The sums by label with each row counted by an atomic on global memory, as where the clusters are more
    than a block's shared-memory counters hold: the same sums and counts."""
    _assert_parity(sim["gemm_global_counters"])


def test_sim_float64_matches_cpu(sim):
    rec = sim["f64"]
    _assert_parity(rec)
    assert rec["steps"][0]["changed"][1] == 300  # every label is new on the first step
    # few rows, no kept bounds, 8 centres: the split step as one kernel (the sums kernel finds the labels)
    assert rec["plans"][0][0] == 4 and rec["plans"][0][5] == 1, rec["plans"]


def test_sim_split_step_matches_the_fused_one_and_cpu(sim):
    """The split full step (sums.py) against the CPU: several tiles per block, threads that only
    stage, weights; and the fused kernel's own summing pass where the split is refused."""
    for name in ("split_tiles", "split_wide_weighted_f32", "split_f64", "split_uneven_f32", "split_ties",
                 "split_duplicate_centres_chunked", "split_wb8_global_centres_weighted",
                 "split_one_kernel_duplicate_centres"):
        rec = sim[name]
        if name.endswith("f32"):
            _assert_parity(rec, sums_tol=1e-6, exact_counts=False)
        else:  # weights' counts are float64 sums, added in another order
            _assert_parity(rec, exact_counts="weighted" not in name)
        assert {p[0] for p in rec["plans"]} == {4}, rec["plans"]
        # one kernel before the exact one where the sums kernel finds the labels itself (whole rows a
        # thread, few centres, no kept bounds), else two (or told to: sums_assign false)
        if name in ("split_f64", "split_one_kernel_duplicate_centres"):
            assert {p[5] for p in rec["plans"]} == {1}, (name, rec["plans"])
        if name in ("split_ties", "split_uneven_f32", "split_wb8_global_centres_weighted"):
            assert {p[5] for p in rec["plans"]} == {2}, (name, rec["plans"])
        if "ties" in name or "duplicate" in name:  # flagged rows: the exact kernel adds them
            assert rec["steps"][0]["flagged"] > 0, rec
    rec = sim["fused_walk"]
    _assert_parity(rec)
    assert rec["plans"][0][0] == 0


def test_sim_float32(sim):
    # the rows are rounded to float32 on the device: labels still agree on separated data
    _assert_parity(sim["f32"], sums_tol=1e-6)


def test_sim_streaming_chunks(sim):
    _assert_parity(sim["chunked"])


def test_sim_weights(sim):
    _assert_parity(sim["weighted"], exact_counts=False)


def test_sim_streaming_float32_weighted(sim):
    _assert_parity(sim["chunked_f32_weighted"], sums_tol=1e-6, exact_counts=False)


def test_sim_sums_too_big_for_shared_memory(sim):
    rec = sim["no_shared_room"]
    _assert_parity(rec)
    mode, _r, _tc, _nct, centres_shared = rec["plans"][0][:5]
    assert mode == 1 and centres_shared is False


def test_sim_several_centre_tiles(sim):
    rec = sim["centre_tiles"]
    _assert_parity(rec)
    assert rec["plans"][0][3] == 3  # 10 centres in tiles of 4


def test_sim_far_from_origin(sim):
    _assert_parity(sim["offset"])


def test_sim_exact_ties_go_to_lowest_index(sim):
    rec = sim["ties"]
    _assert_parity(rec)
    assert rec["steps"][0]["flagged"] > 0  # the exact kernel did the deciding


def test_sim_duplicate_centres(sim):
    rec = sim["duplicate_centres"]
    _assert_parity(rec)
    assert rec["steps"][0]["flagged"] > 0


def test_sim_single_centre(sim):
    _assert_parity(sim["k1"])


def test_sim_streaming_ties_per_chunk_counters(sim):
    rec = sim["ties_chunked"]
    _assert_parity(rec)
    assert rec["steps"][0]["flagged"] > 0


def test_sim_several_warps_split_the_sorted_rows(sim):
    _assert_parity(sim["three_slices"])
    _assert_parity(sim["three_slices_long"])
    _assert_parity(sim["three_slices_weighted_f32"], sums_tol=1e-6, exact_counts=False)


def test_sim_incremental_steps_match_full_ones(sim):
    for name, tol in (("delta_f64", 1e-12), ("delta_f32", 1e-6), ("delta_chunked", 1e-12),
                      ("delta_global_centres", 1e-12), ("delta_offset", 1e-12)):
        rec = sim[name]
        _assert_parity(rec, sums_tol=tol)
        modes = [p[0] for p in rec["plans"]]
        assert modes[0] in (0, 1, 4) and set(modes[1:]) == {3}, (name, modes)  # full, then incremental
        assert any(st["changed"][0] > 0 for st in rec["steps"][1:]), name  # some rows did move
    rec = sim["delta_weighted_is_full"]
    _assert_parity(rec, exact_counts=False)
    assert [p[0] for p in rec["plans"]] == [0, 0]  # weights: never incremental


def test_sim_kept_bounds_match_cpu(sim):
    """Pass 1 on the rows whose kept bounds fail: every step as the CPU's (split, incremental float32,
    the GEMM screen with weights, exact ties), fewer rows searched once labels settle, and a test that
    left most rows to pass 1 is not run at the next step."""
    for name, counts in (("bounds_split", True), ("bounds_delta_f32", True), ("bounds_gemm_weighted", False),
                         ("bounds_ties", True), ("bounds_split_colmajor_rpt8", True)):
        rec = sim[name]
        _assert_parity(rec, sums_tol=1e-12, exact_counts=counts)
        searched = [st["searched"] for st in rec["steps"]]
        tested = [st["tested"] for st in rec["steps"]]
        assert searched[0] == rec["n"] and not tested[0], (name, searched)
        for i in range(1, len(tested)):
            if tested[i - 1] and searched[i - 1] > 0.75 * rec["n"]:
                assert not tested[i], (name, searched, tested)  # backed off: a full pass 1
        if name != "bounds_ties":
            assert any(t for t in tested) and min(searched) < rec["n"] // 2, (name, searched, tested)
    rec = sim["bounds_off"]
    _assert_parity(rec)
    assert all(st["searched"] == rec["n"] and not st["tested"] for st in rec["steps"])


def test_sim_kept_bounds_against_moves(sim):
    """No test after a step that changed every label; the same centres again: only rows without
    certified bounds are searched; centres 0 and 1 swapped: at least their rows are; labels as the
    CPU's throughout."""
    rec = sim["bounds_moves"]
    st = rec["steps"]
    assert all(s_["labels_equal"] and s_["counts_equal"] and s_["changed"][0] == s_["changed"][1]
               and s_["sums_abs"] <= 1e-12 for s_ in st), st
    assert [s_["tested"] for s_ in st[:4]] == [False, False, True, True], st
    busy = st[3]["searched"] > 0.75 * rec["n"] or st[3]["changed"][0] > 0.2 * rec["n"]
    assert st[4]["tested"] == (not busy), st
    # nothing moved: the flagged rows and those within a few certificates of a tie
    assert st[2]["searched"] <= st[1]["flagged"] + rec["n"] // 20, st
    assert st[3]["changed"][0] > 0 and st[3]["searched"] >= st[3]["changed"][0], st  # the swap moved rows


def test_sim_incremental_steps_through_the_exact_kernel(sim):
    steps = sim["delta_ties"]["steps"]
    assert [st["delta"] for st in steps] == [False, True, True, True]
    for st in steps:
        assert st["flagged"] > 0 and st["counts_equal"], st
        assert st["changed"][0] == st["changed"][1], st
        assert st["sums_abs"] <= 1e-12 and st["sse_rel"] <= 1e-12, st
    assert steps[1]["changed"][0] == 0 and steps[2]["changed"][0] > 0


def test_sim_uneven_attribute_blocks(sim):
    _assert_parity(sim["wide_uneven"])
    rec = sim["uneven_chunks"]
    _assert_parity(rec)


def test_sim_k_changes_between_steps(sim):
    rec = sim["k_change"]
    assert rec["ok"] == [True] * 4
    assert rec["states"] == 2


def test_sim_zero_rows(sim):
    rec = sim["empty"]
    assert rec["sums_shape"] == [8, 6] and rec["sums_zero"] and rec["counts_zero"]
    assert rec["sse"] == 0.0 and rec["changed"] == 0
    assert rec["labels"] == 0 and rec["dist2"] == 0


def test_sim_discovery_and_device_choice(sim):
    rec = sim["discovery"]
    assert rec["available"] and rec["count"] == 1
    assert rec["descriptions"][0]["index"] == 0
    assert rec["info_name"] == "gpu" and rec["info_devices"][0].startswith("0: ")
    assert rec["info_dtype"] == "float64"
    assert rec["one_rank"] == 0
    assert rec["choices"]["share"] == [0, 0, 0]
    assert "--share-gpus" in rec["choices"]["refused"]
    assert rec["make_gpu"] == "GPUBackend" and rec["make_auto"] == "GPUBackend"


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


def _fill_numpy(centres, f32, TC):
    """The step buffer's centre data as the numpy form computed it before v5 (the oracle)."""
    k, m = centres.shape
    nct = -(-k // TC)
    shift = centres.mean(axis=0)
    if f32:
        sh = shift.astype(np.float32)
        shift = sh.astype(np.float64)
    else:
        sh = shift.copy()
    z = (centres - shift).astype(np.float32)
    z64 = z.astype(np.float64)
    norms = np.einsum("ij,ij->i", z64, z64)
    cc = np.full(nct * TC, np.inf, np.float32)
    cc[:k] = norms
    zt = np.zeros((nct * TC, m), np.float32)
    np.multiply(z, np.float32(-2.0), out=zt[:k])
    cm = zt.reshape(nct, TC, m).transpose(0, 2, 1).copy()
    finite = np.all(np.isfinite(centres))
    zl = np.float32(min(2.0 * float(norms.max()) * (1.0 + 1e-6), 3.0e38)) if finite else np.float32(np.inf)
    return sh, cc, cm, zl


@pytest.mark.parametrize("f32", [True, False])
@pytest.mark.parametrize("k,m,TC", [(50, 100, 52), (1000, 32, 64), (10, 5, 4), (7, 3, 8), (1000, 40, 64)])
def test_fill_centres_is_bit_identical_to_the_numpy_form(f32, k, m, TC):
    """The compiled fill of the step buffer (host side, every step) against the numpy oracle;
    1000 x 40 is past THREADS_MIN_VALUES (the threaded form)."""
    pytest.importorskip("numba")
    from mpikmeans.backends.gpu import fill_centres

    r = np.random.default_rng(k + m)
    c = r.normal(size=(k, m)) * 10 + 3
    nct = -(-k // TC)
    sh = np.zeros(m, np.float32 if f32 else np.float64)
    cc = np.full(nct * TC, np.inf, np.float32)
    cm = np.zeros((nct, m, TC), np.float32)
    c64 = np.zeros((k, m))
    zl = np.zeros(1, np.float32)
    fill_centres(c, f32, sh, cc, cm, c64, zl)
    want = _fill_numpy(c, f32, TC)
    assert np.array_equal(sh, want[0]) and np.array_equal(cc, want[1]) and np.array_equal(cm, want[2])
    assert zl[0] == want[3] and np.array_equal(c64, c)
    c[1, 2] = np.nan  # a non-finite centre sends every row to the exact kernel
    fill_centres(c, f32, sh, cc, cm, c64, zl)
    assert zl[0] == np.inf
    # where the device makes the rest (the GEMM path): the centres copied (the device's shift: the
    # simulator's scenario device_shift)
    from mpikmeans.backends.gpu.hostk import copy_centres

    c2 = np.zeros_like(c64)
    copy_centres(c, c2)
    assert np.array_equal(c2, c, equal_nan=True)


@pytest.mark.parametrize("k,m", [(6, 4), (300, 200)])
def test_add_step_forms_raw_sums_from_deviations(k, m):
    """dev += d_dev, counts += d_counts, and the raw sums dev + counts c (one thread, and the
    threaded form from THREADS_MIN_VALUES on)."""
    pytest.importorskip("numba")
    from mpikmeans.backends.gpu import add_step

    r = np.random.default_rng(4)
    dev, d_dev, c = r.normal(size=(3, k, m))
    counts, d_counts = r.integers(0, 50, size=(2, k)).astype(np.float64)
    want_dev, want_counts = dev + d_dev, counts + d_counts
    out = np.full((k, m), np.nan)
    sums = add_step(dev, counts, d_dev, d_counts, c, out)
    assert sums is out  # into the caller's buffer, nothing allocated
    assert np.array_equal(dev, want_dev) and np.array_equal(counts, want_counts)
    assert np.array_equal(sums, want_dev + want_counts[:, None] * c)
    # a full step's: the sums it was given, whatever was kept
    sums = add_step(dev, counts, d_dev, d_counts, c, out, fresh=True)
    assert sums is out
    assert np.array_equal(dev, d_dev) and np.array_equal(counts, d_counts)
    assert np.array_equal(sums, d_dev + d_counts[:, None] * c)


def test_carry_kept_moves_the_deviation_sums_and_sse_to_new_centres():
    """The kept rows about new centres: the carried sums and SSE equal those summed afresh."""
    pytest.importorskip("numba")
    from mpikmeans.backends.gpu.kept import Kept

    r = np.random.default_rng(5)
    k, m = 6, 9
    x = r.normal(size=(200, m)) * 3 + 100.0  # far from the origin: the deviation form's case
    lab = r.integers(0, k, 200)
    old, new = Kept(k, m), Kept(k, m)
    old.centres[:] = r.normal(size=(k, m)) + 100.0
    new.centres[:] = old.centres + r.normal(size=(k, m)) * 0.01
    for c in range(k):
        rows = x[lab == c]
        old.dev[c] = (rows - old.centres[c]).sum(axis=0)
        old.counts[c] = len(rows)
    old.sse = float(((x - old.centres[lab]) ** 2).sum())
    sse = new.carry_from(old)
    want_dev = np.array([(x[lab == c] - new.centres[c]).sum(axis=0) for c in range(k)])
    assert np.allclose(new.dev, want_dev, rtol=0, atol=1e-9)
    assert np.array_equal(new.counts, old.counts)
    assert sse == pytest.approx(float(((x - new.centres[lab]) ** 2).sum()), rel=1e-12)


def test_kept_sums_take_turns_between_two_slots():
    """A step writes the slot the last step's sums are not in; a new K makes new slots."""
    pytest.importorskip("numba")
    from mpikmeans.backends.gpu.kept import KeptSums

    ks = KeptSums()
    c = np.arange(12.0).reshape(3, 4)
    a = ks.spare(3, 4)
    a.take(c)
    assert np.array_equal(a.centres, c) and a.centres is not c and not ks.fits(3)
    ks.last = a
    b = ks.spare(3, 4)
    b.take(c + 1)
    assert b is not a and np.array_equal(a.centres, c) and ks.fits(3)
    ks.last = b
    assert ks.spare(3, 4) is a
    assert ks.spare(2, 4).dev.shape == (2, 4) and not ks.fits(2)
    ks.forget()
    assert ks.last is None and not ks.fits(3)


# --------------------------------------------------------------------------------------
# Real GPU
# --------------------------------------------------------------------------------------


def _real_gpu():
    try:
        from mpikmeans.backends import gpu as G
    except Exception:
        return None
    if G.SIM or not G.gpu_available():
        return None
    return G


needs_gpu = pytest.mark.skipif(_real_gpu() is None, reason="needs a real CUDA GPU")


def _blobs(n, m, k, seed, offset=0.0):
    r = np.random.default_rng(seed)
    c = r.uniform(-10, 10, size=(k, m)) + offset
    lab = r.integers(0, k, n)
    x = c[lab] + r.normal(size=(n, m))
    return x, c + r.normal(scale=0.7, size=c.shape)


def _lloyd(backend, cent, iters):
    cent = cent.copy()
    res = None
    for _ in range(iters):
        res = backend.step(cent)
        good = res.counts > 0
        cent[good] = res.sums[good] / res.counts[good, None]
    return cent, res


def _gpu_vs_cpu(n, m, k, dtype="float64", chunk=None, weights=False, tune=None, seed=0, iters=3, offset=0.0,
                start_rows=False, cpu_sees_stored=False):
    """Steps on the GPU and the CPU backend from the same centres, compared every step.

    ``cpu_sees_stored``: the CPU gets the values as the GPU stores them (float32
    rounded), so everything must agree to float64 rounding, float32 or not.
    """
    from mpikmeans.backends.cpu import CPUBackend

    G = _real_gpu()
    x, c = _blobs(n, m, k, seed, offset)
    if start_rows:  # rows as centres: labels keep changing for several steps
        c = x[:k].copy()
    w = np.random.default_rng(seed + 9).uniform(0.5, 2, n) if weights else None
    cpu = CPUBackend()
    stored_f32 = cpu_sees_stored and dtype == "float32"
    cpu.load(x.astype(np.float32).astype(np.float64) if stored_f32 else x, w)
    gpu = G.GPUBackend(dtype=dtype, chunk_rows=chunk, tune=tune or {})
    gpu.load(x, w)
    tol = 1e-12 if dtype == "float64" or stored_f32 else 1e-6
    for _ in range(iters):
        a = cpu.step(c)
        b = gpu.step(c)
        assert np.abs(a.sums - b.sums).max() <= tol * np.abs(a.sums).max()
        assert np.allclose(a.counts, b.counts, rtol=1e-12, atol=0)
        assert abs(a.sse - b.sse) <= tol * a.sse
        assert a.changed == b.changed
        good = a.counts > 0
        c = c.copy()
        c[good] = a.sums[good] / a.counts[good, None]
    la, da = cpu.assign(c)
    lb, db = gpu.assign(c)
    assert np.array_equal(la, lb)
    assert np.abs(da - db).max() <= (1e-12 if tol == 1e-12 else 1e-5) * da.max()
    return gpu


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_gpu_split_step_matches_cpu(dtype):
    """The split full step (pass 1, then sums.py) where the rule takes it (2**24 values and more)
    and forced on smaller shapes: many copies of the sums (m=3, m=8), weights."""
    gpu = _gpu_vs_cpu(300_000, 64, 40, dtype=dtype, iters=2, start_rows=True)
    assert gpu._plan(40, False).mode == 4  # the full steps' plan (the last one was the assignment's)
    sp = {"split": True, "delta": "never"}
    for n, m, k in ((200_000, 3, 7), (150_000, 8, 16), (40_000, 100, 50)):
        gpu = _gpu_vs_cpu(n, m, k, dtype=dtype, tune=sp, weights=(m == 8), iters=2)
        assert gpu._plan(k, False).mode == 4


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_gpu_matches_cpu(dtype):
    _gpu_vs_cpu(200_000, 20, 16, dtype=dtype)


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("case", ["bounds", "delta", "gemm", "one_kernel"])
def test_gpu_step_graphs_match_cpu_and_the_launches(case, monkeypatch):
    """Resident steps as one CUDA graph each (launch.StepGraph, the default): the CPU's results on full steps,
    steps on the rows the bounds test lists, incremental steps, the GEMM path and the one-kernel step; the
    state of a step on the listed rows has both its graphs; with ``{"graph": false}`` none, and the same
    counts, changes, rows searched and kinds of step, step by step; each step launched its graph once (none
    without)."""
    tune, shape = {"bounds": ({"bounds": True, "split": True, "delta": "never"}, (60_000, 16, 40)),
                   "delta": ({"delta": "always"}, (60_000, 16, 40)),
                   "gemm": ({"gemm": True, "bounds": True, "delta": "never"}, (30_000, 64, 600)),
                   "one_kernel": ({}, (200_000, 3, 7))}[case]
    _gpu_vs_cpu(*shape, tune=tune, iters=5, start_rows=True).close()  # graphs are the default
    G = _real_gpu()
    from mpikmeans.backends.gpu import launch

    launched = [0]
    real_launch = launch.StepGraph.__call__

    def counted(graph):
        launched[0] += 1
        real_launch(graph)

    monkeypatch.setattr(launch.StepGraph, "__call__", counted)
    x, c0 = _blobs(*shape, 0, 0.0)
    recs, seen = [], []  # seen: after each graph step, whether its state had graphs, both kinds where tested
    for graph in (True, False):
        gpu = G.GPUBackend(tune=dict(tune, graph=graph))
        gpu.load(x)
        rec = []
        for c in (x[:shape[2]].copy(), c0):  # labels moving for several steps, then few moving
            for _ in range(4):
                before = launched[0]
                r = gpu.step(c)
                assert launched[0] - before == (1 if graph else 0)
                kinds = [set(st.graphs) for key, st in gpu._states.items() if not key[1]]  # the steps' states
                assert all(g is not None for st in gpu._states.values() for g in st.graphs.values())
                rec.append((r.counts.tolist(), r.changed, gpu.last_searched, gpu.last_bounds_tested, gpu.last_delta))
                if graph:  # (a step that switched the GEMM screen dropped its states: none seen)
                    seen.append((gpu.last_bounds_tested, {False, True} in kinds, any(kinds)))
                else:
                    assert all(not k for k in kinds), kinds
                good = r.counts > 0
                c = c.copy()
                c[good] = r.sums[good] / r.counts[good, None]
            gpu.forget_labels()
        gpu.close()
        recs.append(rec)
    assert recs[0] == recs[1]
    assert any(made for _t, _b, made in seen), seen
    if case in ("bounds", "gemm"):  # steps on the listed rows, with both graphs
        assert any(tested and both for tested, both, _m in seen), seen


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("k,m", [(50, 100), (200, 8), (1000, 32)])
def test_gpu_shapes(k, m):
    _gpu_vs_cpu(60_000, m, k, iters=2)


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_gpu_gemm_screen_matches_cpu(dtype):
    """The GEMM-shaped screen: chosen for centres too large for shared memory (K x M = 257,000), and forced
    on a shape that would not choose it, with weights and with labels still changing (incremental steps)."""
    gpu = _gpu_vs_cpu(30_000, 257, 1000, dtype=dtype, iters=2, start_rows=True, cpu_sees_stored=True)
    assert gpu.gemm_wanted(gpu._plan(1000, False), False, 1000)  # the step plan of this shape takes it
    _gpu_vs_cpu(50_000, 70, 130, dtype=dtype, tune={"gemm": True}, weights=True, iters=2)
    _gpu_vs_cpu(50_000, 70, 130, dtype=dtype, tune={"gemm": True, "delta": "always"}, iters=5, start_rows=True)
    # the TF32 screen (tensor.py) from the first step, and with rows as centres (the rows it leaves go to the
    # float32 screen; where they are many, the float32 screen takes over after the first step)
    tf = _gpu_vs_cpu(30_000, 257, 1000, dtype=dtype, tune={"tf32": True}, iters=3)
    assert tf.tf32  # blobs, centres near theirs: nothing to flag, TF32 throughout
    _gpu_vs_cpu(30_000, 257, 1000, dtype=dtype, tune={"tf32": True}, iters=2, start_rows=True, cpu_sees_stored=True)
    _gpu_vs_cpu(50_000, 70, 130, dtype=dtype, tune={"gemm": True, "tf32": True, "delta": "always"}, iters=4,
                start_rows=True)


@pytest.mark.gpu
@needs_gpu
def test_gpu_streaming_and_weights():
    _gpu_vs_cpu(150_000, 12, 10, chunk=40_000, weights=True)
    _gpu_vs_cpu(150_000, 12, 10, chunk=40_000, weights=True, dtype="float32")


@pytest.mark.gpu
@needs_gpu
def test_gpu_forced_global_sums_and_tiles():
    _gpu_vs_cpu(100_000, 16, 300, tune={"sum_mode": "global", "centres_shared": False}, iters=2)
    _gpu_vs_cpu(100_000, 16, 40, tune={"smem_budget": 4096}, iters=2)


@pytest.mark.gpu
@needs_gpu
def test_gpu_offset_and_ties():
    _gpu_vs_cpu(100_000, 10, 12, offset=1.0e5, iters=2)
    from mpikmeans.backends.cpu import CPUBackend

    G = _real_gpu()
    r = np.random.default_rng(3)
    x = r.integers(-20, 21, size=(100_000, 3)).astype(np.float64)
    c = np.array([[0.5, 0, 0], [-0.5, 0, 0], [0, 0.5, 0], [0, -0.5, 0], [0, 0, 0.5], [0.5, 0, 0]])
    cpu, gpu = CPUBackend(), G.GPUBackend()
    cpu.load(x)
    gpu.load(x)
    a, b = cpu.step(c), gpu.step(c)
    assert gpu.last_flagged > 0
    assert np.array_equal(a.counts, b.counts) and a.changed == b.changed
    assert np.array_equal(cpu.assign(c)[0], gpu.assign(c)[0])


@pytest.mark.gpu
@needs_gpu
def test_gpu_streaming_ties():
    """Exact ties while streaming: each chunk has its own flagged-row counter."""
    from mpikmeans.backends.cpu import CPUBackend

    G = _real_gpu()
    r = np.random.default_rng(4)
    x = r.integers(-20, 21, size=(90_000, 3)).astype(np.float64)
    c = np.array([[0.5, 0, 0], [-0.5, 0, 0], [0, 0.5, 0], [0, -0.5, 0], [0, 0, 0.5], [0.5, 0, 0]])
    cpu, gpu = CPUBackend(), G.GPUBackend(chunk_rows=25_000)
    cpu.load(x)
    gpu.load(x)
    for _ in range(2):
        a, b = cpu.step(c), gpu.step(c)
        assert gpu.last_flagged > 0
        assert np.array_equal(a.counts, b.counts) and a.changed == b.changed
        assert np.abs(a.sums - b.sums).max() <= 1e-12 * np.abs(a.sums).max()
    assert np.array_equal(cpu.assign(c)[0], gpu.assign(c)[0])


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("tune", [{}, {"idx64": True}, {"R": 1}, {"maxreg": 168, "blocks": 3}, {"launch": "numba"}])
def test_gpu_kernel_variants(tune):
    """m=45: a partial prefetch block and a short last staged chunk; 64-bit indices;
    one row per thread; capped registers with short chunks; Numba's own launch path."""
    _gpu_vs_cpu(80_000, 45, 20, dtype="float32", tune=tune, iters=2)
    _gpu_vs_cpu(80_000, 45, 20, dtype="float64", tune=tune, iters=2)


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("k,m,chunk", [(50, 100, None), (1000, 32, None), (16, 8, 30_000)])
def test_gpu_incremental_steps(dtype, k, m, chunk):
    """Every step after the first incremental, labels changing: sums, counts, SSE and
    changes as the CPU's, step after step (K=1000: float64 centres read from global memory)."""
    # float32: rows as centres would put near-ties within float32 rounding (labels then
    # differ from the CPU's float64 ones by right); start near the blobs instead
    g = _gpu_vs_cpu(100_000, m, k, dtype=dtype, chunk=chunk, tune={"delta": "always"}, iters=5,
                    start_rows=dtype == "float64")
    assert g.last_delta  # the last step (before the closing assign) was incremental


#: bench fullstep's five cases (issue 16): (N, M, K), and the N of their smaller versions here, on the
#: same plans (the split step from 2**24 values on, the GEMM path from K x M centres that do not fit)
_FULLSTEP_CASES = {"A": ((5_000_000, 100, 50), 500_000), "B": ((10_000_000, 32, 1000), 1_000_000),
                   "C": ((100_000_000, 8, 16), 3_000_000), "D": ((300_000, 257, 1000), 300_000),
                   "E": ((2_000_000, 3, 7), 2_000_000)}


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("case", sorted(_FULLSTEP_CASES))
def test_gpu_fullstep_case_plans_match_cpu_float64(case):
    """Each of bench fullstep's cases on its own plan (and kept bounds where it keeps them), from the
    first K rows so labels keep changing: every step's sums, counts, changes and SSE, and the labels,
    as the CPU backend's in float64."""
    (n_full, m, k), n = _FULLSTEP_CASES[case]
    gpu = _gpu_vs_cpu(n, m, k, iters=6, start_rows=True, seed=31)
    full = gpu._plan_for(k, False, False, n_full)  # the case's own plan (its rows: the split step or not)
    plan = gpu._plan(k, False)
    assert (plan.mode, gpu.gemm_wanted(plan, False, k)) == (full.mode, gpu.gemm_wanted(full, False, k)), case


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("tune", [{"split": True, "delta": "never"}, {"delta": "always"}, {},
                                  {"gemm": True, "delta": "never"}, {"gemm": True, "tf32": True},
                                  {"split": True, "delta": "never", "rowmajor": False}])
def test_gpu_kept_bounds_match_cpu(dtype, tune):
    """Pass 1 on the rows whose kept bounds fail (bounds.py), in split full steps, incremental ones,
    the default policy and the GEMM path's screens: every step's sums, counts, SSE and changes as the CPU's and as the same
    run's without bounds; the bounds did keep rows once labels settled."""
    from mpikmeans.backends.cpu import CPUBackend

    G = _real_gpu()
    x, _c = _blobs(450_000, 40, 30, 21)  # 1.8e7 values: the split step by default
    x = x.astype(np.float32).astype(np.float64) if dtype == "float32" else x
    c = x[:30].copy()  # rows as centres: labels keep changing for many steps
    cpu = CPUBackend()
    cpu.load(x)
    gpu = G.GPUBackend(dtype=dtype, tune=tune)
    gpu.load(x)
    plain = G.GPUBackend(dtype=dtype, tune=dict(tune, bounds=False))
    plain.load(x)
    searched = []
    for _ in range(14):
        a, b, p = cpu.step(c), gpu.step(c), plain.step(c)
        searched.append(gpu.last_searched)
        assert plain.last_searched == len(x)
        for r in (b, p):
            assert np.abs(a.sums - r.sums).max() <= 1e-12 * np.abs(a.sums).max()
            assert np.array_equal(a.counts, r.counts) and a.changed == r.changed
            assert abs(a.sse - r.sse) <= 1e-12 * a.sse
        good = a.counts > 0
        c = c.copy()
        c[good] = a.sums[good] / a.counts[good, None]
    assert np.array_equal(cpu.assign(c)[0], gpu.assign(c)[0])
    assert searched[0] == len(x) and min(searched) < len(x) // 4, searched


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_gpu_incremental_steps_far_from_origin(dtype):
    """Data at 1e5 with unit spread: the SSE carried over to moved centres and the
    deviation sums keep every digit (within 1e-12 of the CPU's, which sees the values
    as stored: float32 keeps only about two digits of a unit deviation at 1e5)."""
    g = _gpu_vs_cpu(100_000, 10, 12, dtype=dtype, offset=1.0e5, tune={"delta": "always"}, iters=6,
                    start_rows=True, cpu_sees_stored=True)
    assert g.last_delta


@pytest.mark.gpu
@needs_gpu
def test_gpu_lloyd_incremental_by_default():
    """A Lloyd run with the default policy turns incremental once few labels change and
    ends within 1e-9 of the CPU's centres."""
    from mpikmeans.backends.cpu import CPUBackend

    G = _real_gpu()
    x, _c = _blobs(300_000, 24, 20, 12)
    c0 = x[:20].copy()
    cpu, gpu = CPUBackend(), G.GPUBackend()
    cpu.load(x)
    gpu.load(x)
    ca, _ = _lloyd(cpu, c0, 15)
    kinds = []
    c = c0.copy()
    for _ in range(15):
        r = gpu.step(c)
        kinds.append(gpu.last_delta)
        good = r.counts > 0
        c[good] = r.sums[good] / r.counts[good, None]
    assert not kinds[0] and any(kinds)
    assert np.abs(ca - c).max() <= 1e-9 * np.abs(ca).max()


@pytest.mark.gpu
@needs_gpu
def test_gpu_prepared_launch_matches_numba_launch():
    """The prepared cuLaunchKernel launches are in use and agree with Numba's dispatcher."""
    G = _real_gpu()
    x, c = _blobs(120_000, 100, 50, 6)
    runs = []
    for launch in ("fast", "numba"):
        g = G.GPUBackend(dtype="float32", tune={"launch": launch})
        g.load(x)
        steps = (g.step(c), g.step(c))
        assert g.last_fast_launch is (launch == "fast")
        runs.append(steps)
    for a, b in zip(runs[0], runs[1]):
        assert np.array_equal(a.counts, b.counts) and a.changed == b.changed
        assert np.abs(a.sums - b.sums).max() <= 1e-12 * np.abs(a.sums).max()
        assert abs(a.sse - b.sse) <= 1e-12 * a.sse


@pytest.mark.gpu
@needs_gpu
def test_gpu_lloyd_centres_match_cpu():
    """Ten Lloyd iterations: centres within 1e-9 relative of the CPU's (float64)."""
    from mpikmeans.backends.cpu import CPUBackend

    G = _real_gpu()
    x, c = _blobs(300_000, 24, 20, 11)
    cpu, gpu = CPUBackend(), G.GPUBackend()
    cpu.load(x)
    gpu.load(x)
    ca, _ = _lloyd(cpu, c, 10)
    cb, _ = _lloyd(gpu, c, 10)
    assert np.abs(ca - cb).max() <= 1e-9 * np.abs(ca).max()


@pytest.mark.gpu
@needs_gpu
def test_gpu_zero_rows_and_info():
    G = _real_gpu()
    g = G.GPUBackend(dtype="float32")
    g.load(np.empty((0, 5)))
    r = g.step(np.ones((3, 5)))
    assert r.sums.shape == (3, 5) and r.changed == 0 and r.sse == 0.0
    info = g.info()
    assert info.name == "gpu" and info.dtype == "float32"
    assert info.devices[0].startswith("0: ") and "unknown" not in info.devices[0]
    desc = G.device_descriptions()
    assert desc and desc[0]["total_memory"] > 0


@pytest.fixture
def empty_store(tmp_path, monkeypatch):
    """A kernel store of its own, empty, and none in memory: GPU kernels are compiled, not loaded."""
    from mpikmeans.backends.gpu import compiled
    from mpikmeans.cache import KernelStore

    store = KernelStore(str(tmp_path / "cuda"))
    monkeypatch.setattr(compiled, "_store", lambda: store)
    monkeypatch.setattr(compiled, "_IN_PROCESS", {})
    return store


@pytest.mark.gpu
@needs_gpu
def test_gpu_warmup_takes_the_compiler_out_of_the_loop(empty_store):
    # warmup builds (compiles) the step's and the final assignment's kernels, so the
    # first step and assign after it compile nothing
    G = _real_gpu()
    x, c = _blobs(50_000, 37, 11, seed=5)
    gpu = G.GPUBackend(dtype="float64")
    gpu.load(x)
    gpu.warmup(11, 37)
    compiled_by_warmup = empty_store.misses
    gpu.step(c)
    gpu.assign(c)
    assert compiled_by_warmup > 0 and empty_store.misses == compiled_by_warmup, (compiled_by_warmup,
                                                                                empty_store.misses)


@pytest.mark.gpu
@needs_gpu
def test_gpu_kernels_load_from_the_store_and_a_damaged_entry_is_rebuilt(empty_store):
    import os

    from mpikmeans.backends.gpu import compiled

    G = _real_gpu()
    x, c = _blobs(40_000, 23, 9, seed=6)
    results = []
    for attempt in range(3):
        compiled._IN_PROCESS.clear()  # each attempt as a new process: only the store holds kernels
        if attempt == 2:  # damage every entry: each is refused, compiled again and rewritten
            for f in os.listdir(empty_store.path):
                path = os.path.join(empty_store.path, f)
                blob = open(path, "rb").read()
                open(path, "wb").write(blob[: len(blob) // 2])
        misses = empty_store.misses
        gpu = G.GPUBackend(dtype="float64")
        gpu.load(x)
        gpu.warmup(9, 23)
        results.append(gpu.step(c))
        gpu.close()
        if attempt == 1:
            assert empty_store.misses == misses, "a warm store compiled nothing"
        else:
            assert empty_store.misses > misses
    for r in results[1:]:  # the same kernels: the same step up to the order of the atomic additions
        assert np.array_equal(r.counts, results[0].counts) and r.changed == results[0].changed
        assert np.abs(r.sums - results[0].sums).max() <= 1e-12 * np.abs(results[0].sums).max()
        assert abs(r.sse - results[0].sse) <= 1e-12 * results[0].sse


@pytest.mark.gpu
@needs_gpu
def test_a_kernel_launched_again_is_not_read_from_the_store_again(empty_store):
    """The initialisations launch a few kernels hundreds of times: each is read (and loaded
    onto the device) once per process, not at every launch."""
    G = _real_gpu()
    x, c = _blobs(20_000, 13, 5, seed=7)
    gpu = G.GPUBackend(dtype="float64")
    gpu.load(x)
    d2 = gpu.dist2_to(c[0])
    gpu.lower_d2(d2, c[1])
    reads = empty_store.hits + empty_store.misses
    assert reads >= 2
    for j in range(5):
        gpu.lower_d2(d2, c[j])
        gpu.dist2_to(c[j])
    assert empty_store.hits + empty_store.misses == reads
    gpu.close()


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("method", ["k-means++", "k-means||"])
@pytest.mark.parametrize("weighted", [False, True])
def test_gpu_init_equals_cpu_init(method, weighted):
    """On the device the initialisations' passes give the CPU's centres, bit for bit (no FMA)."""
    from mpikmeans.backends.cpu import CPUBackend
    from mpikmeans.comm import SerialComm
    from mpikmeans.init import initial_centres

    G = _real_gpu()
    x, _ = _blobs(120_000, 20, 16, seed=7, offset=50.0)
    w = np.random.default_rng(8).uniform(0.5, 2.0, len(x)) if weighted else None
    got = []
    for backend in (CPUBackend(), G.GPUBackend()):
        backend.load(x, w)
        got.append(initial_centres(SerialComm(), method, 16, x, 0, len(x), 3, weights=w, backend=backend))
        backend.close()
    assert got[0].tobytes() == got[1].tobytes()



def test_step_graphs_only_with_prepared_launches_and_not_simulated():
    """A step runs as one CUDA graph (launch.StepGraph) only where its launches are prepared parameter blocks,
    not under the simulator, and unless ``tune={"graph": false}``."""
    from mpikmeans.backends.gpu import launch

    real = not launch.SIM
    assert launch.graphs_wanted({}, True) is real
    assert launch.graphs_wanted({"graph": True}, True) is real
    assert launch.graphs_wanted({"graph": False}, True) is False
    assert launch.graphs_wanted({}, False) is False


def test_gemm_screen_only_where_the_device_gives_its_shared_memory():
    """The GEMM screen's 57,856 bytes of static shared memory (ptxas for sm_90) need compute capability
    8.0 or later and as much opt-in shared memory: older devices keep the fused kernel."""
    from mpikmeans.backends.gpu import gemm

    assert gemm.SCREEN_SMEM == 57856
    assert gemm.device_fits((9, 0), 227 * 1024) and gemm.device_fits((8, 6), 99 * 1024)
    assert not gemm.device_fits((7, 5), 64 * 1024)  # T4: 64 KB opt-in, but not static
    assert not gemm.device_fits((8, 0), 48 * 1024)
    assert gemm.padded_centres(1000) == 1024 and gemm.padded_centres(128) == 128


def test_gemm_screen_choice_rule():
    """TF32 while it flags at most 1 % of the rows (+ 16); back from float32 only when its flagged
    rows, 200 times over, are within that (bench/experiments/tf32_flagged.py's ratios: 49-190)."""
    from mpikmeans.backends.gpu.tensor import next_screen

    n = 300_000
    assert next_screen(True, 0, n) and next_screen(True, 3016, n)
    assert not next_screen(True, 3017, n) and not next_screen(True, 33_525, n)
    assert next_screen(False, 0, n) and next_screen(False, 15, n)
    assert not next_screen(False, 16, n) and not next_screen(False, 27, n)  # noise 4, rows as centres
    assert next_screen(True, 16, 10) and not next_screen(True, 17, 10)  # a few rows decide nothing


def test_gemm_path_rule():
    """The GEMM path: centres that do not fit in shared memory with M >= 64 (D), or with the TF32 cascade
    from K = 512 and M = 32 on (B); never for the final assignment or on devices without the screen's
    shared memory; tune {"gemm": bool} decides instead."""
    from types import SimpleNamespace

    from mpikmeans.backends.gpu.gemm import wanted

    h100 = SimpleNamespace(cc=(9, 0), smem_optin=227 * 1024)
    t4 = SimpleNamespace(cc=(7, 5), smem_optin=64 * 1024)
    assert wanted(False, 257, h100, {}, False, False, 1000, False)  # D
    assert wanted(True, 32, h100, {}, False, False, 1000, True)  # B, TF32 with the cascade
    assert not wanted(True, 32, h100, {}, False, False, 1000, False)  # B without it: the fused kernel
    assert not wanted(True, 100, h100, {}, False, False, 50, True)  # A
    assert not wanted(True, 16, h100, {}, False, False, 1000, True) and not wanted(True, 32, h100, {}, False,
                                                                                 False, 511, True)
    assert not wanted(True, 32, h100, {}, True, False, 1000, True)  # the final assignment
    assert not wanted(True, 32, h100, {}, False, True, 1000, True)  # streamed rows
    assert not wanted(False, 257, t4, {}, False, False, 1000, True)
    assert wanted(True, 3, t4, {"gemm": True}, False, False, 7, False)
    assert not wanted(False, 257, h100, {"gemm": False}, False, False, 1000, True)


def test_gemm_screen_cascade_rule():
    """With the cascade, TF32 while it leaves at most 30 % of the rows it searched (+ 16) to the float32
    screen, back from float32 when its flagged rows, 200 times over, are within that."""
    from mpikmeans.backends.gpu.tensor import next_screen

    n = 300_000
    assert next_screen(True, 90_016, n, True) and not next_screen(True, 90_017, n, True)
    assert next_screen(False, 450, n, True) and not next_screen(False, 451, n, True)
    assert next_screen(True, 3_010, 10_000, True) and not next_screen(True, 3_020, 10_000, True)
    assert next_screen(True, 16, 0, True) and not next_screen(True, 17, 0, True)


def test_gemm_screen_splits_the_centre_tiles_of_few_row_tiles():
    """D's shape (8 centre tiles, 264 blocks): a late step's one listed row tile goes to 8 blocks; 300 row
    tiles (two waves unsplit) in groups of 4 (five waves of 2 centre tiles); 235 or 264 row tiles (one
    wave), a full step's 2344 and one centre tile are never split; the scratch's units and the most groups
    bound the split; the fewest groups win a tie."""
    from mpikmeans.backends.gpu.gemm import _centre_groups as groups

    ucap = 2 * 264 * 8
    assert groups(1, 264, ucap, 8, 8) == 8
    assert groups(33, 264, ucap, 8, 8) == 8  # 264 units: one wave of one centre tile each
    assert groups(300, 264, ucap, 8, 8) == 4
    assert groups(235, 264, ucap, 8, 8) == 1 and groups(264, 264, ucap, 8, 8) == 1
    assert groups(2344, 264, ucap, 8, 8) == 1
    assert groups(1, 264, ucap, 1, 1) == 1 and groups(1, 264, 0, 8, 8) == 1
    assert groups(1, 264, ucap, 8, 3) == 3 and groups(300, 264, 900, 8, 8) == 2
    assert groups(3, 2, 8, 2, 2) == 2  # three row tiles, two blocks: three waves of one centre tile, not two of two


def test_exact_kernel_groups_fill_its_block():
    """A flagged row's group of threads: whole warps, a power of two of them (the groups tile the block),
    as many threads as centres up to the block."""
    pytest.importorskip("numba")
    from mpikmeans.backends.gpu.recheck import RC_WARPS, row_threads

    from mpikmeans.backends.gpu.device import SIM

    nt = 32 * RC_WARPS
    for k in (1, 16, 32, 33, 50, 64, 65, 100, 130, 255, 256, 257, 1000, 10**5):
        t = row_threads(k)
        assert t % 32 == 0 and nt % t == 0 and (t == 32 or t // 2 < k), (k, t)
        assert t >= min(k, nt) or SIM, (k, t)
    assert row_threads(1000, {"rc_threads": 64}) == 64
    for bad in (16, 48, 2 * nt):
        with pytest.raises(ValueError, match="rc_threads"):
            row_threads(10, {"rc_threads": bad})


def test_sums_by_label_walk_threads():
    """The walk's block: whole warps, at most WALK_NT_MAX, the attributes in as few passes as that allows."""
    pytest.importorskip("numba")
    from mpikmeans.backends.gpu.bylabel import WALK_NT_MAX, walk_threads

    for m in (1, 3, 32, 33, 257, 512, 513, 600, 1100, 5000):
        t = walk_threads(m)
        passes = -(-m // t)
        assert t % 32 == 0 and t <= WALK_NT_MAX and passes == -(-m // WALK_NT_MAX), (m, t)
