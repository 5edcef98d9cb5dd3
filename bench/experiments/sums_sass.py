"""The split step's sums kernel as the H100 runs it, without a GPU: registers, stack and SASS.

Builds :func:`mpikmeans.backends.gpu.sums.sums_kernel` for K x M as the backend would
(:func:`~mpikmeans.backends.gpu.plan.sums_layout`, the step buffer's layout, 32-bit row
indices, the register cap), compiles it to PTX for sm_90, runs ``ptxas -v`` and
``nvdisasm``, and prints the register line and the instruction count of each loop body
(the walk's batch of rows, and a tile's whole loop).  Run it on an older commit for the
kernel before a change (the 32-bit index flag is passed only where the kernel takes it).
Needs libnvvm, NVRTC, ptxas and nvdisasm (pip: nvidia-cuda-nvcc, nvidia-cuda-nvrtc 13.0 and
nvidia-cuda-nvdisasm), e.g.

    pip install --target /tmp/nvcc "nvidia-cuda-nvcc==13.0.*" "nvidia-cuda-nvrtc==13.0.*"
    pip install --target /tmp/nvcc2 "nvidia-cuda-nvdisasm==13.2.*"
    LD_LIBRARY_PATH=/tmp/nvcc/nvidia/cu13/lib NUMBA_CUDA_NVVM=/tmp/nvcc/nvidia/cu13/lib/libnvvm.so.4 \\
        PTXAS=/tmp/nvcc/nvidia/cu13/bin/ptxas NVDISASM=/tmp/nvcc2/nvidia/cu13/bin/nvdisasm \\
        python bench/experiments/sums_sass.py 50 100 float32 [weighted] [OUT.sass]
"""
import inspect
import os
import re
import subprocess
import sys
import tempfile
from types import SimpleNamespace as types_ns

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))
from numba import cuda, types  # noqa: E402

from mpikmeans.backends.gpu import plan as P  # noqa: E402
from mpikmeans.backends.gpu import sums as S  # noqa: E402


def main():
    k, m, dtype = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
    weighted = len(sys.argv) > 4 and sys.argv[4] == "weighted"
    out = sys.argv[5] if len(sys.argv) > 5 else None
    lay = P.sums_layout(k, m, dtype, weighted, 200 * 1024)
    plan = P.choose_plan(k, m, dtype, False, weighted, 200 * 1024, {}, 228 * 1024, split=True)
    layout = P.pack_layout(k, m, plan.TC, plan.nct, dtype, 1)[0]
    # 32-bit row indices where the kernel has the choice (commits before it did not)
    idx32 = {"idx32": True} if "idx32" in inspect.signature(S.sums_kernel.__wrapped__).parameters else {}
    # the register cap the backend would give it on an H100 (228 KB of shared memory, 64 K registers)
    cap = (S.register_cap(types_ns(smem_sm=228 * 1024, regs_sm=65536), lay) if hasattr(S, "register_cap")
           else S.SUMS_MAXREG)
    kern = S.sums_kernel(dtype, weighted, k, m, tuple(layout), tuple(lay), cap, **idx32)
    arr = lambda t: types.Array(t, 1, "C")  # noqa: E731
    store = types.float64 if dtype == "float64" else types.float32
    kinds = {"x": arr(store), "n": types.int64, "ld": types.int64, "p32": arr(types.float32),
             "p64": arr(types.float64), "ctr": arr(types.int64), "labels": arr(types.int32),
             "newlab": arr(types.int32), "w": arr(types.float64), "flags": arr(types.int32), "fslot": types.int64}
    # the kernel's own parameters (commits before the assigning one took no p32, flags, fslot)
    sig = tuple(kinds[p] for p in inspect.signature(kern.py_func).parameters)
    ptx, _ = cuda.compile_ptx(kern.py_func, sig, cc=(9, 0), fastmath=False)
    with tempfile.TemporaryDirectory() as tmp:
        with open(f"{tmp}/k.ptx", "w") as f:
            f.write(re.sub(r"^\.version 9\.\d+", ".version 9.0", ptx, flags=re.M))
        r = subprocess.run([os.environ.get("PTXAS", "ptxas"), "-arch=sm_90", "-v", "-O3",
                            f"-maxrregcount={cap}", f"{tmp}/k.ptx", "-o", f"{tmp}/k.cubin"],
                           capture_output=True, text=True, check=True)
        sass = subprocess.run([os.environ.get("NVDISASM", "nvdisasm"), "-c", f"{tmp}/k.cubin"],
                              capture_output=True, text=True, check=True).stdout
    print(f"K={k} M={m} {dtype}{' weighted' if weighted else ''}: {lay}")
    print(" ".join(line.split(":", 1)[1].strip() for line in r.stderr.splitlines() if "Used" in line))
    if out:
        with open(out, "w") as f:
            f.write(sass)
    # loop bodies: from a label to the backward branch to it
    lines = sass.splitlines()
    where = {}
    for n, line in enumerate(lines):
        lab = re.match(r"^(\.L_x_\d+):", line.strip())
        if lab:
            where[lab.group(1)] = n
        br = re.search(r"BRA `\((\.L_x_\d+)\)", line)
        if br and br.group(1) in where and where[br.group(1)] < n:
            body = [x for x in lines[where[br.group(1)]:n + 1] if re.search(r"/\*[0-9a-f]{4}\*/", x)]
            if any("BAR.SYNC" in x for x in body):
                kinds = "a tile: staging, barriers and the walk's loop once"
            elif any("DADD" in x for x in body) and any("STS.64" in x for x in body) and any("LDS" in x for x in body):
                kinds = "the walk: a batch of rows"
            else:
                kinds = "other"
            print(f"  loop {br.group(1)}: {len(body)} instructions ({kinds})")


if __name__ == "__main__":
    main()
