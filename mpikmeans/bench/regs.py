"""``mpikmeans bench regs``: registers and spills of the fused step kernel, without a GPU.

Builds the kernel the GPU backend would launch for K centres x M attributes
(:func:`mpikmeans.backends.gpu.plan.choose_plan`, :func:`~mpikmeans.backends.gpu.plan.pack_layout`,
:func:`mpikmeans.backends.gpu.kernels.fused_kernel`, as ``GPUBackend.kernel_for``
does), compiles it to PTX for sm_90 (``numba.cuda.compile_ptx`` on its
``py_func``) and runs ``ptxas -v`` on it.

Needs libnvvm and NVRTC (numba-cuda's compiler) and a ``ptxas``, but no driver:
e.g. ``pip install --target /tmp/nvcc "nvidia-cuda-nvcc==13.0.*" "nvidia-cuda-nvrtc==13.0.*"``,
then ``NUMBA_CUDA_NVVM=/tmp/nvcc/nvidia/cu13/lib/libnvvm.so.4
PTXAS=/tmp/nvcc/nvidia/cu13/bin/ptxas`` (and the NVRTC library on
``LD_LIBRARY_PATH``).  The PTX ``.version`` is lowered to 9.0 for older ptxas
releases.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import tempfile

from ..errors import RunError, UsageError

#: Which kernel: the incremental step (mode 3), a full step, or the assignment.
WHICH = ("delta", "full", "assign")
DTYPES = ("float32", "float64")
#: The sm_90 limits the backend plans for (H100/H200).
SMEM_LIMIT, SMEM_SM = 200 * 1024, 228 * 1024


def parse_tune(text: str | None) -> dict:
    """A tune dict from JSON (``'{"R": 1}'``); raises :class:`UsageError`."""
    if not text:
        return {}
    try:
        tune = json.loads(text)
    except ValueError as exc:
        raise UsageError(f"bench regs: TUNE is not JSON: {exc}") from None
    if not isinstance(tune, dict):
        raise UsageError('bench regs: TUNE must be a JSON object such as \'{"R": 1}\'')
    return tune


def ptxas_path() -> str:
    """The ``ptxas`` to run: ``$PTXAS``, else the one on ``PATH``; raises :class:`RunError`."""
    ptxas = os.environ.get("PTXAS") or shutil.which("ptxas")
    if not ptxas or not os.access(ptxas, os.X_OK):
        raise RunError("bench regs needs ptxas (set PTXAS, or put the CUDA toolkit's bin on PATH; "
                       "pip install nvidia-cuda-nvcc has one)")
    return ptxas


def compile_ptx(k: int, m: int, dtype: str, tune: dict, which: str) -> tuple:
    """PTX of the fused kernel for these settings, and the plan it was built for.

    Returns
    -------
    (ptx text, Plan)

    Raises
    ------
    UsageError
        Bad sizes, dtype or kernel.
    RunError
        The simulator is on, or numba-cuda cannot compile here (no libnvvm/NVRTC).
    """
    if min(k, m) < 1:
        raise UsageError("bench regs: K and M must be at least 1")
    if dtype not in DTYPES:
        raise UsageError(f"bench regs: DTYPE {dtype}: choose from {', '.join(DTYPES)}")
    if which not in WHICH:
        raise UsageError(f"bench regs: kernel {which!r}: choose from {', '.join(WHICH)}")
    try:
        from numba import cuda, types

        from ..backends.gpu import SIM, kernels, plan as plans
        from ..backends.gpu.bounds import bounds_wanted
    except ImportError as exc:
        raise RunError(f"bench regs needs numba-cuda: {exc}") from None
    if SIM:
        raise RunError("bench regs compiles real PTX: unset NUMBA_ENABLE_CUDASIM")
    try:
        plan = plans.choose_plan(k, m, dtype, which == "assign", False, SMEM_LIMIT, tune, SMEM_SM, which == "delta")
    except ValueError as exc:
        raise UsageError(f"bench regs: {exc}") from None
    layout = plans.pack_layout(k, m, plan.TC, plan.nct, dtype, 1)[0]
    # the positional arguments of GPUBackend.kernel_for: unweighted, 32-bit indices
    # and kept bounds where a step's backend keeps them (resident rows assumed; mpikmeans/backends/gpu/bounds.py)
    keeps = (plan.mode in (plans.MODE_STEP_SPLIT, plans.MODE_STEP_DELTA)
             and bounds_wanted(tune.get("bounds", "auto"), k, m, dtype))
    disp = kernels.fused_kernel(dtype, plan.R, plan.TC, plan.NT, False, plan.mode, plan.centres_shared, plan.maxreg,
                                k, m, plan.nct, plan.offs, layout, True, bool(tune.get("diag_skip_pass2")), False, keeps)
    arr = lambda t: types.Array(t, 1, "C")  # noqa: E731
    store = types.float64 if dtype == "float64" else types.float32
    sig = (arr(store), types.int64, types.int64, arr(types.float32), arr(types.float64), arr(types.int64),
           arr(types.int32), arr(types.int32), arr(types.float64), arr(types.float64), types.int64,
           arr(types.int32), arr(types.float32), arr(types.float32), types.int64, types.int64)
    try:
        ptx, _ = cuda.compile_ptx(disp.py_func, sig, cc=(9, 0), fastmath=False)
    except Exception as exc:  # noqa: BLE001 - libnvvm or NVRTC missing shows up as many types
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise RunError("bench regs needs libnvvm and NVRTC to compile PTX (no GPU needed): "
                       f"{type(exc).__name__}: {first}") from None
    return ptx, plan


def registers(k: int, m: int, dtype: str, tune: dict | None = None, which: str = "delta") -> dict:
    """Registers and spills of the fused kernel as ``ptxas -v`` reports them.

    Parameters
    ----------
    k, m : int
        Centres and attributes.
    dtype : {"float32", "float64"}
        Storage dtype of the rows.
    tune : dict, optional
        Kernel overrides (see :class:`~mpikmeans.backends.gpu.GPUBackend`).
    which : {"delta", "full", "assign"}

    Returns
    -------
    dict
        ``plan`` (mode, R, TC, NT, tiles, centres_shared, smem), ``registers``
        (int or None), ``ptxas`` (its lines about registers, spills and stack),
        ``returncode``.
    """
    tune = dict(tune or {})
    ptxas = ptxas_path()
    ptx, plan = compile_ptx(k, m, dtype, tune, which)
    with tempfile.TemporaryDirectory() as tmp:
        src = os.path.join(tmp, "k.ptx")
        with open(src, "w") as f:
            f.write(re.sub(r"^\.version 9\.\d+", ".version 9.0", ptx, flags=re.M))
        cmd = [ptxas, "-arch=sm_90", "-v", "-O3", src, "-o", os.path.join(tmp, "k.cubin")]
        if plan.maxreg:
            cmd.insert(1, f"-maxrregcount={plan.maxreg}")
        done = subprocess.run(cmd, capture_output=True, text=True)
    lines = [line.strip() for line in done.stderr.splitlines()
             if "registers" in line or "spill" in line or "stack" in line]
    found = re.search(r"Used (\d+) registers", done.stderr)
    return {"plan": {"mode": plan.mode, "R": plan.R, "TC": plan.TC, "NT": plan.NT, "tiles": plan.nct,
                     "centres_shared": plan.centres_shared, "smem": plan.smem, "maxreg": plan.maxreg},
            "registers": int(found.group(1)) if found else None, "ptxas": lines or done.stderr.strip().splitlines(),
            "returncode": done.returncode}
