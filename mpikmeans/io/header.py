"""The ARFF header: ``@relation``, ``@attribute`` and ``@data``, as Weka's ArffLoader reads them.

Rank 0 parses the header (:func:`read_header`) and broadcasts it
(:func:`shared_header`); every rank then knows the attributes, where the data
section starts, and its first line's number.  :func:`header_text` writes one.
:class:`Header` is also what the CSV reader (:mod:`.csvhead`) makes of a CSV
file's first line; which of the two a file takes is decided in :mod:`.formats`.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

from ..errors import InputError
from . import open_input

NUMERIC_TYPES = ("numeric", "real", "integer")


@dataclass
class Attribute:
    """One ``@attribute`` line.

    ``values`` are a nominal attribute's categories, in declaration order,
    unquoted (empty for the other kinds).
    """

    name: str
    kind: str  # numeric | nominal | string | date | relational | unknown
    line: int
    values: tuple = ()


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
    path : str
    delimiter : str
        The character between a row's values.
    format : {"arff", "csv", "npy"}
        How the rows are read: as Weka's ArffLoader tokenises them (values
        separated by a comma or by blanks), as a CSV file's (values separated
        by ``delimiter`` alone), or not text at all (a ``.npy`` copy).
    """

    relation: str
    attributes: list
    data_offset: int
    data_line: int
    file_size: int
    path: str = ""
    delimiter: str = ","  # between values: a comma in ARFF, a CSV file's own
    format: str = "arff"

    @property
    def names(self) -> list:
        return [a.name for a in self.attributes]


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


def _nominal_values(type_text: str, path: str, line_no: int, name: str) -> tuple:
    """The categories of ``{a, 'b c', "d,e"}``: split at commas outside quotes, blanks trimmed, unquoted."""
    body = type_text.strip()
    if not body.endswith("}"):
        raise InputError(f"{path}:{line_no}: nominal attribute {name!r}: no closing '}}' in {body!r}")
    body = body[1:-1]
    values, token, quote, escaped = [], "", None, False
    for ch in body:
        if escaped:
            token += ch
            escaped = False
        elif quote:
            token += ch
            if ch == "\\":
                escaped = True
            elif ch == quote:
                quote = None
        elif ch in "'\"":
            token += ch
            quote = ch
        elif ch == ",":
            values.append(token)
            token = ""
        else:
            token += ch
    if quote:
        raise InputError(f"{path}:{line_no}: nominal attribute {name!r}: a quote that is never closed")
    values.append(token)
    values = [_unquote(v.strip()) for v in values]
    if values == [""]:
        return ()
    if "" in values:
        raise InputError(f"{path}:{line_no}: nominal attribute {name!r}: an empty value in {type_text.strip()!r}")
    return tuple(values)


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
            values = _nominal_values(match.group(2), path, line_no, name) if kind == "nominal" else ()
            attributes.append(Attribute(name, kind, line_no, values))
        elif kw == "@data":
            break
        else:
            raise InputError(f"{path}:{line_no}: expected @relation, @attribute or @data, found {text[:40]!r}")
    if relation is None:
        raise InputError(f"{path}: no @relation line before @data")
    if not attributes:
        raise InputError(f"{path}: no @attribute lines before @data")
    for a in attributes:
        if a.kind == "relational":
            raise InputError(f"{path}:{a.line}: attribute {a.name!r} is relational (multi-instance data); "
                             "flatten it to numeric attributes first")
    return Header(relation, attributes, min(offset, file_size), line_no + 1, file_size, path)


def read_header(path: str) -> Header:
    """Read and parse the ARFF header of ``path`` (see :func:`parse_header`).

    Raises
    ------
    UsageError
        ``path`` is not a regular file (see :func:`mpikmeans.io.open_input`).
    InputError
        It cannot be read, is compressed, or its header is malformed.
    """
    fd = open_input(path)
    try:
        head = b""
        block = 1 << 16
        while True:
            more = os.pread(fd, block, len(head))
            head += more
            try:
                return parse_header(path, head, complete=not more)
            except _NeedMore:
                block = min(block * 2, 1 << 24)
    except OSError as exc:
        raise InputError(f"{path}: cannot read: {exc.strerror}") from None
    finally:
        os.close(fd)


def shared_header(path: str, comm) -> Header:
    """Rank 0 parses the ARFF header and broadcasts it; every rank gets it or the same error (collective)."""
    return comm.from_root(lambda: read_header(path))


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
