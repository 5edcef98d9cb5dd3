"""Registers and local memory (spills) of every kernel a GPU run at one shape compiles.

Builds a GPU backend on random rows of the shape (resident, the kept bounds on unless ``--no-bounds``),
compiles every step kind with :meth:`GPUBackend.warmup` (both GEMM screens included), and prints each
compiled kernel's registers a thread, local bytes a thread (non-zero: spills or local arrays) and
static shared memory, from the CUDA driver's function attributes.

    python3 bench/experiments/kernel_registers.py --shape 3000x257x1000 --dtype float32
"""

from __future__ import annotations

import argparse

import numpy as np

from mpikmeans.backends.gpu import GPUBackend
from mpikmeans.backends.gpu.compiled import _IN_PROCESS


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", default="3000x257x1000", help="NxMxK")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--no-bounds", action="store_true")
    a = ap.parse_args()
    n, m, k = (int(v) for v in a.shape.split("x"))
    x = np.random.default_rng(1).normal(size=(n, m))
    be = GPUBackend(dtype=a.dtype, tune={"bounds": not a.no_bounds})
    be.load(x)
    be.warmup(k, m)
    print(f"{n} x {m}, K = {k}, {a.dtype}: kernel, specialisation, registers, local bytes, static shared bytes")
    for key, kern in _IN_PROCESS.items():
        name, spec = key[0], key[1]
        attrs = kern._codelibrary.get_cufunc().attrs
        print(f"{name:14s} {str(spec)[:90]:90s} regs {attrs.regs:4d} local {attrs.local:5d} shared {attrs.shared:6d}")
    be.close()


if __name__ == "__main__":
    main()
