"""The whole ARFF format (issue 4): what is accepted, and what is rejected with
file, line and attribute — in-process at 1 and 3 ranks, and through the CLI
under mpirun -np 1 and -np 3."""

from __future__ import annotations

import gzip
import io
import json

import arff as liac_arff  # liac-arff: an independent reader
import numpy as np
import pytest

from conftest import HANG_GUARD_S, run_cli
from mpikmeans.io.arff import read_arff
from mpikmeans.errors import InputError, UsageError
from threadcomm import run_ranks


def read(path, ranks, **kw):
    parts = run_ranks(ranks, lambda comm: read_arff(str(path), comm, **kw))
    x = np.concatenate([p.x for p in parts])
    w = None if parts[0].weights is None else np.concatenate([p.weights for p in parts])
    return x, w, parts[0]


RICH = """\ufeff% a file with everything Weka accepts
@RELATION 'weather data'

@Attribute outlook {sunny, overcast, 'light rain'}
@attribute 'temp C' REAL
@attribute humidity integer % percent
@attribute "note" string
@attribute when date "yyyy-MM-dd"
@attribute wind NUMERIC

@DATA
% comment line
sunny, 21.5, 80, 'a, b, and c', "2020-01-01", +1
overcast,\t-.5 ,\t70,\t"x % not a comment", '2020-01-02', 5.   % trailing comment

'light rain',1e3,65,'it\\'s, \\"quoted\\"',"2020-01-03",2.5E-3
{1 7, 2 55, 3 'sparse, row', 5 -2}
{}
"""


@pytest.mark.parametrize("ranks", [1, 3])
@pytest.mark.parametrize("newline", ["\n", "\r\n"])
def test_rich_file(tmp_path, ranks, newline):
    path = tmp_path / "rich.arff"
    path.write_bytes(RICH.replace("\n", newline).encode("utf-8"))
    x, w, part = read(path, ranks)
    expected = np.array([[21.5, 80, 1], [-0.5, 70, 5.0], [1e3, 65, 2.5e-3], [7, 55, -2], [0, 0, 0]])
    assert np.array_equal(x, expected)
    assert part.names == ["temp C", "humidity", "wind"]
    assert part.selection.skipped == ["outlook", "note", "when"]
    assert w is None and part.n == 5


def test_values_agree_with_liac_arff(tmp_path):
    rng = np.random.default_rng(2)
    vals = rng.normal(size=(40, 3)) * 10.0 ** rng.integers(-5, 6, size=(40, 3))
    lines = ["@relation r", "@attribute a numeric", "@attribute c {x,y}", "@attribute b real",
             "@attribute d numeric", "@data"]
    lines += [f"{v[0]!r},{'x' if i % 2 else 'y'},{v[1]!r},{v[2]!r}" for i, v in enumerate(vals.tolist())]
    path = tmp_path / "r.arff"
    path.write_text("\n".join(lines) + "\n")
    ref = liac_arff.load(io.StringIO(path.read_text()))
    ref_x = np.array([[row[0], row[2], row[3]] for row in ref["data"]], dtype=float)
    for ranks in (1, 2, 3):
        x, _, _ = read(path, ranks)
        assert np.array_equal(x, ref_x)


def test_sparse_matches_dense(tmp_path):
    dense = tmp_path / "d.arff"
    sparse = tmp_path / "s.arff"
    head = "@relation r\n@attribute a numeric\n@attribute b numeric\n@attribute c numeric\n@data\n"
    dense.write_text(head + "0,2,0\n1,0,3\n0,0,0\n")
    sparse.write_text(head + "{1 2}\n{0 1, 2 3}\n{ }\n")
    for ranks in (1, 2):
        assert np.array_equal(read(dense, ranks)[0], read(sparse, ranks)[0])


def test_instance_weights(tmp_path):
    path = tmp_path / "w.arff"
    path.write_text("@relation r\n@attribute a numeric\n@attribute b numeric\n@data\n"
                    "1,2,{0.5}\n3,4\n{0 5, 1 6}, {2}\n7,8, {3}\n")
    x, w, _ = read(path, 2)
    assert np.array_equal(w, [0.5, 1, 2, 3])
    assert np.array_equal(x, [[1, 2], [3, 4], [5, 6], [7, 8]])


def test_weights_count_like_repeated_rows(tmp_path):
    """Weka uses weights as sample weights: weight 2 = the row twice."""
    rows = np.array([[0.0, 0.0], [0.2, 0.1], [9.0, 9.0], [9.5, 8.5], [0.4, 0.3]])
    weighted = tmp_path / "w.arff"
    repeated = tmp_path / "r.arff"
    head = "@relation r\n@attribute a numeric\n@attribute b numeric\n@data\n"
    weighted.write_text(head + "".join(f"{a},{b},{{{2 if i == 1 else 1}}}\n" for i, (a, b) in enumerate(rows)))
    repeated.write_text(head + "".join(f"{a},{b}\n" * (2 if i == 1 else 1) for i, (a, b) in enumerate(rows)))
    init = tmp_path / "init.csv"
    init.write_text("0,0\n9,9\n")
    outs = []
    for name, path in (("w", weighted), ("r", repeated)):
        out = tmp_path / name
        r = run_cli(["run", path, "-k", 2, "--init", init, "-o", out])
        assert r.code == 0, r.err
        outs.append(json.loads((out / "summary.json").read_text()))
        outs[-1]["centres"] = np.loadtxt(out / "centers.csv", delimiter=",", skiprows=1)
    np.testing.assert_allclose(outs[0]["centres"], outs[1]["centres"], rtol=1e-15)
    assert outs[0]["inertia"] == pytest.approx(outs[1]["inertia"], rel=1e-12)
    assert outs[0]["weighted"] is True


@pytest.mark.parametrize("ranks", [1, 3])
def test_missing_values_drop_and_mean(tmp_path, ranks):
    path = tmp_path / "m.arff"
    path.write_text("@relation r\n@attribute a numeric\n@attribute b numeric\n@data\n1,2\n?,4\n5,?\n7,8\n")
    x, _, part = read(path, ranks, missing="drop")
    assert np.array_equal(x, [[1, 2], [7, 8]]) and part.missing == 2 and part.n == 2
    x, _, part = read(path, ranks, missing="mean")
    assert np.array_equal(x, [[1, 2], [13 / 3, 4], [5, 14 / 3], [7, 8]]) and part.missing == 2
    with pytest.raises(InputError, match=r"m.arff:6: attribute 'a': missing value"):
        read(path, ranks)


def test_dropped_rows_get_label_minus_one(tmp_path):
    path = tmp_path / "m.arff"
    path.write_text("@relation r\n@attribute a numeric\n@data\n1\n?\n10\n11\n")
    r = run_cli(["run", path, "-k", 2, "--init", "range", "--missing", "drop", "-o", tmp_path / "o"], np=2)
    assert r.code == 0, r.err
    labels = (tmp_path / "o" / "labels.txt").read_text().split()
    assert labels[1] == "-1" and len(labels) == 4 and labels[2] == labels[3] != labels[0]


@pytest.mark.parametrize("spec, names", [
    ("b", ["a", "c"]), ("first", ["b", "c"]), ("last", ["a", "b"]), ("1,3", ["b"]), ("first-2", ["c"]),
])
def test_ignore(tmp_path, spec, names):
    path = tmp_path / "i.arff"
    path.write_text("@relation r\n@attribute a numeric\n@attribute b numeric\n@attribute c numeric\n@data\n1,2,3\n")
    x, _, part = read(path, 1, ignore=spec)
    assert part.names == names and part.selection.ignored
    assert x.shape == (1, len(names))


def test_ignore_errors(tmp_path):
    path = tmp_path / "i.arff"
    path.write_text("@relation r\n@attribute a numeric\n@attribute s string\n@data\n1,x\n")
    with pytest.raises(UsageError, match="no attribute named 'zz'"):
        read(path, 1, ignore="zz")
    with pytest.raises(InputError, match="no numeric attribute is left"):
        read(path, 1, ignore="a")


HEAD3 = "@relation r\n@attribute x numeric\n@attribute y numeric\n@attribute c {p,q}\n@data\n"
GOOD = "1,2,p\n" * 40


@pytest.mark.parametrize("np_", [1, 3])
@pytest.mark.parametrize("bad, needle, attr", [
    ("1,2\n", "row has 2 values, expected 3", "'c'"),
    ("1,2,p,4\n", "more than 3 values", ""),
    ("1,abc,p\n", "'abc' is not a number", "'y'"),
    ("nan,2,p\n", "'nan' is not a number", "'x'"),
    ("1,inf,p\n", "'inf' is not a number", "'y'"),
    ("1,1e999,p\n", "out of the float64 range", "'y'"),
    ("1,,p\n", "empty value", "'y'"),
    ("1,2\x00,p\n", "binary data", "'y'"),
    ("1,5,2,p\n", "decimal comma", ""),
    ("1,?,p\n", "missing value", "'y'"),
    ("{0 1, 7 2}\n", "sparse index", ""),
    ("1,2,'p\n", "never closed", "'c'"),
    ("1,2,p,{-1}\n", "instance weight", ""),
])
def test_bad_rows_exit_3_with_line_and_attribute(tmp_path, np_, bad, needle, attr):
    path = tmp_path / "bad.arff"
    # the bad line sits deep in the last rank's byte range
    path.write_bytes((HEAD3 + GOOD + GOOD + bad + "1,2,q\n").encode())
    r = run_cli(["run", path, "-k", 2], np=np_, timeout=60)
    assert r.code == 3, (r.out, r.err)
    assert r.seconds < HANG_GUARD_S
    assert f"{path}:{HEAD3.count(chr(10)) + 81}:" in r.err
    assert needle in r.err and attr in r.err
    assert "Traceback" not in r.err


@pytest.mark.parametrize("np_", [1, 3])
@pytest.mark.parametrize("text, needle", [
    ("@relation r\n@attribute x numeric\n@attribute x numeric\n@data\n1,2\n", ":3: attribute 'x' is declared twice"),
    ("@relation r\n@attribute x numeric\n@attribute b relational\n@data\n1,2\n", ":3: attribute 'b' is relational"),
    ("@relation r\n@attribute x numerc\n@data\n1\n", ":2: attribute 'x' has an unknown type"),
    ("@relation r\n@atribute x numeric\n@data\n1\n", ":2: expected @relation, @attribute or @data"),
    ("@relation r\n@attribute x numeric\n1\n", ":3: expected @relation"),
    ("@relation r\n@attribute x numeric\n", "no @data line"),
    ("@relation r\n@attribute x numeric\n@data\n% only a comment\n", "no rows"),
    ("@relation r\n@attribute s string\n@data\nabc\n", "no numeric attribute is left"),
])
def test_bad_headers_exit_3(tmp_path, np_, text, needle):
    path = tmp_path / "h.arff"
    path.write_text(text)
    r = run_cli(["run", path, "-k", 1], np=np_, timeout=60)
    assert r.code == 3, (r.out, r.err)
    assert needle in r.err and str(path) in r.err
    assert r.seconds < HANG_GUARD_S and "Traceback" not in r.err


def test_gzip_input_is_refused(tmp_path):
    path = tmp_path / "d.arff.gz"
    with gzip.open(path, "wt") as f:
        f.write("@relation r\n@attribute x numeric\n@data\n1\n")
    r = run_cli(["run", path, "-k", 1])
    assert r.code == 3 and "compressed (gzip): decompress it first" in r.err
