"""Synthetic inputs of the benchmarks, made as a user makes them.

* :func:`gen_arff`: ``mpikmeans gen-data`` (under the launcher where there is
  one); its figures (bytes, write time, start-up) come from its ``--report`` file.
* :func:`gen_npy`: ``gen-data`` then ``mpikmeans convert`` to ``.npy``, once: a
  ``.npy`` of the right shape already there is used as it is.
* :func:`write_blobs_npy`: the rows ``gen-data`` would write, as float64 ``.npy``
  without the text (the size sweeps); :func:`initial_centres`: K rows of it as
  the shared start.
"""

from __future__ import annotations

import json
import os
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from ..io.gen import BLOCK_ROWS, GenSpec, blob_centres, generate_block
from ..io.output import centres_csv, write_atomic
from .harness import Launch


def gen_arff(launch: Launch, ranks: int, path: str, n: int, m: int, k: int, *extra) -> dict:
    """``mpikmeans gen-data PATH -n N -m M -k K EXTRA`` on ``ranks`` ranks (0: alone); its report.

    Returns
    -------
    dict
        The ``--report`` file: ``bytes``, ``write_s`` (the writing, the start-up
        apart), ``startup_s``, ``ranks``...; plus ``wall_s``, the whole command.
    """
    report = path + ".report.json"
    ran = launch.tool(ranks, "gen-data", path, "-n", n, "-m", m, "-k", k, *extra, "--report", report, "-q")
    with open(report) as f:
        figures = json.load(f)
    os.remove(report)
    return {**figures, "wall_s": ran.wall_s}


def npy_shape(path: str) -> tuple | None:
    """The shape of the ``.npy`` at ``path``, or None where there is none (or it is not a ``.npy``)."""
    try:
        return tuple(np.load(path, mmap_mode="r").shape)
    except (OSError, ValueError):
        return None


def gen_npy(launch: Launch, ranks: int, path: str, n: int, m: int, k: int, seed: int, keep_arff: bool = False) -> dict:
    """``gen-data`` and ``convert`` to the ``.npy`` at ``path`` (n rows, m attributes, k blobs), once.

    A ``.npy`` of shape (n, m) already at ``path`` is taken as made by an
    earlier call with the same settings (the file names hold them) and reused.

    Parameters
    ----------
    launch : Launch
    ranks : int
        Ranks of ``gen-data`` and ``convert`` (0: one process, no launcher).
    path : str
        The ``.npy``; the ARFF goes beside it (``.arff``), removed afterwards
        unless ``keep_arff``.
    n, m, k, seed : int
        ``gen-data``'s ``-n``, ``-m``, ``-k`` and ``--seed``.

    Returns
    -------
    dict
        ``reused`` (bool), and where made: ``gen`` (:func:`gen_arff`'s figures)
        and ``convert`` (``convert``'s report plus ``wall_s``).
    """
    if npy_shape(path) == (n, m):
        return {"reused": True}
    arff = os.path.splitext(path)[0] + ".arff"
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    gen = gen_arff(launch, ranks, arff, n, m, k, "--seed", seed)
    report = path + ".report.json"
    ran = launch.tool(ranks, "convert", arff, path, "--report", report, "-q")
    with open(report) as f:
        conv = {**json.load(f), "wall_s": ran.wall_s}
    os.remove(report)
    if not keep_arff:
        os.remove(arff)
    return {"reused": False, "gen": gen, "convert": conv}


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
