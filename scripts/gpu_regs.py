#!/usr/bin/env python3
"""Registers and spills of the fused step kernel, without a GPU.

Compiles the kernel the backend would build for K centres x M attributes to PTX
(``numba.cuda.compile_ptx`` on its ``py_func``) and runs ``ptxas -v`` on it::

    python3 scripts/gpu_regs.py 50 100 float32                 # incremental step (mode 3)
    python3 scripts/gpu_regs.py 50 100 float32 '{}' full       # full step
    python3 scripts/gpu_regs.py 1000 32 float64 '{"R": 1}' assign

Needs libnvvm and a ptxas (no driver), e.g.
``pip install --target /tmp/nvcc "nvidia-cuda-nvcc==13.0.*"``, then
``NUMBA_CUDA_NVVM=/tmp/nvcc/nvidia/cu13/lib/libnvvm.so.4 PTXAS=/tmp/nvcc/nvidia/cu13/bin/ptxas``.
The PTX ``.version`` is lowered to 9.0 for older ptxas releases.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) < 3:
        print(__doc__)
        return 2
    from numba import cuda, types

    import mpikmeans.backends.gpu as G

    k, m, dt = int(argv[0]), int(argv[1]), argv[2]
    tune = json.loads(argv[3]) if len(argv) > 3 else {}
    which = argv[4] if len(argv) > 4 else "delta"
    plan = G._choose_plan(k, m, dt, which == "assign", False, 200 * 1024, tune, 228 * 1024, which == "delta")
    layout = G._pack_layout(k, m, plan.TC, plan.nct, dt, 1)[0]
    disp = G._fused_kernel(dt, plan.R, plan.TC, plan.NT, False, plan.mode, plan.centres_shared, plan.maxreg,
                           k, m, plan.nct, plan.offs, layout, True, bool(tune.get("diag_skip_pass2")))
    arr = lambda t: types.Array(t, 1, "C")  # noqa: E731
    store = types.float64 if dt == "float64" else types.float32
    sig = (arr(store), types.int64, types.int64, arr(types.float32), arr(types.float64), arr(types.int64),
           arr(types.int32), arr(types.int32), arr(types.float64), arr(types.float64), types.int64)
    ptx, _ = cuda.compile_ptx(disp.py_func, sig, cc=(9, 0), fastmath=False)
    with tempfile.TemporaryDirectory() as tmp:
        src = os.path.join(tmp, "k.ptx")
        Path(src).write_text(re.sub(r"^\.version 9\.\d+", ".version 9.0", ptx, flags=re.M))
        cmd = [os.environ.get("PTXAS", "ptxas"), "-arch=sm_90", "-v", "-O3", src, "-o", os.path.join(tmp, "k.cubin")]
        if plan.maxreg:
            cmd.insert(1, f"-maxrregcount={plan.maxreg}")
        r = subprocess.run(cmd, capture_output=True, text=True)
    print(f"plan: mode {plan.mode}, R {plan.R}, TC {plan.TC}, NT {plan.NT}, tiles {plan.nct}, "
          f"centres in shared memory {plan.centres_shared}, {plan.smem} B shared")
    print("\n".join(line.strip() for line in r.stderr.splitlines() if "registers" in line or "spill" in line)
          or r.stderr)
    return r.returncode


if __name__ == "__main__":
    sys.exit(main())
