"""CSV input: the ARFF reader's parallel byte-range read, on a comma-separated file."""

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
from mpikmeans.io.arff import read_arff  # noqa: E402
from mpikmeans.io.csvhead import read_csv_header  # noqa: E402


def _write(path, x, names=None, fmt="%.17g"):
    with open(path, "w") as f:
        if names is not None:
            f.write(",".join(names) + "\n")
        np.savetxt(f, x, delimiter=",", fmt=fmt)
    return path


@pytest.fixture(scope="module")
def table():
    rng = np.random.default_rng(3)
    x = rng.normal(size=(997, 5)) * rng.uniform(1e-3, 1e6, size=5)
    x[::7, 2] = -0.0
    return x


def _read(path, ranks):
    parts = run_ranks(ranks, lambda comm: read_arff(str(path), comm))
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


@pytest.mark.parametrize("text, needle", [
    ("a\tb\n1\t2\n", "separated by tabs"),
    ("a;b\n1;2\n", "separated by semicolons"),
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
