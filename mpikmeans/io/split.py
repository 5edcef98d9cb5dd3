"""Splitting the data section over the ranks (the specification's §5.6) and a rank's text over its threads.

The data section of S bytes is cut into equal byte ranges, one per rank; a rank
owns exactly the lines whose first byte lies in its range, so it skips a partial
first line and finishes the line that crosses its end: every line is read by one
rank and no rank sends rows to another.  Before reading, every rank checks that
its share fits the memory it may use.  A piece of a rank's text is cut the same
way into spans of whole lines, one per parsing thread (:func:`line_cuts`).
"""

from __future__ import annotations

import os

import numpy as np

from ..jit import njit
from ..errors import InputError, MpikmeansError, RunError
from ..memory import available_memory
from . import open_input
from .header import Header

#: Most bytes of text parsed at a time by one rank (bounds the text buffer's memory).
READ_PIECE = 64 << 20

_NL = 10


#: The fewest bytes worth a thread of their own when a piece is read by several.
READ_STRIDE = 2 << 20


def read_into(fd, view, offset: int, pool=None, parts: int = 1) -> int:
    """Fill ``view`` (a writable byte buffer) from the file ``fd`` at ``offset``, in up to ``parts`` strides
    read by ``pool``'s threads (a ``concurrent.futures`` executor; one after the other without one).

    ``os.preadv`` copies straight into the caller's buffer (no bytes object)
    and releases the GIL, so threads copy from the page cache side by side.

    Returns
    -------
    int
        Bytes read (fewer than ``len(view)`` only at the end of the file).
    """
    def fill(lo: int, hi: int) -> int:
        done = lo
        while done < hi:  # preadv may read less than asked
            got = os.preadv(fd, [view[done:hi]], offset + done)
            if got == 0:
                break
            done += got
        return done - lo

    size = len(view)
    strides = min(parts, size // READ_STRIDE)
    if pool is None or strides < 2:
        return fill(0, size)
    bounds = [size * k // strides for k in range(strides + 1)]
    return sum(pool.map(lambda k: fill(bounds[k], bounds[k + 1]), range(strides)))


def byte_ranges(data_offset: int, file_size: int, ranks: int) -> list:
    """Equal byte ranges of the data section, one per rank (before alignment).

    Returns
    -------
    list of (int, int)
        ``[(b_0, b_1), (b_1, b_2), ...]`` with ``b_0 = data_offset`` and
        ``b_ranks = file_size``.
    """
    size = file_size - data_offset
    cuts = [data_offset + size * r // ranks for r in range(ranks + 1)]
    return list(zip(cuts[:-1], cuts[1:]))


def first_line_start(f, pos: int, data_offset: int, file_size: int) -> tuple:
    """The first line start at or after ``pos``.

    A line starts at ``data_offset`` or right after a ``\\n``.  Every rank
    applies this to both ends of its range, so the end of rank r and the start
    of rank r+1 agree and each line has exactly one owner.

    Returns
    -------
    (int, int)
        The offset, and the bytes read to find it.
    """
    if pos <= data_offset:
        return data_offset, 0
    if pos >= file_size:
        return file_size, 0
    read = 0
    at = pos - 1
    block = 1 << 16
    while at < file_size:
        chunk = os.pread(f, block, at)
        read += len(chunk)
        nl = chunk.find(b"\n")
        if nl >= 0:
            return at + nl + 1, read
        at += len(chunk)
        block = min(block * 2, 1 << 24)
    return file_size, read


def plan_local(path: str, header: Header, rank: int, size: int) -> dict:
    """Estimate what rank ``rank`` of ``size`` will read, without parsing.

    Aligns the rank's byte range to whole lines and counts newlines in a
    sample of it to estimate its rows.

    Returns
    -------
    dict
        ``start``, ``end`` (owned bytes), ``bytes``, ``rows`` (estimate),
        ``host_bytes`` (peak memory for the parsed rows and text buffers).
    """
    lo, hi = byte_ranges(header.data_offset, header.file_size, size)[rank]
    fd = open_input(path)
    try:
        start, _ = first_line_start(fd, lo, header.data_offset, header.file_size)
        end, _ = first_line_start(fd, hi, header.data_offset, header.file_size)
        end = max(start, end)
        sample = os.pread(fd, min(end - start, 1 << 20), start)
    finally:
        os.close(fd)
    n_bytes = end - start
    if sample:
        lines = sample.count(b"\n") + (0 if sample.endswith(b"\n") else 1)
        rows = int(round(n_bytes * lines / len(sample)))
    else:
        rows = 0
    m = len(header.attributes)
    # the rows array, with room for one copy should it have to grow past its first
    # estimate, and the one text buffer
    host = 2 * rows * m * 8 + min(READ_PIECE, n_bytes)
    return {"start": start, "end": end, "bytes": n_bytes, "rows": rows, "host_bytes": host}


def check_memory(path: str, header: Header, comm) -> dict:
    """Refuse, before reading, a share of the data that cannot fit in memory (collective).

    Each node's available memory is shared by its ranks.

    Returns
    -------
    dict
        This rank's :func:`plan_local`.

    Raises
    ------
    RunError
        On every rank: the estimate, what is available, and how many ranks
        would fit.
    InputError, UsageError
        On every rank: a rank could not read the file.
    """

    try:
        plan = plan_local(path, header, comm.rank, comm.size)
    except OSError as exc:
        plan, error = None, InputError(f"{path}: cannot read on {comm.host}: {exc.strerror}")
    except MpikmeansError as exc:
        plan, error = None, exc
    else:
        error = None
    avail = available_memory()
    if plan is not None and avail is not None:
        per_rank = avail // max(1, comm.node_size)
        if plan["host_bytes"] > per_rank:
            need_ranks = int(np.ceil(plan["host_bytes"] * comm.size / per_rank))
            error = RunError(
                f"{path}: rank {comm.rank} on {comm.host} needs about {plan['host_bytes'] / 2**30:.1f} GiB "
                f"for its {plan['rows']} rows, but {comm.node_size} rank(s) share "
                f"{avail / 2**30:.1f} GiB available on that node ({per_rank / 2**30:.1f} GiB each): "
                f"use at least {need_ranks} ranks spread over more nodes (same ranks per node)"
            )
    comm.agree(error)
    return plan


@njit(cache=True, nogil=True)
def span_cuts(buf, parts):
    """Cut ``buf`` into ``parts`` spans of whole lines, about equal in bytes.

    Returns
    -------
    cuts : ndarray, shape (parts + 1,), int64
        Span t is ``buf[cuts[t]:cuts[t + 1]]``; every cut is a line start.
    """
    n = buf.shape[0]
    cuts = np.empty(parts + 1, dtype=np.int64)
    cuts[0] = 0
    for t in range(1, parts):
        p = max(n * t // parts, cuts[t - 1])
        while p < n and p > 0 and buf[p - 1] != _NL:
            p += 1
        cuts[t] = p
    cuts[parts] = n
    return cuts


def line_cuts(buf, parts, pool=None):
    """Cut ``buf`` into ``parts`` spans of whole lines (:func:`span_cuts`); also count each span's newlines.

    The counts run on ``pool``'s threads, a span each (the kernel releases the
    GIL): one thread counts at its share of the memory bandwidth, the spans'
    threads together at the machine's.

    Returns
    -------
    cuts : ndarray, shape (parts + 1,), int64
    newlines : ndarray, shape (parts,), int64
    """
    cuts = span_cuts(buf, parts)

    def count(t):
        return _count_newlines(buf[cuts[t]:cuts[t + 1]])

    if pool is None or parts == 1:
        return cuts, np.array([count(t) for t in range(parts)], dtype=np.int64)
    return cuts, np.array(list(pool.map(count, range(parts))), dtype=np.int64)


@njit(cache=True, nogil=True)
def _count_newlines(buf):
    # a plain loop of its own: LLVM vectorises it, the same loop inside a prange
    # body it does not
    c = 0
    for i in range(buf.shape[0]):
        if buf[i] == _NL:
            c += 1
    return c


@njit(cache=True, nogil=True)
def last_newline(buf, lo):
    """Index of the last ``\n`` in ``buf[lo:]``, or -1."""
    i = buf.shape[0] - 1
    while i >= lo:
        if buf[i] == _NL:
            return i
        i -= 1
    return -1
