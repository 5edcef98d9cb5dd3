"""ARFF input: header parsing, byte-range split with line alignment, exact parsing.

The reading scheme is the specification's §5.6 (shared/DESIGN.md, "Reading ARFF
in parallel"): rank 0 parses the header and broadcasts it; the data section of
S bytes is cut into equal byte ranges, one per rank; a rank owns exactly the
lines whose first byte lies in its range, so it skips a partial first line and
finishes the line that crosses its end.  Every line is read by one rank and no
rank sends rows to another.  Row and line counts are then exchanged so that
each rank knows the global index of its first row (labels are written in input
order) and the line number of any bad row.

Numbers are parsed by :func:`mpikmeans.numparse.parse_number`, compiled and
bit-identical to Python's ``float()``.

This module never imports mpi4py: the communicator is passed in.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field

import numpy as np
from numba import njit

from .errors import InputError
from .numparse import PARSE_EMPTY, PARSE_OK, PARSE_RANGE, parse_number

NUMERIC_TYPES = ("numeric", "real", "integer")

#: Bytes of text parsed at a time by one rank (bounds the text buffer's memory).
READ_PIECE = 64 << 20

_NL = 10
_CR = 13
_SPACE = 32
_TAB = 9
_COMMA = 44
_PERCENT = 37

# error codes of the compiled row parser
E_NONE = 0
E_FEW = 1      # fewer values than attributes
E_MANY = 2     # more values than attributes
E_NUMBER = 3   # a token that is not a number
E_EMPTY = 4    # an empty value
E_RANGE = 5    # a value that overflows float64 (infinity)
E_MISSING = 6  # '?' (missing value)


@dataclass
class Attribute:
    """One ``@attribute`` line."""

    name: str
    kind: str  # numeric | nominal | string | date | relational | unknown
    line: int


@dataclass
class Header:
    """What rank 0 learned from the header; broadcast to every rank.

    Attributes
    ----------
    relation : str
    attributes : list of Attribute
    data_offset : int
        Byte offset of the first byte after the ``@data`` line.
    data_line : int
        1-based line number of the line that starts at ``data_offset``.
    file_size : int
    """

    relation: str
    attributes: list
    data_offset: int
    data_line: int
    file_size: int

    @property
    def names(self) -> list:
        return [a.name for a in self.attributes]


@dataclass
class LocalData:
    """One rank's part of the data set.

    Attributes
    ----------
    x : ndarray, shape (n_local, m), float64
        This rank's rows, in file order.
    row_offset : int
        Global index of this rank's first row.
    n : int
        Rows in the whole file.
    mins, maxs : ndarray, shape (m,), float64
        Global per-attribute minimum and maximum (Allreduce MIN/MAX).
    byte_range : (int, int)
        The bytes this rank owns: whole lines, ``[start, end)``.
    bytes_read : int
        Bytes this rank read from the file (its range plus alignment look-ups).
    """

    path: str
    header: Header
    x: np.ndarray
    row_offset: int
    n: int
    mins: np.ndarray
    maxs: np.ndarray
    byte_range: tuple
    bytes_read: int
    counts: list = field(default_factory=list)

    @property
    def m(self) -> int:
        return self.x.shape[1]


# --------------------------------------------------------------------------- header

_QUOTED = re.compile(r"""\s*('(?:[^'\\]|\\.)*'|"(?:[^"\\]|\\.)*"|[^\s{]+)\s*(.*)$""", re.S)


def _unquote(token: str) -> str:
    if len(token) >= 2 and token[0] == token[-1] and token[0] in "'\"":
        return re.sub(r"\\(.)", r"\1", token[1:-1])
    return token


def _attribute_kind(type_text: str) -> str:
    t = type_text.strip()
    low = t.lower()
    if low in NUMERIC_TYPES:
        return "numeric"
    if t.startswith("{"):
        return "nominal"
    if low == "string":
        return "string"
    if low.startswith("date"):
        return "date"
    if low.startswith("relational"):
        return "relational"
    return "unknown"


class _NeedMore(Exception):
    """The bytes given end before the ``@data`` line."""


def _strip_comment(text: str) -> str:
    """Drop a ``%`` comment that is not inside quotes (Weka allows one anywhere)."""
    quote = None
    for i, c in enumerate(text):
        if quote:
            if c == "\\":
                continue
            if c == quote:
                quote = None
        elif c in "'\"":
            quote = c
        elif c == "%":
            return text[:i].rstrip()
    return text


def parse_header(path: str, head: bytes, complete: bool = True) -> Header:
    """Parse the header at the start of an ARFF file.

    Parameters
    ----------
    path : str
        For error messages.
    head : bytes
        The file's first bytes, at least through the ``@data`` line.
    complete : bool
        ``head`` is the whole file.  When False and ``head`` ends before the
        ``@data`` line, :class:`_NeedMore` is raised so the caller reads on.

    Raises
    ------
    InputError
        A malformed or unsupported header; the message names the file and line.
    """
    file_size = os.path.getsize(path)
    offset = 0
    if head.startswith(b"\xef\xbb\xbf"):  # UTF-8 byte-order mark
        offset = 3
    relation = None
    attributes: list[Attribute] = []
    seen: dict[str, int] = {}
    line_no = 0
    while True:
        nl = head.find(b"\n", offset)
        if nl < 0:
            if not complete:
                raise _NeedMore
            if head[offset:].strip():  # a last line without its newline
                head += b"\n"
                continue
            raise InputError(f"{path}: no @data line: the header never ends ({len(head)} bytes read)")
        raw = head[offset:nl]
        offset = nl + 1
        line_no += 1
        try:
            text = raw.decode("utf-8").strip()
        except UnicodeDecodeError:
            raise InputError(f"{path}:{line_no}: the header line is not UTF-8 text") from None
        text = _strip_comment(text)
        if not text:
            continue
        keyword, _, rest = text.partition(" ")
        if "\t" in keyword:
            keyword, _, more = keyword.partition("\t")
            rest = more + " " + rest
        kw = keyword.lower()
        if kw == "@relation":
            relation = _unquote(rest.strip())
        elif kw == "@attribute":
            match = _QUOTED.match(rest)
            if not match or not match.group(2).strip():
                raise InputError(f"{path}:{line_no}: @attribute needs a name and a type: {text!r}")
            name = _unquote(match.group(1))
            kind = _attribute_kind(match.group(2))
            if kind == "unknown":
                raise InputError(f"{path}:{line_no}: attribute {name!r} has an unknown type {match.group(2).strip()!r}")
            if name in seen:
                raise InputError(f"{path}:{line_no}: attribute {name!r} is declared twice (first on line {seen[name]})")
            seen[name] = line_no
            attributes.append(Attribute(name, kind, line_no))
        elif kw == "@data":
            break
        else:
            raise InputError(f"{path}:{line_no}: expected @relation, @attribute or @data, found {text[:40]!r}")
    if relation is None:
        raise InputError(f"{path}: no @relation line before @data")
    if not attributes:
        raise InputError(f"{path}: no @attribute lines before @data")
    for a in attributes:
        if a.kind != "numeric":
            raise InputError(
                f"{path}:{a.line}: attribute {a.name!r} is {a.kind}; only numeric, real and integer "
                "attributes can be clustered"
            )
    return Header(relation, attributes, min(offset, file_size), line_no + 1, file_size)


def read_header(path: str) -> Header:
    """Read and parse the header of ``path`` (see :func:`parse_header`)."""
    if path.endswith(".gz"):
        raise InputError(f"{path}: compressed input cannot be split by byte offsets; decompress it first")
    try:
        with open(path, "rb") as f:
            head = b""
            block = 1 << 16
            while True:
                more = f.read(block)
                head += more
                try:
                    return parse_header(path, head, complete=not more)
                except _NeedMore:
                    block = min(block * 2, 1 << 24)
    except IsADirectoryError:
        raise InputError(f"{path}: is a directory, not an ARFF file") from None
    except OSError as exc:
        raise InputError(f"{path}: cannot read: {exc.strerror}") from None


# --------------------------------------------------------------------------- split

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
    fd = os.open(path, os.O_RDONLY)
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
    # rows parsed piece by piece and joined at the end: twice the array at peak
    host = 2 * rows * m * 8 + min(READ_PIECE, n_bytes) + (min(READ_PIECE, n_bytes) // 2 + 1) * 8
    return {"start": start, "end": end, "bytes": n_bytes, "rows": rows, "host_bytes": host}


def available_memory() -> int | None:
    """Bytes of memory available on this node (``MemAvailable``), if known."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


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
    """
    from .errors import RunError

    try:
        plan = plan_local(path, header, comm.rank, comm.size)
    except OSError as exc:
        plan, error = None, InputError(f"{path}: cannot read on {comm.host}: {exc.strerror}")
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


# --------------------------------------------------------------------------- parse

@njit(cache=True)
def _is_blank(c):
    return c == _SPACE or c == _TAB or c == _CR


@njit(cache=True)
def parse_rows(buf, m, out):
    """Parse whole data lines of ``buf`` into ``out`` (compiled).

    Parameters
    ----------
    buf : ndarray, shape (n_bytes,), uint8
        Whole lines (the last may lack its newline).
    m : int
        Values per row.
    out : ndarray, shape (>= rows, m), float64

    Returns
    -------
    rows, lines, err, err_line, err_col, tok_start, tok_end : int
        Rows parsed; lines consumed (comment and blank lines included); on
        error, its code, the 0-based line within ``buf``, the 0-based column,
        and the offending token's byte span.
    """
    n = buf.shape[0]
    i = 0
    rows = 0
    line = 0
    while i < n:
        # skip leading blanks; comment or blank line?
        while i < n and _is_blank(buf[i]):
            i += 1
        if i >= n:
            line += 1
            break
        c = buf[i]
        if c == _NL or c == _PERCENT:
            while i < n and buf[i] != _NL:
                i += 1
            i += 1
            line += 1
            continue
        for j in range(m):
            while i < n and (buf[i] == _SPACE or buf[i] == _TAB):
                i += 1
            ts = i
            while i < n:
                c = buf[i]
                if c == _COMMA or c == _NL or c == _PERCENT:
                    break
                i += 1
            te = i
            while te > ts and _is_blank(buf[te - 1]):
                te -= 1
            at_eol = i >= n or buf[i] != _COMMA
            if te == ts:
                # (a line with no value at all was taken as blank above, so an
                # empty token is always a real empty value: ",," or a trailing ",")
                return rows, line, E_EMPTY, line, j, ts, te
            if te - ts == 1 and buf[ts] == 63:  # '?'
                return rows, line, E_MISSING, line, j, ts, te
            value, status = parse_number(buf, ts, te)
            if status != PARSE_OK:
                if status == PARSE_RANGE:
                    return rows, line, E_RANGE, line, j, ts, te
                if status == PARSE_EMPTY:
                    return rows, line, E_EMPTY, line, j, ts, te
                return rows, line, E_NUMBER, line, j, ts, te
            out[rows, j] = value
            if j < m - 1:
                if at_eol:
                    return rows, line, E_FEW, line, j + 1, ts, te
                i += 1  # past the comma
            else:
                if not at_eol:
                    # a comma after the last value: more values than attributes
                    return rows, line, E_MANY, line, m, i, i + 1
        # end of the row: an optional comment, then the newline
        while i < n and buf[i] != _NL:
            i += 1
        i += 1
        rows += 1
        line += 1
    return rows, line, E_NONE, -1, -1, -1, -1


def _describe(code: int, path: str, line_no: int, col: int, attrs: list, token: str) -> str:
    name = attrs[col].name if 0 <= col < len(attrs) else None
    where = f"{path}:{line_no}"
    m = len(attrs)
    if code == E_FEW:
        return f"{where}: row has {col} value{'s' if col != 1 else ''}, expected {m} (attribute {attrs[col].name!r} is missing)"
    if code == E_MANY:
        return f"{where}: row has more than {m} values (the header declares {m} attributes)"
    if code == E_EMPTY:
        return f"{where}: attribute {name!r}: empty value"
    if code == E_RANGE:
        return f"{where}: attribute {name!r}: {token!r} is out of the float64 range"
    if code == E_MISSING:
        return f"{where}: attribute {name!r}: missing value '?' is not supported in this version"
    return f"{where}: attribute {name!r}: {token!r} is not a number"


def _parse_span(fd, start: int, end: int, m: int, path: str):
    """Parse the owned lines ``[start, end)`` piece by piece.

    Returns ``(list of row arrays, lines consumed, bad)`` where ``bad`` is None
    or ``(code, line, column, token)`` with the line counted from ``start``
    (the caller adds this rank's first line number once counts are exchanged).
    """
    pieces = []
    total_lines = 0
    pos = start
    while pos < end:
        want = min(READ_PIECE, end - pos)
        buf = np.frombuffer(os.pread(fd, want, pos), dtype=np.uint8)
        if len(buf) < want:
            raise InputError(f"{path}: file shrank while reading (expected {end} bytes)")
        if pos + want < end:
            # cut at the last newline; the rest goes into the next piece
            newlines = np.flatnonzero(buf == _NL)
            if len(newlines) == 0:
                want = len(buf)  # a single line longer than a piece: take it whole
                more = first_line_start(fd, pos + want, start, end)[0]
                buf = np.frombuffer(os.pread(fd, more - pos, pos), dtype=np.uint8)
            else:
                buf = buf[: int(newlines[-1]) + 1]
        upper = int(np.count_nonzero(buf == _NL)) + 1
        out = np.empty((upper, m), dtype=np.float64)
        rows, lines, err, err_line, err_col, ts, te = parse_rows(buf, m, out)
        if err != E_NONE:
            token = bytes(buf[ts:te]).decode("utf-8", "replace")
            line_no = total_lines + err_line
            return pieces, total_lines + lines, (err, line_no, err_col, token)
        pieces.append(out[:rows])
        total_lines += lines
        pos += len(buf)
    return pieces, total_lines, None


def read_local(path: str, header: Header, comm) -> LocalData:
    """Read this rank's rows of an ARFF file (collective: every rank calls it).

    Parameters
    ----------
    path : str
    header : Header
        The same on every rank (rank 0 parsed it and broadcast it).
    comm : mpikmeans.comm.SerialComm or Comm

    Returns
    -------
    LocalData

    Raises
    ------
    InputError
        On every rank, if any rank found a bad row: the message names the file,
        the 1-based line number and the attribute of the first bad row.
    """
    m = len(header.attributes)
    lo, hi = byte_ranges(header.data_offset, header.file_size, comm.size)[comm.rank]
    error = None
    pieces, lines, bad = [], 0, None
    start = end = lo
    bytes_read = 0
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError as exc:
        error = InputError(f"{path}: cannot open: {exc.strerror}")
        fd = None
    if fd is not None:
        try:
            start, r1 = first_line_start(fd, lo, header.data_offset, header.file_size)
            end, r2 = first_line_start(fd, hi, header.data_offset, header.file_size)
            end = max(start, end)
            pieces, lines, bad = _parse_span(fd, start, end, m, path)
            bytes_read = (end - start) + r1 + r2
        except InputError as exc:
            error = exc
        except OSError as exc:
            error = InputError(f"{path}: read failed: {exc.strerror}")
        finally:
            os.close(fd)
    rows = sum(len(p) for p in pieces)
    # one exchange gives every rank its row offset, its first line's number,
    # the global row count, and whether any rank found a bad row
    report = (rows, lines, bad, None if error is None else error.message)
    reports = comm.allgather(report)
    row_offset = sum(r[0] for r in reports[: comm.rank])
    n = sum(r[0] for r in reports)
    problems = []
    line_base = header.data_line
    for r, (_, r_lines, r_bad, r_msg) in enumerate(reports):
        if r_msg is not None:
            problems.append((-1, r, r_msg))
        elif r_bad is not None:
            code, line_in, col, token = r_bad
            line_no = line_base + line_in
            problems.append((line_no, r, _describe(code, path, line_no, col, header.attributes, token)))
        line_base += r_lines
    if problems:
        _, _, message = min(problems)
        raise InputError(message, collective=True)
    if n == 0:
        raise InputError(f"{path}: the data section has no rows", collective=True)
    x = pieces[0] if len(pieces) == 1 else (np.concatenate(pieces) if pieces else np.empty((0, m)))
    x = np.ascontiguousarray(x)
    if len(x):
        mins, maxs = x.min(axis=0), x.max(axis=0)
    else:
        mins, maxs = np.full(m, np.inf), np.full(m, -np.inf)
    mins = comm.allreduce(mins, "min")
    maxs = comm.allreduce(maxs, "max")
    return LocalData(path, header, x, row_offset, n, mins, maxs, (start, end), bytes_read,
                     counts=[r[0] for r in reports])


def shared_header(path: str, comm) -> Header:
    """Rank 0 parses the header and broadcasts it; every rank gets it or the same error (collective)."""
    header, message = None, None
    if comm.rank == 0:
        try:
            header = read_header(path)
        except InputError as exc:
            message = exc.message
    header, message = comm.bcast((header, message), root=0)
    if message is not None:
        raise InputError(message, collective=True)
    return header


def read_arff(path: str, comm, header: Header | None = None) -> LocalData:
    """Read an ARFF file in parallel: header on rank 0, rows on every rank.

    Collective.  See :func:`read_local`; ``header`` skips the header step when
    the caller already has it from :func:`shared_header`.
    """
    return read_local(path, header or shared_header(path, comm), comm)


# --------------------------------------------------------------------------- write

def header_text(relation: str, names: list) -> bytes:
    """The header of an ARFF file in the specification's appendix-2 layout."""

    def quote(name: str) -> str:
        if re.fullmatch(r"[A-Za-z_][\w.\-]*", name):
            return name
        return "'" + name.replace("\\", "\\\\").replace("'", "\\'") + "'"

    lines = [f"@relation {quote(relation)}"]
    lines += [f"@attribute {quote(n)} numeric" for n in names]
    lines.append("@data")
    return ("\n".join(lines) + "\n").encode("utf-8")
