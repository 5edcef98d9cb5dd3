"""Issue 8 through the command line: k-means++/k-means|| at any rank count, restarts,
scaling, --write-arff read back by our reader and by Weka, and the Python API agreeing
with the CLI."""

from __future__ import annotations

import json

import numpy as np
import pytest

from conftest import run_cli
from test_weka import needs_weka, weka_load_summary


def _load(out):
    c = np.loadtxt(out / "centers.csv", delimiter=",", skiprows=1, ndmin=2)
    lab = np.loadtxt(out / "labels.txt", dtype=np.int64)
    return c, lab, json.loads((out / "summary.json").read_text())


@pytest.mark.parametrize("init", ["k-means++", "k-means||"])
def test_smart_inits_do_not_depend_on_ranks(blobs, tmp_path, init):
    runs = []
    for np_ in (1, 4):
        out = tmp_path / f"{np_}"
        r = run_cli(["run", blobs, "-k", 8, "--init", init, "--seed", 7, "-o", out], np=np_)
        assert r.code == 0, r.err
        runs.append(_load(out))
    assert np.array_equal(runs[0][1], runs[1][1])
    np.testing.assert_allclose(runs[0][0], runs[1][0], rtol=1e-12, atol=0)
    assert runs[0][2]["init"] == init


def test_api_matches_cli(blobs, tmp_path):
    from mpikmeans import KMeans

    out = tmp_path / "cli"
    r = run_cli(["run", blobs, "-k", 8, "--seed", 2, "--normalize", "minmax", "--n-init", 3, "-o", out], np=2)
    assert r.code == 0, r.err
    c, lab, s = _load(out)
    x = np.loadtxt(blobs, delimiter=",", comments=["@", "%"])
    km = KMeans(n_clusters=8, random_state=2, normalize="minmax", n_init=3).fit(x)
    assert np.array_equal(lab, km.labels_)
    np.testing.assert_allclose(c, km.cluster_centers_, rtol=1e-12, atol=0)
    assert s["inertia"] == pytest.approx(km.inertia_, rel=1e-12)
    assert s["iterations"] == km.n_iter_
    assert s["n_init"] == 3 and len(s["restarts"]) == 3
    assert s["restarts"][s["best_restart"]]["inertia"] == min(rr["inertia"] for rr in s["restarts"])
    assert s["inertia_units"] == "scaled (minmax)"
    assert "Final cluster centroids" in r.out and "Full Data" in r.out


def test_normalize_writes_centres_in_data_units(tmp_path):
    path = tmp_path / "u.arff"
    rows = [(0, 0), (1, 1000), (10, 0), (11, 1000)]
    path.write_text("@relation u\n@attribute a numeric\n@attribute b numeric\n@data\n"
                    + "".join(f"{a},{b}\n" for a, b in rows))
    init = tmp_path / "i.csv"
    init.write_text("0,500\n10,500\n")  # data units, scaled with the data
    out = tmp_path / "o"
    r = run_cli(["run", path, "-k", 2, "--init", init, "--normalize", "minmax", "-o", out])
    assert r.code == 0, r.err
    c, lab, _ = _load(out)
    # in minmax units the a-split (range 11) beats the b-split (range 1000) only after scaling
    assert lab[0] == lab[1] != lab[2] == lab[3]
    np.testing.assert_allclose(c, [[0.5, 500], [10.5, 500]])


CLUSTER_INPUT = """% with everything the writer must keep
@relation 'mixed data'
@attribute x numeric
@attribute label {a,'b c'}
@attribute y real
@data
0.1, a, 0.2
% a comment line stays
0.2,'b c',0.1   % and a trailing comment
{0 9.8, 1 a, 2 10.1}
{}
9.9, 'b c', 10.0, {2}
10.2,a,9.7
"""


@pytest.mark.parametrize("np_", [1, 3])
def test_write_arff_keeps_rows_and_adds_the_cluster(tmp_path, np_):
    path = tmp_path / "mixed.arff"
    path.write_text(CLUSTER_INPUT)
    out = tmp_path / "o"
    r = run_cli(["run", path, "-k", 2, "--init", "range", "--seed", 1, "--write-arff", "-o", out], np=np_)
    assert r.code == 0, r.err
    text = (out / "clustered.arff").read_text()
    assert "@attribute cluster {cluster1,cluster2}\n@data\n" in text
    assert "% a comment line stays" in text and "'b c'" in text
    labels = np.loadtxt(out / "labels.txt", dtype=int)
    body = [ln for ln in text.split("@data\n", 1)[1].splitlines() if ln.strip() and not ln.startswith("%")]
    assert len(body) == len(labels) == 6
    assert body[0] == f"0.1, a, 0.2,cluster{labels[0] + 1}"
    assert body[2] == f"{{0 9.8, 1 a, 2 10.1, 3 cluster{labels[2] + 1}}}"
    assert body[3] == f"{{3 cluster{labels[3] + 1}}}"
    assert body[4] == f"9.9, 'b c', 10.0,cluster{labels[4] + 1}, {{2}}"
    # our own reader reads it back: the same rows, and one more (nominal) attribute
    r = run_cli(["run", out / "clustered.arff", "-k", 2, "--init", "range", "--seed", 1, "-o", tmp_path / "again"])
    assert r.code == 0, r.err
    assert (tmp_path / "again" / "labels.txt").read_text() == (out / "labels.txt").read_text()


@needs_weka
def test_weka_loads_the_clustered_arff(blobs, tmp_path):
    out = tmp_path / "o"
    r = run_cli(["run", blobs, "-k", 8, "--write-arff", "-o", out], np=3)
    assert r.code == 0, r.err
    info = weka_load_summary(out / "clustered.arff")
    assert info["instances"] == 20000 and info["attributes"] == 11
    assert info["types"][-1] == "Nom"
