"""Results on disk: centres, labels in input order, summary JSON; atomic writes.

Every file appears whole or not at all: it is written under a temporary name
in the same directory and renamed into place, which is atomic on POSIX file
systems.  Files written by all ranks together (labels, generated data) are
assembled with positional writes at offsets from an exchange of byte counts,
then renamed by rank 0 once every rank has finished.
"""

from __future__ import annotations

import json
import os
from typing import Iterable

import numpy as np

from ..errors import RunError
from .textfmt import format_fixed

CENTERS = "centers.csv"
LABELS = "labels.txt"
SUMMARY = "summary.json"
CLUSTERED = "clustered.arff"


def _tmp_name(path: str) -> str:
    head, tail = os.path.split(os.path.abspath(path))
    return os.path.join(head, f".{tail}.tmp-{os.getpid()}")


def write_atomic(path: str, data: bytes) -> None:
    """Write ``data`` to ``path`` so that readers see the old file or the new one.

    Raises
    ------
    RunError
        The directory is not writable, the disk is full...
    """
    tmp = _tmp_name(path)
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as exc:
        remove_quietly(tmp)
        raise RunError(f"{path}: cannot write: {exc.strerror}") from None


def remove_quietly(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


def pwrite_all(fd: int, data, offset: int) -> None:
    """Write all of ``data`` (bytes-like) at ``offset``: ``pwrite`` may write less than asked."""
    view = memoryview(data).cast("B")
    done = 0
    while done < len(view):
        done += os.pwrite(fd, view[done:], offset + done)


def publish(comm, tmp: str, path: str) -> None:
    """Rank 0 renames the finished ``tmp`` to ``path``; every rank learns if that failed (collective).

    Raises
    ------
    RunError
        On every rank, if the rename failed (``tmp`` is removed then).
    """
    error = None
    if comm.rank == 0:
        try:
            os.replace(tmp, path)
        except OSError as exc:
            remove_quietly(tmp)
            error = RunError(f"{path}: cannot write: {exc.strerror}")
    comm.agree(error)


def write_parallel(comm, path: str, head: bytes, pieces: Iterable, threads: int = 1) -> int:
    """Write one file from every rank's bytes, in rank order (collective).

    Parameters
    ----------
    comm : Comm or SerialComm
    path : str
        The final name; it appears only when every rank's bytes are in.
    head : bytes
        Written first, by rank 0 only (a header); ignored on other ranks.
    pieces : iterable of bytes-like
        This rank's bytes, in order.
    threads : int
        Threads writing this rank's bytes (in slices of at least 64 MiB at their
        offsets: a single ``pwrite`` stream does not reach a fast disk's or tmpfs'
        speed).

    Returns
    -------
    int
        Total size of the file in bytes.

    Raises
    ------
    RunError
        On every rank, if any rank failed to write.
    """
    pieces = [memoryview(np.ascontiguousarray(p) if isinstance(p, np.ndarray) else p).cast("B") for p in pieces]
    mine = sum(len(p) for p in pieces)
    sizes = comm.allgather(mine)
    head_len = comm.bcast(len(head) if comm.rank == 0 else 0, root=0)
    offset = head_len + sum(sizes[: comm.rank])
    total = head_len + sum(sizes)
    tmp = comm.bcast(_tmp_name(path) if comm.rank == 0 else None, root=0)

    error = None
    if comm.rank == 0:
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            try:
                os.ftruncate(fd, total)
                os.pwrite(fd, head, 0)
            finally:
                os.close(fd)
        except OSError as exc:
            error = RunError(f"{path}: cannot write: {exc.strerror}")
    comm.agree(error)
    try:
        if mine:
            fd = os.open(tmp, os.O_WRONLY)
            try:
                jobs, at = [], offset
                for p in pieces:
                    step = max(64 << 20, -(-len(p) // max(1, threads)))
                    jobs += [(p[a:a + step], at + a) for a in range(0, len(p), step)]
                    at += len(p)
                if threads > 1 and len(jobs) > 1:
                    from concurrent.futures import ThreadPoolExecutor

                    with ThreadPoolExecutor(min(threads, len(jobs))) as pool:
                        list(pool.map(lambda job: pwrite_all(fd, *job), jobs))  # pwrite releases the GIL
                else:
                    for job in jobs:
                        pwrite_all(fd, *job)
                os.fsync(fd)
            finally:
                os.close(fd)
    except OSError as exc:
        error = RunError(f"{path}: cannot write: {exc.strerror}")
    try:
        comm.agree(error)
    except RunError:
        if comm.rank == 0:
            remove_quietly(tmp)
        raise
    publish(comm, tmp, path)
    return total


def _csv_field(text: str) -> str:
    if any(c in text for c in ',"\n'):
        return '"' + text.replace('"', '""') + '"'
    return text


def centres_csv(centres, names: list) -> bytes:
    """``centers.csv``: a header line of attribute names, then K rows at ``repr`` precision.

    Parameters
    ----------
    centres : ndarray, shape (k, m), float64, or list of k rows of m values
        A value that is a string (a nominal attribute's category) is written as
        it is, quoted for CSV where it must be.
    names : list of str, length m
    """
    lines = [",".join(_csv_field(n) for n in names)]
    lines += [",".join(_csv_field(v) if isinstance(v, str) else repr(float(v)) for v in row) for row in centres]
    return ("\n".join(lines) + "\n").encode("utf-8")


def read_centres_fields(path: str, names: list | None = None) -> tuple[list, list | None]:
    """The rows of a CSV file of centres as text fields, and its header line if it has one.

    Parameters
    ----------
    path : str
    names : list of str, optional
        The data's attribute names: a first line equal to them is the header
        even when the names look like numbers (``@attribute 1 numeric``).

    Returns
    -------
    rows : list of (int, list of str)
        Each row's line number and fields (lines starting with ``#`` are comments).
    names : list of str or None
        The header line's names, if the first line is a header: it is when it
        equals ``names``, or when any of its fields is not a number.
    """
    import csv

    with open(path, newline="") as f:
        reader = csv.reader(f)
        rows = [(reader.line_num, r) for r in reader if r and not r[0].lstrip().startswith("#")]
    header = None
    if rows:
        first = [v.strip() for v in rows[0][1]]
        if names is not None and first == list(names):
            header = first
        else:
            try:
                [float(v) for v in first]
            except ValueError:
                header = first
        if header is not None:
            rows = rows[1:]
    return rows, header


def read_centres_csv(path: str, names: list | None = None) -> tuple[np.ndarray, list | None]:
    """Read centres written by :func:`centres_csv` (or a plain CSV of numbers).

    Parameters
    ----------
    path : str
    names : list of str, optional
        See :func:`read_centres_fields`.

    Returns
    -------
    centres : ndarray, shape (k, m), float64
    names : list of str or None
        The header line's names, if the first line is a header.

    Raises
    ------
    ValueError
        With the file's line number of the first line that is not numbers.
    """
    rows, header = read_centres_fields(path, names)
    values = []
    for line_no, r in rows:
        try:
            values.append([float(v) for v in r])
        except ValueError:
            raise ValueError(f"line {line_no}: not a row of numbers: {','.join(r)[:60]!r}") from None
    if not values:
        raise ValueError("no rows of centres")
    widths = {len(v) for v in values}
    if len(widths) != 1:
        raise ValueError(f"rows have different numbers of values: {sorted(widths)}")
    return np.array(values, dtype=np.float64), header


def write_arrays(comm, out_dir: str, centres: np.ndarray, names: list, labels: np.ndarray) -> None:
    """Write ``centers.csv`` and ``labels.txt`` (collective).

    Any ``summary.json`` already in ``out_dir`` is removed first: the summary is
    written last (:func:`write_summary`), so its presence means a whole result.

    Parameters
    ----------
    comm : Comm or SerialComm
    out_dir : str
        Created if missing.
    centres : ndarray, shape (k, m), float64, or list of k rows of m values
        (see :func:`centres_csv`)
    names : list of str
    labels : ndarray, shape (n_local,), int
        This rank's labels; ranks hold consecutive slices of the input rows.
    """
    error = None
    if comm.rank == 0:
        try:
            os.makedirs(out_dir, exist_ok=True)
            remove_quietly(os.path.join(out_dir, SUMMARY))
            write_atomic(os.path.join(out_dir, CENTERS), centres_csv(centres, names))
        except OSError as exc:
            error = RunError(f"{out_dir}: cannot create the output directory: {exc.strerror}")
        except RunError as exc:
            error = exc
    comm.agree(error)
    write_parallel(comm, os.path.join(out_dir, LABELS), b"", [format_fixed(labels.astype(np.int64), 0)])


def write_summary(comm, out_dir: str, summary: dict) -> None:
    """Write ``summary.json`` from rank 0 (collective: failures reach every rank)."""
    error = None
    if comm.rank == 0:
        try:
            write_atomic(os.path.join(out_dir, SUMMARY), (json.dumps(summary, indent=2) + "\n").encode())
        except RunError as exc:
            error = exc
    comm.agree(error)
