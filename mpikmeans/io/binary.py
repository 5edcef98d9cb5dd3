"""A binary cache of a parsed data set: ``.npy`` rows plus a JSON sidecar.

``mpikmeans convert DATA.arff DATA.npy`` parses the text once (in parallel)
and writes the clustered attributes as a C-ordered float64 ``.npy`` array of
shape (n, m), every rank writing its own rows at their offset.  Its sidecar
``DATA.npy.json`` keeps the attribute names and where the data came from;
instance weights, if any, go to ``DATA.weights.npy``.

A run on the ``.npy`` maps only its rank's contiguous slice of rows (or, where
mapping is not possible, reads it with several threads' ``pread``) as the array
the backend takes, its pages brought in by the reading threads; the
extremes come from the sidecar (``convert`` found them), or one compiled pass
finds non-finite values and the per-attribute min/max, so repeated runs skip
parsing and read at the speed of the disk or page cache.
``.npy`` was chosen over HDF5 or Parquet because NumPy reads it with no extra
dependency, and a row slice is one contiguous byte range.
"""

from __future__ import annotations

import io
import json
import os
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from ..errors import InputError
from ..jit import njit, prange
from . import open_input
from .arff import LocalData, Selection
from .header import Header
from .output import write_atomic, write_parallel
from .rowparse import _combine_min_max
from .split import read_into

#: float64 values in a memory page: :func:`fault_in` reads one of each.
PAGE_VALUES = 4096 // 8


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


def timed_copy(comm, read, target: str, missing: str = "error", threads: int = 1,
               timings: dict | None = None) -> LocalData:
    """``read()`` (collective, a :class:`LocalData`), then :func:`write_npy` of it to ``target``.

    Parameters
    ----------
    timings : dict, optional
        Filled with this rank's ``read_s`` (the read) and ``write_s`` (the
        ``.npy``, the weights and the sidecar, up to the final barrier).

    Returns
    -------
    LocalData
        What this rank read.
    """
    t0 = time.perf_counter()
    local = read()
    t_read = time.perf_counter()
    write_npy(comm, local, target, missing, threads)
    if timings is not None:
        timings.update(read_s=t_read - t0, write_s=time.perf_counter() - t_read)
    return local


def write_npy(comm, local: LocalData, target: str, missing: str = "error", threads: int = 1) -> None:
    """Write the rows every rank read as ``target`` (.npy), its weights and its sidecar (collective).

    Every rank writes its own rows at their offset (a rank may have none).

    Parameters
    ----------
    comm : Comm or SerialComm
    local : LocalData
        This rank's rows, as a reader gave them.
    target : str
    missing : str
        The ``--missing`` policy the rows were read with (recorded in the sidecar).
    threads : int
        Writing threads per rank.
    """
    # flat views: a rank without rows writes an empty piece (a (0, m) array's
    # memoryview cannot be cast to bytes)
    rows = np.ascontiguousarray(local.x, dtype="<f8").reshape(-1)
    head = _npy_header((local.n, local.m)) if comm.rank == 0 else b""
    write_parallel(comm, target, head, [rows], threads)
    if local.weights is not None:
        whead = _npy_header((local.n,)) if comm.rank == 0 else b""
        write_parallel(comm, weights_path(target), whead, [np.ascontiguousarray(local.weights, dtype="<f8")])
    if comm.rank == 0:
        meta = {"source": os.path.abspath(local.path), "relation": local.header.relation, "attributes": local.names,
                "skipped_attributes": local.selection.skipped, "ignored_attributes": local.selection.ignored,
                "n": local.n, "m": local.m, "weights": local.weights is not None,
                "missing": {"policy": missing, "count": local.missing},
                # what the read found (every value finite: the reader refuses others), exactly
                # (hex); a run trusts it only for this very file (size and time of change)
                "extremes": {"min": [float(v).hex() for v in local.mins], "max": [float(v).hex() for v in local.maxs],
                             "file": _stamp(target)}}
        write_atomic(sidecar_path(target), (json.dumps(meta, indent=2) + "\n").encode())
    comm.barrier()


def _stamp(path: str) -> list:
    """Size and time of last change of a file (what says it is still the one described)."""
    st = os.stat(path)
    return [st.st_size, st.st_mtime_ns]


def npy_layout(path: str) -> tuple[tuple, np.dtype, int]:
    """Shape, dtype and data offset of a ``.npy`` file, from its header alone.

    Raises
    ------
    InputError
        Not a ``.npy`` file, or a Fortran-ordered one.
    """
    try:
        with os.fdopen(open_input(path), "rb") as f:
            version = np.lib.format.read_magic(f)
            if version == (1, 0):
                shape, fortran, dtype = np.lib.format.read_array_header_1_0(f)
            else:
                shape, fortran, dtype = np.lib.format.read_array_header_2_0(f)
            offset = f.tell()
    except (OSError, ValueError) as exc:
        raise InputError(f"{path}: cannot read as a .npy array: {exc}", collective=True) from None
    if fortran:
        raise InputError(f"{path}: a Fortran-ordered array; save it C-ordered (numpy.ascontiguousarray)",
                         collective=True)
    return tuple(shape), np.dtype(dtype), offset


def describe_npy(path: str) -> tuple[int, int, int, dict, int | None, tuple | None]:
    """What :func:`read_npy` needs to know before reading rows: shape, offsets and the sidecar.

    Returns
    -------
    n, m : int
        Rows and attributes.
    offset : int
        Where the rows start.
    meta : dict
        The sidecar written by ``convert`` (empty where there is none).
    weights_offset : int or None
        Where the weights start in the weights file, or None where the rows are unweighted.
    extremes : (ndarray, ndarray) or None
        Per-attribute minima and maxima, shape (m,) each, from the sidecar where they
        describe this very file (same size and time of change); None where the rows must
        be scanned (none stored, another file's, or unreadable).

    Raises
    ------
    InputError
        Not a 2-D float64 ``.npy`` with rows; an unreadable sidecar; weights that are not one
        float64 per row.
    """
    shape, dtype, offset = npy_layout(path)
    if len(shape) != 2 or dtype != np.dtype("<f8") or shape[0] == 0:
        raise InputError(f"{path}: expected a 2-D float64 array with rows, found {dtype} {shape}")
    n, m = shape
    meta = {}
    side = sidecar_path(path)
    if os.path.exists(side):
        try:
            with open(side) as f:
                meta = json.load(f)
        except (OSError, ValueError) as exc:
            raise InputError(f"{side}: cannot read the description of {path}: {exc}; "
                             "remove it or convert the file again") from None
        if not isinstance(meta, dict):
            raise InputError(f"{side}: not a description written by convert; remove it or convert again")
        names = meta.get("attributes")
        if names is not None and (not isinstance(names, list) or len(names) != m):
            raise InputError(f"{side}: its attribute names do not match the {m} columns of {path}; "
                             "remove it or convert again")
    woffset = None
    if meta.get("weights"):
        wpath = weights_path(path)
        wshape, wdtype, woffset = npy_layout(wpath)
        if wshape != (n,) or wdtype != np.dtype("<f8"):
            raise InputError(f"{wpath}: expected {n} float64 weights, one per row of {path}, "
                             f"found {wdtype} {wshape}")
    known = meta.get("extremes") or {}
    extremes = None
    if isinstance(known, dict) and known.get("file") == _stamp(path):
        try:
            extremes = (np.array([float.fromhex(v) for v in known["min"]]),
                        np.array([float.fromhex(v) for v in known["max"]]))
        except (KeyError, TypeError, ValueError):
            extremes = None  # damaged: the scan finds them again
        if extremes is not None and not (len(extremes[0]) == len(extremes[1]) == m):
            extremes = None
    return n, m, offset, meta, woffset, extremes


def read_rows(path: str, offset: int, out: np.ndarray, threads: int = 1) -> None:
    """Fill ``out`` (C-contiguous, any shape, empty too) with the file's bytes from ``offset``, on ``threads`` threads.

    Raises
    ------
    InputError
        The file is shorter than the rows it should hold.
    """
    view = memoryview(out.reshape(-1)).cast("B")  # flat: a (0, m) array's view cannot be cast
    fd = open_input(path)
    try:
        if threads > 1:
            with ThreadPoolExecutor(threads) as pool:  # the system call releases the GIL: the reads overlap
                got = read_into(fd, view, offset, pool, threads)
        else:
            got = read_into(fd, view, offset)
    finally:
        os.close(fd)
    if got < len(view):
        raise InputError(f"{path}: the file ends {len(view) - got} bytes before its rows do", collective=True)


def map_rows(path: str, offset: int, shape: tuple) -> np.ndarray | None:
    """The rows at ``offset``, shape (n, m) float64, as a private, writable mapping of the file; no copy.

    The array is the page cache's pages: reading them maps them (Linux maps 16
    neighbouring cached pages a fault), a write copies just the page written
    (scaling in place).  ``convert`` replaces a file by renaming a new one over it,
    so a running job keeps the rows it mapped.  None where the file cannot be
    mapped (the caller reads the bytes instead).
    """
    import mmap

    nbytes = shape[0] * shape[1] * 8
    if nbytes == 0 or not hasattr(mmap, "MAP_PRIVATE"):
        return None
    start = offset - offset % mmap.ALLOCATIONGRANULARITY
    try:
        with open(path, "rb") as f:
            # no MAP_POPULATE: on a writable private mapping it breaks copy-on-write for
            # every page, a copy of the whole file on one thread (160 MB: 50 ms)
            mm = mmap.mmap(f.fileno(), nbytes + offset - start, flags=mmap.MAP_PRIVATE,
                           prot=mmap.PROT_READ | mmap.PROT_WRITE, offset=start)
    except (OSError, ValueError):
        return None
    # the array holds the mapping alive; it is unmapped when the array goes
    return np.frombuffer(mm, dtype="<f8", count=shape[0] * shape[1], offset=offset - start).reshape(shape)


@njit(parallel=True, cache=True, nogil=True)
def fault_in(flat, stride, parts):  # pragma: no cover - compiled
    """Read one value every ``stride`` of ``flat`` (n,) on ``parts`` blocks: the mapping's pages in memory.

    The read is the time to bring the rows in (from the page cache, or the disk),
    on the reading threads, not the first pass over them.  Returns the sum of the
    values read (so that the reads are not left out).
    """
    n = flat.size
    sums = np.zeros(parts)
    for t in prange(parts):
        a = n * t // parts
        acc = 0.0
        for i in range(a, n * (t + 1) // parts, stride):
            acc += flat[i]
        sums[t] = acc
    return sums.sum()


@njit(parallel=True, cache=True, nogil=True)
def scan_rows(x, parts):  # pragma: no cover - compiled
    """Non-finite values, and per-attribute min and max, of ``x`` (n, m) in one pass on ``parts`` blocks.

    ``-0.0`` counts as below ``0.0``, as in :func:`mpikmeans.io.rowparse.column_min_max`,
    so the result does not depend on the blocks.  With a non-finite value the
    extremes are meaningless (the caller refuses the data).

    Returns
    -------
    bad : int
    mins, maxs : ndarray, shape (m,), float64
        ``+inf`` / ``-inf`` without rows.
    """
    n, m = x.shape
    lo = np.empty((parts, m))
    hi = np.empty((parts, m))
    bad = np.zeros(parts, dtype=np.int64)
    for t in prange(parts):
        lo_t = lo[t]
        hi_t = hi[t]
        lo_t[:] = np.inf
        hi_t[:] = -np.inf
        nonfinite = 0
        for i in range(n * t // parts, n * (t + 1) // parts):
            row = x[i]
            for j in range(m):
                v = row[j]
                # plain comparisons (NaN fails them); a zero meets the other zero only
                # rarely, and only then is its sign looked at
                if v < lo_t[j]:
                    lo_t[j] = v
                elif v == 0.0 and lo_t[j] == 0.0 and np.signbit(v):
                    lo_t[j] = v
                if v > hi_t[j]:
                    hi_t[j] = v
                elif v == 0.0 and hi_t[j] == 0.0 and not np.signbit(v):
                    hi_t[j] = v
                if not (v - v == 0.0):  # NaN or infinite
                    nonfinite += 1
        bad[t] = nonfinite
    mins, maxs = _combine_min_max(lo, hi)
    return bad.sum(), mins, maxs


def warm_up(threads: int = 1) -> None:
    """The ``.npy`` reader's one-time start-up (Numba, its threads, the scan's cached kernel), untimed."""
    import numba

    numba.set_num_threads(max(1, min(threads, numba.config.NUMBA_NUM_THREADS)))
    scan_rows(np.zeros((2, 1)), 1)
    fault_in(np.zeros(2), PAGE_VALUES, 1)


def read_npy(path: str, comm, threads: int = 1) -> LocalData:
    """This rank's slice of rows of a binary cache (collective).

    Parameters
    ----------
    path : str
    comm : Comm or SerialComm
    threads : int
        Reading threads, and the threads of the scan for non-finite values.

    Raises
    ------
    InputError
        Not a 2-D float64 ``.npy``, or non-finite values.
    """
    # one rank reads the headers and the sidecar for all: one metadata read on a parallel file
    # system, the same answer on every rank (whether the stored extremes still hold decides a
    # collective below), and no header parsed on several threads at once (CPython 3.11's parser
    # is not thread-safe there: gh-106905)
    n, m, offset, meta, woffset, extremes = comm.from_root(lambda: describe_npy(path))
    names = meta.get("attributes") or [f"X{j + 1}" for j in range(m)]
    lo, hi = n * comm.rank // comm.size, n * (comm.rank + 1) // comm.size
    # a mapping of the page cache, its pages brought in by the threads below (or the scan), is
    # no copy at all: 160 MB on 2 cores in 2-5 ms, where threads' reads into a fresh array
    # (its pages zeroed, then filled) took 21-45 ms
    x = map_rows(path, offset + lo * m * 8, (hi - lo, m))
    mapped = x is not None
    if not mapped:
        x = np.empty((hi - lo, m), dtype=np.float64)
        read_rows(path, offset + lo * m * 8, x, threads)
    weights = None
    if woffset is not None:
        weights = np.empty(hi - lo, dtype=np.float64)
        read_rows(weights_path(path), woffset + lo * 8, weights)
    if extremes is not None:
        # convert found them, and the file is the one it wrote: no pass over the rows
        mins, maxs = extremes
        if mapped:
            fault_in(x.reshape(-1), PAGE_VALUES, max(1, min(threads * 4, len(x))))
    else:
        if len(x):
            bad, mins, maxs = scan_rows(x, max(1, min(threads * 4, len(x))))
        else:
            bad, mins, maxs = 0, np.full(m, np.inf), np.full(m, -np.inf)
        bad = int(comm.allreduce(np.array([bad], dtype=np.int64), "sum")[0])
        if bad:
            raise InputError(f"{path}: {bad} values are not finite numbers", collective=True)
        mins, maxs = comm.allreduce(mins, "min"), comm.allreduce(maxs, "max")
    header = Header(meta.get("relation", os.path.basename(path)), [], 0, 0, os.path.getsize(path), path, format="npy")
    kinds = np.zeros(m, dtype=np.int64)
    selection = Selection(kinds, np.arange(m), names, meta.get("skipped_attributes", []),
                          meta.get("ignored_attributes", []))
    counts = [n * (r + 1) // comm.size - n * r // comm.size for r in range(comm.size)]
    return LocalData(path, header, x, lo, n, mins, maxs,
                     (lo, hi), x.nbytes, counts=counts, names=names, selection=selection, weights=weights,
                     input_rows=n, missing=0)
