"""``--nominal weka``: nominal attributes clustered as Weka's SimpleKMeans clusters them.

- :class:`mpikmeans.nominal.Layout`: a block's mode (the first on a tie, from exact
  counts even when the sums were added in another order), names in and out;
- a run on a file of mixed attributes: the same labels and centres at -np 1, 2
  and 3, centres written with category names, the one-hot blocks valid after
  every initialisation (k-means++, k-means||, range, sample);
- the GPU backend (CUDA simulator) gives the CPU's labels and centres;
- bad input: an unknown category exits 3 naming the file, line and attribute
  (-np 1 and 3); a bad category in ``--init FILE`` and a ``.npy`` input exit 2;
  ``?`` is refused, dropped or replaced by the mode.

The comparison with Weka itself is in tests/test_weka.py.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from conftest import needs_gpu, run_cli  # noqa: E402

from mpikmeans.nominal import ONE, Layout  # noqa: E402

COLOURS = ("red", "dark green", "it's blue")
SIZES = ("S", "M", "L", "XL")


def _layout() -> Layout:
    # a numeric attribute, a nominal one of 3, a numeric one, a nominal one of 4
    return Layout(["a", "colour", "b", "size"], [0, 1, 4, 5], [None, COLOURS, None, SIZES])


def test_layout_columns_and_blocks():
    lay = _layout()
    assert lay.columns == 9 and lay.has_nominal
    assert [(a, s, v) for a, s, v in lay.blocks()] == [(1, 1, COLOURS), (3, 5, SIZES)]
    assert lay.numeric_columns().tolist() == [True, False, False, False, True, False, False, False, False]
    assert not Layout.numeric(["x", "y"]).has_nominal and Layout.numeric(["x", "y"]).columns == 2


def test_two_different_categories_are_at_squared_distance_one():
    assert 2 * ONE * ONE == pytest.approx(1.0, rel=0, abs=4e-16)


def test_the_mode_is_the_largest_count_the_first_on_a_tie():
    lay = _layout()
    # counts per cluster: colour (2, 5, 5) -> index 1 (tie 5/5: the first), size (0, 0, 0, 1) -> 3
    sums = np.zeros((2, 9))
    sums[0, 1:4] = np.array([2, 5, 5]) * ONE
    sums[0, 5:9] = np.array([0, 0, 0, 1]) * ONE
    sums[1, 1:4] = np.array([7, 1, 0]) * ONE
    sums[1, 5:9] = np.array([3, 3, 3, 3]) * ONE
    sums[:, 0] = [10.0, 20.0]
    counts = np.array([12.0, 8.0])
    centres = lay.project(sums / counts[:, None], sums)
    assert centres[0, 1:4].tolist() == [0.0, ONE, 0.0] and centres[0, 5:9].tolist() == [0.0, 0.0, 0.0, ONE]
    assert centres[1, 1:4].tolist() == [ONE, 0.0, 0.0] and centres[1, 5:9].tolist() == [ONE, 0.0, 0.0, 0.0]
    assert centres[:, 0].tolist() == [10.0 / 12.0, 20.0 / 8.0]  # numeric columns: the means


def test_equal_counts_tie_whatever_order_the_sums_were_added_in():
    """Counts of unweighted rows are made whole again: a tie stays a tie (the first category wins)
    even when the two sums, added in different orders, differ in their last bit."""
    lay = Layout(["c"], [0], [("p", "q")])
    n = 1_000_003
    a = math.fsum([ONE] * n)
    b = 0.0
    for _ in range(n):  # one at a time: rounding errors pile up differently
        b += ONE
    assert a != b  # otherwise this test shows nothing
    for first, second in ((a, b), (b, a)):
        sums = np.array([[first, second]])
        assert lay.project(np.zeros((1, 2)), sums).tolist() == [[ONE, 0.0]]
    # weighted sums are compared as they are
    sums = np.array([[first, second]])
    assert lay.project(np.zeros((1, 2)), np.array([[1.0, 1.5]]), weighted=True).tolist() == [[0.0, ONE]]


def test_decode_and_encode_are_inverse():
    lay = _layout()
    rows = [["1.5", "'it\\'s blue'", "-2", "XL"], ["0", "dark green", "3e2", "'S'"]]
    # a field in quotes is unquoted, but an escape inside is not read (centers.csv writes none)
    with pytest.raises(ValueError, match="centre 1, attribute 'colour': .* is not one of its categories"):
        lay.encode(rows)
    rows[0][1] = "it's blue"
    c = lay.encode(rows)
    assert c.shape == (2, 9)
    assert lay.decode(c) == [[1.5, "it's blue", -2.0, "XL"], [0.0, "dark green", 300.0, "S"]]


@pytest.mark.parametrize("rows, message", [
    ([["1", "red", "2"]], "centre 1 has 3 values, expected 4"),
    ([["1", "purple", "2", "S"]], "centre 1, attribute 'colour': 'purple' is not one of its categories"),
    ([["x", "red", "2", "S"]], "centre 1, attribute 'a': 'x' is not a number"),
])
def test_encode_says_which_centre_and_attribute(rows, message):
    with pytest.raises(ValueError, match=message):
        _layout().encode(rows)


# =========================================================================== runs

def _mixed_arff(path: Path, n: int = 600, seed: int = 5, missing: bool = False) -> None:
    """Three blobs in two numeric attributes, each with its own likely colour and size; a string id."""
    r = np.random.default_rng(seed)
    lab = r.integers(0, 3, n)
    x = np.array([[0.0, 0.0], [6.0, 1.0], [1.0, 7.0]])[lab] + r.normal(scale=1.0, size=(n, 2))
    colour = np.where(r.random(n) < 0.8, lab, r.integers(0, 3, n))
    size = np.where(r.random(n) < 0.7, lab + 1, r.integers(0, 4, n))
    lines = ["@relation mixed", "@attribute id string", "@attribute a numeric",
             "@attribute colour {red, 'dark green', 'it\\'s blue'}", "@attribute b numeric",
             "@attribute size {S,M,L,XL}", "@data"]
    quoted = ["red", "'dark green'", "'it\\'s blue'"]
    for i in range(n):
        c = quoted[colour[i]]
        s = SIZES[size[i]]
        if missing and i % 50 == 7:
            c = "?"
        if i % 97 == 3:  # a sparse row now and then: attribute 3 omitted (its first category)
            lines.append(f"{{0 r{i}, 1 {x[i, 0]:.6f}, 2 {c}, 3 {x[i, 1]:.6f}}}")
        else:
            lines.append(f"r{i},{x[i, 0]:.6f},{c},{x[i, 1]:.6f},{s}")
    path.write_text("\n".join(lines) + "\n")


@pytest.fixture(scope="module")
def mixed(tmp_path_factory):
    path = tmp_path_factory.mktemp("nominal") / "mixed.arff"
    _mixed_arff(path)
    return path


def _rows(centres_csv: bytes) -> list:
    return [line.split(",") for line in centres_csv.decode().splitlines()[1:]]


def _run(path, out, *args, np=None, env=None):
    r = run_cli(["run", path, "-k", 3, "--nominal", "weka", "--normalize", "minmax", "-o", out, "-q", *args], np=np,
                env=env, timeout=300)
    assert r.code == 0, r.err
    return json.loads((out / "summary.json").read_text()), (out / "centers.csv").read_bytes(), \
        (out / "labels.txt").read_bytes()


@pytest.mark.parametrize("init", ["k-means++", "k-means||", "range", "sample"])
def test_a_mixed_run_gives_the_same_result_at_any_rank_count(mixed, tmp_path, init):
    runs = [_run(mixed, tmp_path / f"np{np}", "--init", init, np=np) for np in (1, 2, 3)]
    summary, centres, labels = runs[0]
    for s, c, lab in runs[1:]:
        # the same labels and categories; numbers up to the order of the Allreduce's additions
        assert lab == labels and s["inertia"] == pytest.approx(summary["inertia"], rel=1e-12)
        for got, want in zip(_rows(c), _rows(centres)):
            assert got[1] == want[1] and got[3] == want[3]
            np.testing.assert_allclose([float(got[0]), float(got[2])], [float(want[0]), float(want[2])], rtol=1e-12)
    assert summary["m"] == 4 and summary["columns"] == 9 and summary["nominal_attributes"] == ["colour", "size"]
    assert summary["attributes"] == ["a", "colour", "b", "size"] and summary["skipped_attributes"] == ["id"]
    lines = centres.decode().splitlines()
    assert lines[0] == "a,colour,b,size" and len(lines) == 4
    for line in lines[1:]:
        fields = line.split(",")
        assert fields[1] in COLOURS and fields[3] in SIZES
        float(fields[0]), float(fields[2])


def test_the_mixed_blobs_are_found(mixed, tmp_path):
    summary, centres, _ = _run(mixed, tmp_path / "o", "--seed", "1")
    rows = _rows(centres)
    # each blob's own colour and size is its centre's mode
    found = sorted((round(float(a)), colour, size) for a, colour, b, size in rows)
    assert found == [(0, "red", "M"), (1, "it's blue", "XL"), (6, "dark green", "L")]


@pytest.mark.parametrize("device", [
    "simulator", pytest.param("gpu", marks=[pytest.mark.gpu, needs_gpu])])
def test_the_gpu_backend_gives_the_cpus_result(mixed, tmp_path, device):
    pytest.importorskip("numba.cuda")
    # the labels and centres are compared here; the scores' passes on the GPU against the host's are
    # test_scores' (under the simulator a score of every row's pairs costs as much as the run)
    cpu = _run(mixed, tmp_path / "cpu", "--backend", "cpu", "--seed", "2", "--scores", "none")
    env = {"NUMBA_ENABLE_CUDASIM": "1"} if device == "simulator" else None
    gpu = _run(mixed, tmp_path / "gpu", "--backend", "gpu", "--seed", "2", "--scores", "none", env=env)
    assert gpu[0]["backend"] == "gpu"
    assert gpu[2] == cpu[2]  # labels
    assert gpu[1] == cpu[1]  # centres (the fixed point's, summed in a fixed order)


def test_missing_nominal_values_refused_dropped_or_the_mode(tmp_path):
    path = tmp_path / "m.arff"
    _mixed_arff(path, missing=True)
    r = run_cli(["run", path, "-k", 3, "--nominal", "weka", "-o", tmp_path / "e"])
    assert r.code == 3 and "m.arff:15: attribute 'colour': missing value '?'" in r.err, r.err
    dropped, _, labels = _run(path, tmp_path / "d", "--missing", "drop")
    assert dropped["missing"] == {"policy": "drop", "count": 12} and dropped["n"] == 588
    assert labels.decode().split().count("-1") == 12
    filled, _, _ = _run(path, tmp_path / "f", "--missing", "mean")
    assert filled["missing"] == {"policy": "mean", "count": 12} and filled["n"] == 600


@pytest.mark.parametrize("np", [1, 3])
def test_an_unknown_category_names_the_file_line_and_attribute(tmp_path, np):
    path = tmp_path / "bad.arff"
    _mixed_arff(path, n=300)
    lines = path.read_text().splitlines()
    lines[250] = lines[250].replace(",S", ",XXL").replace(",M", ",XXL").replace(",L", ",XXL")
    if "XXL" not in lines[250]:
        lines[250] = "r,1.0,red,2.0,XXL"
    path.write_text("\n".join(lines) + "\n")
    r = run_cli(["run", path, "-k", 2, "--nominal", "weka", "-o", tmp_path / "o"], np=np)
    assert r.code == 3, r.err
    assert "bad.arff:251: attribute 'size': 'XXL' is not one of its values (S, M, L, XL)" in r.err, r.err
    assert "Traceback" not in r.err
    # as nominal attributes are skipped by default, the same file clusters without the option
    assert run_cli(["run", path, "-k", 2, "-o", tmp_path / "o2", "-q"], np=np).code == 0


def test_init_file_with_category_names(mixed, tmp_path):
    first, centres, labels = _run(mixed, tmp_path / "a", "--seed", "3")
    start = tmp_path / "start.csv"
    start.write_bytes(centres)
    again, centres2, labels2 = _run(mixed, tmp_path / "b", "--init", start)
    assert labels2 == labels and centres2 == centres and again["iterations"] == 2  # a fixed point
    bad = tmp_path / "bad.csv"
    bad.write_text(centres.decode().replace("red", "purple"))
    r = run_cli(["run", mixed, "-k", 3, "--nominal", "weka", "--init", bad, "-o", tmp_path / "c"])
    assert r.code == 2 and "'purple' is not one of its categories" in r.err and "attribute 'colour'" in r.err, r.err


def test_npy_input_refuses_nominal_weka(mixed, tmp_path):
    npy = tmp_path / "m.npy"
    assert run_cli(["convert", mixed, npy, "-q"]).code == 0
    r = run_cli(["run", npy, "-k", 2, "--nominal", "weka", "-o", tmp_path / "o"])
    assert r.code == 2 and "--nominal" in r.err and "need the ARFF or CSV file" in r.err, r.err
