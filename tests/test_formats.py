"""mpikmeans.io.formats: every row of the registry's table, and the one call each caller makes.

The table in the module's docstring is checked row by row (:func:`formats.detect`);
:func:`formats.read_local`, :func:`formats.shape`, :func:`formats.text_output` and
:func:`formats.convert` give the same rows whatever the format; the input side of
``mpikmeans.io`` has no import cycle (no import hidden inside a function either) and
decides no format by a file's name outside the registry.
"""

from __future__ import annotations

import ast
import bz2
import gzip
import lzma
import os
import re
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(__file__))
from threadcomm import run_ranks  # noqa: E402

from mpikmeans.comm import SerialComm  # noqa: E402
from mpikmeans.errors import InputError, UsageError  # noqa: E402
from mpikmeans.io import formats  # noqa: E402

IO = Path(__file__).resolve().parents[1] / "mpikmeans" / "io"
ARFF = "% a comment\n\n@relation r\n@attribute a numeric\n@attribute b numeric\n@data\n1,2\n3,4\n5.5,-6\n"
CSV = "a,b\n1,2\n3,4\n5.5,-6\n"
X = np.array([[1, 2], [3, 4], [5.5, -6]])


def _write(tmp_path, name, data):
    path = tmp_path / name
    path.write_bytes(data if isinstance(data, bytes) else data.encode())
    return str(path)


# --------------------------------------------------------------------------- the table, row by row


@pytest.mark.parametrize("name, data, fmt", [
    ("d.arff", ARFF, "arff"),
    ("d.ARFF", ARFF, "arff"),
    ("d.arff", CSV, "arff"),  # the name says ARFF: the ARFF reader's errors say what is wrong
    ("d.csv", ARFF, "arff"),  # the content decides before the name
    ("d", ARFF, "arff"),
    ("d", "\ufeff% c\n%\n   \n@RELATION r\n@data\n", "arff"),  # a byte-order mark, comments, any case
    ("d", "@attribute a numeric\n@data\n", "arff"),  # an ARFF file without its @relation still is one
    ("d", "% " + "x" * 200_000 + "\n" * 3000 + "@relation r\n", "arff"),  # past a long comment block
    ("d.tsv", "a\tb\n1\t2\n", "tsv"),
    ("d.TAB", "a\tb\n1\t2\n", "tsv"),
    ("d.csv", CSV, "csv"),
    ("d", CSV, "csv"),
    ("d.txt", CSV, "csv"),
    ("d.csv", "@timestamp,value\n1,2\n", "csv"),  # '@timestamp' is no ARFF keyword
    ("d", "% only comments\n%\n", "csv"),
])
def test_text_formats(tmp_path, name, data, fmt):
    assert formats.detect(_write(tmp_path, name, data)).name == fmt


def test_npy_by_name_or_by_magic(tmp_path):
    np.save(tmp_path / "x.npy", X)
    assert formats.detect(str(tmp_path / "x.npy")).name == "npy"
    os.rename(tmp_path / "x.npy", tmp_path / "x.bin")
    assert formats.detect(str(tmp_path / "x.bin")).name == "npy"


@pytest.mark.parametrize("tool, pack", [("gzip", gzip.compress), ("bzip2", bz2.compress), ("xz", lzma.compress),
                                        ("zstd", lambda b: b"\x28\xb5\x2f\xfd" + b),
                                        ("zip", lambda b: b"PK\x03\x04" + b)])
@pytest.mark.parametrize("name", ["d.arff", "d.csv", "d", "d.npy"])
def test_compressed_whatever_the_name(tmp_path, tool, pack, name):
    path = _write(tmp_path, name, pack(ARFF.encode()))
    with pytest.raises(InputError, match=re.escape(f"{path}: compressed ({tool}): decompress it first")):
        formats.detect(path)


def test_empty_file(tmp_path):
    with pytest.raises(InputError, match="the file is empty"):
        formats.detect(_write(tmp_path, "e.arff", ""))


def test_not_regular_files_are_refused_without_waiting(tmp_path):
    fifo = tmp_path / "p"
    os.mkfifo(fifo)  # no writer: a blocking open would wait forever
    for path, what in ((fifo, "named pipe (FIFO)"), (tmp_path, "directory"), ("/dev/null", "character device")):
        with pytest.raises(UsageError, match=re.escape(what) + ", not a regular file"):
            formats.detect(str(path))
        with pytest.raises(UsageError, match="regular file"):
            formats.shape(str(path))


def test_unreadable(tmp_path):
    with pytest.raises(InputError, match="cannot read"):
        formats.detect(str(tmp_path / "missing.arff"))


# --------------------------------------------------------------------------- one call per caller


@pytest.mark.parametrize("ranks", [1, 2, 5])
def test_read_local_same_rows_in_every_format(tmp_path, ranks):
    paths = [_write(tmp_path, "d.arff", ARFF), _write(tmp_path, "d.csv", CSV), _write(tmp_path, "d", CSV),
             _write(tmp_path, "d.tsv", CSV.replace(",", "\t"))]
    np.save(tmp_path / "d.npy", X)
    paths.append(str(tmp_path / "d.npy"))
    for path in paths:
        parts = run_ranks(ranks, lambda comm: formats.read_local(comm, path, formats.ReadOptions(threads=2)))
        x = np.concatenate([p.x for p in parts])
        assert x.tobytes() == X.tobytes(), path
        assert [p.row_offset for p in parts] == list(np.cumsum([0] + [len(p.x) for p in parts])[:-1])


def test_read_local_npy_refuses_text_options(tmp_path):
    np.save(tmp_path / "d.npy", X)
    for options in (formats.ReadOptions(ignore="a"), formats.ReadOptions(missing="mean"),
                    formats.ReadOptions(nominal="weka"), formats.ReadOptions(write_arff=True)):
        out = run_ranks(2, lambda comm: formats.read_local(comm, str(tmp_path / "d.npy"), options),
                        return_exceptions=True)
        assert all(isinstance(e, UsageError) and e.collective and "not a .npy copy" in e.message for e in out)


def test_read_local_errors_on_every_rank(tmp_path):
    fifo = tmp_path / "p.arff"
    os.mkfifo(fifo)
    out = run_ranks(3, lambda comm: formats.read_local(comm, str(fifo)), return_exceptions=True)
    assert all(isinstance(e, UsageError) and e.collective for e in out)
    assert len({e.message for e in out}) == 1


def test_shape(tmp_path):
    s = formats.shape(_write(tmp_path, "d.arff", ARFF), ranks=2)
    assert (s.columns, s.names, s.exact) == (2, ("a", "b"), False) and s.rows == 3 and s.rank_rows in (1, 2)
    s = formats.shape(_write(tmp_path, "d.tsv", CSV.replace(",", "\t")))
    assert (s.rows, s.columns, s.names) == (3, 2, ("a", "b"))
    np.save(tmp_path / "d.npy", X)
    assert formats.shape(str(tmp_path / "d.npy"), ranks=2) == formats.Shape(3, 2, ("X1", "X2"), 2, True)


def test_input_files(tmp_path):
    np.save(tmp_path / "d.npy", X)
    npy = str(tmp_path / "d.npy")
    assert formats.input_files(npy) == [npy, npy + ".json", str(tmp_path / "d.weights.npy")]
    csv = _write(tmp_path, "d.csv", CSV)
    assert formats.input_files(csv) == [csv]
    assert formats.input_files(str(tmp_path / "missing")) == [str(tmp_path / "missing")]


def test_read_header_of_a_npy_is_a_usage_error(tmp_path):
    np.save(tmp_path / "d.npy", X)
    with pytest.raises(UsageError, match="no text header"):
        formats.read_header(str(tmp_path / "d.npy"))
    assert formats.read_header(_write(tmp_path, "d.tsv", "a\tb c\n1\t2\n")).names == ["a", "b c"]


@pytest.mark.parametrize("name, head, delimiter", [
    ("x.csv", b"X1,X2\n", ","),
    ("x.TSV", b"X1\tX2\n", "\t"),
    ("x.arff", b"@relation rel\n@attribute X1 numeric\n@attribute X2 numeric\n@data\n", ","),
    ("x", b"@relation rel\n@attribute X1 numeric\n@attribute X2 numeric\n@data\n", ","),
])
def test_text_output(name, head, delimiter):
    assert formats.text_output(name, "rel", ["X1", "X2"]) == (head, delimiter)


def test_text_output_quotes_awkward_names_and_refuses_binary_names():
    assert formats.text_output("x.csv", "r", ["a,b", 'q"', "c"])[0] == b'"a,b","q""",c\n'
    for name in ("x.npy", "x.arff.gz", "x.csv.zst"):
        with pytest.raises(UsageError, match="gen-data writes text"):
            formats.text_output(name, "r", ["a"])


def test_convert_any_format(tmp_path):
    src = _write(tmp_path, "d.tsv", CSV.replace(",", "\t"))
    target = str(tmp_path / "d.npy")
    timings = {}
    run_ranks(3, lambda comm: formats.convert(comm, src, target, threads=2, timings=timings))
    assert np.load(target).tobytes() == X.tobytes() and set(timings) == {"read_s", "write_s"}


def test_convert_refuses_its_own_input_and_other_targets(tmp_path):
    np.save(tmp_path / "d.npy", X)
    same = str(tmp_path / "d.npy")
    with pytest.raises(UsageError, match="is the input itself"):
        formats.convert(SerialComm(), same, same)
    with pytest.raises(UsageError, match="must end in .npy"):
        formats.convert(SerialComm(), _write(tmp_path, "d.csv", CSV), str(tmp_path / "d.bin"))
    assert np.load(same).tobytes() == X.tobytes()


# --------------------------------------------------------------------------- the layout of the input side


def _imports(path: Path) -> set:
    """The io modules ``path`` imports, at any depth (inside functions too)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level == 1:
            if node.module:
                found.add(node.module.split(".")[0])
            else:
                found.update(a.name for a in node.names if (IO / f"{a.name}.py").exists())
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").startswith("mpikmeans.io."):
            found.add(node.module.split(".")[2])
    return found


def test_io_has_no_import_cycle():
    graph = {p.stem: _imports(p) - {p.stem} for p in IO.glob("*.py") if p.stem != "__init__"}
    state = {}

    def visit(node, path):
        if state.get(node) == "done":
            return
        assert state.get(node) != "open", f"import cycle: {' -> '.join(path + [node])}"
        state[node] = "open"
        for other in sorted(graph.get(node, ())):
            visit(other, path + [node])
        state[node] = "done"

    for module in sorted(graph):
        visit(module, [])
    assert "csvhead" not in graph["header"] and "formats" not in graph["header"]


#: A decision by a file's name: ``x.endswith(".npy")``, ``.endswith((".csv", ...))``, ``splitext(x)[1] == ".arff"``.
_BY_NAME = re.compile(r"""(endswith\(\s*\(?\s*["']\.(npy|csv|tsv|tab|arff|gz)["'])|(\[1\]\s*==\s*["']\.)""")
#: The reader's modules (wekaout and output write results: their names are not input formats).
READERS = ("__init__", "header", "csvhead", "split", "arff", "rowparse", "numparse", "lemire", "binary", "gen",
           "textfmt")


def test_no_format_decided_by_name_outside_the_registry():
    found = [f"{name}.py:{n}" for name in READERS
             for n, line in enumerate((IO / f"{name}.py").read_text().splitlines(), 1) if _BY_NAME.search(line)]
    assert not found, found
    assert _BY_NAME.search((IO / "formats.py").read_text())  # the pattern does find them
