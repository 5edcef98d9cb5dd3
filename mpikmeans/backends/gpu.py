"""GPU backend: one Lloyd iteration per rank on one NVIDIA GPU, with Numba CUDA kernels.

Data layout and kernels (see ``bench/GPU_NOTES.md`` for the measurements behind them):

* The rank's rows live on the device column-major (structure of arrays, ``m x ld``),
  so that a warp reads one attribute of 32 consecutive rows in one transaction.
  They are copied once, in :meth:`GPUBackend.load`, and stay resident; data larger
  than the device (or any run with ``chunk_rows``) streams through in chunks from
  pinned host memory on two CUDA streams, the copy of one chunk overlapping the
  kernels on the other.
* **Assignment** (pass 1 of the fused step kernel): every thread owns ``R`` rows of a
  tile and keeps ``R x TC`` running distances in registers; the centres sit in shared
  memory and are read four at a time (one 16-byte broadcast load feeds ``4 R`` FMAs),
  so the K = 1000 case is arithmetic, not load, bound.  Distances are computed in
  float32 in the dot-product form ``|z|^2 - 2 y.z`` on data shifted by the mean of the
  centres (``y = x - s``, ``z = c - s``); the result is *certified*: each row keeps its
  best and second-best distance, and a row whose gap is not larger than a rigorous
  bound on the float32 rounding error is handed to an exact float64 kernel
  (``_recheck``), which evaluates ``sum((x - c)^2)`` with the CPU backend's
  tie-break.  Labels are therefore those of the exact float64 computation for either
  storage dtype, at float32 arithmetic speed.
* **Summing** (pass 2, fused, reading the tile again while it is still in L2): the
  tile's rows are counting-sorted by label in shared memory; each thread then owns
  one attribute and walks a slice of the sorted rows, accumulating runs of equal
  labels in float64 registers and flushing each run into per-block float64 partial
  sums in shared memory (the specification's calcSums).  The block adds its partial
  sums into the global float64 sums with one atomic per (cluster, attribute) when it
  finishes.  SSE is accumulated per element as ``(x - c)^2`` in float64, so it is the
  exact diff form, not the cancelling dot form.  When ``K x M`` float64 sums do not
  fit in shared memory, pass 2 adds into the global sums with atomics instead
  (slower, never a launch failure).

Tie-breaking follows the backend contract: equal distances go to the lowest centre
index.  Sums, counts and SSE are always float64; ``dtype`` is the storage precision of
the rows on the device.
"""

from __future__ import annotations

import functools
import logging
import warnings
from dataclasses import dataclass

import numpy as np

from . import Backend, BackendInfo, BackendUnavailable, StepResult

log = logging.getLogger(__name__)

try:  # numba-cuda is an optional dependency
    from numba import cuda
    from numba import float32, float64, int32, int64

    _HAVE_NUMBA_CUDA = True
    # small launches (the warm-up, tiny ranks) are deliberate; numba-cuda's
    # warning about them carries terminal colour codes into batch job logs
    warnings.filterwarnings("ignore", message=".*Grid size .* will likely result in GPU under-utilization")
except ImportError:  # pragma: no cover - exercised only where numba-cuda is absent
    cuda = None
    _HAVE_NUMBA_CUDA = False


def _simulating() -> bool:
    if not _HAVE_NUMBA_CUDA:
        return False
    try:
        from numba.cuda import config as _cfg
    except ImportError:  # pragma: no cover
        from numba import config as _cfg
    return bool(getattr(_cfg, "ENABLE_CUDASIM", False))


SIM = _simulating()

#: float32 unit roundoff; the certification bound is written in multiples of it.
_U32 = 2.0 ** -24
#: rows whose |y|^2 + 2 max|z|^2 exceeds this go to the exact path (float32 overflow guard).
_BIG = 1.0e30
_SUPPORTED_DTYPES = ("float64", "float32")
#: the 16-byte centre loads need an aligned shared base (the simulator refuses the argument)
_SMEM_ALIGN = None if SIM else 16


# ---------------------------------------------------------------------------
# Device discovery
# ---------------------------------------------------------------------------


def gpu_available() -> bool:
    """Whether the GPU backend can run here.

    Returns
    -------
    bool
        True when numba-cuda imports and at least one usable CUDA device is
        visible, or when the CUDA simulator is enabled.
    """
    if not _HAVE_NUMBA_CUDA:
        return False
    if SIM:
        return True
    try:
        return bool(cuda.is_available()) and len(cuda.gpus) > 0
    except Exception:  # driver missing or broken: not usable
        return False


def gpu_count() -> int:
    """Number of visible CUDA devices (1 under the simulator, 0 without numba-cuda)."""
    if not gpu_available():
        return 0
    if SIM:
        return 1
    try:
        return len(cuda.gpus)
    except Exception:
        return 0


def _device_total_memory(index: int) -> int:
    """Total memory of device ``index`` in bytes, without creating a context."""
    try:
        from numba.cuda.cudadrv.driver import driver

        dev = driver.get_device(index)
        handle = getattr(dev, "id", index)
        res = driver.cuDeviceTotalMem(handle)
        return int(res[-1] if isinstance(res, tuple) else res)
    except Exception:
        pass
    try:
        from cuda.bindings import driver as cudrv

        err, dev = cudrv.cuDeviceGet(index)
        err, mem = cudrv.cuDeviceTotalMem(dev)
        return int(mem)
    except Exception:
        return 0


def device_descriptions() -> list[dict]:
    """Describe every visible CUDA device.

    Returns
    -------
    list of dict
        One dict per device with ``index`` (int), ``name`` (str),
        ``total_memory`` (bytes, int; 0 when unknown) and ``compute_capability``
        (``"major.minor"``).  Empty when no GPU is usable.
    """
    if not gpu_available():
        return []
    if SIM:
        return [{"index": 0, "name": "CUDA simulator", "total_memory": 0, "compute_capability": "sim"}]
    out = []
    for dev in cuda.list_devices():
        name = dev.name.decode() if isinstance(dev.name, bytes) else str(dev.name)
        cc = dev.compute_capability
        out.append(
            {
                "index": int(dev.id),
                "name": name,
                "total_memory": _device_total_memory(int(dev.id)),
                "compute_capability": f"{cc[0]}.{cc[1]}",
            }
        )
    return out


def select_device_for(node_rank: int, node_size: int, share: bool) -> int:
    """Pick this rank's device from its node-local rank.

    Parameters
    ----------
    node_rank : int
        Rank among the MPI processes on this node (``Split_type(COMM_TYPE_SHARED)``).
    node_size : int
        Number of MPI processes on this node.
    share : bool
        Allow several ranks on one GPU (``--share-gpus``).

    Returns
    -------
    int
        Device index, ``node_rank % gpu_count()``.

    Raises
    ------
    BackendUnavailable
        No GPU is usable, or more ranks than GPUs on this node without ``share``.
    """
    count = gpu_count()
    if count == 0:
        raise BackendUnavailable("no usable CUDA GPU on this node (numba-cuda and a CUDA driver are needed)")
    if node_size > count and not share:
        raise BackendUnavailable(
            f"{node_size} ranks on this node but only {count} visible GPU(s): start at most {count} "
            f"rank(s) per node, or pass --share-gpus to let ranks share GPUs"
        )
    return node_rank % count


# ---------------------------------------------------------------------------
# Kernels
# ---------------------------------------------------------------------------

if _HAVE_NUMBA_CUDA and not SIM:
    from llvmlite import ir as _llir
    from numba import types as _nbtypes
    from numba.cuda.extending import intrinsic as _intrinsic

    @_intrinsic
    def _ld4(typingctx, arr, idx):
        """Four consecutive elements ``arr[idx:idx+4]`` in one 16-byte vector load.

        ``idx`` must be a multiple of 4 and the array 16-byte aligned; Numba emits
        scalar loads for the plain indexing form, which would make the centre reads
        (not the FMAs) the limit of the assignment loop.
        """
        dt = arr.dtype
        sig = _nbtypes.UniTuple(dt, 4)(arr, idx)

        def codegen(context, builder, signature, args):
            aryty = signature.args[0]
            ary = context.make_array(aryty)(context, builder, args[0])
            i = context.cast(builder, args[1], signature.args[1], _nbtypes.intp)
            ptr = builder.gep(ary.data, [i])
            lt = context.get_data_type(dt)
            vptr = builder.bitcast(ptr, _llir.VectorType(lt, 4).as_pointer())
            v = builder.load(vptr, align=16)
            vals = [builder.extract_element(v, _llir.Constant(_llir.IntType(32), q)) for q in range(4)]
            return context.make_tuple(builder, signature.return_type, vals)

        return sig, codegen

else:

    def _ld4(arr, idx):
        return arr[idx], arr[idx + 1], arr[idx + 2], arr[idx + 3]


# modes of the fused kernel
_MODE_STEP_SHARED = 0  # step, per-block partial sums in shared memory
_MODE_STEP_GLOBAL = 1  # step, sums straight into global memory with atomics
_MODE_ASSIGN = 2  # labels and exact squared distances only

# indices into the int32 'offs' array (shared-memory layout, computed on the host)
_O_CM, _O_CC, _O_SH, _O_SUMS, _O_CNT, _O_HIST, _O_START, _O_PERM, _O_SLAB, _O_LAB, _O_W, _O_XS, _O_RED, _O_JC, _O_BRP, _O_TMP = range(16)
_N_OFFS = 16


@functools.lru_cache(maxsize=None)
def _fused_kernel(storage: str, R: int, TC: int, NT: int, weighted: bool, mode: int, centres_shared: bool,
                  maxreg: int, k_c: int, m_c: int, nct_c: int, offs_c: tuple):
    """Build (once per configuration and shape) the fused assignment + accumulation kernel.

    Everything but the rows is a compile-time constant: rows per thread ``R``, centres
    per register tile ``TC``, threads per block ``NT``, weighting, mode, where the
    centres are read from, and the shape (``k_c``, ``m_c``, ``nct_c``) with its
    shared-memory layout ``offs_c``.  Loops over them unroll, the per-thread arrays stay
    in registers, and no register holds an offset (a run compiles once per K x M).
    The ``m, k, nct, offs`` arguments are kept in the signature but not read.

    Kernel arguments (all arrays 1-D, C-contiguous, on the device)
    ---------------------------------------------------------------
    x : storage dtype, (m * ld,)      rows, column-major: x[j * ld + i]
    n, m, ld, k, nct : int64          rows, attributes, row stride, centres, centre tiles
    cm : float32, (nct * m * TC,)      -2 (c - s) laid out [tile][attribute][TC]
    cc : float32, (nct * TC,)          |c - s|^2 (+inf for padding)
    shift : storage dtype, (m,)       s, the mean of the centres
    c64 : float64, (k * m,)           centres, row-major
    tolf, zlim : float32              certification bound: tol = tolf * (|y|^2 + zlim) + tiny
    w : float64, (n,) or (1,)         weights (read only when weighted)
    labels : int32, (n,)              previous labels in, new labels out
    dist2 : float64, (n,) or (1,)     exact squared distances (assign mode)
    sums : float64, (k * m,)          accumulated (global) sums
    counts : float64, (k,)
    stats : float64, (1,)             SSE
    ctrs : int64, (2,)                [changed rows, flagged rows]
    flags : int32, (n,)               indices of rows handed to the exact kernel
    offs : int32, (16,)               shared-memory layout (see _plan_shared)
    """
    DT = float64 if storage == "float64" else float32
    BR = NT * R
    ACC = R * TC
    JB = max(1, min(4, 8 // R))  # attributes per prefetch block (<= 8 values in flight)
    XB = JB * R
    SJ = max(1, 16 // R)  # pass-2 staging: 16 loads in flight per thread
    SV = SJ * R
    EB = 8  # epilogue (global sums / assign): attributes per batch
    WB = 4  # pass-2 walk: sorted rows per batch
    TC4 = TC // 4
    SHARED = mode == _MODE_STEP_SHARED
    GLOBAL = mode == _MODE_STEP_GLOBAL
    ASSIGN = mode == _MODE_ASSIGN
    WEIGHTED = weighted
    CSH = centres_shared
    F32_INF = np.float32(np.inf)
    TINY = np.float32(1.0e-36)
    BIG = np.float32(_BIG)

    K_C, M_C, NCT_C = int(k_c), int(m_c), int(nct_c)
    (O_CM, O_CC, O_SH, O_SUMS, O_CNT, O_HIST, O_START, O_PERM, O_SLAB, O_LAB, O_W, O_XS, O_RED,
     O_JC, O_BRP, O_TMP) = (int(v) for v in offs_c)

    def km_fused(x, n, _m, ld, _k, _nct, cm, cc, shift, c64, tolf, zlim, w, labels, dist2,
                 sums, counts, stats, ctrs, flags, _offs):
        smf = cuda.shared.array(0, dtype=float32, alignment=_SMEM_ALIGN)
        smd = cuda.shared.array(0, dtype=float64)
        smi = cuda.shared.array(0, dtype=int32)
        smx = cuda.shared.array(0, dtype=DT)
        tid = cuda.threadIdx.x
        m = M_C
        k = K_C
        nct = NCT_C
        o_cm = O_CM
        o_cc = O_CC
        o_sh = O_SH
        o_sums = O_SUMS
        o_cnt = O_CNT
        o_hist = O_HIST
        o_start = O_START
        o_perm = O_PERM
        o_slab = O_SLAB
        o_w = O_W
        o_xs = O_XS
        o_red = O_RED
        jc = O_JC
        brp = O_BRP
        o_tmp = O_TMP
        kp = nct * TC

        # ---- block set-up: centres (and their norms) to shared memory, zero partials
        if CSH:
            for q in range(tid, kp * m, NT):
                smf[o_cm + q] = cm[q]
        for q in range(tid, kp, NT):
            smf[o_cc + q] = cc[q]
        for q in range(tid, m, NT):
            smx[o_sh + q] = shift[q]
        if SHARED:
            for q in range(tid, k * m, NT):
                smd[o_sums + q] = 0.0
            for q in range(tid, k, NT):
                smd[o_cnt + q] = 0.0
        if tid == 0:
            smd[o_red] = 0.0
            smi[o_tmp] = 0
        cuda.syncthreads()

        sse_t = 0.0
        changed_t = 0
        acc = cuda.local.array(ACC, dtype=float32)
        yv = cuda.local.array(R, dtype=float32)
        xb = cuda.local.array(XB, dtype=DT)
        xn = cuda.local.array(XB, dtype=DT)
        sv = cuda.local.array(SV, dtype=DT)
        ev = cuda.local.array(EB, dtype=float64)
        ec = cuda.local.array(EB, dtype=float64)
        wl = cuda.local.array(WB, dtype=int32)
        wx = cuda.local.array(WB, dtype=float64)
        wc = cuda.local.array(WB, dtype=float64)
        ww = cuda.local.array(WB, dtype=float64)
        yy = cuda.local.array(R, dtype=float32)
        b1 = cuda.local.array(R, dtype=float32)
        b2 = cuda.local.array(R, dtype=float32)
        i1 = cuda.local.array(R, dtype=int32)
        labr = cuda.local.array(R, dtype=int32)
        pos = cuda.local.array(R, dtype=int32)

        ntiles = (n + BR - 1) // BR
        for tile in range(cuda.blockIdx.x, ntiles, cuda.gridDim.x):
            row0 = tile * BR
            # ================= pass 1: certified nearest centre =================
            for r in range(R):
                yy[r] = float32(0.0)
                b1[r] = F32_INF
                b2[r] = F32_INF
                i1[r] = 0
            for ct in range(nct):
                for r in range(R):
                    for c in range(TC):
                        acc[r * TC + c] = smf[o_cc + ct * TC + c]
                cbase = ct * m * TC
                # the rows' values for attributes jb..jb+JB-1 are loaded one block ahead,
                # so the global loads of the next block overlap the FMAs of this one
                for q in range(JB):
                    for r in range(R):
                        i = row0 + tid + r * NT
                        xb[q * R + r] = x[q * ld + i] if (i < n and q < m) else DT(0.0)
                for jb in range(0, m, JB):
                    for q in range(JB):
                        jn = jb + JB + q
                        for r in range(R):
                            i = row0 + tid + r * NT
                            xn[q * R + r] = x[jn * ld + i] if (i < n and jn < m) else DT(0.0)
                    for q in range(JB):
                        j = jb + q
                        if j < m:
                            sj = smx[o_sh + j]
                            for r in range(R):
                                yv[r] = float32(xb[q * R + r] - sj)
                            if ct == 0:
                                for r in range(R):
                                    yy[r] += yv[r] * yv[r]
                            # the next 16-byte vector is requested before this one is used
                            if CSH:
                                nxt = _ld4(smf, o_cm + cbase + j * TC)
                            else:
                                nxt = _ld4(cm, cbase + j * TC)
                            for c4 in range(TC4):
                                w0, w1, w2, w3 = nxt
                                if c4 + 1 < TC4:
                                    if CSH:
                                        nxt = _ld4(smf, o_cm + cbase + j * TC + 4 * c4 + 4)
                                    else:
                                        nxt = _ld4(cm, cbase + j * TC + 4 * c4 + 4)
                                for r in range(R):
                                    a = r * TC + 4 * c4
                                    acc[a] += yv[r] * w0
                                    acc[a + 1] += yv[r] * w1
                                    acc[a + 2] += yv[r] * w2
                                    acc[a + 3] += yv[r] * w3
                    for q in range(XB):
                        xb[q] = xn[q]
                # fold this tile of centres into best / second best (strict '<' keeps
                # the lowest index on ties; an exact tie leaves gap 0, so it is rechecked)
                for c in range(TC):
                    kk = ct * TC + c
                    for r in range(R):
                        d = acc[r * TC + c]
                        o1 = b1[r]
                        o2 = b2[r]
                        lt1 = d < o1
                        # selects, not branches: b2 <- min(b2, max(b1, d)), b1 <- min(b1, d)
                        b2[r] = o1 if lt1 else (d if d < o2 else o2)
                        b1[r] = d if lt1 else o1
                        i1[r] = kk if lt1 else i1[r]
            # ---- certify, write labels, flag the rest for the exact kernel
            for r in range(R):
                i = row0 + tid + r * NT
                lab = -1
                if i < n:
                    scale = yy[r] + zlim
                    tol = tolf * scale + TINY
                    gap = b2[r] - b1[r]
                    if gap > tol and scale < BIG:
                        lab = i1[r]
                        if ASSIGN:
                            labels[i] = lab
                        else:
                            old = labels[i]
                            if old != lab:
                                changed_t += 1
                                labels[i] = lab
                    else:
                        p = cuda.atomic.add(ctrs, 1, 1)
                        flags[p] = i
                labr[r] = lab
                if SHARED:
                    if WEIGHTED:
                        smd[o_w + tid + r * NT] = w[i] if i < n else 0.0

            if ASSIGN or GLOBAL:
                # exact float64 distance to the chosen centre (and, for a step, the
                # global-atomic sums); the thread's rows are still in L1/L2
                for r in range(R):
                    lab = labr[r]
                    if lab >= 0:
                        i = row0 + tid + r * NT
                        wi = w[i] if WEIGHTED else 1.0
                        cb = lab * m
                        s2 = 0.0
                        # EB attributes per batch: their loads are in flight together
                        for jb in range(0, m, EB):
                            for q in range(EB):
                                j = jb + q
                                if j < m:
                                    ev[q] = float64(x[j * ld + i])
                                    ec[q] = c64[cb + j]
                            for q in range(EB):
                                j = jb + q
                                if j < m:
                                    t = ev[q] - ec[q]
                                    s2 += t * t
                                    if GLOBAL:
                                        cuda.atomic.add(sums, cb + j, wi * ev[q])
                        if ASSIGN:
                            dist2[i] = s2
                        else:
                            sse_t += wi * s2
                            cuda.atomic.add(counts, lab, wi)

            if SHARED:
                # ================= pass 2: fused per-block sums =================
                # counting sort of the tile's rows by label
                for q in range(tid, k, NT):
                    smi[o_hist + q] = 0
                cuda.syncthreads()
                for r in range(R):
                    lab = labr[r]
                    if lab >= 0:
                        pos[r] = cuda.atomic.add(smi, o_hist + lab, 1)
                cuda.syncthreads()
                # exclusive scan of the histogram into start[0..k]
                if k <= 4 * NT:
                    for q in range(tid, k + 1, NT):
                        s = 0
                        for e in range(q):
                            s += smi[o_hist + e]
                        smi[o_start + q] = s
                else:
                    if tid == 0:
                        s = 0
                        for e in range(k):
                            smi[o_start + e] = s
                            s += smi[o_hist + e]
                        smi[o_start + k] = s
                cuda.syncthreads()
                for r in range(R):
                    lab = labr[r]
                    if lab >= 0:
                        dst = smi[o_start + lab] + pos[r]
                        smi[o_perm + dst] = tid + r * NT
                        smi[o_slab + dst] = lab
                if not WEIGHTED:
                    for q in range(tid, k, NT):
                        smd[o_cnt + q] += float64(smi[o_hist + q])
                cuda.syncthreads()
                nval = smi[o_start + k]
                groups = NT // jc
                g = tid // jc
                jj = tid - g * jc
                p0 = (g * nval) // groups
                p1 = ((g + 1) * nval) // groups
                for j0 in range(0, m, jc):
                    jn = min(jc, m - j0)
                    # stage attributes j0..j0+jn of the tile (coalesced, mostly from L2)
                    # SJ attributes x R rows per batch, loads issued before any store
                    for jb in range(0, jn, SJ):
                        for q in range(SJ):
                            jr = jb + q
                            for r in range(R):
                                i = row0 + tid + r * NT
                                sv[q * R + r] = x[(j0 + jr) * ld + i] if (jr < jn and i < n) else DT(0.0)
                        for q in range(SJ):
                            jr = jb + q
                            if jr < jn:
                                for r in range(R):
                                    smx[o_xs + jr * brp + tid + r * NT] = sv[q * R + r]
                    cuda.syncthreads()
                    if g < groups and jj < jn:
                        j = j0 + jj
                        cur = -1
                        run_s = 0.0
                        run_w = 0.0
                        # WB sorted rows per batch: their loads (label, row, value, centre
                        # coordinate) are independent, only the run logic is sequential
                        for pb in range(p0, p1, WB):
                            for u in range(WB):
                                p = pb + u
                                if p < p1:
                                    la = smi[o_slab + p]
                                    rl = smi[o_perm + p]
                                    wl[u] = la
                                    wx[u] = float64(smx[o_xs + jj * brp + rl])
                                    wc[u] = c64[la * m + j]
                                    if WEIGHTED:
                                        ww[u] = smd[o_w + rl]
                                else:
                                    wl[u] = -1
                            for u in range(WB):
                                lab = wl[u]
                                if lab >= 0:
                                    if lab != cur:
                                        if cur >= 0:
                                            cuda.atomic.add(smd, o_sums + cur * m + j, run_s)
                                            if WEIGHTED and j == 0:
                                                cuda.atomic.add(smd, o_cnt + cur, run_w)
                                        cur = lab
                                        run_s = 0.0
                                        run_w = 0.0
                                    v = wx[u]
                                    t = v - wc[u]
                                    if WEIGHTED:
                                        wi = ww[u]
                                        run_s += wi * v
                                        run_w += wi
                                        sse_t += wi * (t * t)
                                    else:
                                        run_s += v
                                        sse_t += t * t
                        if cur >= 0:
                            cuda.atomic.add(smd, o_sums + cur * m + j, run_s)
                            if WEIGHTED and j == 0:
                                cuda.atomic.add(smd, o_cnt + cur, run_w)
                    cuda.syncthreads()

        # ---- block epilogue: one global atomic per (cluster, attribute)
        if not ASSIGN:
            cuda.atomic.add(smd, o_red, sse_t)
            cuda.atomic.add(smi, o_tmp, changed_t)
        cuda.syncthreads()
        if SHARED:
            for q in range(tid, k * m, NT):
                v = smd[o_sums + q]
                if v != 0.0:
                    cuda.atomic.add(sums, q, v)
            for q in range(tid, k, NT):
                v = smd[o_cnt + q]
                if v != 0.0:
                    cuda.atomic.add(counts, q, v)
        if not ASSIGN and tid == 0:
            cuda.atomic.add(stats, 0, smd[o_red])
            cuda.atomic.add(ctrs, 0, int64(smi[o_tmp]))

    if SIM:
        return cuda.jit(km_fused)
    # a register cap trades scheduling freedom for resident warps (see GPU_NOTES.md)
    return cuda.jit(km_fused, fastmath=False, max_registers=maxreg or None)


#: warps per block of the exact (recheck) kernel
_RC_WARPS = 4


@functools.lru_cache(maxsize=None)
def _recheck_kernel(storage: str, weighted: bool, assign: bool):
    """Exact float64 assignment of the flagged rows, one warp per row.

    Lanes split the centres; each computes ``sum_j (x_j - c_kj)^2`` in float64 in
    attribute order, like the CPU backend, keeping the lowest index on ties; lane 0
    reduces over the lanes.  For a step the row is then added to the global sums,
    counts, SSE and change count (atomics: flagged rows are rare).

    Arguments: x, n, m, ld, k, c64, w, labels, dist2, sums, counts, stats, ctrs, flags
    (as in :func:`_fused_kernel`).
    """
    NT = 32 * _RC_WARPS
    WEIGHTED = weighted
    ASSIGN = assign
    F64_INF = np.inf

    def km_recheck(x, n, m, ld, k, c64, w, labels, dist2, sums, counts, stats, ctrs, flags):
        bd_s = cuda.shared.array(NT, dtype=float64)
        bi_s = cuda.shared.array(NT, dtype=int32)
        tid = cuda.threadIdx.x
        lane = tid % 32
        wib = tid // 32
        nflag = ctrs[1]
        sse_w = 0.0
        changed_w = 0
        step = cuda.gridDim.x * _RC_WARPS
        for base in range(cuda.blockIdx.x * _RC_WARPS, nflag, step):
            f = base + wib
            bd = F64_INF
            bi = k
            i = 0
            if f < nflag:
                i = flags[f]
                for kk in range(lane, k, 32):
                    d = 0.0
                    cb = kk * m
                    for j in range(m):
                        t = float64(x[j * ld + i]) - c64[cb + j]
                        d += t * t
                    if d < bd:
                        bd = d
                        bi = kk
            bd_s[tid] = bd
            bi_s[tid] = bi
            cuda.syncthreads()
            if f < nflag and lane == 0:
                for q in range(1, 32):
                    dq = bd_s[tid + q]
                    iq = bi_s[tid + q]
                    if dq < bd or (dq == bd and iq < bi):
                        bd = dq
                        bi = iq
                if bi >= k:  # every distance NaN: label 0 and an infinite distance, as the CPU does
                    bi = 0
                    bd = F64_INF
                bi_s[tid] = bi
                bd_s[tid] = bd
                if ASSIGN:
                    labels[i] = bi
                    dist2[i] = bd
                else:
                    wi = w[i] if WEIGHTED else 1.0
                    if labels[i] != bi:
                        changed_w += 1
                        labels[i] = bi
                    sse_w += wi * bd
                    cuda.atomic.add(counts, bi, wi)
            cuda.syncthreads()
            if not ASSIGN and f < nflag:
                lab = bi_s[wib * 32]
                wi = w[i] if WEIGHTED else 1.0
                for j in range(lane, m, 32):
                    cuda.atomic.add(sums, lab * m + j, wi * float64(x[j * ld + i]))
            cuda.syncthreads()
        if not ASSIGN and lane == 0:
            if sse_w != 0.0:
                cuda.atomic.add(stats, 0, sse_w)
            if changed_w != 0:
                cuda.atomic.add(ctrs, 0, int64(changed_w))

    return cuda.jit(km_recheck)


@functools.lru_cache(maxsize=None)
def _transpose_kernel(storage: str):
    """Row-major float64 block (rows x m) -> column-major storage dtype, 32 x 32 tiles.

    Arguments: src (rows * m,), rows, m, dst (m * ld,), ld, row0.
    """
    DT = float64 if storage == "float64" else float32

    def km_transpose(src, rows, m, dst, ld, row0):
        tile = cuda.shared.array((32, 33), dtype=float64)
        tx = cuda.threadIdx.x
        ty = cuda.threadIdx.y
        i0 = cuda.blockIdx.x * 32
        j0 = cuda.blockIdx.y * 32
        for q in range(ty, 32, 8):
            i = i0 + q
            j = j0 + tx
            if i < rows and j < m:
                tile[q, tx] = src[i * m + j]
        cuda.syncthreads()
        for q in range(ty, 32, 8):
            j = j0 + q
            i = i0 + tx
            if i < rows and j < m:
                dst[j * ld + row0 + i] = DT(tile[tx, q])

    return cuda.jit(km_transpose)


@functools.lru_cache(maxsize=None)
def _zero_kernel():
    def kernel(a, d):
        i = cuda.grid(1)
        s = cuda.gridsize(1)
        for q in range(i, a.size, s):
            a[q] = 0.0
        for q in range(i, d.size, s):
            d[q] = 0

    return cuda.jit(kernel)


@functools.lru_cache(maxsize=None)
def _zero_ctr_kernel():
    def kernel(d):
        if cuda.grid(1) == 0:
            d[1] = 0

    return cuda.jit(kernel)


# ---------------------------------------------------------------------------
# Launch planning
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class _Plan:
    """One kernel configuration and its shared-memory layout."""

    mode: int
    R: int
    TC: int
    NT: int
    nct: int
    centres_shared: bool
    offs: tuple  # int32 offsets, see _O_*
    smem: int  # dynamic shared bytes
    maxreg: int = 0  # register cap per thread (0: compiler's choice)


def _round_up(a: int, b: int) -> int:
    return (a + b - 1) // b * b


def _plan_shared(k: int, m: int, storage: str, mode: int, R: int, TC: int, NT: int,
                 centres_shared: bool, weighted: bool, jc: int | None = None,
                 target: int | None = None) -> tuple[tuple, int]:
    """Byte layout of the dynamic shared memory; offsets in units of each view's dtype.

    ``jc`` attributes are staged per pass-2 chunk; when not given, the widest chunk
    (at most 32) that keeps the block within ``target`` bytes, so that the wanted
    number of blocks stays resident on a multiprocessor.
    """
    if jc is None:
        nchunks = max(1, -(-m // 32))
        while True:
            jc = -(-m // nchunks)
            offs, smem = _plan_shared(k, m, storage, mode, R, TC, NT, centres_shared, weighted, jc)
            if target is None or smem <= target or jc == 1 or mode != _MODE_STEP_SHARED:
                return offs, smem
            nchunks += 1
    dsize = 8 if storage == "float64" else 4
    kp = _round_up(k, TC)
    BR = NT * R
    off = 0

    def take(nbytes, align=16):
        nonlocal off
        off = _round_up(off, align)
        start = off
        off += nbytes
        return start

    b_cm = take(kp * m * 4 if centres_shared else 0)
    b_cc = take(kp * 4)
    b_sh = take(m * dsize)
    b_red = take(16)
    b_tmp = take(16)
    brp = BR + 1
    b_sums = b_cnt = b_hist = b_start = b_perm = b_slab = b_lab = b_w = b_xs = 0
    if mode == _MODE_STEP_SHARED:
        b_sums = take(k * m * 8)
        b_cnt = take(k * 8)
        b_hist = take(k * 4)
        b_start = take((k + 1) * 4)
        b_perm = take(BR * 4)
        b_slab = take(BR * 4)
        b_w = take(BR * 8 if weighted else 0)
        b_xs = take(jc * brp * dsize)
    offs = [0] * _N_OFFS
    offs[_O_CM] = b_cm // 4
    offs[_O_CC] = b_cc // 4
    offs[_O_SH] = b_sh // dsize
    offs[_O_SUMS] = b_sums // 8
    offs[_O_CNT] = b_cnt // 8
    offs[_O_HIST] = b_hist // 4
    offs[_O_START] = b_start // 4
    offs[_O_PERM] = b_perm // 4
    offs[_O_SLAB] = b_slab // 4
    offs[_O_LAB] = b_lab // 4
    offs[_O_W] = b_w // 8
    offs[_O_XS] = b_xs // dsize
    offs[_O_RED] = b_red // 8
    offs[_O_JC] = jc
    offs[_O_BRP] = brp
    offs[_O_TMP] = b_tmp // 4
    return tuple(offs), _round_up(off, 16)


def _choose_plan(k: int, m: int, storage: str, assign: bool, weighted: bool,
                 smem_limit: int, tune: dict, smem_sm: int = 228 * 1024) -> _Plan:
    """Pick rows per thread, centre tile, block size and the summing mode.

    Registers: each thread keeps ``R * TC`` float32 running distances; about 128 keeps
    the kernel near 170 registers.  ``K <= 64``: one tile of all centres.  Larger K:
    tiles of 32 or 64 centres with the rows re-read (from L1) per tile.
    """
    kp4 = _round_up(max(k, 1), 4)
    if "TC" in tune:
        TC = int(tune["TC"])
    elif kp4 <= 64:
        TC = kp4
    elif k <= 256:
        TC = 32
    else:
        TC = 64
    nct = -(-k // TC)
    if "R" in tune:
        R = int(tune["R"])
    else:
        # two rows per thread measured best for K = 16, 50 and 1000 (bench/GPU_NOTES.md)
        R = max(1, min(2, 128 // TC))
    NT = int(tune.get("NT", 256 if TC >= 64 else 128))
    if SIM:
        NT = int(tune.get("NT", 32))
    budget = int(tune.get("smem_budget", smem_limit))
    maxreg = int(tune.get("maxreg", 0))
    want_cs = tune.get("centres_shared")
    if assign:
        modes = [_MODE_ASSIGN]
    elif tune.get("sum_mode") == "global":
        modes = [_MODE_STEP_GLOBAL]
    else:
        modes = [_MODE_STEP_SHARED, _MODE_STEP_GLOBAL]
    blocks = int(tune.get("blocks", 2))
    target = None
    if not SIM:
        target = min(budget, smem_sm // blocks - 1024)
    jc = int(tune["JC"]) if "JC" in tune else None
    for mode in modes:
        for cs in ([want_cs] if want_cs is not None else [True, False]):
            offs, smem = _plan_shared(k, m, storage, mode, R, TC, NT, cs, weighted, jc, target)
            if smem <= budget:
                return _Plan(mode, R, TC, NT, nct, cs, offs, smem, maxreg)
    # the last resort always fits: no centres, no sums in shared memory
    mode = _MODE_ASSIGN if assign else _MODE_STEP_GLOBAL
    offs, smem = _plan_shared(k, m, storage, mode, R, TC, NT, False, weighted)
    return _Plan(mode, R, TC, NT, nct, False, offs, smem, maxreg)


def _prepare(kernel, args, nbytes: int) -> int | None:
    """Compile ``kernel`` for ``args``, allow ``nbytes`` of dynamic shared memory; return regs/thread.

    Past 48 KB a kernel must opt in to more dynamic shared memory
    (``CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES``), which Numba does not do.
    """
    if SIM:
        return None
    argtypes = tuple(kernel.typeof_pyval(a) for a in args)
    kobj = kernel.compile(argtypes)
    try:
        cufunc = kobj._codelibrary.get_cufunc()
    except Exception:  # pragma: no cover - numba internals moved
        return None
    if nbytes > 48 * 1024:
        from cuda.bindings import driver as cudrv
        from numba.cuda.cudadrv.driver import driver

        attr = cudrv.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
        driver.cuKernelSetAttribute(attr, int(nbytes), cufunc.handle, cufunc.device.id)
    try:
        return int(cufunc.attrs.regs)
    except Exception:  # pragma: no cover
        return None


# ---------------------------------------------------------------------------
# The backend
# ---------------------------------------------------------------------------


class _Centres:
    """Per-step centre data on the device (float32 tiles for pass 1, float64 for sums)."""

    def __init__(self, centres: np.ndarray, storage: str, TC: int, nct: int, bufs=None):
        k, m = centres.shape
        kp = nct * TC
        shift = centres.mean(axis=0)
        if storage == "float32":
            # the kernel subtracts in float32: shift by exactly the float32 value it uses
            shift_st = shift.astype(np.float32)
            shift = shift_st.astype(np.float64)
        else:
            shift_st = shift
        z = (centres - shift).astype(np.float32)
        z64 = z.astype(np.float64)
        cc = np.full(kp, np.inf, dtype=np.float32)
        norms = np.einsum("ij,ij->i", z64, z64)
        cc[:k] = norms.astype(np.float32)
        cm = np.zeros((nct, m, TC), dtype=np.float32)
        zt = np.zeros((kp, m), dtype=np.float32)
        zt[:k] = -2.0 * z
        cm[:] = zt.reshape(nct, TC, m).transpose(0, 2, 1)
        zmax = float(norms.max()) if k else 0.0
        # bound on |computed - exact| of (|z|^2 - 2 y.z) for one centre is
        # (m + 4)(1 + eps) u (|y|^2 + 2 max|z|^2); two centres, a computed |y|^2 and
        # a computed gap need a little more: factor 2.1 and m + 5
        self.tolf = np.float32(2.1 * (m + 5) * _U32)
        self.zlim = np.float32(min(2.0 * zmax * (1.0 + 1e-6), 3.0e38))
        # two host->device copies per step: a float32 pack (16-byte aligned tiles first)
        # and a float64 pack; the kernels get views
        f32 = [cm.ravel(), cc]
        if storage == "float32":
            f32.append(shift_st)
        pack32 = np.concatenate(f32)
        pack64 = np.concatenate([np.ascontiguousarray(centres, dtype=np.float64).ravel(), shift])
        # reuse the device buffers of the previous step (an allocation per step costs
        # more than the copy)
        if bufs is not None and bufs[0].shape == pack32.shape and bufs[1].shape == pack64.shape:
            d32, d64 = bufs
            d32.copy_to_device(pack32)
            d64.copy_to_device(pack64)
        else:
            d32 = cuda.to_device(pack32)
            d64 = cuda.to_device(pack64)
        a, b = kp * m, kp * m + kp
        self.cm = d32[:a]
        self.cc = d32[a:b]
        self.c64 = d64[: k * m]
        self.shift = d32[b:b + m] if storage == "float32" else d64[k * m:]
        self._keep = (d32, d64)
        if not np.all(np.isfinite(centres)):
            # non-finite centres: every row takes the exact path
            self.zlim = np.float32(np.inf)


class GPUBackend(Backend):
    """Lloyd iteration on one NVIDIA GPU with Numba CUDA kernels.

    Parameters
    ----------
    device : int, optional
        CUDA device index (default 0; the caller picks it with :func:`select_device_for`).
    dtype : {"float64", "float32"}
        Storage precision of the rows on the device.  Sums, counts and SSE are
        float64 either way; labels are those of the exact float64 distances of the
        stored values.
    chunk_rows : int, optional
        Stream the rows through the device in chunks of this many rows (pinned host
        memory, two streams) instead of keeping them resident.  Chosen automatically
        when the rows do not fit in device memory.
    tune : dict, optional
        Kernel overrides for benchmarks and tests: ``R``, ``TC``, ``NT``,
        ``sum_mode`` ("global"), ``centres_shared`` (bool), ``smem_budget`` (bytes).
    """

    name = "gpu"

    def __init__(self, device: int | None = None, dtype: str = "float64", chunk_rows: int | None = None,
                 *, tune: dict | None = None):
        if not gpu_available():
            raise BackendUnavailable("the GPU backend needs numba-cuda and a usable CUDA GPU")
        dtype = str(np.dtype(dtype))
        if dtype not in _SUPPORTED_DTYPES:
            raise ValueError(f"GPU dtype must be one of {', '.join(_SUPPORTED_DTYPES)}, not {dtype!r}")
        self.device_index = 0 if device is None else int(device)
        if SIM and self.device_index != 0:
            self.device_index = 0  # the simulator has one device
        count = gpu_count()
        if not 0 <= self.device_index < count:
            raise BackendUnavailable(f"CUDA device {self.device_index} does not exist ({count} visible)")
        cuda.select_device(self.device_index)
        self.dtype = dtype
        self.chunk_rows = int(chunk_rows) if chunk_rows else None
        if self.chunk_rows is not None and self.chunk_rows <= 0:
            raise ValueError("chunk_rows must be positive")
        self.tune = dict(tune or {})
        dev = cuda.get_current_device()
        self._sm_count = int(getattr(dev, "MULTIPROCESSOR_COUNT", 1) or 1)
        self._smem_optin = int(getattr(dev, "MAX_SHARED_MEMORY_PER_BLOCK_OPTIN", 48 * 1024) or 48 * 1024)
        self._smem_sm = int(getattr(dev, "MAX_SHARED_MEMORY_PER_MULTIPROCESSOR", self._smem_optin) or self._smem_optin)
        self._regs_sm = int(getattr(dev, "MAX_REGISTERS_PER_MULTIPROCESSOR", 65536) or 65536)
        if SIM:
            self._smem_optin = self._smem_sm = 48 * 1024
        self._desc = device_descriptions()
        self.n = 0
        self.m = 0
        self._streaming = False
        self._dx = None
        self._labels = None
        self._weights_host = None
        self._dw = None
        self._ld = 0
        self._kbufs = None
        self.last_flagged = 0
        self.last_plan = None
        self.last_grid = 0
        self.last_regs = None
        self._occupancy = {}
        self._offs_cache = {}
        self._cbufs = {}
        self.last_kernel_ms = float("nan")

    # ------------------------------------------------------------------ load
    def _free_memory(self) -> int:
        if SIM:
            return 1 << 40
        free, _total = cuda.current_context().get_memory_info()
        return int(free)

    def load(self, x: np.ndarray, weights: np.ndarray | None = None) -> None:
        """Copy this rank's rows to the device (see :meth:`Backend.load`).

        Parameters
        ----------
        x : ndarray, shape (n_local, m), float64
            May have zero rows.
        weights : ndarray, shape (n_local,), float64, optional
            Instance weights; an empty or omitted array means unweighted.
        """
        self.close()
        x = np.ascontiguousarray(x, dtype=np.float64)
        if x.ndim != 2:
            raise ValueError(f"x must be 2-D (n, m), got shape {x.shape}")
        n, m = x.shape
        self.n, self.m = n, m
        if weights is not None and np.size(weights) > 0:
            w = np.ascontiguousarray(weights, dtype=np.float64).ravel()
            if w.shape[0] != n:
                raise ValueError(f"weights has {w.shape[0]} entries for {n} rows")
            self._weights_host = w
        else:
            self._weights_host = None
        if n == 0:
            return
        dsize = np.dtype(self.dtype).itemsize
        row_bytes = m * dsize + 4 + 4 + (8 if self._weights_host is not None else 0)
        resident = self.chunk_rows is None and n * row_bytes <= 0.8 * self._free_memory()
        if resident:
            self._ld = _round_up(n, 32)
            self._dx = cuda.device_array(m * self._ld, dtype=self.dtype)
            self._upload_soa(x, self._dx, self._ld, 0)
            self._labels = cuda.to_device(np.full(n, -1, dtype=np.int32))
            self._flags = cuda.device_array(n, dtype=np.int32)
            self._dw = cuda.to_device(self._weights_host) if self._weights_host is not None else None
            self._streaming = False
        else:
            self._setup_streaming(x, row_bytes)

    def load_device(self, x_soa, weights: np.ndarray | None = None) -> None:
        """Take rows that are already on this device, column-major.

        For benchmarks that generate data on the GPU: no host copy, no transpose.

        Parameters
        ----------
        x_soa : device array (numba, CuPy, PyTorch...), shape (m, n), backend dtype
            C-contiguous, so that attribute ``j`` of row ``i`` is at ``j * n + i``.
        weights : ndarray, shape (n,), float64, optional
        """
        self.close()
        arr = cuda.as_cuda_array(x_soa)
        m, n = arr.shape
        if str(arr.dtype) != self.dtype:
            raise ValueError(f"device data is {arr.dtype}, backend dtype is {self.dtype}")
        self.n, self.m = int(n), int(m)
        self._ld = int(n)
        self._dx = arr.reshape(m * n)
        self._labels = cuda.to_device(np.full(n, -1, dtype=np.int32))
        self._flags = cuda.device_array(max(n, 1), dtype=np.int32)
        self._weights_host = None if weights is None or np.size(weights) == 0 else np.ascontiguousarray(weights, np.float64)
        self._dw = cuda.to_device(self._weights_host) if self._weights_host is not None else None
        self._streaming = False

    def _upload_soa(self, x: np.ndarray, dst, ld: int, row0: int, stream=0) -> None:
        """Copy row-major host rows into the column-major device array ``dst`` via the GPU."""
        n, m = x.shape
        if n == 0:
            return
        block_rows = max(32, min(n, (32 << 20) // max(1, m * 8)))
        stage = cuda.device_array(block_rows * m, dtype=np.float64, stream=stream)
        tk = _transpose_kernel(self.dtype)
        for a in range(0, n, block_rows):
            b = min(n, a + block_rows)
            rows = b - a
            stage[: rows * m].copy_to_device(x[a:b].ravel(), stream=stream)
            grid = (-(-rows // 32), -(-m // 32))
            tk[grid, (32, 8), stream](stage, rows, m, dst, ld, row0 + a)
        if stream == 0:
            cuda.synchronize()
        else:
            stream.synchronize()

    def _setup_streaming(self, x: np.ndarray, row_bytes: int) -> None:
        n, m = self.n, self.m
        dsize = np.dtype(self.dtype).itemsize
        if self.chunk_rows is not None:
            cr = self.chunk_rows
        else:
            # two chunk buffers (and their labels, flags) in 35% of free memory each
            cr = int(0.35 * self._free_memory() // max(1, row_bytes))
            cr = max(1024, cr // 1024 * 1024)
        cr = max(1, min(cr, n))
        self.chunk = cr
        self._ld = _round_up(cr, 32)
        nch = -(-n // cr)
        self._nchunks = nch
        # host copy of the rows in chunk-column-major order, pinned when possible, so
        # each iteration's copies run at full PCIe speed with no host-side work
        try:
            host = cuda.pinned_array((nch, m * self._ld), dtype=self.dtype)
        except Exception:  # pragma: no cover - pinning refused: pageable, slower copies
            log.warning("could not pin %.1f GB of host memory; streaming from pageable memory",
                        nch * m * self._ld * dsize / 1e9)
            host = np.empty((nch, m * self._ld), dtype=self.dtype)
        self._host_soa = host
        self._streams = [cuda.stream(), cuda.stream()]
        self._dbuf = [cuda.device_array(m * self._ld, dtype=self.dtype) for _ in range(2)]
        self._dlab = [cuda.device_array(self._ld, dtype=np.int32) for _ in range(2)]
        self._dflags = [cuda.device_array(self._ld, dtype=np.int32) for _ in range(2)]
        self._dwbuf = [cuda.device_array(self._ld, dtype=np.float64) for _ in range(2)] if self._weights_host is not None else None
        self._ddist = [cuda.device_array(self._ld, dtype=np.float64) for _ in range(2)]
        try:
            self._host_labels = cuda.pinned_array(n, dtype=np.int32)
        except Exception:  # pragma: no cover
            self._host_labels = np.empty(n, dtype=np.int32)
        self._host_labels[:] = -1
        # transpose each chunk on the device and keep the column-major copy on the host
        s = self._streams[0]
        for c in range(nch):
            a = c * cr
            b = min(n, a + cr)
            self._upload_soa(x[a:b], self._dbuf[0], self._ld, 0, stream=s)
            self._dbuf[0].copy_to_host(host[c], stream=s)
        s.synchronize()
        self._streaming = True

    # ------------------------------------------------------------------ step
    def _buffers(self, k: int, m: int):
        """Output buffers for k centres: float64 [sums | counts | sse] and int64 [changed, flagged]."""
        if self._kbufs is None or self._kbufs[0] != (k, m):
            out64 = cuda.device_array(k * m + k + 1, dtype=np.float64)
            self._kbufs = (
                (k, m),
                out64,
                cuda.device_array(2, dtype=np.int64),
                cuda.to_device(np.zeros(1, dtype=np.float64)),  # dummy weights / dist2
            )
        _, out64, ctrs, dummy = self._kbufs
        return out64, out64[: k * m], out64[k * m: k * m + k], out64[k * m + k:], ctrs, dummy

    def _offsets(self, plan: _Plan):
        if plan.offs not in self._offs_cache:
            self._offs_cache[plan.offs] = cuda.to_device(np.asarray(plan.offs, dtype=np.int32))
        return self._offs_cache[plan.offs]

    def _blocks_per_sm(self, kern, plan: _Plan, args) -> int:
        """Resident blocks per multiprocessor (registers, shared memory, threads), cached."""
        key = (id(kern), plan)
        if key not in self._occupancy:
            if SIM:
                self._occupancy[key] = 1
            else:
                regs = _prepare(kern, args, plan.smem) or 128
                self.last_regs = regs
                regs_alloc = _round_up(regs, 8) * plan.NT
                by_regs = self._regs_sm // max(1, regs_alloc)
                by_smem = self._smem_sm // max(1, plan.smem + 1024)
                by_thr = 2048 // plan.NT
                self._occupancy[key] = max(1, min(by_regs, by_smem, by_thr, 32))
        return self._occupancy[key]

    def _plan(self, k: int, assign: bool) -> _Plan:
        weighted = self._weights_host is not None
        limit = min(self._smem_optin, 200 * 1024) if not SIM else 48 * 1024
        return _choose_plan(k, self.m, self.dtype, assign, weighted, limit, self.tune, self._smem_sm)

    def _launch(self, plan: _Plan, cen: _Centres, x, rows: int, ld: int, labels, flags, w, dist2,
                sums, counts, stats, ctrs, stream, offs_dev, assign: bool):
        weighted = self._weights_host is not None
        k = cen.c64.shape[0] // self.m
        kern = _fused_kernel(self.dtype, plan.R, plan.TC, plan.NT, weighted, plan.mode, plan.centres_shared,
                             plan.maxreg, k, self.m, plan.nct, plan.offs)
        args = (x, rows, self.m, ld, k, plan.nct, cen.cm, cen.cc, cen.shift, cen.c64,
                cen.tolf, cen.zlim, w, labels, dist2, sums, counts, stats, ctrs, flags, offs_dev)
        per_sm = self._blocks_per_sm(kern, plan, args)
        ntiles = -(-rows // (plan.NT * plan.R))
        grid = max(1, min(ntiles, 2 if SIM else per_sm * self._sm_count))
        self.last_grid = grid
        kern[grid, plan.NT, stream, plan.smem](*args)
        rk = _recheck_kernel(self.dtype, weighted, assign)
        rgrid = max(1, min(4 * self._sm_count, -(-rows // _RC_WARPS)))
        if SIM:
            rgrid = 1
        rk[rgrid, 32 * _RC_WARPS, stream](x, rows, self.m, ld, k, cen.c64, w, labels, dist2,
                                          sums, counts, stats, ctrs, flags)

    def _run(self, centres: np.ndarray, assign: bool):
        centres = np.ascontiguousarray(centres, dtype=np.float64)
        if centres.ndim != 2 or centres.shape[1] != self.m:
            raise ValueError(f"centres must have shape (k, {self.m}), got {centres.shape}")
        k, m = centres.shape
        n = self.n
        if k == 0:
            raise ValueError("at least one centre is needed")
        plan = self._plan(k, assign)
        self.last_plan = plan
        key = (k, m, plan.TC, plan.nct)
        cen = _Centres(centres, self.dtype, plan.TC, plan.nct, self._cbufs.get(key))
        self._cbufs[key] = cen._keep
        out64, sums, counts, stats, ctrs, dummy = self._buffers(k, m)
        dummy_w = dummy_d = dummy
        offs_dev = self._offsets(plan)
        zk = _zero_kernel()
        zk[max(1, min(64, -(-(k * m + k + 1) // 256))), 256](out64, ctrs)
        labels_out = dist_out = None
        if assign:
            labels_out = np.empty(n, dtype=np.int32)
            dist_out = np.empty(n, dtype=np.float64)
        profile = bool(self.tune.get("profile")) and not SIM
        if not self._streaming:
            w = self._dw if self._dw is not None else dummy_w
            dist2 = cuda.device_array(n, dtype=np.float64) if assign else dummy_d
            labels = cuda.device_array(n, dtype=np.int32) if assign else self._labels
            if profile:
                e0, e1 = cuda.event(), cuda.event()
                e0.record()
            self._launch(plan, cen, self._dx, n, self._ld, labels, self._flags, w, dist2,
                         sums, counts, stats, ctrs, 0, offs_dev, assign)
            if profile:
                e1.record()
            if assign:
                labels.copy_to_host(labels_out)
                dist2.copy_to_host(dist_out)
        else:
            self._run_streaming(plan, cen, sums, counts, stats, ctrs, dummy_w, offs_dev, assign,
                                labels_out, dist_out)
        h64 = out64.copy_to_host()
        ct = ctrs.copy_to_host()
        if profile and not self._streaming:
            self.last_kernel_ms = cuda.event_elapsed_time(e0, e1)
        if not self._streaming:
            self.last_flagged = int(ct[1])
        hs = h64[: k * m].reshape(k, m)
        hc = h64[k * m: k * m + k].copy()
        st = h64[k * m + k:]
        if assign:
            return labels_out, dist_out
        return StepResult(sums=hs, counts=hc, sse=float(st[0]), changed=int(ct[0]))

    def _run_streaming(self, plan, cen, sums, counts, stats, ctrs, dummy_w, offs_dev, assign,
                       labels_out, dist_out):
        """Chunks alternate between two streams: the copy of chunk i+1 runs while chunk i computes."""
        n, cr = self.n, self.chunk
        weighted = self._weights_host is not None
        zc = _zero_ctr_kernel()
        # per-stream counters: flags are per chunk, so each stream needs its own
        ctr_pair = [cuda.device_array(2, dtype=np.int64) for _ in range(2)]
        for s in range(2):
            ctr_pair[s].copy_to_device(np.zeros(2, dtype=np.int64))
        for c in range(self._nchunks):
            s = c % 2
            st = self._streams[s]
            a = c * cr
            b = min(n, a + cr)
            rows = b - a
            self._dbuf[s].copy_to_device(self._host_soa[c], stream=st)
            if not assign:
                self._dlab[s][:rows].copy_to_device(self._host_labels[a:b], stream=st)
            w = dummy_w
            if weighted:
                self._dwbuf[s][:rows].copy_to_device(self._weights_host[a:b], stream=st)
                w = self._dwbuf[s]
            zc[1, 1, st](ctr_pair[s])
            self._launch(plan, cen, self._dbuf[s], rows, self._ld, self._dlab[s], self._dflags[s], w,
                         self._ddist[s], sums, counts, stats, ctr_pair[s], st, offs_dev, assign)
            if assign:
                self._dlab[s][:rows].copy_to_host(labels_out[a:b], stream=st)
                self._ddist[s][:rows].copy_to_host(dist_out[a:b], stream=st)
            else:
                self._dlab[s][:rows].copy_to_host(self._host_labels[a:b], stream=st)
        for st in self._streams:
            st.synchronize()
        changed = 0
        for s in range(2):
            h = ctr_pair[s].copy_to_host()
            changed += int(h[0])
        # fold the change count into the shared counter array read by _run
        h = ctrs.copy_to_host()
        h[0] += changed
        ctrs.copy_to_device(h)
        self.last_flagged = -1  # not tracked per chunk

    def step(self, centres: np.ndarray) -> StepResult:
        """Assign every local row and accumulate float64 sums (see :meth:`Backend.step`).

        Parameters
        ----------
        centres : ndarray, shape (k, m), float64

        Returns
        -------
        StepResult
        """
        centres = np.asarray(centres, dtype=np.float64)
        k = centres.shape[0]
        if self.n == 0:
            return StepResult(sums=np.zeros((k, self.m if self.m else centres.shape[1])),
                              counts=np.zeros(k), sse=0.0, changed=0)
        return self._run(centres, assign=False)

    def assign(self, centres: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Nearest centre and exact float64 squared distance for every local row.

        Parameters
        ----------
        centres : ndarray, shape (k, m), float64

        Returns
        -------
        labels : ndarray, shape (n_local,), int32
        dist2 : ndarray, shape (n_local,), float64
        """
        if self.n == 0:
            return np.empty(0, dtype=np.int32), np.empty(0, dtype=np.float64)
        return self._run(np.asarray(centres, dtype=np.float64), assign=True)

    def info(self) -> BackendInfo:
        d = next((d for d in self._desc if d["index"] == self.device_index), None)
        name = d["name"] if d else "unknown"
        return BackendInfo(name="gpu", devices=[f"{self.device_index}: {name}"], threads=1, dtype=self.dtype)

    def close(self) -> None:
        self._dx = None
        self._labels = None
        self._flags = None
        self._dw = None
        self._kbufs = None
        self._cbufs = {}
        self._streaming = False
        for attr in ("_host_soa", "_dbuf", "_dlab", "_dflags", "_dwbuf", "_ddist", "_host_labels", "_streams"):
            if hasattr(self, attr):
                setattr(self, attr, None)
