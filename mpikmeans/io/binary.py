"""A binary cache of a parsed data set: ``.npy`` rows plus a JSON sidecar.

``mpikmeans convert DATA.arff DATA.npy`` parses the text once (in parallel)
and writes the clustered attributes as a C-ordered float64 ``.npy`` array of
shape (n, m), every rank writing its own rows at their offset.  Its sidecar
``DATA.npy.json`` keeps the attribute names and where the data came from;
instance weights, if any, go to ``DATA.weights.npy``.

A run on the ``.npy`` memory-maps the file and each rank copies only its own
contiguous slice of rows, so repeated runs skip parsing.  ``.npy`` was chosen
over HDF5 or Parquet because NumPy reads it with no extra dependency, it can
be memory-mapped, and a row slice is one contiguous byte range.
"""

from __future__ import annotations

import io
import json
import os

import numpy as np

from .arff import LocalData, read_arff
from ..errors import InputError
from .output import write_atomic, write_parallel


def sidecar_path(npy: str) -> str:
    """Where the attribute names of ``npy`` are kept."""
    return npy + ".json"


def weights_path(npy: str) -> str:
    """Where the instance weights of ``npy`` are kept, if any."""
    root, _ = os.path.splitext(npy)
    return root + ".weights.npy"


def _npy_header(shape: tuple, dtype=np.float64) -> bytes:
    buf = io.BytesIO()
    np.lib.format.write_array_header_1_0(buf, {"descr": np.lib.format.dtype_to_descr(np.dtype(dtype)),
                                               "fortran_order": False, "shape": shape})
    return buf.getvalue()


def convert(comm, source: str, target: str, ignore: str | None = None, missing: str = "error") -> LocalData:
    """Parse ``source`` (ARFF) and write ``target`` (.npy) and its sidecar (collective).

    Returns
    -------
    LocalData
        What this rank read.
    """
    local = read_arff(source, comm, ignore=ignore, missing=missing)
    head = _npy_header((local.n, local.m)) if comm.rank == 0 else b""
    write_parallel(comm, target, head, [np.ascontiguousarray(local.x, dtype="<f8")])
    if local.weights is not None:
        whead = _npy_header((local.n,)) if comm.rank == 0 else b""
        write_parallel(comm, weights_path(target), whead, [np.ascontiguousarray(local.weights, dtype="<f8")])
    if comm.rank == 0:
        meta = {"source": os.path.abspath(source), "relation": local.header.relation, "attributes": local.names,
                "skipped_attributes": local.selection.skipped, "ignored_attributes": local.selection.ignored,
                "n": local.n, "m": local.m, "weights": local.weights is not None,
                "missing": {"policy": missing, "count": local.missing}}
        write_atomic(sidecar_path(target), (json.dumps(meta, indent=2) + "\n").encode())
    comm.barrier()
    return local


def read_npy(path: str, comm) -> LocalData:
    """This rank's slice of rows of a binary cache (collective).

    Raises
    ------
    InputError
        Not a 2-D float64 ``.npy``, or non-finite values.
    """
    from .arff import Header, Selection

    try:
        data = np.load(path, mmap_mode="r")
    except (OSError, ValueError) as exc:
        raise InputError(f"{path}: cannot read as a .npy array: {exc}", collective=True) from None
    if data.ndim != 2 or data.dtype != np.float64 or data.shape[0] == 0:
        raise InputError(f"{path}: expected a 2-D float64 array with rows, found {data.dtype} {data.shape}",
                         collective=True)
    n, m = data.shape
    meta = {}
    if os.path.exists(sidecar_path(path)):
        with open(sidecar_path(path)) as f:
            meta = json.load(f)
    names = meta.get("attributes") or [f"X{j + 1}" for j in range(m)]
    lo, hi = n * comm.rank // comm.size, n * (comm.rank + 1) // comm.size
    x = np.array(data[lo:hi], dtype=np.float64, order="C")
    weights = None
    if meta.get("weights"):
        weights = np.array(np.load(weights_path(path), mmap_mode="r")[lo:hi], dtype=np.float64)
    bad = int(comm.allreduce(np.array([np.count_nonzero(~np.isfinite(x))], dtype=np.int64), "sum")[0])
    if bad:
        raise InputError(f"{path}: {bad} values are not finite numbers", collective=True)
    mins = x.min(axis=0) if len(x) else np.full(m, np.inf)
    maxs = x.max(axis=0) if len(x) else np.full(m, -np.inf)
    header = Header(meta.get("relation", os.path.basename(path)), [], 0, 0, os.path.getsize(path), path)
    kinds = np.zeros(m, dtype=np.int64)
    selection = Selection(kinds, np.arange(m), names, meta.get("skipped_attributes", []),
                          meta.get("ignored_attributes", []))
    counts = [n * (r + 1) // comm.size - n * r // comm.size for r in range(comm.size)]
    return LocalData(path, header, x, lo, n, comm.allreduce(mins, "min"), comm.allreduce(maxs, "max"),
                     (lo, hi), x.nbytes, counts=counts, names=names, selection=selection, weights=weights,
                     input_rows=n, missing=0)
