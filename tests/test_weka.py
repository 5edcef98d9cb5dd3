"""Against the real Weka (Debian package ``weka``, Weka 3.6): on Weka's own example
data sets (numeric attributes, the nominal class ignored), SimpleKMeans' final
centroids are a fixed point of this tool's Lloyd step with ``minmax`` scaling:
the same assignment, the same cluster sizes, the same SSE (Weka prints it in
full: equal to ~1e-15), and the same centroids to Weka's printed 4 decimals;
and Weka loads the ARFF files this tool writes.

Skipped, saying why, where Java, ``weka.jar`` or the example files are absent
(``apt-get install weka`` provides all three; so does a headless JRE plus
``apt-get download weka`` unpacked into ``.venv/weka``; ``WEKA_JAR`` and
``WEKA_EXAMPLES`` point elsewhere).

How Weka is run (each takes ~0.3 s):

- ``java -cp weka.jar weka.clusterers.SimpleKMeans -N K -S SEED -I 500 -t FILE -c last``
  prints iterations, the SSE (in Weka's normalised units), the centroid table
  and the sizes; ``-c last`` makes the class attribute ignored in clustering;
- ``java -cp weka.jar weka.filters.unsupervised.attribute.AddCluster
  -W "weka.clusterers.SimpleKMeans -N K -S SEED -I 500" -I last -i FILE -o OUT``
  writes every row with its cluster (``clusterJ`` = cluster J-1), the same
  model (``-I last`` ignores the class).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from threadcomm import Serialised, run_ranks  # noqa: E402

from conftest import run_cli  # noqa: E402

from mpikmeans.comm import SerialComm  # noqa: E402
from mpikmeans.io.arff import read_arff  # noqa: E402
from mpikmeans.io.output import centres_csv, read_centres_fields  # noqa: E402
from mpikmeans.lloyd import STOP_UNCHANGED, lloyd  # noqa: E402
from mpikmeans.scaling import fit_scaler  # noqa: E402

#: where ``apt-get install weka`` puts things, then an unpacked ``apt-get download weka``
#: (``dpkg-deb -x weka_*.deb .venv/weka``: no root, no dependencies)
_ROOTS = [Path("/"), Path(__file__).resolve().parents[1] / ".venv" / "weka"]


def _first(env: str, relative: str) -> Path:
    if os.environ.get(env):
        return Path(os.environ[env])
    found = [r / relative for r in _ROOTS if (r / relative).exists()]
    return found[0] if found else _ROOTS[0] / relative


WEKA_JAR = _first("WEKA_JAR", "usr/share/java/weka.jar")
EXAMPLES = _first("WEKA_EXAMPLES", "usr/share/doc/weka/examples")

#: (data set, K, Weka seed): each converges well below Weka's -I 500
CASES = [("iris", 3, 10), ("iris", 5, 3), ("glass", 6, 10), ("diabetes", 2, 10), ("segment-challenge", 7, 10)]

#: Weka prints centroids with 4 decimals, rounding half up (Utils.doubleToString)
PRINTED = 0.5e-4 + 1e-9

#: Weka's examples with nominal attributes (labor with missing values too), K, seed, and whether
#: the last attribute is a nominal class to ignore (-c last; cpu.with.vendor's class is numeric
#: and is clustered): clustered by this tool with WEKA_OPTIONS, as Weka's SimpleKMeans does by default
NOMINAL_CASES = [("labor", 2, 10, True), ("credit-g", 3, 10, True), ("cpu.with.vendor", 3, 10, False)]
WEKA_OPTIONS = ["--nominal", "weka", "--normalize", "minmax", "--missing", "mean"]


def _why_no_weka() -> str | None:
    if shutil.which("java") is None:
        return "Weka tests need Java and Weka: apt-get install weka (no 'java' on PATH)"
    if not WEKA_JAR.is_file():
        return f"Weka tests need Weka: apt-get install weka (no {WEKA_JAR}; or set WEKA_JAR)"
    return None


def _why_no_examples() -> str | None:
    if not (EXAMPLES / "iris.arff").is_file():
        return f"Weka's example data sets are not in {EXAMPLES} (apt-get install weka; or set WEKA_EXAMPLES)"
    return None


needs_weka = pytest.mark.skipif(_why_no_weka() is not None, reason=_why_no_weka() or "")
needs_examples = pytest.mark.skipif(_why_no_examples() is not None, reason=_why_no_examples() or "")


# =========================================================================== running Weka

def run_weka(*args: str) -> str:
    """Run a Weka main class; its stdout.  Weka often exits 0 after an
    exception, so a stack trace on stderr is a failure too."""
    r = subprocess.run(["java", "-Xmx1g", "-cp", str(WEKA_JAR), *args], capture_output=True, text=True, timeout=300)
    if r.returncode != 0 or "Exception" in r.stderr:
        raise AssertionError(f"Weka {' '.join(args)} failed ({r.returncode}):\n{r.stderr[-2000:]}")
    return r.stdout


def weka_load_summary(path) -> dict:
    """Load an ARFF file with Weka (``weka.core.Instances``).

    Returns
    -------
    dict
        ``instances``, ``attributes`` (counts) and ``types`` (Weka's
        ``Num``/``Nom``/... per attribute).  Raises AssertionError when Weka
        cannot load the file.
    """
    out = run_weka("weka.core.Instances", str(path))
    inst = re.search(r"Num Instances:\s*(\d+)", out)
    attrs = re.search(r"Num Attributes:\s*(\d+)", out)
    if not inst or not attrs:
        raise AssertionError(f"Weka could not load {path}:\n{out[-2000:]}")
    types = re.findall(r"^\s*\d+\s+\S+\s+(Num|Nom|Str|Dat|Rel)\b", out, flags=re.MULTILINE)
    return {"instances": int(inst.group(1)), "attributes": int(attrs.group(1)), "types": types}


def weka_table(out: str, names: list, k: int) -> list:
    """Weka's printed centroid table: per attribute of ``names`` (in order), its k + 1 cells
    (Full Data, then each cluster) as text.  Cells are right-aligned under the header's
    column titles, so a category name with blanks in it stays one cell."""
    lines = out.splitlines()
    head = next(i for i, line in enumerate(lines) if line.startswith("Attribute"))
    ends = [m.end() for m in re.finditer(r"Full Data|\S+", lines[head][len("Attribute"):])][-(k + 1):]
    ends = [e + len("Attribute") for e in ends]
    cells = []
    for name, line in zip(names, lines[head + 3:]):
        assert line.startswith(name), (name, line)
        starts = [len(name)] + ends[:-1]
        cells.append([line[a:b].strip() for a, b in zip(starts, ends)])
    return cells


def weka_simple_kmeans(path: Path, k: int, seed: int, names: list | None = None, class_last: bool = True) -> dict:
    """SimpleKMeans on ``path`` with the last attribute (the class) ignored.

    Parameters
    ----------
    names : list of str, optional
        The clustered attributes, in order (default: the table's first words).
    class_last : bool
        The last attribute is a nominal class, not clustered (``-c last``);
        False clusters every attribute.

    Returns
    -------
    dict
        ``iterations``, ``sse`` (normalised units), ``n``, ``sizes`` (k,), ``cells``
        (per attribute, Full Data then each cluster, as printed), and when every
        attribute is numeric ``full`` (m,) the Full Data column and ``centroids``
        (k, m) as printed.
    """
    out = run_weka("weka.clusterers.SimpleKMeans", "-N", str(k), "-S", str(seed), "-I", "500",
                   "-t", str(path), *(["-c", "last"] if class_last else []))
    lines = out.splitlines()
    head = next(i for i, line in enumerate(lines) if line.startswith("Attribute"))
    sizes = [int(v) for v in re.findall(r"\((\d+)\)", lines[head + 1])]
    if names is None:
        names = []
        for line in lines[head + 3:]:
            if not line.strip():
                break
            names.append(line.split()[0])
    cells = weka_table(out, names, k)
    run = {"iterations": int(re.search(r"Number of iterations:\s*(\d+)", out).group(1)),
           "sse": float(re.search(r"Within cluster sum of squared errors:\s*(\S+)", out).group(1)),
           "n": sizes[0], "sizes": sizes[1:], "cells": cells}
    try:
        table = np.array([[float(v) for v in row] for row in cells])
    except ValueError:  # nominal attributes: categories in the table
        return run
    return {**run, "full": table[:, 0], "centroids": table[:, 1:].T.copy()}


def weka_assignment(path: Path, k: int, seed: int, out: Path, ignore_last: bool = True) -> np.ndarray:
    """Weka's cluster (0-based) of every row, from AddCluster with the same model.

    Returns
    -------
    ndarray, shape (n,), int64
    """
    run_weka("weka.filters.unsupervised.attribute.AddCluster", "-W",
             f"weka.clusterers.SimpleKMeans -N {k} -S {seed} -I 500", *(["-I", "last"] if ignore_last else []),
             "-i", str(path), "-o", str(out))
    labels, data = [], False
    for line in out.read_text().splitlines():
        text = line.strip()
        if not text or text.startswith("%"):
            continue
        if data:
            labels.append(int(text.rsplit(",", 1)[1].strip().strip("'\"").removeprefix("cluster")) - 1)
        elif text.lower().startswith("@data"):
            data = True
    return np.array(labels, dtype=np.int64)


@pytest.fixture(scope="module")
def weka_runs(tmp_path_factory):
    """Weka's results per case, computed once."""
    tmp = tmp_path_factory.mktemp("weka")
    cache = {}

    def get(name, k, seed):
        key = (name, k, seed)
        if key not in cache:
            path = EXAMPLES / f"{name}.arff"
            run = weka_simple_kmeans(path, k, seed)
            run["labels"] = weka_assignment(path, k, seed, tmp / f"{name}-{k}-{seed}.arff")
            cache[key] = run
        return cache[key]

    return get


# =========================================================================== our side

def read_numeric(path: Path, ranks: int = 1) -> np.ndarray:
    """The clustered columns of ``path`` as our reader gives them, all ranks' rows."""
    return np.concatenate([loc.x for loc in run_ranks(ranks, lambda comm: read_arff(str(path), comm))])


def liac_numeric(path: Path) -> tuple[np.ndarray, list]:
    """Reference parse (liac-arff): the numeric columns and their names."""
    import arff

    with open(path) as f:
        d = arff.load(f)
    cols = [j for j, (_, kind) in enumerate(d["attributes"]) if isinstance(kind, str) and kind.upper() in
            ("NUMERIC", "REAL", "INTEGER")]
    return (np.array([[row[j] for j in cols] for row in d["data"]], dtype=np.float64),
            [d["attributes"][j][0] for j in cols])


# =========================================================================== tests

@needs_examples
@pytest.mark.parametrize("name", ["iris", "glass", "diabetes", "segment-challenge"])
@pytest.mark.parametrize("ranks", [1, 3])
def test_reader_reads_wekas_examples_skipping_the_nominal_class(name, ranks):
    path = EXAMPLES / f"{name}.arff"
    ref, names = liac_numeric(path)
    locs = run_ranks(ranks, lambda comm: read_arff(str(path), comm))
    assert np.concatenate([loc.x for loc in locs]).tobytes() == ref.tobytes()
    assert locs[0].names == names  # the class attribute is not clustered
    assert locs[0].header.attributes[-1].kind == "nominal"


@needs_weka
@needs_examples
@pytest.mark.parametrize("name,k,seed", CASES)
@pytest.mark.parametrize("ranks", [1, 3])
def test_weka_centroids_are_a_fixed_point_of_our_lloyd_step(weka_runs, name, k, seed, ranks):
    path = EXAMPLES / f"{name}.arff"
    weka = weka_runs(name, k, seed)
    assert weka["iterations"] < 500  # Weka converged: its centroids are the means of its final clusters
    x = read_numeric(path)
    assert weka["n"] == len(x) and len(weka["labels"]) == len(x)
    labels = weka["labels"]
    assert np.bincount(labels, minlength=k).tolist() == weka["sizes"]

    # Weka's centroids in full precision: the means of its final clusters (what
    # its last update computed); they print as Weka printed them
    means = np.array([x[labels == j].mean(axis=0) for j in range(k)])
    assert np.abs(means - weka["centroids"]).max() <= PRINTED
    assert np.abs(x.mean(axis=0) - weka["full"]).max() <= PRINTED

    def body(comm):
        loc = read_arff(str(path), comm)
        scaler = fit_scaler(comm, loc.x, "minmax")  # global ranges, as Weka's EuclideanDistance
        z = scaler.transform(loc.x)
        c0 = scaler.transform(means)
        res = lloyd(comm, Serialised(z), z, loc.row_offset, c0, max_iter=50)
        return res, scaler.inverse(res.centres)

    out = run_ranks(ranks, body)
    res, centres = out[0]
    # one step from Weka's centroids assigns every row as Weka did and gives back
    # the same centroids; the next step changes nothing
    assert np.array_equal(np.concatenate([r.labels for r, _ in out]), labels)
    assert res.iterations == 2 and res.stop_reason == STOP_UNCHANGED
    assert [h["changed"] for h in res.history] == [len(x), 0]
    assert res.sizes.tolist() == weka["sizes"]
    assert np.abs(centres - weka["centroids"]).max() <= PRINTED
    np.testing.assert_allclose(centres, means, rtol=1e-12, atol=1e-12)
    # the SSE in Weka's normalised units, which Weka prints in full
    assert res.inertia == pytest.approx(weka["sse"], rel=1e-12)


@needs_weka
@needs_examples
@pytest.mark.parametrize("name,k,seed", CASES[:3])
def test_api_with_minmax_reproduces_weka(weka_runs, name, k, seed):
    from mpikmeans import KMeans

    path = EXAMPLES / f"{name}.arff"
    weka = weka_runs(name, k, seed)
    x = read_numeric(path)
    start = np.array([x[weka["labels"] == j].mean(axis=0) for j in range(k)])
    km = KMeans(n_clusters=k, init=start, normalize="minmax").fit(x)
    assert np.array_equal(km.labels_, weka["labels"])
    assert km.n_iter_ == 2
    assert np.abs(km.cluster_centers_ - weka["centroids"]).max() <= PRINTED
    assert km.inertia_ == pytest.approx(weka["sse"], rel=1e-12)


# =========================================================================== nominal attributes (--nominal weka)

def read_weka_style(path: Path, ignore_last: bool = True, comm=None):
    """Our reading of ``path`` as WEKA_OPTIONS reads it (with ``--ignore last`` where the class is
    not clustered): nominal attributes as one-hot blocks, missing values replaced by the mean or mode."""
    return read_arff(str(path), comm or SerialComm(), ignore="last" if ignore_last else None, missing="mean",
                     nominal="weka")


@pytest.fixture(scope="module")
def weka_nominal_runs(tmp_path_factory):
    """(Weka's result, our reading) per nominal case, computed once."""
    tmp = tmp_path_factory.mktemp("weka-nominal")
    cache = {}

    def get(name, k, seed, class_last):
        key = (name, k, seed)
        if key not in cache:
            path = EXAMPLES / f"{name}.arff"
            loc = read_weka_style(path, class_last)
            run = weka_simple_kmeans(path, k, seed, loc.names, class_last)
            run["labels"] = weka_assignment(path, k, seed, tmp / f"{name}-{k}-{seed}.arff", class_last)
            cache[key] = run, loc
        return cache[key]

    return get


def _weka_centroids(loc, labels: np.ndarray, k: int) -> tuple:
    """Weka's final centroids in full precision, from its final clusters (what its last update
    computed): each numeric attribute's mean, each nominal one's mode; and the Full Data row."""
    layout, x = loc.layout, loc.x
    sums = np.array([x[labels == j].sum(axis=0) for j in range(k)])
    counts = np.bincount(labels, minlength=k).astype(np.float64)
    centres = layout.project(sums / counts[:, None], sums)
    total = x.sum(axis=0)[None, :]
    full = layout.project(total / len(x), total)[0]
    return centres, full


@needs_weka
@needs_examples
@pytest.mark.parametrize("name,k,seed,class_last", NOMINAL_CASES)
@pytest.mark.parametrize("ranks", [1, 3])
def test_weka_nominal_result_is_a_fixed_point_of_a_run(weka_nominal_runs, name, k, seed, class_last, ranks,
                                                         tmp_path):
    """From Weka's final centroids (numeric means and nominal modes, written as category names),
    ``mpikmeans run --nominal weka --normalize minmax`` assigns every row as Weka did, gives back
    the same centroids and Weka's SSE, and stops after the next step changes nothing."""
    path = EXAMPLES / f"{name}.arff"
    weka, loc = weka_nominal_runs(name, k, seed, class_last)
    layout = loc.layout
    assert layout.has_nominal and weka["iterations"] < 500  # converged: its centroids are its clusters'
    labels = weka["labels"]
    assert weka["n"] == len(loc.x) == len(labels)
    assert np.bincount(labels, minlength=k).tolist() == weka["sizes"]
    centres, full = _weka_centroids(loc, labels, k)
    # they print as Weka printed them: numbers to its 4 decimals, categories by name
    table = layout.decode(np.vstack([full, centres]))
    for a, printed in enumerate(weka["cells"]):
        for col, cell in enumerate(printed):
            ours = table[col][a]
            if isinstance(ours, str):
                assert ours == cell, (loc.names[a], col, ours, cell)
            else:
                assert abs(ours - float(cell)) <= PRINTED * max(1.0, abs(ours)), (loc.names[a], col, ours, cell)

    start = tmp_path / "weka-centroids.csv"
    start.write_bytes(centres_csv(layout.decode(centres), loc.names))
    out = tmp_path / "out"
    ignore = ["--ignore", "last"] if class_last else []
    r = run_cli(["run", path, "-k", k, *WEKA_OPTIONS, *ignore, "--init", start, "-o", out, "-q"], np=ranks,
                timeout=300)
    assert r.code == 0, r.err
    summary = __import__("json").loads((out / "summary.json").read_text())
    assert np.array_equal(np.loadtxt(out / "labels.txt", dtype=np.int64), labels)
    assert summary["iterations"] == 2 and summary["stop_reason"] == STOP_UNCHANGED
    assert summary["sizes"] == weka["sizes"] and summary["nominal_attributes"]
    rows, header = read_centres_fields(str(out / "centers.csv"), loc.names)
    assert header == loc.names
    want = layout.decode(centres)
    for got, expected in zip((fields for _, fields in rows), want):
        for field, value in zip(got, expected):
            if isinstance(value, str):
                assert field == value
            else:
                assert float(field) == pytest.approx(value, rel=1e-9, abs=1e-12)
    # the SSE in Weka's normalised units (nominal mismatches count 1), which Weka prints in full
    assert summary["inertia"] == pytest.approx(weka["sse"], rel=1e-12)


@needs_examples
@pytest.mark.parametrize("name,k,seed,class_last", NOMINAL_CASES)
def test_nominal_reading_is_one_hot_and_the_same_at_any_rank_count(name, k, seed, class_last):
    path = EXAMPLES / f"{name}.arff"
    one = read_weka_style(path, class_last)
    three = run_ranks(3, lambda comm: read_weka_style(path, class_last, comm))
    assert np.concatenate([loc.x for loc in three]).tobytes() == one.x.tobytes()
    layout = one.layout
    for _, s, values in layout.blocks():
        block = one.x[:, s:s + len(values)]
        assert ((block == 0) | (block == layout_one())).all() and ((block > 0).sum(axis=1) == 1).all()


def layout_one() -> float:
    from mpikmeans.nominal import ONE

    return ONE


@needs_weka
def test_weka_loads_our_arff_files(tmp_path):
    from mpikmeans.io.gen import GenSpec, write_blobs

    path = tmp_path / "blobs.arff"
    run_ranks(3, lambda comm: write_blobs(GenSpec(n=500, m=4, k=3, seed=2, decimals=4), str(path), comm))
    summary = weka_load_summary(path)
    assert summary == {"instances": 500, "attributes": 4, "types": ["Num"] * 4}


@needs_weka
def test_weka_load_check_catches_a_bad_file(tmp_path):
    # Weka exits 0 when it cannot parse a file: the helper must still fail
    bad = tmp_path / "bad.arff"
    bad.write_text("@relation r\n@attribute a numeric\n@attribute c {c1,c2}\n@data\n1,c1\n2,c3\n")
    with pytest.raises(AssertionError, match="failed|could not load"):
        weka_load_summary(bad)


# =========================================================================== a saved model on new rows

#: Weka's examples split into the rows a model is fitted on and new rows it is applied to (the class
#: attribute removed by Weka's own filter: Weka saves no clusterer fitted with -c), K and seed;
#: segment-challenge comes with its own test file, the others are cut at two thirds
SAVED_CASES = [("segment-challenge", "segment-test", 7, 10), ("labor", None, 2, 10), ("credit-g", None, 3, 10),
               ("cpu.with.vendor", None, 3, 10)]


def _train_and_test(name: str, test_name: str | None, tmp: Path) -> tuple:
    """``(train, test)``: ARFF files of the example's attributes less its last one, as Weka removes it."""
    sources = [EXAMPLES / f"{name}.arff", EXAMPLES / f"{test_name}.arff"] if test_name else [EXAMPLES / f"{name}.arff"]
    if test_name is None:
        lines = sources[0].read_text().splitlines()
        at = next(i for i, line in enumerate(lines) if line.strip().lower().startswith("@data"))
        rows = [line for line in lines[at + 1:] if line.strip() and not line.lstrip().startswith("%")]
        cut = len(rows) * 2 // 3
        sources = []
        for part, chosen in (("fit", rows[:cut]), ("new", rows[cut:])):
            p = tmp / f"{name}-{part}-full.arff"
            p.write_text("\n".join(lines[:at + 1] + chosen) + "\n")
            sources.append(p)
    out = []
    for i, src in enumerate(sources):
        dst = tmp / f"{name}-{'fit' if i == 0 else 'new'}.arff"
        if name == "cpu.with.vendor":  # its last attribute (the class) is numeric and clustered: kept
            dst.write_bytes(src.read_bytes())
        else:
            run_weka("weka.filters.unsupervised.attribute.Remove", "-R", "last", "-i", str(src), "-o", str(dst))
        out.append(dst)
    return tuple(out)


def weka_saved_model_labels(train: Path, test: Path, k: int, seed: int, tmp: Path) -> np.ndarray:
    """Weka's SimpleKMeans fitted on ``train`` and saved (``-d``), then loaded (``-l``) to cluster ``test``
    (``-T ... -p 0``: each row's 0-based cluster)."""
    model = tmp / f"{train.stem}.model"
    run_weka("weka.clusterers.SimpleKMeans", "-N", str(k), "-S", str(seed), "-I", "500", "-t", str(train),
             "-d", str(model))
    out = run_weka("weka.clusterers.SimpleKMeans", "-l", str(model), "-T", str(test), "-p", "0")
    rows = [line.split() for line in out.splitlines() if re.fullmatch(r"\s*\d+\s+\d+\s*", line)]
    return np.array([int(c) for _, c in rows], dtype=np.int64)


@needs_weka
@needs_examples
@pytest.mark.parametrize("name,test_name,k,seed", SAVED_CASES)
def test_predict_with_a_model_of_wekas_clusters_gives_wekas_saved_clusterer_labels(name, test_name, k, seed,
                                                                                    tmp_path):
    """A model fitted as Weka fits SimpleKMeans (``--nominal weka --normalize minmax --missing mean``, from
    Weka's final centroids: the same clusters), applied by ``mpikmeans predict`` to rows it has not seen,
    labels every row as Weka's saved and reloaded clusterer does: the training ranges scale the new rows,
    the training means fill their missing values (labor has some), a nominal attribute counts 0 or 1."""
    train, test = _train_and_test(name, test_name, tmp_path)
    loc = read_weka_style(train, ignore_last=False)
    labels = weka_assignment(train, k, seed, tmp_path / "fit-clusters.arff", ignore_last=False)
    assert len(labels) == len(loc.x)
    centres, _ = _weka_centroids(loc, labels, k)
    start = tmp_path / "weka-centroids.csv"
    start.write_bytes(centres_csv(loc.layout.decode(centres), loc.names))
    fit = tmp_path / "fit"
    r = run_cli(["run", train, "-k", k, *WEKA_OPTIONS, "--init", start, "-o", fit, "-q"], timeout=300)
    assert r.code == 0, r.err
    assert np.array_equal(np.loadtxt(fit / "labels.txt", dtype=np.int64), labels)  # Weka's clusters
    new = tmp_path / "new"
    r = run_cli(["predict", fit / "model.json", test, "-o", new, "-q"], timeout=300)
    assert r.code == 0, r.err
    ours = np.loadtxt(new / "labels.txt", dtype=np.int64, ndmin=1)
    weka = weka_saved_model_labels(train, test, k, seed, tmp_path)
    assert len(weka) == len(ours) > 0
    assert np.array_equal(ours, weka), np.flatnonzero(ours != weka)[:20]
