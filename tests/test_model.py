"""Tests for :mod:`mpikmeans.model` (model.json: written to the bit, read with checks, a data file's
attributes matched against it) and the API's ``KMeans.save`` / ``mpikmeans.load``."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from conftest import HANG_GUARD_S, run_cli  # noqa: E402
from threadcomm import run_ranks  # noqa: E402

from mpikmeans.backends import make_backend  # noqa: E402
from mpikmeans.comm import SerialComm  # noqa: E402
from mpikmeans.config import build_config  # noqa: E402
from mpikmeans.errors import InputError, UsageError  # noqa: E402
from mpikmeans.io.header import parse_header  # noqa: E402
from mpikmeans.model import (FORMAT_VERSION, REQUIRED, Model, is_model, load_model, match_header,  # noqa: E402
                             match_names, save_model)
from mpikmeans.nominal import ONE  # noqa: E402
from mpikmeans.restarts import run_restarts  # noqa: E402
from mpikmeans.startup import read_input  # noqa: E402
from mpikmeans.scaling import fit_scaler  # noqa: E402


def fit_like_run(data, **settings):
    """What ``mpikmeans run DATA`` computes, in this process, and its model: (Model, labels of the rows kept, local).

    The same steps and arguments as :func:`mpikmeans.runner.run_job` (read, scale in place, the backend
    loaded with the reader's scaled bounds, :func:`run_restarts`), so the centres are the run's to the bit
    (they do not depend on the number of ranks).
    """
    cfg = build_config({}, settings)
    comm = SerialComm()
    local = read_input(comm, str(data), cfg, 2)
    layout = local.layout
    scaler = fit_scaler(comm, local.x, cfg.normalize, local.mins, local.maxs, layout.numeric_columns())
    x = scaler.transform(local.x, out=local.x)
    backend = make_backend("cpu", threads=2)
    bounds = scaler.transform(np.vstack([local.mins, local.maxs]))
    backend.load(x, local.weights, magnitudes=np.abs(bounds).max(axis=0))
    result = run_restarts(comm, backend, x, local.row_offset, local.n, cfg.k, init=cfg.init, seed=cfg.seed,
                          n_init=cfg.n_init, weights=local.weights, max_iter=cfg.max_iter, tol=cfg.tol,
                          empty_cluster=cfg.empty_cluster, layout=layout if layout.has_nominal else None).best
    model = Model.from_run(local, scaler, result, cfg, backend.info().dtype)
    backend.close()
    return model, result.labels, local


NOMINAL_ARFF = """% a small mixed file: numeric, nominal, an id to ignore, a string skipped
@relation mixed
@attribute id numeric
@attribute a numeric
@attribute colour {red,green,blue}
@attribute b real
@attribute note string
@data
"""


def write_mixed(path, rows: int = 240, seed: int = 0, header: str = NOMINAL_ARFF, missing: bool = True) -> Path:
    """A mixed ARFF file of three groups; a few '?' (dropped or filled as the run says)."""
    rng = np.random.default_rng(seed)
    colours = ("red", "green", "blue")
    lines = []
    for i in range(rows):
        g = i % 3
        a = rng.normal(10.0 * g, 1.0)
        b = rng.normal(-5.0 * g, 2.0)
        colour = colours[g] if rng.random() < 0.8 else colours[rng.integers(0, 3)]
        va = "?" if missing and i % 37 == 5 else f"{a:.6f}"
        lines.append(f"{i},{va},{colour},{b:.6f},'row {i}'")
    path = Path(path)
    path.write_text(header + "\n".join(lines) + "\n")
    return path


GAPS_ARFF = """% three groups; '?' in every clustered attribute
@relation gaps
@attribute a numeric
@attribute colour {red,green,blue}
@attribute b numeric
@data
"""
COLOURS = ("red", "green", "blue")


def write_gaps(path, rows: int, seed: int, groups=(1 / 3, 1 / 3, 1 / 3), colours=COLOURS, gap: float = 0.1):
    """An ARFF file of three groups with '?' scattered over a, colour and b (``gap`` of each).

    Returns
    -------
    path : Path
    a, b : ndarray, shape (rows,), float64
        The values as the reader parses them, NaN for '?'.
    colour : list of str or None
        Each row's category (None for '?'), drawn from ``colours``.
    """
    rng = np.random.default_rng(seed)
    a, b, colour, lines = [], [], [], []
    for _ in range(rows):
        g = int(rng.choice(3, p=groups))
        ta = "?" if rng.random() < gap else f"{rng.normal(10.0 * g, 1.0):.6f}"
        tb = "?" if rng.random() < gap else f"{rng.normal(-5.0 * g, 1.0):.6f}"
        c = None if rng.random() < gap / 2 else (COLOURS[g] if COLOURS[g] in colours and rng.random() < 0.8
                                                  else colours[int(rng.integers(0, len(colours)))])
        a.append(np.nan if ta == "?" else float(ta))
        b.append(np.nan if tb == "?" else float(tb))
        colour.append(c)
        lines.append(f"{ta},{'?' if c is None else c},{tb}")
    header = GAPS_ARFF.replace("{red,green,blue}", "{" + ",".join(colours) + "}")
    path = Path(path)
    path.write_text(header + "\n".join(lines) + "\n")
    return path, np.array(a), np.array(b), colour


def gaps_fill(a, b, colour) -> list:
    """What ``--missing mean`` fills in, computed with numpy: a's and b's nanmean, colour's mode one-hot."""
    counts = [sum(c == name for c in colour) for name in COLOURS]
    block = [0.0, 0.0, 0.0]
    block[int(np.argmax(counts))] = ONE  # the first most frequent
    return [float(np.nanmean(a))] + block + [float(np.nanmean(b))]


@pytest.fixture(scope="module")
def mixed(tmp_path_factory):
    return write_mixed(tmp_path_factory.mktemp("mixed") / "mixed.arff")


@pytest.fixture(scope="module")
def numeric_model(small_file):
    return fit_like_run(small_file, k=5, normalize="zscore", seed=3)


def test_a_runs_model_reads_back_to_the_bit(numeric_model, tmp_path):
    model, labels, local = numeric_model
    path = tmp_path / "model.json"
    save_model(str(path), model)
    doc = json.loads(path.read_text())
    assert set(REQUIRED) <= set(doc) and doc["format_version"] == FORMAT_VERSION
    assert doc["k"] == 5 and doc["seed"] == 3 and doc["init"] == "k-means++" and doc["dtype"] == "float64"
    assert doc["n"] == local.n and doc["scaling"]["method"] == "zscore" and doc["missing"]["policy"] == "error"
    assert [a["name"] for a in doc["attributes"] if a["role"] == "clustered"] == local.names
    back = load_model(str(path))
    assert back.centres_scaled.tobytes() == model.centres_scaled.tobytes()
    assert back.scaler.offset.tobytes() == model.scaler.offset.tobytes()
    assert back.scaler.scale.tobytes() == model.scaler.scale.tobytes()
    assert back.sse == model.sse and back.n == model.n and back.k == 5
    # the centres in data units are the means of their rows (the file says so in data units)
    x = np.array(doc["centres"])
    for j in range(5):
        np.testing.assert_allclose(x[j], model.scaler.inverse(local.x[labels == j]).mean(axis=0), rtol=1e-9)
    assert not [f for f in os.listdir(tmp_path) if f != "model.json"]  # no temporary file left


def test_nominal_model_records_categories_ignored_and_skipped(mixed, tmp_path):
    model, _, _ = fit_like_run(mixed, k=3, nominal="weka", normalize="minmax", missing="mean", ignore="id")
    roles = {a["name"]: (a["type"], a["role"]) for a in model.attributes}
    assert roles == {"id": ("numeric", "ignored"), "a": ("numeric", "clustered"),
                     "colour": ("nominal", "clustered"), "b": ("numeric", "clustered"),
                     "note": ("string", "skipped")}
    path = tmp_path / "m.json"
    save_model(str(path), model)
    doc = json.loads(path.read_text())
    assert doc["attributes"][2]["categories"] == ["red", "green", "blue"]
    assert sorted(row[1] for row in doc["centres"]) == ["blue", "green", "red"]  # a category name, by mode
    back = load_model(str(path))
    assert back.layout.columns == 5 and back.layout.values[1] == ("red", "green", "blue")
    assert back.centres_scaled.tobytes() == model.centres_scaled.tobytes()
    assert set(back.centres_scaled[:, 1:4].ravel()) == {0.0, ONE}
    assert back.missing == {"policy": "mean", "fill": model.missing["fill"]} and back.nominal == "weka"
    assert len(back.missing["fill"]) == 5 and back.missing["fill"][1:4] in ([ONE, 0, 0], [0, ONE, 0], [0, 0, ONE])


@pytest.mark.mpi
def test_a_mean_run_records_the_training_means_at_any_rank_count(tmp_path):
    data, a, b, colour = write_gaps(tmp_path / "gaps.arff", rows=500, seed=7)
    assert np.isnan(a).any() and np.isnan(b).any() and None in colour
    fills = []
    for np_ in (1, 3):
        r = run_cli(["run", data, "-k", 3, "--nominal", "weka", "--missing", "mean", "--normalize", "zscore",
                     "-o", tmp_path / f"np{np_}", "-q"], np=np_, timeout=4 * HANG_GUARD_S)
        assert r.code == 0, r.err
        doc = json.loads((tmp_path / f"np{np_}" / "model.json").read_text())
        assert doc["missing"]["policy"] == "mean"
        fills.append(doc["missing"]["fill"])
    assert fills[0] == fills[1]  # the same bits at any rank count (exact sums)
    expected = gaps_fill(a, b, colour)
    np.testing.assert_allclose(fills[0], expected, rtol=1e-13, atol=0.0)
    assert fills[0][1:4] == expected[1:4]  # the mode, one-hot: exactly ONE
    # in data units, before scaling: the means themselves, not their z-scores
    assert load_model(str(tmp_path / "np1" / "model.json")).missing["fill"] == fills[0]


def test_a_mean_model_records_the_means_of_data_without_a_gap(tmp_path):
    data, a, b, colour = write_gaps(tmp_path / "full.arff", rows=200, seed=2, gap=0.0)
    model = fit_like_run(data, k=3, nominal="weka", missing="mean")[0]
    np.testing.assert_allclose(model.missing["fill"], gaps_fill(a, b, colour), rtol=1e-13, atol=0.0)
    for policy in ("error", "drop"):  # nothing is filled in: nothing recorded
        assert fit_like_run(data, k=3, nominal="weka", missing=policy)[0].missing == {"policy": policy, "fill": None}


def test_save_never_writes_over_a_file_it_did_not_make(numeric_model, tmp_path):
    model = numeric_model[0]
    other = tmp_path / "notes.json"
    other.write_text('{"mine": 1}\n')
    for overwrite in (False, True):
        with pytest.raises(UsageError, match="not an mpikmeans model"):
            save_model(str(other), model, overwrite=overwrite)
    assert other.read_text() == '{"mine": 1}\n'
    path = tmp_path / "model.json"
    save_model(str(path), model)
    with pytest.raises(UsageError, match="already there"):
        save_model(str(path), model)
    save_model(str(path), model, overwrite=True)
    assert is_model(str(path)) and not is_model(str(other))
    with pytest.raises(UsageError, match="directory"):
        save_model(str(tmp_path), model)


def _edited(tmp_path, model, change) -> str:
    doc = json.loads(model.to_json())
    change(doc)
    path = tmp_path / "edited.json"
    path.write_text(json.dumps(doc))
    return str(path)


@pytest.mark.parametrize("case, error, code, words", [
    ("not json", UsageError, 2, "not an mpikmeans model"),
    ("other json", UsageError, 2, "not an mpikmeans model"),
    ("version", UsageError, 2, "format version 99"),
    ("missing key", InputError, 3, "no 'centres'"),
    ("bad shape", InputError, 3, "'centres_scaled' has shape"),
    ("bad role", InputError, 3, "entry 2 is not an attribute"),
    ("bad category", InputError, 3, "'centres' does not give"),
    ("disagree", InputError, 3, "disagree"),
    ("no file", UsageError, 2, "cannot read"),
    ("directory", UsageError, 2, "is a directory"),
    ("fill shape", InputError, 3, r"'missing.fill' has shape \(2,\), expected \(5,\)"),
    ("fill not a number", InputError, 3, "'missing.fill' holds something that is not a number"),
    ("fill not finite", InputError, 3, "'missing.fill' holds a value that is not a finite number"),
    ("fill no category", InputError, 3, "'missing.fill' gives the nominal attribute 'colour' no category"),
])
def test_load_refuses_with_the_exit_code(numeric_model, mixed, tmp_path, case, error, code, words):
    model = numeric_model[0]
    if case == "bad category":
        model = fit_like_run(mixed, k=3, nominal="weka", missing="drop")[0]
    if case.startswith("fill"):
        model = fit_like_run(mixed, k=3, nominal="weka", missing="mean", ignore="id")[0]

    def fill(value):
        return lambda d: d["missing"].update(fill=value)

    good = model.missing["fill"] or []
    changes = {
        "fill shape": fill(good[:2]),
        "fill not a number": fill(good[:4] + ["x"]),
        "fill not finite": fill(good[:4] + [1e400]),
        "fill no category": fill(good[:1] + [ONE, ONE, 0.0] + good[4:]),
        "version": lambda d: d.update(format_version=99),
        "missing key": lambda d: d.pop("centres"),
        "bad shape": lambda d: d.update(centres_scaled=d["centres_scaled"][:-1]),
        "bad role": lambda d: d["attributes"][1].update(role="maybe"),
        "bad category": lambda d: d["centres"][0].__setitem__(2, "purple"),
        "disagree": lambda d: d["centres"][0].__setitem__(0, d["centres"][0][0] + 1.0),
    }
    if case in changes:
        path = _edited(tmp_path, model, changes[case])
    elif case == "not json":
        path = str(tmp_path / "x.json")
        Path(path).write_bytes(b"\x00\x01 not json")
    elif case == "other json":
        path = str(tmp_path / "x.json")
        Path(path).write_text('{"k": 3}')
    elif case == "no file":
        path = str(tmp_path / "absent.json")
    else:
        path = str(tmp_path)
    with pytest.raises(error, match=words) as info:
        load_model(path)
    assert info.value.exit_code == code and "\n" not in info.value.message


def test_a_hand_written_model_needs_no_scaled_centres(numeric_model, tmp_path):
    model = numeric_model[0]
    path = _edited(tmp_path, model, lambda d: d.pop("centres_scaled"))
    back = load_model(path)
    np.testing.assert_allclose(back.centres_scaled, model.centres_scaled, rtol=1e-12, atol=1e-12)


# ----------------------------------------------------------------------- a data file against a model

def _header(tmp_path, text: str, name: str = "new.arff"):
    path = tmp_path / name
    path.write_text(text + "1,2,red,3,'x'\n")
    return parse_header(str(path), path.read_bytes())


@pytest.fixture(scope="module")
def mixed_model(mixed):
    return fit_like_run(mixed, k=3, nominal="weka", missing="drop", ignore="id")[0]


@pytest.mark.parametrize("case, text, words", [
    ("missing attribute", NOMINAL_ARFF.replace("@attribute b real\n", ""), "no attribute 'b'"),
    ("other order", NOMINAL_ARFF.replace("@attribute a numeric\n@attribute colour {red,green,blue}\n",
                                         "@attribute colour {red,green,blue}\n@attribute a numeric\n"),
     "attribute 'colour' comes where the model M.json has 'a'"),
    ("numeric vs nominal", NOMINAL_ARFF.replace("@attribute b real", "@attribute b {x,y}"),
     "attribute 'b' is nominal, numeric in the model M.json"),
    ("unknown category", NOMINAL_ARFF.replace("{red,green,blue}", "{red,green,blue,purple}"),
     "attribute 'colour': category 'purple' is not one of the model M.json's"),
    ("extra attribute", NOMINAL_ARFF.replace("@attribute note string", "@attribute c numeric"),
     "attribute 'c' is numeric and not in the model M.json: leave it out with --ignore c"),
])
def test_the_first_mismatch_is_one_line_naming_both_files_and_the_attribute(mixed_model, tmp_path, case, text,
                                                                           words):
    header = _header(tmp_path, text)
    with pytest.raises(InputError) as info:
        match_header(mixed_model, header, "new.arff", "M.json")
    message = info.value.message
    assert info.value.exit_code == 3 and "\n" not in message
    assert message.startswith("new.arff: ") and words in message, message


def test_what_may_differ_between_the_data_and_the_model(mixed_model, tmp_path):
    # the model's ignored attribute may be absent, a skipped one of any type, categories in another order
    text = (NOMINAL_ARFF.replace("@attribute id numeric\n", "").replace("{red,green,blue}", "{blue,red}")
            .replace("@attribute note string", "@attribute note date"))
    match = match_header(mixed_model, _header(tmp_path, text), "new.arff", "M.json")
    assert match.ignore is None
    # columns: a (0), colour's blue (3) and red (1), b (4)
    assert match.columns.tolist() == [0, 3, 1, 4]
    same = match_header(mixed_model, _header(tmp_path, NOMINAL_ARFF), "new.arff", "M.json")
    assert same.columns is None and same.ignore == "1"
    # an extra attribute left out with --ignore; a clustered one left out is a mismatch
    extra = NOMINAL_ARFF.replace("@attribute note string", "@attribute c numeric")
    assert match_header(mixed_model, _header(tmp_path, extra), "new.arff", "M.json", ignore="c").ignore == "1,c"
    with pytest.raises(InputError, match="'b' is left out with --ignore, and the model M.json clusters it"):
        match_header(mixed_model, _header(tmp_path, NOMINAL_ARFF), "new.arff", "M.json", ignore="b")
    with pytest.raises(UsageError, match="no attribute named 'zz'"):
        match_header(mixed_model, _header(tmp_path, NOMINAL_ARFF), "new.arff", "M.json", ignore="zz")


def test_a_npy_copys_columns_against_a_model(numeric_model, mixed_model):
    model = numeric_model[0]
    match_names(model, list(model.names), "d.npy", "M.json")
    with pytest.raises(InputError, match="d.npy: column 'X3' comes where the model M.json has 'X1'"):
        match_names(model, list(reversed(model.names)), "d.npy", "M.json")
    with pytest.raises(InputError, match="no column 'X3'"):
        match_names(model, model.names[:2], "d.npy", "M.json")
    with pytest.raises(InputError, match="nominal attribute 'colour'"):
        match_names(mixed_model, ["a", "b"], "d.npy", "M.json")


# ----------------------------------------------------------------------- the API

@pytest.fixture(scope="module")
def rows(small_x):
    return small_x * np.array([1.0, 100.0, 0.01]) + np.array([0.0, 5e3, -2.0])


def test_kmeans_save_and_load(rows, tmp_path):
    import mpikmeans
    from mpikmeans import KMeans

    km = KMeans(n_clusters=5, normalize="minmax", random_state=2).fit(rows)
    path = tmp_path / "model.json"
    km.save(str(path))
    with pytest.raises(UsageError, match="already there"):
        km.save(str(path))
    back = mpikmeans.load(str(path))
    assert np.array_equal(back.predict(rows), km.labels_)
    assert back.scaled_centers_.tobytes() == km.scaled_centers_.tobytes()
    assert back.cluster_centers_.tobytes() == km.cluster_centers_.tobytes()
    assert back.transform(rows[:50]).tobytes() == km.transform(rows[:50]).tobytes()
    assert back.score(rows) == km.score(rows) == pytest.approx(-km.inertia_, rel=1e-12)
    assert back.inertia_ == km.inertia_ and back.n_samples_ == len(rows) and back.n_iter_ == km.n_iter_
    assert list(back.feature_names_in_) == ["x0", "x1", "x2"]
    assert back.transform(rows[:50]).argmin(axis=1).tolist() == km.labels_[:50].tolist()
    quality = back.quality(rows, sample_size=200)
    assert quality["clusters_scored"] == 5 and quality["silhouette_sample_size"] == 200
    with pytest.raises(UsageError, match="not fitted"):
        KMeans(n_clusters=2).save(str(tmp_path / "other.json"))


def test_load_and_score_under_a_communicator(rows, tmp_path):
    import mpikmeans
    from mpikmeans import KMeans

    km = KMeans(n_clusters=5, random_state=1).fit(rows)
    path = str(tmp_path / "model.json")
    km.save(path)
    cuts = [0, 100, 100, len(rows)]  # rank 1 holds no rows

    def body(comm):
        lo, hi = cuts[comm.rank], cuts[comm.rank + 1]
        loaded = mpikmeans.load(path, comm=comm)
        return loaded.predict(rows[lo:hi]), loaded.score(rows[lo:hi])

    out = run_ranks(3, body)
    assert np.array_equal(np.concatenate([labels for labels, _ in out]), km.labels_)
    assert {score for _, score in out} == {km.score(rows)}  # the total, the same bits on every rank


def test_a_model_gives_a_runs_initial_centres(mixed, numeric_model, tmp_path):
    model, _, local = fit_like_run(mixed, k=3, nominal="weka", missing="drop", ignore="id")
    back = load_model(_edited(tmp_path, model, lambda d: None))
    assert back.centres_for(local.layout, "M.json").tobytes() == model.centres.tobytes()
    # the same categories in another order: the run's columns
    from mpikmeans.nominal import Layout

    swapped = Layout(["a", "colour", "b"], [0, 1, 4], [None, ("blue", "green", "red"), None])
    again = back.centres_for(swapped, "M.json")
    assert np.array_equal(again[:, 1:4], model.centres[:, 3:0:-1]) and np.array_equal(again[:, [0, 4]],
                                                                                          model.centres[:, [0, 4]])
    with pytest.raises(InputError, match="D.arff: attribute 'X1' is clustered here and not by the model M.json"):
        back.centres_for(numeric_model[2].layout, "M.json", "D.arff")
