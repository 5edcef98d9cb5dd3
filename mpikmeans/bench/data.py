"""Synthetic inputs of the benchmarks: ARFF through ``gen-data``, ``.npy`` blobs, data made on the GPU.

* :func:`gen_arff`: ``mpikmeans gen-data`` under the launcher, as a user makes an
  input; its figures (bytes, write time, start-up) come from its ``--report`` file.
* :func:`write_blobs_npy`: the rows ``gen-data`` would write, as float64 ``.npy``
  (the size sweeps skip text); :func:`initial_centres`: K rows of it as the shared start.
* :func:`gpu_blobs` and :func:`gpu_rows`: clusters generated directly on a GPU,
  column-major (the GPU backend's device layout), so no host memory or PCIe time
  is spent on inputs of several GB.  PyTorch makes them.
"""

from __future__ import annotations

import json
import os
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from ..io.gen import BLOCK_ROWS, GenSpec, blob_centres, generate_block
from ..io.output import centres_csv, write_atomic
from .harness import Launch

#: Rows per block of :func:`gpu_rows` (one seed each, so rows do not depend on the rank count).
GPU_BLOCK = 1_000_000


def gen_arff(launch: Launch, ranks: int, path: str, n: int, m: int, k: int, *extra) -> dict:
    """``mpikmeans gen-data PATH -n N -m M -k K EXTRA`` on ``ranks`` ranks; its report.

    Returns
    -------
    dict
        The ``--report`` file: ``bytes``, ``write_s`` (the writing, the start-up
        apart), ``startup_s``, ``ranks``...; plus ``wall_s``, the whole command.
    """
    report = path + ".report.json"
    ran = launch.mpi(ranks, "gen-data", path, "-n", n, "-m", m, "-k", k, *extra, "--report", report, "-q")
    with open(report) as f:
        figures = json.load(f)
    os.remove(report)
    return {**figures, "wall_s": ran.wall_s}


def write_blobs_npy(spec: GenSpec, path: str, workers: int | None = None) -> None:
    """The rows ``gen-data`` would write for ``spec``, as a float64 ``.npy`` of shape (n, m).

    Values are the fixed-point ticks over ``10**decimals``: a correctly rounded
    division of two exact doubles, so equal to parsing the text ``gen-data`` writes.
    Blocks are independent random streams, generated on several threads.
    """
    spec.validate()
    centres = blob_centres(spec)
    out = np.lib.format.open_memmap(path + ".part", mode="w+", dtype=np.float64, shape=(spec.n, spec.m))
    scale = 10.0 ** spec.decimals

    def block(b):
        ticks, _ = generate_block(spec, b, centres)
        out[b * BLOCK_ROWS : b * BLOCK_ROWS + len(ticks)] = ticks / scale

    blocks = (spec.n + BLOCK_ROWS - 1) // BLOCK_ROWS
    with ThreadPoolExecutor(workers or os.cpu_count() or 1) as pool:
        list(pool.map(block, range(blocks)))
    out.flush()  # a rename leaves the mapping valid (POSIX), so no need to close it first
    os.replace(path + ".part", path)


def initial_centres(data: str, k: int, seed: int, prefix: str) -> tuple[str, str]:
    """K distinct rows of ``data`` (.npy), as ``PREFIX.csv`` (for ``--init``) and ``PREFIX.npy`` (k, m).

    Returns
    -------
    (csv path, npy path)
    """
    x = np.load(data, mmap_mode="r")
    rows = np.sort(np.random.default_rng(seed).choice(len(x), size=k, replace=False))
    c = np.array(x[rows], dtype=np.float64)
    np.save(prefix + ".npy", c)
    write_atomic(prefix + ".csv", centres_csv(c, [f"X{j + 1}" for j in range(c.shape[1])]))
    return prefix + ".csv", prefix + ".npy"


def _columns(torch, ctrue, labels, noise: float, generator, tdt):
    """Rows around ``ctrue[labels]``, column-major (m, len(labels)), normal noise of sd ``noise``."""
    m = ctrue.shape[1]
    noise_block = torch.randn(m, len(labels), generator=generator, device="cuda", dtype=torch.float64)
    return (ctrue.t()[:, labels] + noise * noise_block).to(tdt)


def _torch_dtype(torch, dtype: str):
    return torch.float32 if dtype == "float32" else torch.float64


def gpu_blobs(torch, n: int, m: int, k: int, dtype: str, seed: int, noise: float = 1.0):
    """Clusters on the current GPU for ``bench gpu``; and a start near their centres.

    Centres uniform in [-10, 10]^m, rows at a centre plus normal noise of standard
    deviation ``noise`` per attribute (1: well separated).  The start is near the
    true centres, so labels settle at once even for noisy clusters (measured for
    A at noise 5 and 8); starting from rows instead gives a start they move from.

    Returns
    -------
    xt : torch.Tensor, shape (m, n), ``dtype``, on the GPU
    start : ndarray, shape (k, m), float64
    """
    g = torch.Generator(device="cuda").manual_seed(seed)
    tdt = _torch_dtype(torch, dtype)
    ctrue = torch.rand(k, m, generator=g, device="cuda", dtype=torch.float64) * 20 - 10
    xt = torch.empty(m, n, device="cuda", dtype=tdt)
    step = max(1, (1 << 28) // (m * 8))  # 256 MB of float64 noise at a time
    for a in range(0, n, step):
        b = min(n, a + step)
        lab = torch.randint(0, k, (b - a,), generator=g, device="cuda")
        xt[:, a:b] = _columns(torch, ctrue, lab, noise, g, tdt)
        del lab
    start = ctrue.cpu().numpy() + np.random.default_rng(seed).normal(scale=0.5, size=(k, m))
    return xt, start


def gpu_rows(torch, a: int, b: int, ctrue, dtype: str, seed: int):
    """Rows [a, b) of one global data set, column-major (m, b - a), on the current GPU.

    The rows come in blocks of :data:`GPU_BLOCK`, each from its own seed, so a
    rank's share is the same rows whatever the number of ranks (``bench mpi-gpu``).

    Parameters
    ----------
    torch : module
    a, b : int
        Global row range.
    ctrue : torch.Tensor, shape (k, m), float64, on the GPU
        The clusters' centres; rows have unit noise around them.
    dtype : {"float32", "float64"}
    seed : int
    """
    tdt = _torch_dtype(torch, dtype)
    k, m = ctrue.shape
    xt = torch.empty(m, b - a, device="cuda", dtype=tdt)
    for blk in range(a // GPU_BLOCK, -(-b // GPU_BLOCK)):
        lo, hi = blk * GPU_BLOCK, (blk + 1) * GPU_BLOCK
        g = torch.Generator(device="cuda").manual_seed(seed * 100_003 + blk)
        lab = torch.randint(0, k, (GPU_BLOCK,), generator=g, device="cuda")
        s, e = max(lo, a), min(hi, b)
        xt[:, s - a:e - a] = _columns(torch, ctrue, lab, 1.0, g, tdt)[:, s - lo:e - lo]
    return xt
