"""Reading an ARFF file in parallel: every rank its own lines, parsed exactly, on its threads.

The reading scheme is the specification's §5.6 (shared/DESIGN.md, "Reading ARFF
in parallel"): rank 0 parses the header and broadcasts it (:mod:`.header`); the
data section is cut into byte ranges aligned to whole lines (:mod:`.split`); each
rank reads and parses its own range here.  Row and line counts are then
exchanged so that each rank knows the global index of its first row (labels are
written in input order) and the line number of any bad row.

Data lines are parsed by :mod:`mpikmeans.io.rowparse` (compiled; numbers
bit-identical to Python's ``float()``), with Weka's tokens for an ARFF file and
the delimiter alone for a CSV file (the header's ``format``); which file is
which is decided in :mod:`mpikmeans.io.formats`.

This module never imports mpi4py: the communicator is passed in.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

import numpy as np

from ..errors import InputError, MpikmeansError, UsageError
from ..exact import exact_column_means
from ..nominal import ONE, Layout
from . import open_input, rowparse
from .header import Header, shared_header
from .split import (READ_PIECE, _count_newlines, byte_ranges, first_line_start, last_newline, line_cuts, read_into,
                    span_cuts)

#: Bytes of text per parsing thread in one piece.  A rank with few threads (many
#: ranks per node) then fills a smaller buffer: less memory touched for the first
#: time in each process, which is what a run's one read pays (the first touch of a
#: page costs system time, which larger pieces multiply).
PIECE_PER_THREAD = 8 << 20

_NL = 10


@dataclass
class LocalData:
    """One rank's part of the data set.

    Attributes
    ----------
    x : ndarray, shape (n_local, m), float64
        This rank's rows, in file order (the clustered attributes only; a
        nominal attribute clustered as Weka does takes a block of columns, see
        :attr:`layout`).
    row_offset : int
        Global index of this rank's first row (among the rows kept).
    n : int
        Rows clustered, over all ranks.
    mins, maxs : ndarray, shape (m,), float64
        Global per-attribute minimum and maximum (Allreduce MIN/MAX).
    byte_range : (int, int)
        The bytes this rank owns: whole lines, ``[start, end)``.
    bytes_read : int
        Bytes this rank read from the file (its range plus alignment look-ups).
    counts : list of int
        Rows clustered on each rank.
    names : list of str
        The clustered attributes' names.
    weights : ndarray, shape (n_local,), float64, or None
        Instance weights, when any row of the file has one.
    kept : ndarray, shape (rows read,), bool, or None
        Which rows read were kept (``--missing drop``); None: all of them.
    input_rows : int
        Data rows in the file.
    missing : int
        Rows dropped or values filled in because of ``?``, over all ranks.
    fill : ndarray, shape (m,), float64, or None
        ``missing="mean"``: the value that replaces a ``?`` in each column (the
        given one, or the attribute's global mean; a nominal attribute's block
        one-hot at its mode), the same on every rank, whether or not any ``?``
        was found; None with another policy.
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
    names: list = field(default_factory=list)
    selection: "Selection | None" = None
    weights: np.ndarray | None = None
    kept: np.ndarray | None = None
    input_rows: int = 0
    missing: int = 0
    fill: np.ndarray | None = None

    @property
    def m(self) -> int:
        """Columns of ``x``."""
        return self.x.shape[1]

    @property
    def layout(self) -> Layout:
        """Which columns hold which clustered attribute."""
        if self.selection is not None and self.selection.layout is not None:
            return self.selection.layout
        return Layout.numeric(self.names)


# --------------------------------------------------------------------------- parse

MISSING_POLICIES = ("error", "drop", "mean")
#: What becomes of nominal attributes: not clustered, or clustered as Weka's SimpleKMeans does
NOMINAL_POLICIES = ("skip", "weka")


@dataclass
class Selection:
    """Which attributes of the header are clustered.

    Attributes
    ----------
    kinds : ndarray, shape (a,), int64
        ``rowparse.KEEP``, ``rowparse.NOMINAL`` or ``rowparse.SKIP`` per header attribute.
    outcol : ndarray, shape (a,), int64
        Column of each kept attribute in the data array, the first of a
        nominal attribute's block (-1 if skipped).
    names : list of str
        Kept attribute names, in order.
    skipped : list of str
        Attributes not clustered for their type, in order.
    ignored : list of str
        Attributes dropped with ``--ignore``.
    layout : Layout, optional
        The columns of each kept attribute (None: one each).
    nominal : tuple, optional
        The parser's table of the nominal attributes' categories
        (:func:`rowparse.nominal_table`; None: no nominal attribute is clustered).
    """

    kinds: np.ndarray
    outcol: np.ndarray
    names: list
    skipped: list
    ignored: list
    layout: Layout | None = None
    nominal: tuple | None = None

    @property
    def columns(self) -> int:
        """Columns of the data array."""
        return len(self.names) if self.layout is None else self.layout.columns


def _ignore_indices(spec: str, header: Header) -> set:
    """0-based indices named by ``--ignore`` (names, ``first``, ``last``, 1-based indices, ranges)."""
    names = header.names
    a = len(names)

    def position(token: str) -> int:
        low = token.lower()
        if low == "first":
            return 0
        if low == "last":
            return a - 1
        if token.isdigit():
            index = int(token) - 1
            if not 0 <= index < a:
                raise UsageError(f"--ignore {spec!r}: index {token} is not in 1..{a}")
            return index
        raise ValueError(token)

    out = set()
    for item in (t.strip() for t in spec.split(",")):
        if not item:
            continue
        if item in names:
            out.add(names.index(item))
            continue
        try:
            if "-" in item and not item.startswith("-"):
                lo, hi = item.split("-", 1)
                out.update(range(position(lo.strip()), position(hi.strip()) + 1))
            else:
                out.add(position(item))
        except ValueError:
            raise UsageError(f"--ignore {spec!r}: no attribute named {item!r} "
                             f"(names, first, last, 1-based indices or ranges like 2-4)") from None
    return out


def select_attributes(header: Header, ignore: str | None = None, nominal: str = "skip") -> Selection:
    """Decide which attributes are clustered: the numeric ones not ignored, and with
    ``nominal="weka"`` the nominal ones not ignored too (one-hot blocks, see :mod:`mpikmeans.nominal`).

    Raises
    ------
    UsageError
        ``ignore`` names an attribute that does not exist; an unknown ``nominal``.
    InputError
        No attribute is left to cluster.
    """
    if nominal not in NOMINAL_POLICIES:
        raise UsageError(f"--nominal {nominal!r}: expected one of {', '.join(NOMINAL_POLICIES)}")
    ignored_idx = _ignore_indices(ignore, header) if ignore else set()
    kinds = np.full(len(header.attributes), rowparse.SKIP, dtype=np.int64)
    outcol = np.full(len(header.attributes), -1, dtype=np.int64)
    names, starts, values, skipped, ignored = [], [], [], [], []
    column = 0
    for idx, attr in enumerate(header.attributes):
        clustered = attr.kind == "numeric" or (attr.kind == "nominal" and nominal == "weka")
        if not clustered:
            skipped.append(attr.name)
        elif idx in ignored_idx:
            ignored.append(attr.name)
        else:
            kinds[idx] = rowparse.KEEP if attr.kind == "numeric" else rowparse.NOMINAL
            outcol[idx] = column
            names.append(attr.name)
            starts.append(column)
            values.append(None if attr.kind == "numeric" else tuple(attr.values))
            column += 1 if attr.kind == "numeric" else len(attr.values)
    if not names:
        what = f" ({len(ignored)} ignored with --ignore)" if ignored else ""
        kinds_named = "numeric or nominal" if nominal == "weka" else "numeric"
        nominals = [a.name for j, a in enumerate(header.attributes) if a.kind == "nominal" and j not in ignored_idx]
        hint = ""
        if nominal == "skip" and nominals:
            shown = ", ".join(repr(n) for n in nominals[:5]) + (", ..." if len(nominals) > 5 else "")
            hint = (f"; its nominal attribute{'s' if len(nominals) > 1 else ''} ({shown}) can be clustered "
                    "as Weka's SimpleKMeans does with --nominal weka")
        raise InputError(f"{header.path}: no {kinds_named} attribute is left to cluster{what}{hint}")
    layout = Layout(names, starts, values)
    if not layout.has_nominal:
        return Selection(kinds, outcol, names, skipped, ignored)
    table = rowparse.nominal_table([a.values if kinds[j] == rowparse.NOMINAL else None
                                    for j, a in enumerate(header.attributes)])
    return Selection(kinds, outcol, names, skipped, ignored, layout, table)


_MESSAGES = {
    rowparse.E_EMPTY: "empty value",
    rowparse.E_RANGE: "{token!r} is out of the float64 range",
    rowparse.E_MISSING: "missing value '?' (use --missing drop or --missing mean to accept them)",
    rowparse.E_NUMBER: "{token!r} is not a number",
    rowparse.E_QUOTE: "a quote that is never closed: {token!r}",
    rowparse.E_NOMINAL: "{token!r} is not one of its values ({values})",
}


def _describe(code: int, header: Header, line_no: int, col: int, token: str) -> str:
    """The message for a bad row: file, line, attribute, what is wrong."""
    where = f"{header.path}:{line_no}"
    attrs = header.attributes
    a = len(attrs)
    noun = "column" if header.format == "csv" else "attribute"
    if "\x00" in token or any(ord(ch) < 32 and ch not in "\t\r" for ch in token) or "\ufffd" in token:
        shown = token.encode("utf-8", "backslashreplace")[:40]
        attr = f"{noun} {attrs[col].name!r}: " if 0 <= col < a else ""
        return f"{where}: {attr}binary data, not text: {shown!r}"
    if code == rowparse.E_FEW:
        return (f"{where}: row has {col} value{'s' if col != 1 else ''}, expected {a} "
                f"({noun} {attrs[col].name!r} is missing)")
    if code == rowparse.E_MANY:
        if noun == "column":
            return (f"{where}: row has more than {a} values (the first line has {a} columns; "
                    "a decimal comma would split a number in two)")
        return (f"{where}: row has more than {a} values (the header declares {a} attributes; a decimal comma "
                "would split a number in two, and a value with blanks or commas in it needs quotes)")
    if code == rowparse.E_INDEX:
        return f"{where}: sparse index {token!r} is not an attribute index (0..{a - 1})"
    if code == rowparse.E_SPARSE:
        return f"{where}: malformed sparse row near {token!r}: expected {{index value, ...}}"
    if code == rowparse.E_WEIGHT:
        return f"{where}: instance weight {{{token}}} is not a positive number"
    values = ", ".join(attrs[col].values[:8]) + (", ..." if len(attrs[col].values) > 8 else "")
    return f"{where}: {noun} {attrs[col].name!r}: " + _MESSAGES[code].format(token=token, values=values)


#: The text reader's compiled kernels, as :func:`warm_up` loads them (what a warm-up compiles ahead).
READ_KERNELS = (last_newline, span_cuts, _count_newlines, rowparse.parse_rows, rowparse._min_max_rows,
                rowparse._combine_min_max)


def warm_up(threads: int = 1) -> None:
    """Pay the reader's one-time start-up now, on a two-line buffer, so no read is timed with it.

    The first call of any Numba function in a process initialises Numba itself
    (its registries; through Numba's BLAS check it imports SciPy), and the first
    call of each kernel loads it from Numba's on-disk cache: both once per
    process whatever the file size, so with many ranks each reading a small share
    they would dominate a timed read.  Each kernel of :data:`READ_KERNELS` is
    called here with the argument types the reader gives it (the tests check
    that reading afterwards adds no compiled version).

    Parameters
    ----------
    threads : int
        Threads the reader will use (Numba's thread pool is started for them).
    """
    import numba

    numba.set_num_threads(max(1, min(threads, numba.config.NUMBA_NUM_THREADS)))
    text = np.frombuffer(b"1,2\n3,4\n", dtype=np.uint8).copy()
    # the parser first: on a cold machine it is the long compile, and a second process
    # (startup.BackgroundCompile) compiles the small kernels below meanwhile
    cuts = np.array([0, len(text)], dtype=np.int64)
    seg = np.array([0, 2], dtype=np.int64)
    kinds = np.full(2, rowparse.KEEP, dtype=np.int64)
    outcol = np.arange(2, dtype=np.int64)
    out = np.empty((2, 2))
    weights = np.empty(2)
    res = np.empty((1, 8), dtype=np.int64)
    rowparse.parse_parallel(text, cuts, seg, kinds, outcol, rowparse.MISSING_ERROR, out, weights, res)
    last_newline(text, 0)
    line_cuts(text, 1)
    rowparse.column_min_max(out, 1)


def _parse_span(fd, start: int, end: int, sel: Selection, missing_mode: int, path: str, threads: int = 1,
                delim: int = ord(","), weka: int = rowparse.WEKA_TOKENS):
    """Parse the owned lines ``[start, end)`` piece by piece, each piece by ``threads`` threads.

    One text buffer of ``PIECE_PER_THREAD`` bytes per thread (at most
    ``READ_PIECE``) is reused for every piece (read by ``threads`` threads at
    once); a piece ends at its last newline and the partial line after it
    moves to the front of the buffer for the next piece.  Each thread parses a span of whole lines straight into its place
    in one rows array, which is allocated once from the first piece's rows
    per byte (and grown if the estimate falls short): no copy joins the
    pieces or the spans, unless blank or comment lines leave gaps to close.

    Returns ``(rows, weights, lines consumed, weighted, bad)`` where ``bad``
    is None or ``(code, line, attribute, token)`` with the line counted from
    ``start`` (the caller adds this rank's first line number once counts are
    exchanged).
    """
    m = sel.columns
    parts = max(1, threads)
    out = np.empty((0, m))
    weights = np.empty(0)
    rows = total_lines = 0
    weighted = False
    cap = max(1, min(READ_PIECE, PIECE_PER_THREAD * parts, end - start))
    buf = np.empty(cap, dtype=np.uint8)
    have = 0  # bytes at the front of buf: the start of a line cut off by the previous piece
    pos = start
    pool = None
    if parts > 1:  # reads the file in strides and parses the spans of each piece
        from concurrent.futures import ThreadPoolExecutor

        pool = ThreadPoolExecutor(max_workers=parts)
    try:
        while pos < end or have:
            want = min(cap - have, end - pos)
            got = read_into(fd, memoryview(buf)[have:have + want], pos, pool, parts)
            if got < want:
                raise InputError(f"{path}: file shrank while reading (expected {end} bytes)")
            pos += want
            have += want
            if pos < end:
                nl = last_newline(buf[:have], 0)
                if nl < 0:  # a single line longer than the buffer: make room for it
                    grown = np.empty(2 * cap, dtype=np.uint8)
                    grown[:have] = buf[:have]
                    buf, cap = grown, 2 * cap
                    continue
                use = nl + 1
            else:
                use = have
            text = buf[:use]
            cuts, counts = line_cuts(text, parts, pool)
            # room for one row per line: a span holds whole lines, each ending in a
            # newline but the file's last one (in the last span that is not empty)
            ends = cuts[1:]
            unterminated = (ends > cuts[:-1]) & (text[np.maximum(ends - 1, 0)] != _NL)
            seg = np.zeros(parts + 1, dtype=np.int64)
            seg[1:] = np.cumsum(counts + unterminated)
            need = rows + int(seg[-1])
            if need > len(out):
                if rows == 0:  # first piece: room for the whole span at this piece's rows per byte
                    guess = int((end - start) * seg[-1] / use * 1.02) + 16
                else:  # the estimate fell short: what is left at the rows per byte seen so far
                    guess = int(rows + (end - pos + have) * rows / (pos - have - start) * 1.05) + 16
                capacity = max(need, guess)
                grown = np.empty((capacity, m))
                grown[:rows] = out[:rows]
                out = grown
                wgrown = np.empty(capacity)
                wgrown[:rows] = weights[:rows]
                weights = wgrown
            res = np.empty((parts, 8), dtype=np.int64)
            first = rows
            rowparse.parse_parallel(text, cuts, seg + first, sel.kinds, sel.outcol, missing_mode, out, weights, res,
                                    pool, sel.nominal, delim, weka)
            for t in range(parts):
                got, lines, has_w, err, err_line, err_col, ts, te = (int(v) for v in res[t])
                base = first + int(seg[t])
                if base != rows:  # close the gap left by blank or comment lines of earlier spans
                    out[rows:rows + got] = out[base:base + got]
                    weights[rows:rows + got] = weights[base:base + got]
                rows += got
                weighted = weighted or bool(has_w)
                if err != rowparse.E_NONE:
                    token = bytes(text[ts:te]).decode("utf-8", "replace")
                    return out[:rows], weights[:rows], total_lines + lines, weighted, \
                        (err, total_lines + err_line, err_col, token)
                total_lines += lines
            # the cut-off start of a line moves to the front (less than a line: cheap)
            rest = have - use
            if rest:
                buf[:rest] = buf[use:have].copy()
            have = rest
    finally:
        if pool is not None:
            pool.shutdown()
    return out[:rows], weights[:rows], total_lines, weighted, None


def read_local(path: str, header: Header, comm, ignore: str | None = None, missing: str = "error",
               threads: int = 1, nominal: str = "skip", fill: np.ndarray | None = None) -> LocalData:
    """Read this rank's rows of an ARFF file (collective: every rank calls it).

    Parameters
    ----------
    path : str
    header : Header
        The same on every rank (rank 0 parsed it and broadcast it).
    comm : mpikmeans.comm.SerialComm or Comm
    ignore : str, optional
        Numeric attributes not to cluster (see :func:`select_attributes`).
    missing : {"error", "drop", "mean"}
        What to do with ``?``: refuse the file, drop the rows that have one,
        or replace it by the attribute's global mean, a nominal attribute's
        mode (as Weka's SimpleKMeans).
    threads : int
        Threads parsing this rank's text.
    nominal : {"skip", "weka"}
        Nominal attributes are not clustered, or clustered as Weka does
        (see :func:`select_attributes`).
    fill : ndarray, shape (columns,), float64, optional
        With ``missing="mean"``: the values that replace ``?`` (a fitted
        model's training means, in this file's columns), instead of this
        file's own means.

    Returns
    -------
    LocalData

    Raises
    ------
    InputError
        On every rank, if any rank found a bad row: the message names the file,
        the 1-based line number and the attribute of the first bad row.
    ValueError
        ``fill`` has not one value per column.
    """
    sel = select_attributes(header, ignore, nominal)
    m = sel.columns
    if fill is not None and np.shape(fill) != (m,):
        raise ValueError(f"fill: {np.shape(fill)} values for {m} columns")
    mode = rowparse.MISSING_ERROR if missing == "error" else rowparse.MISSING_NAN
    lo, hi = byte_ranges(header.data_offset, header.file_size, comm.size)[comm.rank]
    error = None
    x, weights, lines, weighted, bad = np.empty((0, m)), np.empty(0), 0, False, None
    start = end = lo
    bytes_read = 0
    try:
        fd = open_input(path)
    except MpikmeansError as exc:
        error, fd = exc, None
    if fd is not None:
        weka = rowparse.WEKA_TOKENS if header.format == "arff" else rowparse.CSV_TOKENS
        try:
            start, r1 = first_line_start(fd, lo, header.data_offset, header.file_size)
            end, r2 = first_line_start(fd, hi, header.data_offset, header.file_size)
            end = max(start, end)
            x, weights, lines, weighted, bad = _parse_span(fd, start, end, sel, mode, path, threads,
                                                           ord(header.delimiter), weka)
            bytes_read = (end - start) + r1 + r2
        except InputError as exc:
            error = exc
        except OSError as exc:
            error = InputError(f"{path}: read failed: {exc.strerror}")
        finally:
            os.close(fd)
    # one exchange gives every rank its first line's number, the row counts,
    # whether any row is weighted, and whether any rank found a bad row
    failure = None if error is None else (type(error), error.message)
    reports = comm.allgather((len(x), lines, weighted, bad, failure))
    problems = []
    line_base = header.data_line
    for r, (_, r_lines, _, r_bad, r_failure) in enumerate(reports):
        if r_failure is not None:
            problems.append((-1, r, r_failure))
        elif r_bad is not None:
            code, line_in, col, token = r_bad
            line_no = line_base + line_in
            problems.append((line_no, r, (InputError, _describe(code, header, line_no, col, token))))
        line_base += r_lines
    if problems:
        _, _, (cls, message) = min(problems, key=lambda p: p[:2])
        raise cls(message, collective=True)
    input_rows = sum(r[0] for r in reports)
    if input_rows == 0:
        raise InputError(f"{path}: the data section has no rows", collective=True)
    any_weighted = any(r[2] for r in reports)

    kept, missing_count = None, 0
    if mode == rowparse.MISSING_NAN:
        x, weights, kept, missing_count, fill = _apply_missing(comm, x, weights, missing, header, sel, fill)
    else:
        fill = None
    counts = comm.allgather(len(x))
    n = sum(counts)
    if n == 0:
        raise InputError(f"{path}: every row has a missing value: none is left to cluster", collective=True)
    if len(x):
        mins, maxs = rowparse.column_min_max(x, max(1, threads))
    else:
        mins, maxs = np.full(m, np.inf), np.full(m, -np.inf)
    return LocalData(path, header, x, sum(counts[: comm.rank]), n, comm.allreduce(mins, "min"),
                     comm.allreduce(maxs, "max"), (start, end), bytes_read, counts=counts, names=sel.names,
                     selection=sel, weights=weights if any_weighted else None, kept=kept,
                     input_rows=input_rows, missing=missing_count, fill=fill)


def _apply_missing(comm, x: np.ndarray, weights: np.ndarray, policy: str, header: Header, sel: Selection,
                   given: np.ndarray | None = None):
    """Drop rows with a ``?`` or fill it with the global mean of its attribute (collective).

    A nominal attribute's ``?`` (a block of NaN, see :mod:`mpikmeans.nominal`)
    is filled with its global mode instead: the most frequent category among the
    rows that have one, the first on a tie (Weka's ReplaceMissingValues).
    ``given`` values (``mean``) replace ``?`` instead of the global ones.

    Returns
    -------
    x, weights : the rows kept (filled)
    kept : ndarray of bool, shape (rows read,), or None when every row is kept
    count : int
        Rows dropped (``drop``) or values replaced (``mean``), over all ranks.
    fill : ndarray, shape (columns,), or None
        ``mean``: the values a ``?`` gets, computed even where there is none (a
        model records them to fill new rows); None for ``drop``.

    Raises
    ------
    InputError
        On every rank (``mean``): an attribute has no value at all; the message names it.
    """
    layout = sel.layout
    nan = np.isnan(x)
    if policy == "drop":
        bad_rows = nan.any(axis=1)
        count = int(comm.allreduce(np.array([bad_rows.sum()], dtype=np.int64), "sum")[0])
        if count == 0:
            return x, weights, None, 0, None
        keep = ~bad_rows
        return np.ascontiguousarray(x[keep]), weights[keep], keep, count, None
    numeric = np.ones(x.shape[1], dtype=bool) if layout is None else layout.numeric_columns()
    stats = np.zeros((3, x.shape[1]), dtype=np.int64)
    stats[0] = (~nan).sum(axis=0)
    stats[1] = nan.sum(axis=0)
    blocks = [] if layout is None else layout.blocks()
    if blocks:  # a nominal block's category counts
        stats[2][~numeric] = (x[:, ~numeric] == ONE).sum(axis=0)
    stats = comm.allreduce(stats, "sum")
    # a nominal attribute's missing value is one NaN per column of its block: count it once
    count = int(stats[1][numeric].sum() + sum(stats[1][s] for _, s, _ in blocks))
    if given is not None:
        fill = np.array(given, dtype=np.float64)
    else:
        empty = np.flatnonzero(stats[0] == 0)
        if len(empty):
            lay = layout if layout is not None else Layout.numeric(sel.names)
            k = max(a for a, start in enumerate(lay.starts) if start <= empty[0])
            noun = "column" if header.format == "csv" else "attribute"
            what = "mean" if lay.values[k] is None else "mode"
            raise InputError(f"{header.path}: {noun} {lay.names[k]!r} has only missing values ('?'): no {what} to "
                             "fill in; leave it out with --ignore", collective=True)
        # the means of the values present, summed exactly: the same bits at any rank count
        # (without a '?' the rows themselves: no copy of them)
        fill = exact_column_means(comm, np.where(nan, 0.0, x) if count else x, stats[0])
        for _, s, v in blocks:
            fill[s:s + len(v)] = 0.0
            fill[s + int(np.argmax(stats[2][s:s + len(v)]))] = ONE  # the first most frequent
    if count == 0:
        return x, weights, None, 0, fill
    x = np.where(nan, fill, x)
    return np.ascontiguousarray(x), weights, None, count, fill


def read_arff(path: str, comm, header: Header | None = None, ignore: str | None = None,
              missing: str = "error", threads: int = 1, nominal: str = "skip",
              fill: np.ndarray | None = None) -> LocalData:
    """Read a text file in parallel: header on rank 0, rows on every rank.

    Collective.  See :func:`read_local`.  Without ``header`` the file is read as
    ARFF (:func:`.header.shared_header`); a caller with any text format's header
    (:func:`mpikmeans.io.formats.shared_header`: ARFF, CSV, TSV) passes it.
    """
    header = header or shared_header(path, comm)
    try:
        return read_local(path, header, comm, ignore=ignore, missing=missing, threads=threads, nominal=nominal,
                          fill=fill)
    except (UsageError, InputError) as exc:
        exc.collective = True  # select_attributes decides the same on every rank
        raise
