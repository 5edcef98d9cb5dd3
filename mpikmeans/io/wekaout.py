"""Weka-readable results: the input rows with a nominal ``cluster`` attribute.

Weka's AddCluster filter appends ``@attribute cluster {cluster1,...,clusterK}``
and, to every row, the name of its cluster.  Here every rank copies its own
lines of the input (the bytes it read, so nominal, string and date values stay
exactly as they were) and inserts its rows' cluster names; the pieces are
written in parallel, in input order.  Sparse rows get ``A clusterN`` inside
their braces (A = the new attribute's index); a row's instance weight stays
last; a row dropped for a missing value gets ``?``.  A CSV file's rows get
an ARFF header made of its columns, and commas between their values.
"""

from __future__ import annotations

import os
import re

import numpy as np
from ..jit import njit

from .header import header_text
from .output import write_parallel

_NL, _CR, _SPACE, _TAB = 10, 13, 32, 9
_COMMA, _PERCENT, _LBRACE, _RBRACE = 44, 37, 123, 125
_SQUOTE, _DQUOTE, _BACKSLASH = 39, 34, 92


@njit(cache=True)
def _scan_line(buf, s, e):
    """One pass over a line's values, quotes respected.

    Returns the end of the values (before a ``%`` comment and trailing blanks),
    the last comma and the first ``}`` outside quotes (-1 when absent).
    """
    q = 0
    last_comma = -1
    first_close = -1
    i = s
    while i < e:
        c = buf[i]
        if q:
            if c == _BACKSLASH:
                i += 1
            elif c == q:
                q = 0
        elif c == _SQUOTE or c == _DQUOTE:
            q = c
        elif c == _PERCENT:
            break
        elif c == _COMMA:
            last_comma = i
        elif c == _RBRACE and first_close < 0:
            first_close = i
        i += 1
    while i > s and (buf[i - 1] == _SPACE or buf[i - 1] == _TAB or buf[i - 1] == _CR):
        i -= 1
    return i, last_comma, first_close


@njit(cache=True)
def _insert_at(buf, s, e, sparse):
    """Where the cluster value goes in the data line ``buf[s:e]``."""
    ce, last_comma, first_close = _scan_line(buf, s, e)
    if sparse:
        return first_close  # inside the row's braces
    if ce > s and buf[ce - 1] == _RBRACE and last_comma >= 0:
        j = last_comma + 1
        while j < ce and (buf[j] == _SPACE or buf[j] == _TAB):
            j += 1
        if buf[j] == _LBRACE:  # ", {weight}" stays last
            return last_comma
    return ce


@njit(cache=True)
def _add_clusters(buf, labels, names, name_start, sparse_prefix, out):
    """Copy ``buf``'s lines to ``out`` with a cluster value inserted into each data line."""
    n = buf.shape[0]
    pos = 0
    row = 0
    s = 0
    while s < n:
        e = s
        while e < n and buf[e] != _NL:
            e += 1
        i = s
        while i < e and (buf[i] == _SPACE or buf[i] == _TAB or buf[i] == _CR):
            i += 1
        is_data = i < e and buf[i] != _PERCENT
        if is_data:
            sparse = buf[i] == _LBRACE
            at = _insert_at(buf, i, e, sparse)
            for t in range(s, at):
                out[pos] = buf[t]
                pos += 1
            lab = labels[row]
            row += 1
            if sparse:
                # "{}" takes no separator before the new pair
                j = at - 1
                while j > i and (buf[j] == _SPACE or buf[j] == _TAB):
                    j -= 1
                if j > i:
                    out[pos] = _COMMA
                    pos += 1
                    out[pos] = _SPACE
                    pos += 1
                for t in range(sparse_prefix.shape[0]):
                    out[pos] = sparse_prefix[t]
                    pos += 1
            else:
                out[pos] = _COMMA
                pos += 1
            a, b = name_start[lab + 1], name_start[lab + 2]
            for t in range(a, b):
                out[pos] = names[t]
                pos += 1
            s = at
        for t in range(s, e):
            out[pos] = buf[t]
            pos += 1
        if e < n:
            out[pos] = _NL
            pos += 1
        s = e + 1
    return pos


def write_clustered_arff(comm, local, labels: np.ndarray, k: int, path: str) -> int:
    """Write the input rows with their cluster as a last nominal attribute (collective).

    Parameters
    ----------
    comm : Comm or SerialComm
    local : mpikmeans.io.arff.LocalData
        This rank's part of the input (its byte range is re-read).
    labels : ndarray, shape (rows of this rank's lines,), int
        One label per data line of this rank, in order (-1: not clustered).
    k : int
    path : str

    Returns
    -------
    int
        Bytes written.
    """
    start, end = local.byte_range
    with open(local.path, "rb") as f:
        buf = np.frombuffer(os.pread(f.fileno(), end - start, start), dtype=np.uint8)
    delimiter = ord(local.header.delimiter)
    if delimiter != _COMMA:  # a CSV file's rows of numbers: ARFF separates values with commas
        buf = np.where(buf == delimiter, np.uint8(_COMMA), buf)
    # names[0] is "?", for rows that were not clustered (label -1)
    words = ["?"] + [f"cluster{c + 1}" for c in range(k)]
    name_start = np.cumsum([0] + [len(w) for w in words]).astype(np.int64)
    names = np.frombuffer("".join(words).encode(), dtype=np.uint8)
    prefix = np.frombuffer(f"{len(local.header.attributes)} ".encode(), dtype=np.uint8)
    longest = max(len(w) for w in words) + len(prefix) + 3
    rows = int(np.count_nonzero(buf == _NL)) + 1
    out = np.empty(len(buf) + rows * longest + 1, dtype=np.uint8)
    used = _add_clusters(buf, np.asarray(labels, dtype=np.int64), names, name_start, prefix, out)
    piece = out[:used]
    if used and piece[-1] != _NL:
        piece = np.concatenate([piece, np.array([_NL], dtype=np.uint8)])
    head = b""
    tail = ("@attribute cluster {" + ",".join(words[1:]) + "}\n@data\n").encode()
    if comm.rank == 0 and local.header.format != "arff":
        # a CSV or TSV file (whatever its name: io.formats decided) has no ARFF header to copy: its
        # columns, all numeric, as attributes
        head = header_text(local.header.relation, local.header.names).rsplit(b"@data\n", 1)[0] + tail
    elif comm.rank == 0:
        with open(local.path, "rb") as f:
            text = f.read(local.header.data_offset)
        # the header as written, less its @data line, plus the new attribute
        lines = text.splitlines(keepends=True)
        while lines and not re.match(rb"\s*@data\b", lines[-1], re.I):
            lines.pop()
        body = b"".join(lines[:-1])
        if body and not body.endswith(b"\n"):
            body += b"\n"
        head = body + tail
    return write_parallel(comm, path, head, [piece])
