"""CSV input: the ARFF reader's parallel byte-range read, on a comma-, tab-, semicolon- or '|'-separated file."""

from __future__ import annotations

import json
import os
import sys

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(__file__))
from conftest import run_cli  # noqa: E402
from threadcomm import run_ranks  # noqa: E402

from mpikmeans.errors import InputError  # noqa: E402
from mpikmeans.io import formats  # noqa: E402
from mpikmeans.io.csvhead import read_csv_header  # noqa: E402


def _write(path, x, names=None, fmt="%.17g", delimiter=","):
    with open(path, "w") as f:
        if names is not None:
            f.write(delimiter.join(names) + "\n")
        np.savetxt(f, x, delimiter=delimiter, fmt=fmt)
    return path


@pytest.fixture(scope="module")
def table():
    rng = np.random.default_rng(3)
    x = rng.normal(size=(997, 5)) * rng.uniform(1e-3, 1e6, size=5)
    x[::7, 2] = -0.0
    return x


def _read(path, ranks):
    parts = run_ranks(ranks, lambda comm: formats.read_local(comm, str(path)))
    return np.vstack([p.x for p in parts]), parts[0]


@pytest.mark.parametrize("ranks", range(1, 8))
@pytest.mark.parametrize("with_names", [True, False])
def test_read_equals_numpy_loadtxt(tmp_path, table, ranks, with_names):
    names = ["a", "b b", "c", "d", "e"] if with_names else None
    path = _write(tmp_path / "t.csv", table, names)
    x, first = _read(path, ranks)
    expected = np.loadtxt(path, delimiter=",", skiprows=1 if with_names else 0)
    assert x.shape == expected.shape and np.array_equal(x, expected)
    assert np.array_equal(np.signbit(x), np.signbit(expected))
    assert first.names == (names or [f"col{i}" for i in range(1, 6)])
    assert first.n == len(table)


def test_header_detection_and_quoted_names(tmp_path):
    p = tmp_path / "q.csv"
    p.write_text('"x, one",y\r\n1,2\r\n3,4\r\n')
    h = read_csv_header(str(p))
    assert h.names == ["x, one", "y"] and h.data_line == 2
    x, _ = _read(p, 2)
    assert np.array_equal(x, [[1, 2], [3, 4]])
    p.write_text("\ufeff1.5,2\n3,4\n")  # byte-order mark, no names
    h = read_csv_header(str(p))
    assert h.names == ["col1", "col2"] and h.data_line == 1 and h.data_offset == 3


@pytest.mark.parametrize("delimiter", ["\t", ";", "|"])
@pytest.mark.parametrize("ranks", [1, 3])
@pytest.mark.parametrize("with_names", [True, False])
def test_other_delimiters_are_detected_and_read_exactly(tmp_path, table, delimiter, ranks, with_names):
    names = ["a", "b b", "c", "d", "e"] if with_names else None
    path = _write(tmp_path / "t.csv", table, names, delimiter=delimiter)
    assert read_csv_header(str(path)).delimiter == delimiter
    x, first = _read(path, ranks)
    expected = np.loadtxt(path, delimiter=delimiter, skiprows=1 if with_names else 0)
    assert np.array_equal(x, expected) and np.array_equal(np.signbit(x), np.signbit(expected))
    assert first.names == (names or [f"col{i}" for i in range(1, 6)])


@pytest.mark.parametrize("line, delimiter", [
    ("a,b,c", ","), ("a\tb\tc", "\t"), ("a;b;c", ";"), ("a|b", "|"), ("x", ","),
    ('"a;b",c', ","),          # a delimiter inside quotes does not count
    ("a;b,c", ","),            # a tie: the comma
    ("a\tb c\td, e", "\t"),  # more tabs than commas
])
def test_delimiter_detection(line, delimiter):
    from mpikmeans.io.csvhead import detect_delimiter

    assert detect_delimiter(line) == delimiter


def test_a_tab_separated_file_keeps_its_blanks_apart_from_its_tabs(tmp_path):
    """Tabs separate the values; blanks around a value are trimmed, as in any CSV file."""
    p = tmp_path / "t.csv"
    p.write_text("a\tb\n 1.5 \t2\n3\t 4 \n")
    x, _ = _read(p, 1)
    assert np.array_equal(x, [[1.5, 2], [3, 4]])
    p.write_text("a\tb\n1\t\t2\n")  # an empty value
    with pytest.raises(InputError, match=r"t.csv:2: column 'b': empty value"):
        _read(p, 1)


@pytest.mark.parametrize("text, needle", [
    ("a,b\n", "followed by no rows"),
    ("\n1,2\n", "the first line is empty"),
    ("a,a\n1,2\n", "column 2 is named 'a' like column 1"),
])
def test_bad_first_lines(tmp_path, text, needle):
    p = tmp_path / "bad.csv"
    p.write_text(text)
    with pytest.raises(InputError, match=needle):
        read_csv_header(str(p))


@pytest.mark.parametrize("np_", [1, 3])
def test_malformed_row_exits_3_with_its_line(tmp_path, table, np_):
    path = _write(tmp_path / "bad.csv", table[:300], ["a", "b", "c", "d", "e"])
    lines = path.read_text().splitlines(keepends=True)
    lines[201] = lines[201].replace(",", ",x", 1)  # line 202 of the file
    lines[250] = "1,2,3\n"
    path.write_text("".join(lines))
    r = run_cli(["run", path, "-k", 2, "-o", tmp_path / "out"], np=np_, timeout=120)
    assert r.code == 3, (r.out, r.err)
    assert f"{path}:202: column 'b'" in r.err and "not a number" in r.err
    assert "Traceback" not in r.err


def test_run_on_csv_equals_run_on_arff(tmp_path, table):
    names = ["a", "b", "c", "d", "e"]
    csv = _write(tmp_path / "t.csv", table, names)
    arff = tmp_path / "t.arff"
    with open(arff, "w") as f:
        f.write("@relation t\n" + "".join(f"@attribute {n} numeric\n" for n in names) + "@data\n")
        np.savetxt(f, table, delimiter=",", fmt="%.17g")
    out = {}
    for path in (csv, arff):
        r = run_cli(["run", path, "-k", 4, "--seed", 2, "-o", tmp_path / path.suffix[1:]], np=2, timeout=120)
        assert r.code == 0, r.err
        d = tmp_path / path.suffix[1:]
        out[path.suffix] = (json.loads((d / "summary.json").read_text())["inertia"], (d / "centers.csv").read_text(),
                            (d / "labels.txt").read_text())
    assert out[".csv"] == out[".arff"]


@pytest.mark.parametrize("delimiter", [",", "\t"])
@pytest.mark.parametrize("np_", [1, 2])
def test_write_arff_from_a_csv_file_is_an_arff_file(tmp_path, table, delimiter, np_):
    """clustered.arff of a CSV input: an ARFF header of its columns, the rows with commas, each row's cluster."""
    path = _write(tmp_path / "t.csv", table[:200], ["a", "b b", "c", "d", "e"], delimiter=delimiter)
    out = tmp_path / "o"
    r = run_cli(["run", path, "-k", 3, "--write-arff", "-o", out, "-q"], np=np_, timeout=120)
    assert r.code == 0, r.err
    arff = out / "clustered.arff"
    text = arff.read_text()
    assert text.startswith("@relation t\n@attribute a numeric\n@attribute 'b b' numeric\n")
    assert "@attribute cluster {cluster1,cluster2,cluster3}\n@data\n" in text
    back, _ = _read(arff, 1)  # the nominal cluster attribute is not numeric: skipped
    assert np.array_equal(back, np.loadtxt(path, delimiter=delimiter, skiprows=1))
    labels = np.loadtxt(out / "labels.txt", dtype=int)
    clusters = [int(line.rsplit(",cluster", 1)[1]) - 1 for line in text.split("@data\n", 1)[1].splitlines()]
    assert clusters == labels.tolist()
