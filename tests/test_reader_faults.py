"""Issue 40's reader items, as a user meets them: the real command under mpirun, each case named after its item.

6: ranks that get no rows (more ranks than rows, a long comment block in one
rank's byte range) work in ``convert``, ``run`` (ARFF and ``.npy``),
``gen-data`` and ``--write-arff``.  7: a FIFO, a device or a directory as
DATA is refused at once with a usage error, never waited on.  12: "only missing
values" names the attribute; an all-nominal file under ``--nominal skip``
suggests ``--nominal weka``.  13: ``.tsv`` and extension-less CSV are read as
CSV, ``gen-data x.csv`` writes CSV, compressed input says so whatever its name,
and rows as Weka's ArffLoader reads them (tabs or blanks between values, a
trailing comma, quoted numbers) give the same results as the plain file.
"""

from __future__ import annotations

import bz2
import gzip
import lzma
import os
import sys

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(__file__))
from conftest import HANG_GUARD_S, run_cli  # noqa: E402

HEADER = "@relation r\n@attribute a numeric\n@attribute b numeric\n@attribute c numeric\n@data\n"
#: rows of three well-separated groups, every value exact in float64 and as text
ROWS = [(1.5, -2.0, 0.25), (1.25, -2.5, 0.5), (1.75, -1.5, 0.0), (9.0, 8.5, -7.25), (9.5, 8.0, -7.0),
        (-6.0, 4.5, 3.0), (-6.5, 4.0, 3.5), (-5.5, 5.0, 2.75)]


def _plain(tmp_path, name="plain.arff"):
    path = tmp_path / name
    path.write_text(HEADER + "".join(f"{a},{b},{c}\n" for a, b, c in ROWS))
    return path


def _clean(r, code):
    """Exit ``code``, no traceback, no NUL byte, within the hang guard."""
    assert r.code == code, (r.code, r.out, r.err)
    assert "Traceback" not in r.err and "\x00" not in r.err + r.out, r.err
    assert r.seconds < HANG_GUARD_S


def _results(out_dir):
    return (out_dir / "labels.txt").read_bytes(), (out_dir / "centers.csv").read_bytes()


@pytest.fixture(scope="module")
def plain_results(tmp_path_factory):
    """``np_ -> _results`` of ``run PLAIN -k 3`` under ``mpirun -np np_``: the reference every item-13 form is
    compared with, run once per rank count for the module (not once per form), when first asked for."""
    done = {}

    def results(np_):
        if np_ not in done:
            d = tmp_path_factory.mktemp(f"plain-np{np_}")
            _clean(run_cli(["run", _plain(d), "-k", 3, "-o", d / "ref", "-q"], np=np_, timeout=120), 0)
            done[np_] = _results(d / "ref")
        return done[np_]

    return results


# --------------------------------------------------------------------------- item 6


@pytest.mark.mpi
@pytest.mark.parametrize("np_", [1, 4])
def test_item06_convert_with_empty_ranks(tmp_path, np_):
    # three rows on four ranks: some ranks own no line at all
    src = tmp_path / "three.arff"
    src.write_text(HEADER + "1,2,3\n4,5,6\n7,8,9\n")
    r = run_cli(["convert", src, tmp_path / "t.npy"], np=np_, timeout=120)
    _clean(r, 0)
    assert np.array_equal(np.load(tmp_path / "t.npy"), [[1, 2, 3], [4, 5, 6], [7, 8, 9]])


@pytest.mark.mpi
@pytest.mark.parametrize("np_", [4])
def test_item06_comment_block_in_one_ranks_range(tmp_path, np_):
    # a 400 KB comment block between the rows: the ranks whose byte range it fills read no row
    src = tmp_path / "c.arff"
    block = "".join(f"% {'x' * 97}\n" for _ in range(4000))
    src.write_text(HEADER + "1,2,3\n" + block + "4,5,6\n7,8,9\n")
    r = run_cli(["convert", src, tmp_path / "c.npy"], np=np_, timeout=120)
    _clean(r, 0)
    assert np.array_equal(np.load(tmp_path / "c.npy"), [[1, 2, 3], [4, 5, 6], [7, 8, 9]])
    r = run_cli(["run", src, "-k", 2, "-o", tmp_path / "out", "-q", "--write-arff"], np=np_, timeout=120)
    _clean(r, 0)
    labels = (tmp_path / "out" / "labels.txt").read_text().split()
    assert len(labels) == 3 and len(set(labels)) == 2


@pytest.mark.mpi
@pytest.mark.parametrize("np_", [1, 4])
def test_item06_run_npy_with_empty_ranks(tmp_path, np_):
    src = tmp_path / "three.arff"
    src.write_text(HEADER + "1,2,3\n4,5,6\n40,50,60\n")
    _clean(run_cli(["convert", src, tmp_path / "t.npy", "-q"]), 0)
    r = run_cli(["run", tmp_path / "t.npy", "-k", 2, "-o", tmp_path / "out", "-q"], np=np_, timeout=120)
    _clean(r, 0)
    labels = (tmp_path / "out" / "labels.txt").read_text().split()
    assert len(labels) == 3 and labels[0] == labels[1] != labels[2]


@pytest.mark.mpi
@pytest.mark.parametrize("np_", [1, 4])
def test_item06_gen_data_and_write_arff_with_empty_ranks(tmp_path, np_):
    data = tmp_path / "g.arff"
    _clean(run_cli(["gen-data", data, "-n", 3, "-m", 2, "-k", 1, "-q"], np=np_, timeout=120), 0)
    r = run_cli(["run", data, "-k", 1, "-o", tmp_path / "out", "-q", "--write-arff"], np=np_, timeout=120)
    _clean(r, 0)
    text = (tmp_path / "out" / "clustered.arff").read_text()
    assert text.count("cluster1\n") == 3


# --------------------------------------------------------------------------- item 7


@pytest.mark.mpi
@pytest.mark.parametrize("np_", [1, 3])
@pytest.mark.parametrize("command", ["run", "convert"])
def test_item07_fifo_input_does_not_hang(tmp_path, np_, command):
    fifo = tmp_path / "pipe.arff"
    os.mkfifo(fifo)  # nobody writes to it: opening it to read would wait forever
    args = ["run", fifo, "-k", 2, "-o", tmp_path / "out"] if command == "run" else ["convert", fifo, tmp_path / "p.npy"]
    r = run_cli(args, np=np_, timeout=HANG_GUARD_S)
    _clean(r, 2)
    assert "named pipe (FIFO)" in r.err and "regular file" in r.err and str(fifo) in r.err


@pytest.mark.parametrize("device", ["/dev/zero", "/dev/null"])
def test_item07_devices_are_refused(tmp_path, device):
    if not os.path.exists(device):
        pytest.skip(f"no {device}")
    r = run_cli(["run", device, "-k", 2, "-o", tmp_path / "out"], timeout=HANG_GUARD_S)
    _clean(r, 2)
    assert "character device" in r.err and "regular file" in r.err


# --------------------------------------------------------------------------- item 12


@pytest.mark.parametrize("np_", [1, 3])
def test_item12_only_missing_values_names_the_attribute(tmp_path, np_):
    src = tmp_path / "m.arff"
    src.write_text("@relation r\n@attribute a numeric\n@attribute 'b b' numeric\n@data\n"
                   + "".join(f"{i},?\n" for i in range(9)))
    r = run_cli(["run", src, "-k", 2, "--missing", "mean", "-o", tmp_path / "out"], np=np_, timeout=120)
    _clean(r, 3)
    assert "attribute 'b b' has only missing values" in r.err and str(src) in r.err


def test_item12_all_nominal_suggests_nominal_weka(tmp_path):
    src = tmp_path / "n.arff"
    src.write_text("@relation r\n@attribute colour {red,green}\n@attribute size {s,m,l}\n@data\nred,s\ngreen,l\n")
    r = run_cli(["run", src, "-k", 2, "-o", tmp_path / "out"], timeout=120)
    _clean(r, 3)
    assert "--nominal weka" in r.err and "'colour'" in r.err and str(src) in r.err


# --------------------------------------------------------------------------- item 13


def _table(tmp_path, name, delimiter, names=True):
    path = tmp_path / name
    head = delimiter.join(["a", "b", "c"]) + "\n" if names else ""
    path.write_text(head + "".join(delimiter.join(repr(v) for v in row) + "\n" for row in ROWS))
    return path


@pytest.mark.mpi
@pytest.mark.parametrize("np_", [1, 3])
def test_item13_tsv_is_csv(tmp_path, plain_results, np_):
    out = tmp_path / "out"
    r = run_cli(["run", _table(tmp_path, "t.tsv", "\t"), "-k", 3, "-o", out, "-q"], np=np_, timeout=120)
    _clean(r, 0)
    assert _results(out) == plain_results(np_)


@pytest.mark.mpi
@pytest.mark.parametrize("np_", [1, 3])
@pytest.mark.parametrize("name", ["table", "table.txt", "table.dat"])
def test_item13_extensionless_csv_is_csv(tmp_path, plain_results, np_, name):
    out = tmp_path / "out"
    r = run_cli(["run", _table(tmp_path, name, ","), "-k", 3, "-o", out, "-q"], np=np_, timeout=120)
    _clean(r, 0)
    assert _results(out) == plain_results(np_)


@pytest.mark.mpi
def test_item13_gen_data_csv_writes_csv(tmp_path):
    args = ["-n", 70_000, "-m", 3, "-k", 4, "--seed", 5, "--decimals", 4, "-q"]
    _clean(run_cli(["gen-data", tmp_path / "g.arff", *args], timeout=120), 0)
    arff_rows = (tmp_path / "g.arff").read_bytes().split(b"@data\n", 1)[1]
    for name, delimiter in (("g.csv", b","), ("g.tsv", b"\t")):
        texts = []
        for np_ in (1, 3, 4):
            path = tmp_path / f"{np_}{name}"
            _clean(run_cli(["gen-data", path, *args], np=np_, timeout=120), 0)
            texts.append(path.read_bytes())
        assert texts[0] == texts[1] == texts[2]  # the same bytes at any rank count
        head, rows = texts[0].split(b"\n", 1)
        assert head == delimiter.join([b"X1", b"X2", b"X3"])
        assert rows == arff_rows.replace(b",", delimiter)  # the same numbers as the ARFF file


@pytest.mark.mpi
@pytest.mark.parametrize("np_", [1, 3])
@pytest.mark.parametrize("tool, name", [("gzip", "d.arff.gz"), ("gzip", "d.arff"), ("bzip2", "d"), ("xz", "d.csv"),
                                        ("zstd", "d.arff")])
def test_item13_gzip_says_compressed(tmp_path, np_, tool, name):
    text = (HEADER + "1,2,3\n").encode()
    packed = {"gzip": gzip.compress, "bzip2": bz2.compress, "xz": lzma.compress,
              # a zstd frame's magic number, then anything: recognised by its first bytes
              "zstd": lambda b: b"\x28\xb5\x2f\xfd" + b}[tool](text)
    path = tmp_path / name
    path.write_bytes(packed)
    r = run_cli(["run", path, "-k", 1, "-o", tmp_path / "out"], np=np_, timeout=120)
    _clean(r, 3)
    assert f"compressed ({tool}): decompress it first, the parallel reader needs byte offsets" in r.err
    assert str(path) in r.err


def _weka_rows(rows, form):
    """ROWS written as Weka's ArffLoader also reads them."""
    if form == "tabs":
        return "".join("\t".join(map(str, row)) + "\n" for row in rows)
    if form == "spaces":
        return "".join("  " + " ".join(map(str, row)) + " \n" for row in rows)
    if form == "trailing-comma":
        return "".join(",".join(map(str, row)) + ",\n" for row in rows)
    if form == "quoted":
        return "".join(f"'{a}',\"{b}\",' {c} '\n" for a, b, c in rows)
    return "".join(f"{a} , {b}\t{c},\n" for a, b, c in rows)  # mixed


@pytest.mark.mpi
@pytest.mark.parametrize("np_", [1, 3])
@pytest.mark.parametrize("form", ["tabs", "spaces", "trailing-comma", "quoted", "mixed"])
def test_item13_weka_tab_separated_rows(tmp_path, plain_results, np_, form):
    # (each form in turn: tabs, blanks, a trailing comma, quoted numbers, all together)
    path = tmp_path / "weka.arff"
    path.write_text(HEADER + _weka_rows(ROWS, form))
    out = tmp_path / "out"
    r = run_cli(["run", path, "-k", 3, "-o", out, "-q"], np=np_, timeout=120)
    _clean(r, 0)
    assert _results(out) == plain_results(np_)


def test_item13_weka_rows_keep_their_errors(tmp_path):
    # what Weka's tokenizer would silently shift (two commas) stays an error naming the line
    # and attribute; a value with a blank inside needs quotes
    path = tmp_path / "bad.arff"
    path.write_text(HEADER + "1,2,3\n4,,5,6\n")
    r = run_cli(["run", path, "-k", 1, "-o", tmp_path / "out"], timeout=120)
    _clean(r, 3)
    assert f"{path}:7: attribute 'b': empty value" in r.err
