"""CSV input: the first line read as the ARFF reader's :class:`~mpikmeans.io.header.Header`.

A numeric CSV file is an ARFF data section without its header: the same
parallel byte-range reader parses its rows (every rank its lines, exactly, on
its threads), with the same error messages naming the file, line and column.
This module only decides what the first line is: column names (any field that
is not a number makes it a header line) or the first row (the columns are then
named ``col1 .. colM``), and which delimiter the file uses: the one of comma,
tab, semicolon and ``|`` that the first line holds most often outside quotes
(a comma on a tie; a single column needs none), unless the caller names it
(a ``.tsv`` file's tab, see :mod:`.formats`).
"""

from __future__ import annotations

import csv
import io
import os

from ..errors import InputError
from . import open_input
from .header import Attribute, Header

#: how far into the file the first line may end
_FIRST_LINE_MAX = 1 << 20
#: the delimiters recognised, the first winning a tie
DELIMITERS = (",", "\t", ";", "|")


def detect_delimiter(line: str) -> str:
    """The delimiter of a CSV file from its first line: the most frequent of :data:`DELIMITERS` outside quotes."""
    counts = dict.fromkeys(DELIMITERS, 0)
    quote = None
    for ch in line:
        if quote:
            if ch == quote:
                quote = None
        elif ch in "'\"":
            quote = ch
        elif ch in counts:
            counts[ch] += 1
    return max(DELIMITERS, key=lambda d: (counts[d], -DELIMITERS.index(d)))


def _is_number(field: str) -> bool:
    text = field.strip()
    if len(text) >= 2 and text[0] == text[-1] and text[0] in "'\"":  # a quoted number is a number
        text = text[1:-1].strip()
    if text in ("", "?"):  # an empty or missing value: still a data row (the reader decides)
        return True
    try:
        float(text)
    except ValueError:
        return False
    return True


def read_csv_header(path: str, delimiter: str | None = None) -> Header:
    """The columns of a CSV file, its delimiter and where its rows start.

    Parameters
    ----------
    path : str
    delimiter : str, optional
        The byte between values; default: :func:`detect_delimiter` of the first line.

    Returns
    -------
    Header
        ``relation``: the file's name; ``attributes``: one numeric attribute
        per column (the header line's names, else ``col1 .. colM``);
        ``data_offset``/``data_line``: the first data row; ``delimiter``;
        ``format``: ``"csv"``.

    Raises
    ------
    UsageError
        ``path`` is not a regular file (see :func:`mpikmeans.io.open_input`).
    InputError
        An unreadable, compressed or empty file, a header line without data
        rows, or a header line naming a column twice.
    """
    fd = open_input(path)
    try:
        size = os.fstat(fd).st_size
        head = os.pread(fd, min(size, _FIRST_LINE_MAX), 0)
    except OSError as exc:
        raise InputError(f"{path}: cannot read: {exc.strerror}") from None
    finally:
        os.close(fd)
    start = 3 if head.startswith(b"\xef\xbb\xbf") else 0  # UTF-8 byte-order mark
    nl = head.find(b"\n", start)
    if nl < 0:
        if size > len(head):
            raise InputError(f"{path}:1: the first line is longer than {_FIRST_LINE_MAX} bytes")
        nl = len(head)
    try:
        first = head[start:nl].decode("utf-8").rstrip("\r")
    except UnicodeDecodeError:
        raise InputError(f"{path}:1: the first line is not UTF-8 text") from None
    if not first.strip():
        raise InputError(f"{path}:1: the first line is empty: a CSV file starts with its column names or "
                         "its first row")
    delimiter = delimiter or detect_delimiter(first)
    fields = next(csv.reader(io.StringIO(first), delimiter=delimiter, skipinitialspace=True))
    named = not all(_is_number(f) for f in fields)
    if named:
        names = [f.strip() for f in fields]
        seen: dict = {}
        for col, name in enumerate(names, 1):
            if not name:
                names[col - 1] = name = f"col{col}"
            if name in seen:
                raise InputError(f"{path}:1: column {col} is named {name!r} like column {seen[name]}")
            seen[name] = col
        offset, line = min(nl + 1, size), 2
        if offset >= size or not head[offset:].strip() and size <= len(head):
            raise InputError(f"{path}: the column names on line 1 are followed by no rows")
    else:
        names = [f"col{col}" for col in range(1, len(fields) + 1)]
        offset, line = start, 1
    relation = os.path.splitext(os.path.basename(path))[0]
    attributes = [Attribute(name, "numeric", 1) for name in names]
    return Header(relation, attributes, offset, line, size, path, delimiter, "csv")
