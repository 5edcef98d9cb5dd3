"""Empty clusters through the command line: the default re-seeds them as scikit-learn does,
``drop`` removes them as Weka's SimpleKMeans does, ``keep`` keeps their centres.

With default settings and the same initial centres the result is scikit-learn's
``KMeans(init=centres, n_init=1, algorithm="lloyd", tol=0)``: centres within 1e-9,
labels identical, also when clusters empty on the way; at -np 1 and -np 3.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from conftest import run_cli

pytestmark = pytest.mark.mpi


def _data(tmp_path):
    """Four tight blobs and initial centres of which two start with no rows at all."""
    r = np.random.default_rng(12)
    blobs = np.array([[0.0, 0.0, 0.0], [10.0, 0.0, 0.0], [0.0, 10.0, 0.0], [0.0, 0.0, 10.0]])
    x = blobs[r.integers(0, 4, 3000)] + r.normal(scale=0.7, size=(3000, 3))
    x[0] = [40.0, 40.0, 40.0]  # a far point: where an empty cluster goes under scikit-learn's rule
    arff = tmp_path / "e.arff"
    with open(arff, "w") as f:
        f.write("@relation e\n@attribute a numeric\n@attribute b numeric\n@attribute c numeric\n@data\n")
        f.write("\n".join(",".join(repr(float(v)) for v in row) for row in x) + "\n")
    # two centres on blobs 0 and 1, one between blobs 2 and 3, and two far away: empty
    init = np.array([[0.2, 0.1, 0.0], [9.5, 0.3, 0.0], [0.0, 5.0, 5.0], [-80.0, -80.0, -80.0],
                     [-90.0, 80.0, -80.0]])
    csv = tmp_path / "init.csv"
    np.savetxt(csv, init, delimiter=",", header="a,b,c", comments="")
    return x, init, arff, csv


def _run(tmp_path, arff, csv, ranks, *extra):
    out = tmp_path / f"out{ranks}{''.join(extra)}"
    r = run_cli(["run", arff, "-k", 5, "--init", csv, "-o", out, "--overwrite", "-q",
                 *extra], np=ranks, timeout=180)
    assert r.code == 0, r.err
    centres = np.loadtxt(out / "centers.csv", delimiter=",", skiprows=1, ndmin=2)
    labels = np.loadtxt(out / "labels.txt", dtype=np.int64)
    return centres, labels, json.loads((out / "summary.json").read_text())


@pytest.mark.parametrize("ranks", [1, 3])
def test_defaults_give_scikit_learns_result_when_clusters_empty(tmp_path, ranks):
    from sklearn.cluster import KMeans

    x, init, arff, csv = _data(tmp_path)
    centres, labels, summary = _run(tmp_path, arff, csv, ranks)
    km = KMeans(n_clusters=5, init=init, n_init=1, algorithm="lloyd", tol=0.0, max_iter=300).fit(x)
    assert summary["empty_cluster"] == "farthest" and summary["clusters_reseeded"] >= 2
    assert np.array_equal(labels, km.labels_)
    np.testing.assert_allclose(centres, km.cluster_centers_, rtol=1e-9, atol=1e-12)
    assert summary["inertia"] == pytest.approx(km.inertia_, rel=1e-9)


@pytest.mark.parametrize("ranks", [1, 3])
def test_drop_removes_empty_clusters_as_weka_does(tmp_path, ranks):
    x, init, arff, csv = _data(tmp_path)
    centres, labels, summary = _run(tmp_path, arff, csv, ranks, "--empty-cluster", "drop")
    assert summary["clusters_dropped"] == 2 and summary["clusters"] == 3 and summary["k"] == 5
    assert centres.shape == (3, 3) and set(labels.tolist()) == {0, 1, 2}
    assert len(summary["sizes"]) == 3 and sum(summary["sizes"]) == len(x)
    # the two far centres never had a row: the run is the one started from the other three
    live = tmp_path / "live.csv"
    np.savetxt(live, init[:3], delimiter=",", header="a,b,c", comments="")
    r = run_cli(["run", arff, "-k", 3, "--init", live, "-o", tmp_path / "live", "--overwrite", "-q"], np=ranks,
                timeout=180)
    assert r.code == 0, r.err
    assert (tmp_path / "live" / "labels.txt").read_bytes() == \
        (tmp_path / f"out{ranks}--empty-clusterdrop" / "labels.txt").read_bytes()
    ref = np.loadtxt(tmp_path / "live" / "centers.csv", delimiter=",", skiprows=1)
    assert centres.tobytes() == ref.tobytes()


def test_keep_keeps_the_centre(tmp_path):
    x, init, arff, csv = _data(tmp_path)
    centres, labels, summary = _run(tmp_path, arff, csv, 1, "--empty-cluster", "keep")
    assert summary["clusters_reseeded"] == 0 and summary["clusters"] == 5
    assert np.array_equal(centres[3:], init[3:])
    assert summary["sizes"][3] == summary["sizes"][4] == 0
