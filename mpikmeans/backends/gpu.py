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
  sums in shared memory (the specification's calcSums).  What is summed is the
  deviation ``x - c`` from the row's centre (the raw sums are ``dev + n c``, formed on
  the host), so data far from the origin lose no digits.  The block adds its partial
  sums into the global float64 sums with one atomic per (cluster, attribute) when it
  finishes.  SSE is accumulated per element as ``(x - c)^2`` in float64, so it is the
  exact diff form, not the cancelling dot form.  Once labels settle, steps are
  incremental: only rows whose label changed touch the sums (see ``GPUBackend``'s
  notes).  When ``K x M`` float64 sums do not
  fit in shared memory, pass 2 adds into the global sums with atomics instead
  (slower, never a launch failure).
* **Per step on the host** (after the first step with a given number of centres):
  the centre data is written into a pinned host buffer that mirrors one device
  buffer (centre data, then zeros for the outputs); one asynchronous copy in, the
  fused and the recheck kernels launched with parameter blocks prepared once
  (``cuLaunchKernel``), one asynchronous copy of sums, counts, SSE and counters
  out, one synchronisation.  No allocation, no zeroing kernel, no host round trip
  before the recheck kernel (it reads the flagged count on the device).

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
from numba import njit

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

    @_intrinsic
    def _ldx(typingctx, arr, idx):
        """``arr[idx]`` for an index known to be in ``[0, len)``: address and load only.

        Numba's indexing turns a signed index into ``idx < 0 ? idx + len : idx``.
        That select sits between the index arithmetic and the address, so LLVM
        cannot strength-reduce ``j * ld + i`` across a loop, and every access costs a
        64-bit multiply, a sign test and a reload of the array's shape.  Here the
        address is one ``inbounds`` GEP of the data pointer (1-D C-contiguous arrays).
        """
        if not isinstance(arr, _nbtypes.Array) or not isinstance(idx, _nbtypes.Integer):
            return None
        dt = arr.dtype
        sig = dt(arr, idx)

        def codegen(context, builder, signature, args):
            ary = context.make_array(signature.args[0])(context, builder, args[0])
            i = context.cast(builder, args[1], signature.args[1], _nbtypes.intp)
            ptr = builder.gep(ary.data, [i], inbounds=True)
            return builder.load(ptr, align=context.get_abi_sizeof(context.get_data_type(dt)))

        return sig, codegen

    def _make_ldc(bits: int):
        def _ldc(typingctx, arr, j, ld, i):
            """``arr[j * ld + i]`` (a column-major element) with ``bits``-bit index arithmetic.

            No wraparound select (see :func:`_ldx`).  With ``bits=32`` (arrays of fewer
            than ``2**31`` elements, checked on the host) the index is one 32-bit
            ``mad.lo.u32``, written as inline PTX because LLVM widens plain 32-bit
            arithmetic on truncated 64-bit values back to 64 bits; the address is
            then one ``IMAD.WIDE.U32``.  With ``bits=64`` the multiply and add carry
            ``nuw nsw`` so LLVM can strength-reduce the address across a loop.
            """
            if not isinstance(arr, _nbtypes.Array) or not all(isinstance(t, _nbtypes.Integer) for t in (j, ld, i)):
                return None
            dt = arr.dtype
            sig = dt(arr, j, ld, i)

            def codegen(context, builder, signature, args):
                ary = context.make_array(signature.args[0])(context, builder, args[0])
                v = [context.cast(builder, args[q], signature.args[q], _nbtypes.intp) for q in (1, 2, 3)]
                if bits == 32:
                    i32 = _llir.IntType(32)
                    v = [builder.trunc(a, i32) for a in v]
                    fty = _llir.FunctionType(i32, [i32, i32, i32])
                    idx = builder.asm(fty, "mad.lo.u32 $0, $1, $2, $3;", "=r,r,r,r", v, side_effect=False)
                    idx = builder.zext(idx, _llir.IntType(64))
                else:
                    idx = builder.mul(v[0], v[1], flags=("nuw", "nsw"))
                    idx = builder.add(idx, v[2], flags=("nuw", "nsw"))
                ptr = builder.gep(ary.data, [idx], inbounds=True)
                return builder.load(ptr, align=context.get_abi_sizeof(context.get_data_type(dt)))

            return sig, codegen

        return _intrinsic(_ldc)

    _ldc32 = _make_ldc(32)
    _ldc64 = _make_ldc(64)

    @_intrinsic
    def _stx(typingctx, arr, idx, val):
        """``arr[idx] = val`` for an index known to be in ``[0, len)`` (see :func:`_ldx`)."""
        if not isinstance(arr, _nbtypes.Array) or not isinstance(idx, _nbtypes.Integer):
            return None
        dt = arr.dtype
        sig = _nbtypes.void(arr, idx, val)

        def codegen(context, builder, signature, args):
            ary = context.make_array(signature.args[0])(context, builder, args[0])
            i = context.cast(builder, args[1], signature.args[1], _nbtypes.intp)
            v = context.cast(builder, args[2], signature.args[2], dt)
            ptr = builder.gep(ary.data, [i], inbounds=True)
            builder.store(v, ptr, align=context.get_abi_sizeof(context.get_data_type(dt)))
            return context.get_dummy_value()

        return sig, codegen

else:

    def _ld4(arr, idx):
        return arr[idx], arr[idx + 1], arr[idx + 2], arr[idx + 3]

    def _ldx(arr, idx):
        assert 0 <= idx < arr.shape[0] or arr.shape[0] == 0, (idx, arr.shape)
        return arr[idx]

    def _ldc64(arr, j, ld, i):
        idx = j * ld + i
        assert 0 <= idx < arr.shape[0], (idx, arr.shape)
        return arr[idx]

    def _ldc32(arr, j, ld, i):
        assert arr.shape[0] < 2**31
        return _ldc64(arr, j, ld, i)

    def _stx(arr, idx, val):
        assert 0 <= idx < arr.shape[0] or arr.shape[0] == 0, (idx, arr.shape)
        arr[idx] = val


# modes of the fused kernel
_MODE_STEP_SHARED = 0  # step, per-block partial sums in shared memory
_MODE_STEP_GLOBAL = 1  # step, sums straight into global memory with atomics
_MODE_ASSIGN = 2  # labels and exact squared distances only
_MODE_STEP_DELTA = 3  # step, only the changes of the sums (rows whose label changed)
#: steps in a row that may be incremental before a full one (bounds rounding drift)
_DELTA_REFRESH = 32
#: When an incremental step pays (H100, bench/GPU_NOTES.md, v5): each row that changed
#: label costs the exact kernel about _MOVE_NS + _MOVE_NS_PER_ELEM * K * M nanoseconds
#: (26 ns at K x M = 5000, 110 ns at 32000); a full step's pass 2, which an incremental
#: step saves, about _PASS2_NS_PER_ELEM per element of the rows (0.005 measured, less a
#: margin).  The last step's change count predicts the next one's.
_MOVE_NS = 10.5
_MOVE_NS_PER_ELEM = 0.0031
_PASS2_NS_PER_ELEM = 0.004

# indices into the shared-memory layout tuple (see _plan_shared)
(_O_CM, _O_CC, _O_SH, _O_SUMS, _O_CNT, _O_HIST, _O_START, _O_PERM, _O_SLAB, _O_LAB, _O_W, _O_XS, _O_RED, _O_JC,
 _O_BRP, _O_TMP) = range(16)
_N_OFFS = 16

# indices into the step-buffer layout tuple (see _pack_layout): element offsets into the
# float32 view (P32_*), the float64 view (P64_*) and the int64 view (I64_*) of one buffer
_P32_CM, _P32_CC, _P32_SH, _P32_ZL, _P64_C64, _P64_SH, _P64_SUMS, _P64_CNT, _P64_SSE, _I64_CHG = range(10)


@functools.lru_cache(maxsize=None)
def _fused_kernel(storage: str, R: int, TC: int, NT: int, weighted: bool, mode: int, centres_shared: bool,
                  maxreg: int, k_c: int, m_c: int, nct_c: int, offs_c: tuple, pack_c: tuple, idx32: bool = False,
                  diag_skip_pass2: bool = False, lineinfo: bool = False):
    """Build (once per configuration and shape) the fused assignment + accumulation kernel.

    Everything but the rows is a compile-time constant: rows per thread ``R``, centres
    per register tile ``TC``, threads per block ``NT``, weighting, mode, where the
    centres are read from, the shape (``k_c``, ``m_c``, ``nct_c``), the shared-memory
    layout ``offs_c`` and the layout ``pack_c`` of the step buffer.  Loops over them
    unroll, the per-thread arrays stay in registers, and no register holds an offset
    (a run compiles once per K x M).  ``idx32``: the rows array has fewer than
    ``2**31`` elements, so its indices are computed on 32 bits (:func:`_ldc32`).
    ``diag_skip_pass2`` is for profiling only: pass 2 is left out, so the sums, counts
    and SSE are wrong (``scripts/bench_gpu.py`` uses it to time pass 1 alone).
    ``lineinfo`` adds source lines for ``ncu``'s per-line sampling.

    Kernel arguments (all arrays 1-D, C-contiguous, on the device)
    ---------------------------------------------------------------
    x : storage dtype, (m * ld,)      rows, column-major: x[j * ld + i]
    n, ld : int64                     rows, row stride
    p32, p64, ctr : float32, float64, int64 views of one step buffer (:func:`_pack_layout`):
        p32[P32_CM:]  -2 (c - s) laid out [tile][attribute][TC]
        p32[P32_CC:]  |c - s|^2 (+inf for padding)
        p32/p64[..SH:] s, the mean of the centres, in the storage dtype
        p32[P32_ZL]   2 max |c - s|^2 (certification bound: tol = tolf (|y|^2 + zlim) + tiny)
        p64[P64_C64:] centres, row-major
        p64[P64_SUMS:], p64[P64_CNT:], p64[P64_SSE]   accumulated float64 deviation sums
                      (of x - c), counts, SSE (DELTA: their changes; see GPUBackend)
        ctr[I64_CHG]  changed rows; ctr[fslot] flagged rows (one slot per chunk)
    labels : int32, (n,)              previous labels in, new labels out
    flags : int32, (n,)               indices of rows handed to the exact kernel
    w : float64, (n,) or (1,)         weights (read only when weighted)
    dist2 : float64, (n,) or (1,)     exact squared distances (assign mode)
    fslot : int64                     index in ``ctr`` of this launch's flagged-row counter

    All hot-loop accesses go through :func:`_ldx` / :func:`_stx` (no wraparound
    select); row indices past ``n`` are clamped to ``n - 1`` for the loads, so only
    the attribute bound is tested in the loops.
    """
    DT = float64 if storage == "float64" else float32
    BR = NT * R
    ACC = R * TC
    JB = max(1, min(4, 8 // R))  # attributes per prefetch block (<= 8 values in flight)
    XB = JB * R
    EB = 8  # epilogue (global sums / assign): attributes per batch
    WB = 4  # pass-2 walk: sorted rows per batch
    WARP = 32
    GROUPS = max(1, NT // WARP)  # pass-2 row slices: one per warp
    TC4 = TC // 4
    SHARED = mode == _MODE_STEP_SHARED
    DELTA = mode == _MODE_STEP_DELTA
    GLOBAL = mode == _MODE_STEP_GLOBAL
    ASSIGN = mode == _MODE_ASSIGN
    WEIGHTED = weighted
    CSH = centres_shared
    SH32 = storage == "float32"
    F32_INF = np.float32(np.inf)
    TINY = np.float32(1.0e-36)
    BIG = np.float32(_BIG)

    K_C, M_C, NCT_C = int(k_c), int(m_c), int(nct_c)
    # bound on |computed - exact| of (|z|^2 - 2 y.z) for one centre is
    # (m + 4)(1 + eps) u (|y|^2 + 2 max|z|^2); two centres, a computed |y|^2 and
    # a computed gap need a little more: factor 2.1 and m + 5
    TOLF = np.float32(2.1 * (M_C + 5) * _U32)
    (O_CM, O_CC, O_SH, O_SUMS, O_CNT, O_HIST, O_START, O_PERM, O_SLAB, O_LAB, O_W, O_XS, O_RED,
     O_JC, O_BRP, O_TMP) = (int(v) for v in offs_c)
    (P_CM, P_CC, P_SH32, P_ZL, P_C64, P_SH64, P_SUMS, P_CNT, P_SSE, I_CHG) = (int(v) for v in pack_c)
    # pass-2 staging: about 16 loads in flight per thread, in batches that divide the
    # attribute chunk as evenly as possible (no all-idle tail batch)
    SJ0 = max(1, 16 // R)
    SJ = -(-O_JC // -(-O_JC // SJ0))
    SV = SJ * R
    # compile-time facts that drop bound tests from the loops
    FULLJ = M_C % JB == 0  # every prefetch block is whole
    FULLC = M_C % O_JC == 0  # every staged chunk has jc attributes
    # loads of the rows, x[j * ld + i]: 32-bit index arithmetic where it is allowed, except
    # in the staging loop, where LLVM strength-reduces the 64-bit form into fewer instructions
    LDC = _ldc32 if idx32 else _ldc64

    def km_fused(x, n, ld, p32, p64, ctr, labels, flags, w, dist2, fslot):
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
        zlim = p32[P_ZL]

        # ---- block set-up: centres (and their norms) to shared memory, zero partials
        if CSH:
            for q in range(tid, kp * m, NT):
                _stx(smf, o_cm + q, _ldx(p32, P_CM + q))
        for q in range(tid, kp, NT):
            _stx(smf, o_cc + q, _ldx(p32, P_CC + q))
        for q in range(tid, m, NT):
            if SH32:
                _stx(smx, o_sh + q, _ldx(p32, P_SH32 + q))
            else:
                _stx(smx, o_sh + q, _ldx(p64, P_SH64 + q))
        if SHARED:
            for q in range(tid, k * m, NT):
                _stx(smd, o_sums + q, 0.0)
            for q in range(tid, k, NT):
                _stx(smd, o_cnt + q, 0.0)
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
        wx = cuda.local.array(WB, dtype=float64)
        ww = cuda.local.array(WB, dtype=float64)
        yy = cuda.local.array(R, dtype=float32)
        b1 = cuda.local.array(R, dtype=float32)
        b2 = cuda.local.array(R, dtype=float32)
        i1 = cuda.local.array(R, dtype=int32)
        labr = cuda.local.array(R, dtype=int32)
        pos = cuda.local.array(R, dtype=int32)
        rowc = cuda.local.array(R, dtype=int64)

        ntiles = (n + BR - 1) // BR
        for tile in range(cuda.blockIdx.x, ntiles, cuda.gridDim.x):
            row0 = tile * BR
            # ================= pass 1: certified nearest centre =================
            for r in range(R):
                yy[r] = float32(0.0)
                b1[r] = F32_INF
                b2[r] = F32_INF
                i1[r] = 0
                i = row0 + tid + r * NT
                # rows past the end load row n - 1 (always in bounds) and are ignored
                rowc[r] = i if i < n else n - 1
            for ct in range(nct):
                for r in range(R):
                    for c in range(TC):
                        acc[r * TC + c] = smf[o_cc + ct * TC + c]
                cbase = ct * m * TC
                # the rows' values for attributes jb..jb+JB-1 are loaded one block ahead,
                # so the global loads of the next block overlap the FMAs of this one
                for q in range(JB):
                    for r in range(R):
                        xb[q * R + r] = LDC(x, q, ld, rowc[r]) if q < m else DT(0.0)
                for jb in range(0, m, JB):
                    if FULLJ:
                        # no bound tests: the last block re-reads itself (in bounds, unused)
                        nb = jb + JB if jb + JB < m else jb
                        for q in range(JB):
                            for r in range(R):
                                xn[q * R + r] = LDC(x, nb + q, ld, rowc[r])
                    else:
                        for q in range(JB):
                            jn = jb + JB + q
                            for r in range(R):
                                xn[q * R + r] = LDC(x, jn, ld, rowc[r]) if jn < m else DT(0.0)
                    for q in range(JB):
                        j = jb + q
                        if FULLJ or j < m:
                            sj = _ldx(smx, o_sh + j)
                            for r in range(R):
                                yv[r] = float32(xb[q * R + r] - sj)
                            if ct == 0:
                                for r in range(R):
                                    yy[r] += yv[r] * yv[r]
                            # the next 16-byte vector is requested before this one is used
                            if CSH:
                                nxt = _ld4(smf, o_cm + cbase + j * TC)
                            else:
                                nxt = _ld4(p32, P_CM + cbase + j * TC)
                            for c4 in range(TC4):
                                w0, w1, w2, w3 = nxt
                                if c4 + 1 < TC4:
                                    if CSH:
                                        nxt = _ld4(smf, o_cm + cbase + j * TC + 4 * c4 + 4)
                                    else:
                                        nxt = _ld4(p32, P_CM + cbase + j * TC + 4 * c4 + 4)
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
                    tol = TOLF * scale + TINY
                    gap = b2[r] - b1[r]
                    if gap > tol and scale < BIG:
                        lab = i1[r]
                        if ASSIGN:
                            _stx(labels, i, lab)
                        elif DELTA:
                            # a row that keeps its label: the kept sums and SSE hold it
                            # already.  One that changes is rare here: the exact kernel
                            # moves it (no per-attribute code in this kernel, whose
                            # registers pass 1 needs)
                            if _ldx(labels, i) != lab:
                                p = cuda.atomic.add(ctr, fslot, 1)
                                _stx(flags, p, i)
                            lab = -1
                        else:
                            if _ldx(labels, i) != lab:
                                changed_t += 1
                                _stx(labels, i, lab)
                    else:
                        p = cuda.atomic.add(ctr, fslot, 1)
                        _stx(flags, p, i)
                labr[r] = lab
                if SHARED:
                    if WEIGHTED:
                        _stx(smd, o_w + tid + r * NT, _ldx(w, i) if i < n else 0.0)

            if ASSIGN or GLOBAL:
                # exact float64 distance to the chosen centre and, for a step, the
                # deviation sums; the rows come from L1/L2
                for r in range(R):
                    lab = labr[r]
                    if lab >= 0:
                        i = rowc[r]
                        wi = _ldx(w, i) if WEIGHTED else 1.0
                        cb = lab * m
                        s2 = 0.0
                        # EB attributes per batch: their loads are in flight together
                        for jb in range(0, m, EB):
                            for q in range(EB):
                                j = jb + q
                                if j < m:
                                    ev[q] = float64(LDC(x, j, ld, i))
                                    ec[q] = _ldx(p64, P_C64 + cb + j)
                            for q in range(EB):
                                j = jb + q
                                if j < m:
                                    t = ev[q] - ec[q]
                                    s2 += t * t
                                    if not ASSIGN:
                                        cuda.atomic.add(p64, P_SUMS + cb + j, wi * t)
                        if ASSIGN:
                            _stx(dist2, i, s2)
                        else:
                            sse_t += wi * s2
                            cuda.atomic.add(p64, P_CNT + lab, wi)

            if SHARED and not diag_skip_pass2:
                # ================= pass 2: fused per-block sums =================
                # counting sort of the tile's rows by label
                for q in range(tid, k, NT):
                    _stx(smi, o_hist + q, 0)
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
                            s += _ldx(smi, o_hist + e)
                        _stx(smi, o_start + q, s)
                else:
                    if tid == 0:
                        s = 0
                        for e in range(k):
                            _stx(smi, o_start + e, s)
                            s += _ldx(smi, o_hist + e)
                        _stx(smi, o_start + k, s)
                cuda.syncthreads()
                for r in range(R):
                    lab = labr[r]
                    if lab >= 0:
                        dst = _ldx(smi, o_start + lab) + pos[r]
                        _stx(smi, o_perm + dst, tid + r * NT)
                        _stx(smi, o_slab + dst, lab)
                if not WEIGHTED:
                    for q in range(tid, k, NT):
                        _stx(smd, o_cnt + q, _ldx(smd, o_cnt + q) + float64(_ldx(smi, o_hist + q)))
                cuda.syncthreads()
                nval = smi[o_start + k]
                # each warp walks one slice of the sorted rows, its lanes one attribute
                # each; a slice crosses about nval/k cluster segments, and a segment is
                # summed in registers, then added once: plainly when the whole cluster
                # lies in this slice (no other warp touches it), else atomically
                g = tid // WARP
                jj = tid - g * WARP
                p0 = (g * nval) // GROUPS
                p1 = ((g + 1) * nval) // GROUPS
                for j0 in range(0, m, jc):
                    jn = jc if FULLC else min(jc, m - j0)
                    # stage attributes j0..j0+jn of the tile (coalesced, mostly from L2)
                    # SJ attributes x R rows per batch, loads issued before any store
                    for jb in range(0, jn, SJ):
                        for q in range(SJ):
                            jr = jb + q
                            for r in range(R):
                                sv[q * R + r] = _ldc64(x, j0 + jr, ld, rowc[r]) if jr < jn else DT(0.0)
                        for q in range(SJ):
                            jr = jb + q
                            if jr < jn:
                                for r in range(R):
                                    _stx(smx, o_xs + jr * brp + tid + r * NT, sv[q * R + r])
                    cuda.syncthreads()
                    if g < GROUPS and jj < jn and p0 < p1:
                        j = j0 + jj
                        xsb = o_xs + jj * brp
                        csb = P_C64 + j
                        lab = _ldx(smi, o_slab + p0)
                        last = _ldx(smi, o_slab + p1 - 1)
                        sl = _ldx(smi, o_start + lab)
                        while lab <= last:
                            sr = _ldx(smi, o_start + lab + 1)
                            a = sl if sl > p0 else p0
                            b = sr if sr < p1 else p1
                            if b > a:
                                cj = _ldx(p64, csb + lab * m)
                                s_run = 0.0
                                q_run = 0.0
                                w_run = 0.0
                                p = a
                                # WB rows per batch: their loads are independent
                                while p + WB <= b:
                                    for u in range(WB):
                                        rl = _ldx(smi, o_perm + p + u)
                                        wx[u] = float64(_ldx(smx, xsb + rl))
                                        if WEIGHTED:
                                            ww[u] = _ldx(smd, o_w + rl)
                                    for u in range(WB):
                                        t = wx[u] - cj
                                        if WEIGHTED:
                                            s_run += ww[u] * t
                                            q_run += ww[u] * (t * t)
                                            w_run += ww[u]
                                        else:
                                            s_run += t
                                            q_run += t * t
                                    p += WB
                                while p < b:
                                    rl = _ldx(smi, o_perm + p)
                                    t = float64(_ldx(smx, xsb + rl)) - cj
                                    if WEIGHTED:
                                        wi = _ldx(smd, o_w + rl)
                                        s_run += wi * t
                                        q_run += wi * (t * t)
                                        w_run += wi
                                    else:
                                        s_run += t
                                        q_run += t * t
                                    p += 1
                                sse_t += q_run
                                o = o_sums + lab * m + j
                                if sl >= p0 and sr <= p1:
                                    _stx(smd, o, _ldx(smd, o) + s_run)
                                    if WEIGHTED and j == 0:
                                        _stx(smd, o_cnt + lab, _ldx(smd, o_cnt + lab) + w_run)
                                else:
                                    cuda.atomic.add(smd, o, s_run)
                                    if WEIGHTED and j == 0:
                                        cuda.atomic.add(smd, o_cnt + lab, w_run)
                            sl = sr
                            lab += 1
                    cuda.syncthreads()

        # ---- block epilogue: one global atomic per (cluster, attribute)
        if not ASSIGN:
            cuda.atomic.add(smd, o_red, sse_t)
            cuda.atomic.add(smi, o_tmp, changed_t)
        cuda.syncthreads()
        if SHARED:
            for q in range(tid, k * m, NT):
                v = _ldx(smd, o_sums + q)
                if v != 0.0:
                    cuda.atomic.add(p64, P_SUMS + q, v)
            for q in range(tid, k, NT):
                v = _ldx(smd, o_cnt + q)
                if v != 0.0:
                    cuda.atomic.add(p64, P_CNT + q, v)
        if not ASSIGN and tid == 0:
            cuda.atomic.add(p64, P_SSE, smd[o_red])
            cuda.atomic.add(ctr, I_CHG, int64(smi[o_tmp]))

    if SIM:
        return cuda.jit(km_fused)
    # a register cap trades scheduling freedom for resident warps (see GPU_NOTES.md)
    return cuda.jit(km_fused, fastmath=False, max_registers=maxreg or None, lineinfo=lineinfo)


#: warps per block of the exact (recheck) kernel
_RC_WARPS = 4


@functools.lru_cache(maxsize=None)
def _recheck_kernel(storage: str, weighted: bool, assign: bool, k_c: int, m_c: int, pack_c: tuple,
                    delta: bool = False):
    """Exact float64 assignment of the flagged rows, one warp per row.

    Lanes split the centres; each computes ``sum_j (x_j - c_kj)^2`` in float64 in
    attribute order, like the CPU backend, keeping the lowest index on ties; lane 0
    reduces over the lanes.  For a step the row is then added to the global deviation
    sums (``x - c``), counts, SSE and change count (atomics: flagged rows are rare); with
    ``delta`` only a row whose label changed moves: ``x - c_old``, its count and its
    squared distance to the old centre leave, the same for the new one join.

    Arguments: x, ld, p64, ctr, labels, flags, w, dist2, fslot (as in
    :func:`_fused_kernel`).  It is launched after every fused launch, with no host
    round trip: it reads the flagged count ``ctr[fslot]`` on the device, and with
    none flagged every block returns at once.
    """
    NT = 32 * _RC_WARPS
    WEIGHTED = weighted
    ASSIGN = assign
    DELTA = delta
    F64_INF = np.inf
    K_C, M_C = int(k_c), int(m_c)
    (_a, _b, _c, _d, P_C64, _e, P_SUMS, P_CNT, P_SSE, I_CHG) = (int(v) for v in pack_c)

    def km_recheck(x, ld, p64, ctr, labels, flags, w, dist2, fslot):
        bd_s = cuda.shared.array(NT, dtype=float64)
        bi_s = cuda.shared.array(NT, dtype=int32)
        old_s = cuda.shared.array(NT, dtype=int32)
        od_s = cuda.shared.array(_RC_WARPS, dtype=float64)
        tid = cuda.threadIdx.x
        lane = tid % 32
        wib = tid // 32
        m = M_C
        k = K_C
        nflag = ctr[fslot]
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
                old = labels[i] if DELTA else -1
                for kk in range(lane, k, 32):
                    d = 0.0
                    cb = P_C64 + kk * m
                    for j in range(m):
                        t = float64(_ldx(x, j * ld + i)) - _ldx(p64, cb + j)
                        d += t * t
                    if kk == old:
                        od_s[wib] = d  # the squared distance to the old centre
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
                    old = labels[i]
                    if old != bi:
                        changed_w += 1
                        labels[i] = bi
                    if DELTA:
                        if old != bi:
                            sse_w += wi * (bd - (od_s[wib] if old >= 0 else 0.0))
                            cuda.atomic.add(p64, P_CNT + bi, wi)
                            if old >= 0:
                                cuda.atomic.add(p64, P_CNT + old, -wi)
                        else:
                            bi_s[tid] = -1  # unchanged: the kept sums and SSE hold it already
                        old_s[tid] = old
                    else:
                        sse_w += wi * bd
                        cuda.atomic.add(p64, P_CNT + bi, wi)
            cuda.syncthreads()
            if not ASSIGN and f < nflag:
                lab = bi_s[wib * 32]
                old = old_s[wib * 32] if DELTA else -1
                wi = w[i] if WEIGHTED else 1.0
                if lab >= 0:
                    for j in range(lane, m, 32):
                        v = float64(_ldx(x, j * ld + i))
                        cuda.atomic.add(p64, P_SUMS + lab * m + j, wi * (v - _ldx(p64, P_C64 + lab * m + j)))
                        if old >= 0:
                            cuda.atomic.add(p64, P_SUMS + old * m + j, -(wi * (v - _ldx(p64, P_C64 + old * m + j))))
            cuda.syncthreads()
        if not ASSIGN and lane == 0:
            if sse_w != 0.0:
                cuda.atomic.add(p64, P_SSE, sse_w)
            if changed_w != 0:
                cuda.atomic.add(ctr, I_CHG, int64(changed_w))

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
    # pass 2 maps a warp's lanes to the staged attributes: at most one per lane
    jc = max(1, min(int(jc), 32, NT))
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
                 smem_limit: int, tune: dict, smem_sm: int = 228 * 1024, delta: bool = False) -> _Plan:
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
    if NT % 32:
        raise ValueError(f"GPU tune NT={NT}: threads per block must be a multiple of 32")
    budget = int(tune.get("smem_budget", smem_limit))
    maxreg = int(tune.get("maxreg", 0))
    want_cs = tune.get("centres_shared")
    sum_mode = tune.get("sum_mode")
    if assign:
        modes = [_MODE_ASSIGN]
    elif sum_mode == "global":
        modes = [_MODE_STEP_GLOBAL]
    elif sum_mode == "walk":
        modes = [_MODE_STEP_SHARED, _MODE_STEP_GLOBAL]
    elif delta:
        modes = [_MODE_STEP_DELTA]
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


def _pack_layout(k: int, m: int, TC: int, nct: int, storage: str, nslots: int) -> tuple[tuple, int, int]:
    """Layout of the per-step device buffer: inputs (centre data) first, then outputs.

    One allocation holds everything a step moves between host and device, so a step
    is one host-to-device copy (the inputs, and zeros for the outputs) and one
    device-to-host copy (the outputs).  The kernels get three views of it (float32,
    float64, int64) and compile-time offsets into them.

    Returns
    -------
    layout : tuple of int
        Element offsets, indexed by the ``_P32_*``, ``_P64_*`` and ``_I64_*``
        constants.  The int64 counters are last: ``changed`` at ``I64_CHG``, then
        ``nslots`` flagged-row counters (one per chunk), so ``layout`` does not
        depend on ``nslots``.
    out0 : int
        Byte offset of the outputs (sums, counts, SSE, counters).
    total : int
        Bytes of the whole buffer (a multiple of 16).
    """
    kp = nct * TC
    f32 = storage == "float32"
    off = 0

    def take(nbytes, align=16):
        nonlocal off
        off = _round_up(off, align)
        start = off
        off += nbytes
        return start

    b_cm = take(kp * m * 4)  # 16-byte aligned: read with 16-byte vector loads
    b_cc = take(kp * 4)
    b_sh32 = take(m * 4 if f32 else 0)
    b_zl = take(4)
    b_c64 = take(k * m * 8)
    b_sh64 = take(0 if f32 else m * 8)
    out0 = take(0)
    b_sums = take(k * m * 8, 8)
    b_cnt = take(k * 8, 8)
    b_sse = take(8, 8)
    b_ctr = take((1 + max(1, nslots)) * 8, 8)
    total = _round_up(off, 16)
    layout = [0] * 10
    layout[_P32_CM] = b_cm // 4
    layout[_P32_CC] = b_cc // 4
    layout[_P32_SH] = b_sh32 // 4
    layout[_P32_ZL] = b_zl // 4
    layout[_P64_C64] = b_c64 // 8
    layout[_P64_SH] = b_sh64 // 8
    layout[_P64_SUMS] = b_sums // 8
    layout[_P64_CNT] = b_cnt // 8
    layout[_P64_SSE] = b_sse // 8
    layout[_I64_CHG] = b_ctr // 8
    return tuple(layout), out0, total


# ---------------------------------------------------------------------------
# The backend
# ---------------------------------------------------------------------------


def _cu():
    """The CUDA driver bindings (``cuda.bindings.driver``) that numba-cuda itself uses."""
    from cuda.bindings import driver as cub

    return cub


def _cucheck(res, what: str):
    """Raise on a non-success ``CUresult``; return the call's other results."""
    err = res[0]
    if int(err) != 0:
        raise RuntimeError(f"{what} failed: {err!r}")
    return res[1:]


def _fast_launch_wanted(tune: dict) -> bool:
    import os

    if SIM:
        return False
    mode = str(tune.get("launch", os.environ.get("MPIKMEANS_GPU_LAUNCH", "fast")))
    return mode != "numba"


class _Launch:
    """One kernel launch whose arguments are marshalled once and replayed every step.

    Numba's launch path types every argument, flattens every array into seven
    parameters and hands them to ``cuda.core`` on each call: tens of microseconds for
    a kernel with many array arguments.  The kernels of a step take the same device
    buffers every step, so the parameter block is built once, with Numba's own
    marshalling (``_Kernel._prepare_args``), checked against the compiled kernel's
    parameter sizes (``cuFuncGetParamInfo``) and launched with one
    ``cuLaunchKernel``.  If any of that is unavailable (simulator, changed Numba
    internals, ``tune={"launch": "numba"}`` or ``MPIKMEANS_GPU_LAUNCH=numba``) the
    launch goes through Numba's dispatcher as before.
    """

    def __init__(self, kern, args, grid: int, block: int, smem: int, stream, fast: bool):
        self.kern = kern
        self.args = args
        self.grid = int(grid)
        self.block = int(block)
        self.smem = int(smem)
        self.stream = stream
        self.fast = False
        if fast:
            try:
                self._build()
                self.fast = True
            except Exception as exc:  # pragma: no cover - depends on numba-cuda internals
                log.info("GPU backend: Numba's launch path for %s (%s)", getattr(kern, "__name__", kern), exc)
        if not self.fast and not SIM:
            # compile now (warm-up), not at the first launch inside the timed loop
            kern.compile(tuple(kern.typeof_pyval(a) for a in args))

    def _build(self):
        import ctypes

        cub = _cu()
        kern = self.kern
        argtypes = tuple(kern.typeof_pyval(a) for a in self.args)
        kobj = kern.compile(argtypes)
        kargs, retr = [], []
        for t, v in zip(kobj.argument_types, self.args):
            kobj._prepare_args(t, v, self.stream, retr, kargs)
        if retr:
            raise RuntimeError("an argument needs a copy back (host array)")
        objs = []
        for a in kargs:
            if isinstance(a, ctypes._SimpleCData):
                objs.append(a)
            elif isinstance(a, (int, np.integer)) and not isinstance(a, (bool, np.bool_)):
                objs.append(ctypes.c_int64(int(a)))  # pointers and extents: intptr_t, as cuda.core passes them
            else:
                raise TypeError(f"unexpected kernel parameter {type(a).__name__}")
        params = (ctypes.c_void_p * len(objs))(*[ctypes.addressof(o) for o in objs])
        cufunc = kobj._codelibrary.get_cufunc()
        handle = cufunc.handle
        try:
            (fn,) = _cucheck(cub.cuKernelGetFunction(handle), "cuKernelGetFunction")
        except Exception:
            if isinstance(handle, cub.CUfunction):
                fn = handle
            else:
                fn = cub.CUfunction(int(handle))
        # the parameter block must match the compiled kernel, parameter by parameter
        if hasattr(cub, "cuFuncGetParamInfo"):
            for i, o in enumerate(objs):
                _off, size = _cucheck(cub.cuFuncGetParamInfo(fn, i), "cuFuncGetParamInfo")
                if int(size) != ctypes.sizeof(o):
                    raise RuntimeError(f"parameter {i}: kernel takes {size} bytes, block has {ctypes.sizeof(o)}")
            if int(cub.cuFuncGetParamInfo(fn, len(objs))[0]) == 0:
                raise RuntimeError("the kernel takes more parameters than Numba marshalled")
        if self.smem > 48 * 1024:
            attr = cub.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
            _cucheck(cub.cuFuncSetAttribute(fn, attr, self.smem), "cuFuncSetAttribute")
        self._keep = (objs, params, kobj)
        self._fn = fn
        self._params = ctypes.addressof(params)
        self._hstream = 0 if isinstance(self.stream, int) else int(self.stream.handle)
        self._launch_kernel = cub.cuLaunchKernel

    def __call__(self):
        if self.fast:
            err = self._launch_kernel(self._fn, self.grid, 1, 1, self.block, 1, 1, self.smem, self._hstream,
                                      self._params, 0)[0]
            if int(err) != 0:
                raise RuntimeError(f"cuLaunchKernel failed: {err!r}")
        else:
            self.kern[self.grid, self.block, self.stream, self.smem](*self.args)


def _pinned(n: int, dtype) -> np.ndarray:
    try:
        return cuda.pinned_array(n, dtype=dtype)
    except Exception:  # pragma: no cover - pinning refused: pageable (copies then block)
        return np.empty(n, dtype=dtype)


class _Pack:
    """The step buffer of one (k, plan) on the device, with pinned host mirrors.

    ``hin`` mirrors the whole buffer: the centre data, written in place each step,
    and zeros for the outputs, which are never written on the host.  Uploading it
    therefore also clears the sums, counts, SSE and counters: no zeroing kernel.
    ``hout`` receives the outputs.  Both copies are asynchronous on the legacy
    default stream, so a step synchronises once.
    """

    def __init__(self, k: int, m: int, TC: int, nct: int, storage: str, nslots: int):
        self.k, self.m, self.TC, self.nct = k, m, TC, nct
        self.f32 = storage == "float32"
        self.layout, self.out0, self.total = _pack_layout(k, m, TC, nct, storage, nslots)
        L = self.layout
        words = self.total // 8
        o = self.out0 // 8
        self.nslots = max(1, nslots)
        self.dev = cuda.device_array(words, dtype=np.float64)
        self.p32 = self.dev.view(np.float32)
        self.ctr = self.dev.view(np.int64)
        self.dout = self.dev[o:]
        self.hin = _pinned(words, np.float64)
        self.hin[:] = 0.0
        self.hout = _pinned(words - o, np.float64)
        h32 = self.hin.view(np.float32)
        kp = nct * TC
        self.cm = h32[L[_P32_CM]: L[_P32_CM] + kp * m].reshape(nct, m, TC)
        self.cc = h32[L[_P32_CC]: L[_P32_CC] + kp]
        self.cc[:] = np.inf  # padding centres never win
        self.sh = h32[L[_P32_SH]: L[_P32_SH] + m] if self.f32 else self.hin[L[_P64_SH]: L[_P64_SH] + m]
        self.zl = h32[L[_P32_ZL]: L[_P32_ZL] + 1]
        self.c64 = self.hin[L[_P64_C64]: L[_P64_C64] + k * m].reshape(k, m)
        # results: views of hout
        self.r_sums = self.hout[L[_P64_SUMS] - o: L[_P64_SUMS] - o + k * m].reshape(k, m)
        self.r_cnt = self.hout[L[_P64_CNT] - o: L[_P64_CNT] - o + k]
        self.r_sse = L[_P64_SSE] - o
        self.r_ctr = self.hout.view(np.int64)[L[_I64_CHG] - o: L[_I64_CHG] - o + 1 + self.nslots]
        if not SIM:
            from numba.cuda.cudadrv.driver import device_pointer

            self._dptr = int(device_pointer(self.dev))
            self._hin_ptr = int(self.hin.ctypes.data)
            self._hout_ptr = int(self.hout.ctypes.data)
            cub = _cu()
            self._h2d = cub.cuMemcpyHtoDAsync
            self._d2h = cub.cuMemcpyDtoHAsync

    def fill(self, centres: np.ndarray) -> None:
        """Write this step's centre data into the pinned input buffer (host only)."""
        _fill_centres(np.ascontiguousarray(centres, dtype=np.float64), self.f32, self.sh, self.cc, self.cm,
                      self.c64, self.zl)

    def upload(self) -> None:
        """Inputs and zeroed outputs to the device: one asynchronous copy."""
        if SIM:
            self.dev.copy_to_device(self.hin)
        else:
            _cucheck(self._h2d(self._dptr, self._hin_ptr, self.total, 0), "cuMemcpyHtoDAsync")

    def download(self) -> None:
        """Outputs to ``hout``: one asynchronous copy (the caller synchronises)."""
        if SIM:
            self.dout.copy_to_host(self.hout)
        else:
            _cucheck(self._d2h(self._hout_ptr, self._dptr + self.out0, self.total - self.out0, 0),
                     "cuMemcpyDtoHAsync")


@njit(cache=True, nogil=True)
def _fill_centres(centres, f32, sh, cc, cm, c64, zl):  # pragma: no cover - compiled
    """The step buffer's centre data, in one compiled pass (numpy took ~0.1 ms a step).

    ``sh`` (m,): ``s``, the mean of the centres (rounded to float32 first when the rows
    are float32: the kernel subtracts exactly the value it is given); ``cm``
    (tiles, m, TC): ``-2 z`` with ``z = float32(c - s)``; ``cc`` (k,): ``|z|^2``;
    ``zl``: twice the largest ``|z|^2`` (the certification bound), infinite when a
    centre is not finite (every row then takes the exact path); ``c64``: the centres.
    Padding centres keep what the buffer was set up with (``cc`` infinite, ``cm`` 0).
    """
    k, m = centres.shape
    TC = cm.shape[2]
    shift = np.empty(m)
    for j in range(m):
        t = 0.0
        for i in range(k):
            t += centres[i, j]
        t /= k
        if f32:
            t = np.float64(np.float32(t))
        shift[j] = t
        sh[j] = t
    finite = True
    zmax = 0.0
    for i in range(k):
        tile = i // TC
        c = i - tile * TC
        norm = 0.0
        for j in range(m):
            v = centres[i, j]
            c64[i, j] = v
            finite = finite and np.isfinite(v)
            z = np.float32(v - shift[j])
            norm += np.float64(z) * np.float64(z)
            cm[tile, j, c] = z * np.float32(-2.0)
        cc[i] = norm
        if norm > zmax:
            zmax = norm
    zl[0] = min(2.0 * zmax * (1.0 + 1e-6), 3.0e38) if finite else np.inf


@njit(cache=True, nogil=True)
def _add_step(dev, counts, d_dev, d_counts, centres):  # pragma: no cover - compiled
    """``dev += d_dev``, ``counts += d_counts``; return the raw sums ``dev + counts c`` (k, m)."""
    k, m = dev.shape
    sums = np.empty((k, m))
    for i in range(k):
        n = counts[i] + d_counts[i]
        counts[i] = n
        for j in range(m):
            d = dev[i, j] + d_dev[i, j]
            dev[i, j] = d
            sums[i, j] = d + n * centres[i, j]
    return sums


@dataclass
class _Kept:
    """What an incremental step builds on: the last step's labels, summed (float64).

    ``dev`` (k, m): per cluster, the sum of ``w (x - c)`` over its rows; ``counts`` (k,):
    their weight; ``sse``: the sum of ``w |x - c|^2`` over all rows; ``centres`` (k, m):
    the ``c`` of that step.
    """

    dev: np.ndarray
    counts: np.ndarray
    sse: float
    centres: np.ndarray


@dataclass
class _State:
    """Everything a step with k centres reuses: plan, step buffer, prepared launches."""

    plan: _Plan
    pack: _Pack
    launches: list  # [(fused, recheck)] per chunk (one when resident)


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
        ``sum_mode`` ("global"), ``centres_shared`` (bool), ``smem_budget`` (bytes),
        ``maxreg``, ``blocks``, ``JC``; ``launch="numba"`` launches through Numba's
        dispatcher instead of the prepared launches; ``profile`` sets :attr:`profile`;
        ``delta`` ("auto", "always", "never"), see below.

    Attributes
    ----------
    profile : bool
        Record :attr:`last_kernel_ms`, the kernels' time in the last step or assignment
        (CUDA events around them; two event records per step; not when streaming).

    Notes
    -----
    Deviation sums.  The kernels sum ``x - c`` (``c`` the centre a row is assigned
    to), not ``x``; :meth:`step` returns ``sums = dev + counts c``.  Deviations are
    small where the data are far from the origin, so nothing cancels, and they are
    what an incremental step needs.

    Incremental steps.  After a step the backend keeps, in float64, each cluster's
    deviation sum and count, the total SSE and the centres used (:class:`_Kept`).
    When few labels changed in the last step (at most 1/16 of the rows, and few enough
    that moving them costs less than a full step's summing pass: ``_MOVE_NS``), the next step
    does no per-row work beyond the certified assignment (pass 1) for rows that keep
    their label: their deviation sums and SSE are carried over to the new centres
    exactly on the host, ``sum |x - c'|^2 = sum |x - c|^2 + 2 (c - c').sum(x - c) +
    n |c - c'|^2``, O(K M) work.  Rows whose label changes leave the old cluster
    (``x - c_old`` and ``|x - c_old|^2`` taken away) and join the new one (global
    atomics).  The results equal a full step's up to float64 rounding.  A full step
    runs at least every ``_DELTA_REFRESH`` steps, after a step that changed many
    labels, with weights (float weights summed and taken away need not return to 0 for
    an emptied cluster) and after :meth:`load`.
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
        self._dummy = None
        self._alabels = None
        self._adist = None
        self._states = {}
        self._plans = {}
        self._fast = _fast_launch_wanted(self.tune)
        self.profile = bool(self.tune.get("profile"))
        self._events = None
        self.last_flagged = 0
        self.last_plan = None
        self.last_grid = 0
        self.last_regs = None
        self.last_fast_launch = None
        self._occupancy = {}
        self.last_kernel_ms = float("nan")
        self._forget_kept()
        self.last_delta = False

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
        if self._weights_host is not None:
            # pinned too, so the per-chunk weight copies are asynchronous
            wp = _pinned(n, np.float64)
            wp[:] = self._weights_host
            self._weights_host = wp
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
    # ------------------------------------------------------------------ step
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

    def _plan(self, k: int, assign: bool, delta: bool = False) -> _Plan:
        key = (k, assign, delta)
        plan = self._plans.get(key)
        if plan is None:
            weighted = self._weights_host is not None
            limit = min(self._smem_optin, 200 * 1024) if not SIM else 48 * 1024
            plan = _choose_plan(k, self.m, self.dtype, assign, weighted, limit, self.tune, self._smem_sm, delta)
            self._plans[key] = plan
        return plan

    def _launches(self, plan: _Plan, pack: _Pack, k: int, assign: bool, x, rows: int, labels, flags, w,
                  dist2, fslot: int, stream, delta: bool = False):
        """The prepared (fused, recheck) pair for one block of rows."""
        weighted = self._weights_host is not None
        idx32 = self.m * self._ld < 2**31 and not self.tune.get("idx64")
        kern = _fused_kernel(self.dtype, plan.R, plan.TC, plan.NT, weighted, plan.mode, plan.centres_shared,
                             plan.maxreg, k, self.m, plan.nct, plan.offs, pack.layout, idx32,
                             bool(self.tune.get("diag_skip_pass2")), bool(self.tune.get("lineinfo")))
        args = (x, int(rows), int(self._ld), pack.p32, pack.dev, pack.ctr, labels, flags, w, dist2, int(fslot))
        per_sm = self._blocks_per_sm(kern, plan, args)
        ntiles = -(-rows // (plan.NT * plan.R))
        grid = max(1, min(ntiles, 2 if SIM else per_sm * self._sm_count))
        self.last_grid = grid
        fused = _Launch(kern, args, grid, plan.NT, plan.smem, stream, self._fast)
        rk = _recheck_kernel(self.dtype, weighted, assign, k, self.m, pack.layout, delta)
        rargs = (x, int(self._ld), pack.dev, pack.ctr, labels, flags, w, dist2, int(fslot))
        # one warp per flagged row; with none flagged each block reads the count and returns
        rgrid = 1 if SIM else max(1, min(2 * self._sm_count, -(-rows // _RC_WARPS)))
        recheck = _Launch(rk, rargs, rgrid, 32 * _RC_WARPS, 0, stream, self._fast)
        self.last_fast_launch = fused.fast and recheck.fast
        return fused, recheck

    def _state(self, k: int, assign: bool, delta: bool = False) -> _State:
        """Plan, step buffer and prepared launches for k centres: built once, reused every step."""
        key = (k, assign, delta)
        st = self._states.get(key)
        if st is not None:
            return st
        plan = self._plan(k, assign, delta)
        weighted = self._weights_host is not None
        if self._dummy is None:
            self._dummy = cuda.device_array(1, dtype=np.float64)
        if not self._streaming:
            pack = _Pack(k, self.m, plan.TC, plan.nct, self.dtype, 1)
            if assign:
                if self._alabels is None:
                    self._alabels = cuda.device_array(self.n, dtype=np.int32)
                    self._adist = cuda.device_array(self.n, dtype=np.float64)
                labels, dist2 = self._alabels, self._adist
            else:
                labels, dist2 = self._labels, self._dummy
            w = self._dw if weighted else self._dummy
            fslot = pack.layout[_I64_CHG] + 1
            launches = [self._launches(plan, pack, k, assign, self._dx, self.n, labels, self._flags, w, dist2,
                                       fslot, 0, delta)]
        else:
            pack = _Pack(k, self.m, plan.TC, plan.nct, self.dtype, self._nchunks)
            launches = []
            for c in range(self._nchunks):
                s = c % 2
                rows = min(self.n, (c + 1) * self.chunk) - c * self.chunk
                w = self._dwbuf[s] if weighted else self._dummy
                # one flagged-row counter per chunk: the outputs' upload zeroes them all
                fslot = pack.layout[_I64_CHG] + 1 + c
                launches.append(self._launches(plan, pack, k, assign, self._dbuf[s], rows, self._dlab[s],
                                               self._dflags[s], w, self._ddist[s], fslot, self._streams[s],
                                               delta))
        st = _State(plan, pack, launches)
        if len(self._states) >= 8:
            # k-means|| assigns to a new number of candidates each round: keep the latest few
            self._states.pop(next(iter(self._states)))
        self._states[key] = st
        return st

    def _run(self, centres: np.ndarray, assign: bool, delta: bool = False, while_busy=None):
        """One step (or assignment) on the device.

        Host work per call, once the state for this k exists: fill the pinned input
        buffer; one asynchronous copy in (centre data and zeroed outputs); the fused
        and recheck launches (per chunk when streaming); one asynchronous copy out of
        sums, counts, SSE and counters; ``while_busy()`` if given (host work that then
        overlaps the kernels); one synchronisation.
        """
        centres = np.ascontiguousarray(centres, dtype=np.float64)
        if centres.ndim != 2 or centres.shape[1] != self.m:
            raise ValueError(f"centres must have shape (k, {self.m}), got {centres.shape}")
        k = centres.shape[0]
        n = self.n
        if k == 0:
            raise ValueError("at least one centre is needed")
        st = self._state(k, assign, delta)
        self.last_plan = st.plan
        pack = st.pack
        pack.fill(centres)
        pack.upload()
        labels_out = dist_out = None
        if assign:
            labels_out = np.empty(n, dtype=np.int32)
            dist_out = np.empty(n, dtype=np.float64)
        profile = self.profile and not self._streaming and not SIM
        if profile and self._events is None:
            self._events = (cuda.event(), cuda.event())
        if not self._streaming:
            fused, recheck = st.launches[0]
            if profile:
                self._events[0].record()
            fused()
            recheck()
            if profile:
                self._events[1].record()
            if assign:
                self._alabels.copy_to_host(labels_out)
                self._adist.copy_to_host(dist_out)
        else:
            self._run_streaming(st, assign, labels_out, dist_out)
        pack.download()
        if while_busy is not None:
            while_busy()
        if not SIM:
            _cucheck(_cu().cuStreamSynchronize(0), "cuStreamSynchronize")
        if profile:
            self.last_kernel_ms = cuda.event_elapsed_time(*self._events)
        ctr = pack.r_ctr
        self.last_flagged = int(ctr[1:].sum())
        if assign:
            return labels_out, dist_out
        # views of the pinned output buffer: step() consumes them before the next step
        return StepResult(sums=pack.r_sums, counts=pack.r_cnt, sse=float(pack.hout[pack.r_sse]),
                          changed=int(ctr[0]))

    def _run_streaming(self, st: _State, assign: bool, labels_out, dist_out):
        """Chunks alternate between two streams: the copy of chunk i+1 runs while chunk i computes.

        The streams synchronise with the legacy default stream, so the centre upload
        (issued before) is complete when a chunk starts, and the outputs' copy back
        (issued after) waits for every chunk.
        """
        n, cr = self.n, self.chunk
        weighted = self._weights_host is not None
        for c in range(self._nchunks):
            s = c % 2
            stream = self._streams[s]
            a = c * cr
            b = min(n, a + cr)
            rows = b - a
            self._dbuf[s].copy_to_device(self._host_soa[c], stream=stream)
            if not assign:
                self._dlab[s][:rows].copy_to_device(self._host_labels[a:b], stream=stream)
            if weighted:
                self._dwbuf[s][:rows].copy_to_device(self._weights_host[a:b], stream=stream)
            fused, recheck = st.launches[c]
            fused()
            recheck()
            if assign:
                self._dlab[s][:rows].copy_to_host(labels_out[a:b], stream=stream)
                self._ddist[s][:rows].copy_to_host(dist_out[a:b], stream=stream)
            else:
                self._dlab[s][:rows].copy_to_host(self._host_labels[a:b], stream=stream)
        for stream in self._streams:
            stream.synchronize()

    def warmup(self, k: int, m: int) -> None:
        """Compile the step's and the final assignment's kernels for k centres (see :meth:`Backend.warmup`).

        Building the per-k state prepares (so compiles) both launches; without this
        the first step and the closing assignment would carry seconds of JIT into
        the timed Lloyd loop.
        """
        if self.n == 0 or k < 1:
            return
        st = self._state(k, False)
        self._state(k, True)
        if self._delta_allowed():
            self._state(k, False, True)
        # the host-side helpers too (compiled, cached on disk after the first run)
        zeros = np.zeros((k, self.m))
        st.pack.fill(zeros)  # overwritten by every step's fill
        _add_step(zeros.copy(), np.zeros(k), zeros, np.zeros(k), zeros)

    def step(self, centres: np.ndarray) -> StepResult:
        """Assign every local row and accumulate float64 sums (see :meth:`Backend.step`).

        Parameters
        ----------
        centres : ndarray, shape (k, m), float64

        Returns
        -------
        StepResult
        """
        # a private copy: it is kept for the next step's carry-over
        centres = np.array(centres, dtype=np.float64, order="C")
        k = centres.shape[0]
        if self.n == 0:
            return StepResult(sums=np.zeros((k, self.m if self.m else centres.shape[1])),
                              counts=np.zeros(k), sse=0.0, changed=0)
        policy = self.tune.get("delta", "auto")
        delta = (self._delta_allowed() and self._kept is not None and self._kept.counts.shape[0] == k
                 and (policy == "always"
                      or (self._delta_run < _DELTA_REFRESH and self._last_changed * 16 <= self.n
                          and (self._last_changed * (_MOVE_NS + _MOVE_NS_PER_ELEM * k * self.m)
                               <= _PASS2_NS_PER_ELEM * self.n * self.m))))
        carried = []

        def carry_over():
            # the kept rows, carried over to this step's centres (exact algebra; every
            # term is small when the centres move little): sum |x - c'|^2 = sum |x - c|^2
            # + 2 (c - c').sum(x - c) + n |c - c'|^2, sum(x - c') = sum(x - c) + n (c - c').
            # Host work, done while the kernels run.
            kept = self._kept
            move = kept.centres - centres
            carried.append(kept.sse + 2.0 * float(np.vdot(move, kept.dev))
                           + float(kept.counts @ np.einsum("km,km->k", move, move)))
            carried.append(kept.dev + kept.counts[:, None] * move)
            carried.append(kept.counts.copy())

        res = self._run(centres, assign=False, delta=delta, while_busy=carry_over if delta else None)
        if delta:
            # then the rows that changed label: they left one cluster and joined another
            sse, dev, counts = carried
            sse += res.sse
            self._delta_run += 1
        else:
            sse, dev, counts = res.sse, np.zeros_like(res.sums), np.zeros_like(res.counts)
            self._delta_run = 0
        # the device sums deviations from the centres (no cancellation far from the
        # origin, and what the carry-over above needs); the raw sums are dev + n c
        sums = _add_step(dev, counts, res.sums, res.counts, centres)
        self._kept = _Kept(dev, counts, sse, centres)
        self._last_changed = res.changed
        self.last_delta = delta
        return StepResult(sums=sums, counts=counts.copy(), sse=sse, changed=res.changed)

    def forget_labels(self) -> None:
        """Start over: every label unknown, no kept sums (the next step is like a first one).

        For benchmarks that time several runs on one loaded backend.
        """
        self._forget_kept()
        if self._streaming:
            self._host_labels[:] = -1
        elif self._labels is not None:
            self._labels.copy_to_device(np.full(self.n, -1, dtype=np.int32))

    def _forget_kept(self) -> None:
        """Drop the kept sums: the next step is a full one."""
        self._kept = None  # _Kept of the current labels
        self._delta_run = 0
        self._last_changed = None

    def _delta_allowed(self) -> bool:
        """Whether incremental steps may run at all (see the class notes)."""
        return self.tune.get("delta", "auto") != "never" and self._weights_host is None

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
        self._forget_kept()
        self._dx = None
        self._labels = None
        self._flags = None
        self._dw = None
        self._dummy = None
        self._alabels = None
        self._adist = None
        self._states = {}
        self._plans = {}
        self._streaming = False
        for attr in ("_host_soa", "_dbuf", "_dlab", "_dflags", "_dwbuf", "_ddist", "_host_labels", "_streams"):
            if hasattr(self, attr):
                setattr(self, attr, None)
