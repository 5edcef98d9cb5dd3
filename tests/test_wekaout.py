"""io/wekaout: ``--write-arff``'s file, for every text input format whatever the file's name."""

from __future__ import annotations

import os
import sys

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(__file__))
from threadcomm import run_ranks  # noqa: E402

from mpikmeans.io import formats  # noqa: E402
from mpikmeans.io.wekaout import write_clustered_arff  # noqa: E402

ROWS = np.array([[1.5, 2.0], [3.25, -4.0], [0.5, 8.0], [7.0, 1.0]])


def _clustered(tmp_path, name: str, text: str, ranks: int) -> str:
    data = tmp_path / name
    data.write_text(text)
    out = str(tmp_path / f"{name}.clustered.arff")

    def body(comm):
        local = formats.read_local(comm, str(data))
        labels = (local.row_offset + np.arange(len(local.x))) % 2
        write_clustered_arff(comm, local, labels, 2, out)
        return local.x

    x = np.vstack(run_ranks(ranks, body))
    assert np.array_equal(x, ROWS)
    with open(out, encoding="utf-8") as f:
        return f.read()


def _table(delimiter: str) -> str:
    return f"a{delimiter}b\n" + "".join(delimiter.join(repr(float(v)) for v in row) + "\n" for row in ROWS)


@pytest.mark.parametrize("ranks", [1, 2])
@pytest.mark.parametrize("name, delimiter", [("t.csv", ","), ("t.tsv", "\t"), ("t.txt", ","), ("t", ";")])
def test_a_csv_or_tsv_file_gets_an_arff_header_whatever_its_name(tmp_path, name, delimiter, ranks):
    """The header is made from the columns wherever io.formats reads the file as CSV or TSV, not only for
    ``*.csv`` (a TSV or an extension-less CSV file has no ARFF header to copy)."""
    text = _clustered(tmp_path, name, _table(delimiter), ranks)
    head, body = text.split("@data\n", 1)
    assert head.startswith("@relation ")
    assert "@attribute a numeric\n@attribute b numeric\n@attribute cluster {cluster1,cluster2}\n" in head
    assert [line.rsplit(",", 1)[1] for line in body.splitlines()] == ["cluster1", "cluster2"] * 2


def test_an_arff_file_keeps_its_own_header(tmp_path):
    arff = ("% a comment kept\n@relation r\n@attribute a numeric\n@attribute b numeric\n@data\n"
            + "".join(",".join(repr(float(v)) for v in row) + "\n" for row in ROWS))
    text = _clustered(tmp_path, "t.data", arff, 1)  # ARFF by content, not by name
    assert text.startswith("% a comment kept\n@relation r\n@attribute a numeric\n@attribute b numeric\n"
                           "@attribute cluster {cluster1,cluster2}\n@data\n")
