"""Tests for :mod:`mpikmeans.io.arff`: header parsing, the byte-range split, and the
parallel reader, which must return exactly ``numpy.loadtxt``'s values for every
split of the file over 1..7 ranks (ranks simulated with threads, see
tests/threadcomm.py)."""

from __future__ import annotations

import gzip
import io
import os
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from threadcomm import run_ranks  # noqa: E402

from mpikmeans.io import arff, split  # noqa: E402
from mpikmeans.io.arff import read_arff  # noqa: E402
from mpikmeans.io.header import header_text, parse_header, read_header  # noqa: E402
from mpikmeans.io.split import byte_ranges, first_line_start  # noqa: E402
from mpikmeans.errors import InputError  # noqa: E402

NAMES = ["a", "b b", "c"]
HEADER = [
    "% a data set for the tests",
    "@relation test",
    "",
    "@attribute a numeric",
    "@attribute 'b b' real",
    "% between attributes",
    "@attribute c integer",
    "",
    "@data",
]


# --------------------------------------------------------------------------- helpers

def write_file(path: Path, header: list, data: list, *, newline: str = "\n", final_newline: bool = True,
               bom: bool = False) -> Path:
    text = newline.join(header + data)
    if final_newline:
        text += newline
    raw = text.encode("utf-8")
    if bom:
        raw = b"\xef\xbb\xbf" + raw
    path.write_bytes(raw)
    return path


def loadtxt(data: list) -> np.ndarray:
    """The reference: numpy.loadtxt on the data section (LF line endings)."""
    text = "\n".join(data) + "\n"
    return np.loadtxt(io.StringIO(text), delimiter=",", comments="%", ndmin=2, dtype=np.float64)


def _token(rng) -> str:
    kind = int(rng.integers(0, 12))
    if kind == 0:
        return repr(float(rng.standard_normal()))
    if kind == 1:
        return repr(float(rng.standard_normal() * 10.0 ** int(rng.integers(-300, 300))))
    if kind == 2:
        return str(int(rng.integers(-10**6, 10**6)))
    if kind == 3:
        return "-0.0"
    if kind == 4:
        return f"{rng.random():.25f}"  # more than 19 significant digits
    if kind == 5:
        return f"{rng.standard_normal():.6E}"
    if kind == 6:
        return [".5", "5.", "+1.25", "-.75", "00012", "1e5", "1E-5"][int(rng.integers(0, 7))]
    if kind == 7:
        return repr(5e-324 * int(rng.integers(1, 10**6)))  # subnormal
    if kind == 8:
        return "0"
    if kind == 9:
        return repr(float(rng.uniform(-1e6, 1e6)))
    if kind == 10:
        return "1.7976931348623157e308" if rng.random() < 0.5 else "-2.2250738585072014e-308"
    return f"{rng.standard_normal() * 1e3:.2f}"


def random_data(seed: int, rows: int = 40, m: int = 3, extras: bool = True) -> list:
    """Data lines: random values printed with repr and other exact forms, varying
    lengths and spacing, with comment and blank lines that loadtxt also skips."""
    rng = np.random.default_rng(seed)
    lines = []
    for i in range(rows):
        toks = []
        for _ in range(m):
            t = _token(rng)
            if rng.random() < 0.15:
                t = " " * int(rng.integers(1, 3)) + t + "\t" * int(rng.integers(0, 2)) + " "
            toks.append(t)
        line = ",".join(toks)
        if extras and rng.random() < 0.1:
            line += " % trailing comment, with a comma"
        lines.append(line)
        if extras and rng.random() < 0.1:
            lines.append("% a comment line inside the data, 1,2,3")
        if extras and rng.random() < 0.08:
            lines.append("")
    if extras:
        lines.insert(0, "% first data line is a comment")
        lines.insert(1, "")
    return lines


def read_all(path, ranks: int) -> list:
    return run_ranks(ranks, lambda comm: read_arff(str(path), comm))


def check_split(parts: list, expected: np.ndarray, path) -> None:
    """The ranks' rows, in rank order, are loadtxt's rows bit for bit, each once."""
    size = os.path.getsize(path)
    x = np.concatenate([p.x for p in parts])
    assert x.dtype == np.float64
    assert x.shape == expected.shape
    assert x.tobytes() == expected.tobytes(), "values differ from numpy.loadtxt (bitwise)"
    counts = [len(p.x) for p in parts]
    offset = 0
    for r, p in enumerate(parts):
        assert p.row_offset == offset, f"rank {r}: row_offset {p.row_offset}, expected {offset}"
        assert p.n == len(expected)
        assert p.counts == counts
        assert p.m == expected.shape[1]
        offset += counts[r]
        if len(expected):
            np.testing.assert_array_equal(p.mins, expected.min(axis=0))
            np.testing.assert_array_equal(p.maxs, expected.max(axis=0))
    # the owned byte ranges tile the data section
    assert parts[0].byte_range[0] == parts[0].header.data_offset
    for a, b in zip(parts, parts[1:]):
        assert a.byte_range[1] == b.byte_range[0]
    assert parts[-1].byte_range[1] == size
    for p in parts:
        assert p.bytes_read >= p.byte_range[1] - p.byte_range[0]


# --------------------------------------------------------------------------- header

def test_header_fields(tmp_path):
    path = write_file(tmp_path / "h.arff", HEADER, ["1,2,3"])
    h = read_header(str(path))
    assert h.relation == "test"
    assert h.names == NAMES
    assert [a.kind for a in h.attributes] == ["numeric"] * 3
    assert [a.line for a in h.attributes] == [4, 5, 7]
    header_bytes = ("\n".join(HEADER) + "\n").encode()
    assert h.data_offset == len(header_bytes)
    assert h.data_line == len(HEADER) + 1
    assert h.file_size == os.path.getsize(path)


def test_header_keywords_any_case_and_quoting(tmp_path):
    header = [
        "@RELATION 'my data set'",
        "@Attribute x NUMERIC",
        "@ATTRIBUTE 'petal length' Real",
        '@attribute "sepal width" INTEGER',
        "@attribute\ttabbed\tnumeric",
        r"@attribute 'it\'s' numeric",
        "@DATA",
    ]
    path = write_file(tmp_path / "k.arff", header, ["1,2,3,4,5"])
    h = read_header(str(path))
    assert h.relation == "my data set"
    assert h.names == ["x", "petal length", "sepal width", "tabbed", "it's"]
    assert h.data_line == len(header) + 1


def test_header_bom_and_crlf(tmp_path):
    header = ["% comment", "@relation r", "", "@attribute u numeric", "@attribute v numeric", "@data"]
    data = ["1.5,2.5", "3.5,4.5"]
    path = write_file(tmp_path / "b.arff", header, data, newline="\r\n", bom=True)
    h = read_header(str(path))
    assert h.relation == "r"
    assert h.names == ["u", "v"]
    assert h.data_offset == 3 + len(("\r\n".join(header) + "\r\n").encode())
    assert h.data_line == len(header) + 1
    for ranks in (1, 2):
        check_split(read_all(path, ranks), loadtxt(data), path)


def test_header_inline_comment_after_type(tmp_path):
    # Weka's tokenizer treats '%' as a comment anywhere on a line, and the data
    # rows of this reader accept trailing comments too
    header = ["@relation r", "@attribute x numeric % the x coordinate", "@attribute y real", "@data"]
    path = write_file(tmp_path / "c.arff", header, ["1,2"])
    assert read_header(str(path)).names == ["x", "y"]


@pytest.mark.parametrize("data", [[], ["% only a comment", ""]], ids=["empty", "comments-only"])
@pytest.mark.parametrize("ranks", [1, 3])
def test_data_without_rows(tmp_path, data, ranks):
    path = write_file(tmp_path / "e.arff", HEADER, data)
    out = run_ranks(ranks, lambda comm: read_arff(str(path), comm), return_exceptions=True)
    assert all(isinstance(e, InputError) for e in out), out
    assert len({e.message for e in out}) == 1
    assert "no rows" in out[0].message and str(path) in out[0].message
    assert all(e.collective for e in out)


def test_data_line_without_newline(tmp_path):
    path = write_file(tmp_path / "e.arff", HEADER, [], final_newline=False)
    with pytest.raises(InputError, match="no rows"):
        read_all(path, 2)


@pytest.mark.parametrize("ranks", [1, 3])
def test_no_data_line(tmp_path, ranks):
    path = write_file(tmp_path / "n.arff", HEADER[:-1], [])
    out = run_ranks(ranks, lambda comm: read_arff(str(path), comm), return_exceptions=True)
    assert all(isinstance(e, InputError) and e.collective for e in out), out
    assert len({e.message for e in out}) == 1
    assert "@data" in out[0].message and str(path) in out[0].message


def test_duplicate_names_name_both_lines(tmp_path):
    header = ["@relation r", "@attribute x numeric", "@attribute y numeric", "", "@attribute x real", "@data"]
    path = write_file(tmp_path / "d.arff", header, ["1,2,3"])
    with pytest.raises(InputError) as info:
        read_header(str(path))
    msg = info.value.message
    assert f"{path}:5:" in msg and "line 2" in msg and "'x'" in msg


@pytest.mark.parametrize(
    "decl, kind",
    [
        ("@attribute class {a,b,c}", "nominal"),
        ("@attribute class{a,b}", "nominal"),
        ("@attribute class string", "string"),
        ("@attribute class STRING", "string"),
        ('@attribute class date "yyyy-MM-dd"', "date"),
    ],
)
def test_non_numeric_attribute_types_are_recognised(tmp_path, decl, kind):
    header = ["@relation r", "@attribute x numeric", "% comment", decl, "@data"]
    path = write_file(tmp_path / "u.arff", header, ["1,a"])
    h = read_header(str(path))
    assert [(a.name, a.kind) for a in h.attributes] == [("x", "numeric"), ("class", kind)]


def test_relational_attribute_is_rejected(tmp_path):
    header = ["@relation r", "@attribute x numeric", "% comment", "@attribute bag relational", "@data"]
    path = write_file(tmp_path / "u.arff", header, ["1,a"])
    with pytest.raises(InputError) as info:
        read_header(str(path))
    msg = info.value.message
    assert f"{path}:4:" in msg and "'bag'" in msg and "relational" in msg


def test_unknown_attribute_type(tmp_path):
    header = ["@relation r", "@attribute x numeric", "@attribute y float", "@data"]
    path = write_file(tmp_path / "u.arff", header, ["1,2"])
    with pytest.raises(InputError) as info:
        read_header(str(path))
    msg = info.value.message
    assert f"{path}:3:" in msg and "'y'" in msg and "float" in msg


@pytest.mark.parametrize(
    "header, needle",
    [
        (["@attribute x numeric", "@data"], "@relation"),
        (["@relation r", "@data"], "@attribute"),
        (["@relation r", "@attribute x", "@data"], ":2:"),
        (["@relation r", "@attrib x numeric", "@data"], ":2:"),
    ],
)
def test_malformed_header(tmp_path, header, needle):
    path = write_file(tmp_path / "m.arff", header, ["1"])
    with pytest.raises(InputError, match=needle):
        read_header(str(path))


def test_gzip_is_refused(tmp_path):
    path = tmp_path / "z.arff.gz"
    with gzip.open(path, "wb") as f:
        f.write(("\n".join(HEADER + ["1,2,3"]) + "\n").encode())
    with pytest.raises(InputError, match="compress"):
        read_header(str(path))
    out = run_ranks(2, lambda comm: read_arff(str(path), comm), return_exceptions=True)
    assert all(isinstance(e, InputError) and e.collective for e in out)


def test_missing_file(tmp_path):
    path = tmp_path / "missing.arff"
    out = run_ranks(2, lambda comm: read_arff(str(path), comm), return_exceptions=True)
    assert all(isinstance(e, InputError) and e.collective for e in out)
    assert str(path) in out[0].message


def test_long_header(tmp_path):
    # a header longer than the first 64 KiB block read
    names = [f"attribute_number_{j}" for j in range(4000)]
    path = tmp_path / "wide.arff"
    path.write_bytes(header_text("wide", names) + (",".join(["1"] * 4000) + "\n").encode())
    h = read_header(str(path))
    assert h.names == names and h.data_line == 4003


def test_long_header_mentioning_data_in_a_comment(tmp_path):
    # '@data' inside a comment near the top must not end the header search early
    names = [f"attribute_number_{j}" for j in range(4000)]
    head = b"% The @data section holds one row per sample.\n" + header_text("wide", names)
    path = tmp_path / "wide.arff"
    path.write_bytes(head + (",".join(["1"] * 4000) + "\n").encode())
    h = read_header(str(path))
    assert h.names == names and h.data_line == 4004


@pytest.mark.parametrize(
    "relation, names",
    [
        ("mpikmeans-blobs", ["X1", "X2", "X3"]),
        ("my relation", ["petal length", "it's", "back\\slash", "1st", "x{1}", "%pct", "a,b", "naïve", "_u.v-w"]),
    ],
)
def test_header_text_round_trip(tmp_path, relation, names):
    head = header_text(relation, names)
    path = tmp_path / "rt.arff"
    path.write_bytes(head + (",".join(["0"] * len(names)) + "\n").encode())
    h = parse_header(str(path), path.read_bytes())
    assert h.relation == relation
    assert h.names == names
    assert h.data_offset == len(head)
    assert h.data_line == len(names) + 3


def test_header_text_layout():
    assert header_text("M", ["X1", "X2"]) == b"@relation M\n@attribute X1 numeric\n@attribute X2 numeric\n@data\n"


# --------------------------------------------------------------------------- split

def test_byte_ranges():
    assert byte_ranges(100, 110, 1) == [(100, 110)]
    assert byte_ranges(100, 110, 3) == [(100, 103), (103, 106), (106, 110)]
    for off, size, ranks in [(0, 0, 3), (7, 9, 5), (10, 1000, 7), (3, 3 + 10**12, 4)]:
        r = byte_ranges(off, size, ranks)
        assert len(r) == ranks
        assert r[0][0] == off and r[-1][1] == size
        assert all(a[1] == b[0] for a, b in zip(r, r[1:]))
        lengths = [b - a for a, b in r]
        assert min(lengths) >= 0 and max(lengths) - min(lengths) <= 1


def test_first_line_start(tmp_path):
    # offsets: H0 D1 R2 \n3 a4 b5 \n6 c7 d8 \n9 \n10 e11 f12, size 13
    content = b"HDR\nab\ncd\n\nef"
    path = tmp_path / "f.txt"
    path.write_bytes(content)
    off, size = 4, len(content)  # data starts after "HDR\n"
    fd = os.open(path, os.O_RDONLY)
    try:
        def fls(pos):
            return first_line_start(fd, pos, off, size)[0]
        assert fls(0) == off  # before the data section
        assert fls(off) == off  # the data start is a line start
        assert fls(5) == 7  # inside "ab"
        assert fls(6) == 7  # on the '\n' of "ab": the next line
        assert fls(7) == 7  # right after a newline: a line start
        assert fls(8) == 10
        assert fls(10) == 10  # the empty line is a line of its own
        assert fls(11) == 11
        assert fls(12) == size  # inside the last line, which has no newline
        assert fls(size) == size
        assert fls(size + 5) == size
        assert first_line_start(fd, 8, off, size)[1] > 0  # it had to read
    finally:
        os.close(fd)


def test_first_line_start_long_line(tmp_path):
    content = b"x" * 300_000 + b"\n" + b"y" * 10 + b"\n"
    path = tmp_path / "l.txt"
    path.write_bytes(content)
    fd = os.open(path, os.O_RDONLY)
    try:
        assert first_line_start(fd, 1, 0, len(content))[0] == 300_001
        assert first_line_start(fd, 300_001, 0, len(content))[0] == 300_001
        assert first_line_start(fd, 300_002, 0, len(content))[0] == len(content)
    finally:
        os.close(fd)


# --------------------------------------------------------------------------- reader == loadtxt

@pytest.mark.parametrize("final_newline", [True, False], ids=["final-nl", "no-final-nl"])
@pytest.mark.parametrize("newline", ["\n", "\r\n"], ids=["LF", "CRLF"])
@pytest.mark.parametrize("seed", [1, 2])
def test_reader_equals_loadtxt_every_split(tmp_path, seed, newline, final_newline):
    data = random_data(seed, rows=36 + seed * 5)
    if not final_newline:
        while not data[-1] or data[-1].startswith("%"):
            data.pop()  # the file must end in a row
    expected = loadtxt(data)
    path = write_file(tmp_path / "r.arff", HEADER, data, newline=newline, final_newline=final_newline)
    for ranks in range(1, 8):
        check_split(read_all(path, ranks), expected, path)


@pytest.mark.parametrize("piece", [8, 23, 64, 200])
@pytest.mark.parametrize("ranks", [1, 3])
def test_reader_small_pieces(tmp_path, monkeypatch, piece, ranks):
    # pieces shorter than a line exercise the "line longer than a piece" path
    monkeypatch.setattr(arff, "READ_PIECE", piece)
    data = random_data(7, rows=30)
    path = write_file(tmp_path / "p.arff", HEADER, data)
    check_split(read_all(path, ranks), loadtxt(data), path)


def test_reader_arff_only_blank_and_comment_lines(tmp_path):
    # lines of blanks and indented comments are skipped (loadtxt rejects them,
    # so compare with loadtxt on the file without them)
    data = random_data(3, rows=20, extras=False)
    extra = list(data)
    extra.insert(5, "   ")
    extra.insert(9, "\t")
    extra.insert(12, "   % indented comment")
    extra.append("  ")
    path = write_file(tmp_path / "w.arff", HEADER, extra, newline="\r\n")
    for ranks in (1, 2, 4):
        check_split(read_all(path, ranks), loadtxt(data), path)


@pytest.mark.parametrize("final_newline", [True, False])
@pytest.mark.parametrize("rows", [1, 2, 3])
def test_more_ranks_than_rows(tmp_path, rows, final_newline):
    data = ["-1.5,2,1e10", "3.25,-4,0", "7,8,-9e-9"][:rows]
    path = write_file(tmp_path / "s.arff", HEADER, data, final_newline=final_newline)
    expected = loadtxt(data)
    parts = read_all(path, 7)
    check_split(parts, expected, path)
    assert sum(1 for p in parts if len(p.x) == 0) >= 7 - rows
    for p in parts:  # every rank, with rows or without, has the global bounds
        assert p.mins.tobytes() == expected.min(axis=0).tobytes()
        assert p.maxs.tobytes() == expected.max(axis=0).tobytes()


def test_one_long_row_many_ranks(tmp_path):
    # one row, wider than the data section divided by the ranks
    m = 200
    header = ["@relation wide"] + [f"@attribute v{j} numeric" for j in range(m)] + ["@data"]
    row = ",".join(repr(0.1 * j) for j in range(m))
    path = write_file(tmp_path / "o.arff", header, [row])
    check_split(read_all(path, 5), loadtxt([row]), path)


# --------------------------------------------------------------------------- bad rows

GOOD = [f"{i}.5,{-i}.25,{i * 7}" for i in range(30)]

BAD_CASES = {
    "too-few": ("1.0,2.0", "'c'", "2 values"),
    "too-many": ("1,2,3,4", None, "more than 3 values"),
    "not-a-number": ("1.0,abc,3", "'b b'", "'abc'"),
    "empty": ("1.0,,3", "'b b'", "empty"),
    # a comma may end an ARFF row (as Weka reads it): the row is short, its last attribute missing
    "trailing-empty": ("1.0,2,", "'c'", "expected 3"),
    "missing": ("1.0,2.0,?", "'c'", "?"),
    "overflow": ("1e400,2,3", "'a'", "1e400"),
    "negative-overflow": ("1,-1e400,3", "'b b'", "-1e400"),
}


def _expect_error_everywhere(path, ranks, line_no, attr, phrase):
    out = run_ranks(ranks, lambda comm: read_arff(str(path), comm), return_exceptions=True)
    assert all(isinstance(e, InputError) for e in out), out
    messages = {e.message for e in out}
    assert len(messages) == 1, messages
    msg = out[0].message
    assert all(e.collective for e in out)
    assert msg.startswith(f"{path}:{line_no}:"), msg
    if attr is not None:
        assert attr in msg, msg
    assert phrase in msg, msg
    return msg


def _line_start(path, line_no):
    """Byte offset where 1-based line ``line_no`` of a file starts."""
    raw = Path(path).read_bytes()
    pos = 0
    for _ in range(line_no - 1):
        pos = raw.index(b"\n", pos) + 1
    return pos


@pytest.mark.parametrize("case", list(BAD_CASES))
@pytest.mark.parametrize("ranks", [1, 3])
@pytest.mark.parametrize("newline", ["\n", "\r\n"], ids=["LF", "CRLF"])
def test_bad_row_in_last_rank(tmp_path, case, ranks, newline):
    bad, attr, phrase = BAD_CASES[case]
    data = list(GOOD)
    data.insert(3, "% a comment line")
    data.insert(6, "")
    data.insert(len(data) - 2, bad)  # near the end: inside the last rank's range
    path = write_file(tmp_path / "bad.arff", HEADER, data, newline=newline)
    line_no = len(HEADER) + 1 + data.index(bad)
    if ranks == 3:
        h = read_header(str(path))
        cut = byte_ranges(h.data_offset, h.file_size, 3)[2][0]
        assert _line_start(path, line_no) >= cut, "test set-up: the bad line is not in rank 2's range"
    _expect_error_everywhere(path, ranks, line_no, attr, phrase)


def test_bad_row_first_line_and_last_line_without_newline(tmp_path):
    data = ["x,1,2"] + GOOD
    path = write_file(tmp_path / "b1.arff", HEADER, data)
    _expect_error_everywhere(path, 4, len(HEADER) + 1, "'a'", "'x'")
    data = GOOD + ["1,2"]
    path = write_file(tmp_path / "b2.arff", HEADER, data, final_newline=False)
    _expect_error_everywhere(path, 4, len(HEADER) + len(data), "'c'", "2 values")


@pytest.mark.parametrize("ranks", [3, 4, 7])
def test_two_ranks_with_bad_rows_first_line_wins(tmp_path, ranks):
    data = list(GOOD)
    data[14] = "1,2,oops"  # in a middle rank's range
    data[27] = "1,,3"  # in the last rank's range
    path = write_file(tmp_path / "two.arff", HEADER, data)
    h = read_header(str(path))
    cuts = [a for a, _ in byte_ranges(h.data_offset, h.file_size, ranks)]
    first, second = len(HEADER) + 1 + 14, len(HEADER) + 1 + 27
    owner = [sum(1 for c in cuts if c <= _line_start(path, ln)) - 1 for ln in (first, second)]
    assert owner[0] < owner[1], "test set-up: both bad lines on one rank"
    _expect_error_everywhere(path, ranks, first, "'c'", "'oops'")


def test_bad_rows_on_every_rank(tmp_path):
    data = list(GOOD)
    data[2] = "1,2,3,4"
    data[13] = "nope,2,3"
    data[25] = "1"
    path = write_file(tmp_path / "all.arff", HEADER, data)
    _expect_error_everywhere(path, 3, len(HEADER) + 3, None, "more than 3 values")


@pytest.mark.parametrize("piece", [16, 40])
def test_bad_row_line_number_across_pieces(tmp_path, monkeypatch, piece):
    monkeypatch.setattr(arff, "READ_PIECE", piece)
    data = list(GOOD)
    data.insert(10, "% comment")
    data.insert(20, "")
    data[24] = "1,2,zz"
    path = write_file(tmp_path / "pc.arff", HEADER, data, newline="\r\n")
    for ranks in (1, 2):
        _expect_error_everywhere(path, ranks, len(HEADER) + 25, "'c'", "'zz'")


# --------------------------------------------------------------------------- parse threads

def _read_threads(path, ranks: int, threads: int) -> list:
    return run_ranks(ranks, lambda comm: read_arff(str(path), comm, threads=threads))


@pytest.mark.parametrize("final_newline", [True, False], ids=["final-nl", "no-final-nl"])
@pytest.mark.parametrize("piece", [None, 64, 300])
@pytest.mark.parametrize("threads", [2, 3, 8])
def test_reader_threads_equal_loadtxt(tmp_path, monkeypatch, threads, piece, final_newline):
    # spans of whole lines parsed side by side, blank and comment lines between
    # rows (gaps to close), the last line without its newline in any span, more
    # threads than lines in a piece: the same rows as one thread and loadtxt
    if piece:
        monkeypatch.setattr(arff, "READ_PIECE", piece)
    monkeypatch.setattr(split, "READ_STRIDE", 7)  # pieces read by several threads too
    data = random_data(5, rows=60)
    if not final_newline:
        while not data[-1] or data[-1].startswith("%"):
            data.pop()
    path = write_file(tmp_path / "t.arff", HEADER, data, newline="\r\n", final_newline=final_newline)
    for ranks in (1, 2):
        check_split(_read_threads(path, ranks, threads), loadtxt(data), path)


def test_reader_threads_long_last_line(tmp_path):
    # the line that lacks a newline is long, so the span cut meant for a later
    # thread lands inside it and every later span is empty
    data = ["1,2,3"] * 3 + [",".join(["1" + "0" * 300, "2", "3"])]
    path = write_file(tmp_path / "l.arff", HEADER, data, final_newline=False)
    for threads in (2, 4, 7):
        check_split(_read_threads(path, 1, threads), loadtxt(data), path)


@pytest.mark.parametrize("threads", [1, 2, 5])
def test_bad_row_line_number_any_threads(tmp_path, monkeypatch, threads):
    monkeypatch.setattr(arff, "READ_PIECE", 100)
    data = list(GOOD)
    data.insert(10, "% comment")
    data.insert(20, "")
    data[24] = "1,2,zz"
    data[27] = "1,2,yy"
    path = write_file(tmp_path / "pt.arff", HEADER, data)
    for ranks in (1, 3):
        out = run_ranks(ranks, lambda comm: read_arff(str(path), comm, threads=threads), return_exceptions=True)
        assert all(isinstance(e, InputError) for e in out), out
        assert {e.message for e in out} == {out[0].message}
        assert f":{len(HEADER) + 25}:" in out[0].message and "'zz'" in out[0].message


# --------------------------------------------------------------------------- one-time start-up

_WARM_CHECK = r"""
import json, sys, time
import numpy as np
from mpikmeans.io import arff, rowparse
from mpikmeans.comm import SerialComm

files = sys.argv[1:]
t0 = time.perf_counter()
arff.warm_up(2)
warm = time.perf_counter() - t0
loaded = {k.py_func.__name__: len(k.overloads) for k in arff.READ_KERNELS}
cases = []
for path in files:
    for threads in (1, 2):
        for missing in ("error", "mean", "drop"):
            try:
                arff.read_arff(path, SerialComm(), threads=threads, missing=missing)
            except arff.InputError:
                pass
            cases.append({k.py_func.__name__: len(k.overloads) for k in arff.READ_KERNELS})
print(json.dumps({"warm_s": warm, "after_warm_up": loaded, "after_reads": cases}))
"""


def test_warm_up_loads_every_kernel_the_reader_calls(tmp_path):
    # after warm_up, no read (dense, sparse, weighted, missing values, errors,
    # 1 or 2 threads, a file of several pieces) loads or compiles another version
    # of a kernel: the one-time cost is all in warm_up, none in a timed read
    import json
    import subprocess

    dense = write_file(tmp_path / "dense.arff", HEADER, [f"{i}.5,{-i}e-3,{i * 7}" for i in range(3000)])
    other = write_file(tmp_path / "other.arff", ["@relation r", "@attribute x numeric", "@attribute s string",
                                                 "@attribute y real", "@data"],
                       ["{0 1.5, 2 3}", "2,'a, b',?", "{}", "4,x,5,{2.5}", "% c", "", "7,'q',8"])
    bad = write_file(tmp_path / "bad.arff", HEADER, ["1,2,3", "4,x,6"])
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)}
    p = subprocess.run([sys.executable, "-c", _WARM_CHECK, str(dense), str(other), str(bad)], capture_output=True,
                       text=True, timeout=300, env=env)
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout.strip().splitlines()[-1])
    assert all(v >= 1 for v in out["after_warm_up"].values()), out
    assert all(case == out["after_warm_up"] for case in out["after_reads"]), out


def test_warm_up_small_pieces_same_kernels(tmp_path, monkeypatch):
    # a file read in several pieces by several threads uses the kernels warm_up loaded
    monkeypatch.setattr(arff, "READ_PIECE", 256)
    arff.warm_up(3)
    from mpikmeans.comm import SerialComm

    before = {k.py_func.__name__: len(k.overloads) for k in arff.READ_KERNELS}
    rows = [f"{i}.25,{i},{-i}" for i in range(500)]
    path = write_file(tmp_path / "p.arff", HEADER, rows)
    x = read_arff(str(path), SerialComm(), threads=3).x
    assert np.array_equal(x, loadtxt(rows))
    assert {k.py_func.__name__: len(k.overloads) for k in arff.READ_KERNELS} == before
