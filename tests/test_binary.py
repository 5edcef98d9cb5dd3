"""mpikmeans convert: a .npy cache that gives the same results as the ARFF."""

from __future__ import annotations

import json
import mmap

import numpy as np
import pytest

from conftest import run_cli
from mpikmeans.io.arff import read_arff
from mpikmeans.io.binary import read_npy
from mpikmeans.errors import InputError
from threadcomm import run_ranks


@pytest.mark.parametrize("np_", [1, 3])
def test_convert_then_run_equals_run_on_arff(blobs, tmp_path, np_):
    npy = tmp_path / "b.npy"
    r = run_cli(["convert", blobs, npy], np=np_)
    assert r.code == 0, r.err
    x = np.load(npy)
    assert x.shape == (20000, 10)
    meta = json.loads((tmp_path / "b.npy.json").read_text())
    assert meta["attributes"] == [f"X{j}" for j in range(1, 11)] and meta["n"] == 20000
    ref = np.loadtxt(blobs, delimiter=",", comments=["@", "%"])
    assert np.array_equal(x, ref)
    outs = {}
    for name, data in (("arff", blobs), ("npy", npy)):
        out = tmp_path / name
        r = run_cli(["run", data, "-k", 8, "--seed", 2, "-o", out], np=np_)
        assert r.code == 0, r.err
        outs[name] = out
    assert (outs["arff"] / "labels.txt").read_bytes() == (outs["npy"] / "labels.txt").read_bytes()
    a = np.loadtxt(outs["arff"] / "centers.csv", delimiter=",", skiprows=1)
    b = np.loadtxt(outs["npy"] / "centers.csv", delimiter=",", skiprows=1)
    if np_ == 1:  # the same rows in the same order on one rank: bit for bit
        assert (outs["arff"] / "centers.csv").read_bytes() == (outs["npy"] / "centers.csv").read_bytes()
    np.testing.assert_allclose(a, b, rtol=1e-12, atol=0)


def test_weights_and_names_survive_conversion(tmp_path):
    npy = _convert_arff(tmp_path, "w", "@relation r\n@attribute 'a b' numeric\n@attribute c {x,y}\n"
                        "@attribute d numeric\n@data\n1,x,2,{3}\n4,y,5\n")
    src = npy.with_suffix(".arff")
    for ranks in (1, 2):
        parts = run_ranks(ranks, lambda comm: read_npy(str(npy), comm))
        ref = run_ranks(ranks, lambda comm: read_arff(str(src), comm))
        assert parts[0].names == ["a b", "d"]
        assert np.array_equal(np.concatenate([p.x for p in parts]), np.concatenate([p.x for p in ref]))
        assert np.array_equal(np.concatenate([p.weights for p in parts]), [3.0, 1.0])


def test_bad_npy_is_input_error(tmp_path):
    bad = tmp_path / "bad.npy"
    np.save(bad, np.arange(5))
    with pytest.raises(InputError, match="2-D float64"):
        run_ranks(1, lambda comm: read_npy(str(bad), comm))
    r = run_cli(["run", bad, "-k", 2])
    assert r.code == 3 and "2-D float64" in r.err
    r = run_cli(["convert", tmp_path / "x.arff", tmp_path / "x.bin"])
    assert r.code == 2 and ".npy" in r.err


@pytest.mark.parametrize("ranks", [1, 3])
def test_a_broken_sidecar_or_weights_file_is_input_error_on_every_rank(tmp_path, ranks):
    npy = _convert_arff(tmp_path, "w", "@relation r\n@attribute a numeric\n@attribute b numeric\n@data\n"
                        "1,2,{3}\n4,5\n6,7,{2}\n")
    side, wfile = tmp_path / "w.npy.json", tmp_path / "w.weights.npy"
    assert side.exists() and wfile.exists()
    good = side.read_text()
    for text, why in (("{not json", "cannot read the description"), ("[1, 2]", "not a description")):
        side.write_text(text)
        with pytest.raises(InputError, match=why) as err:
            run_ranks(ranks, lambda comm: read_npy(str(npy), comm))
        assert err.value.collective and "w.npy.json" in str(err.value)
    meta = json.loads(good)
    side.write_text(json.dumps({**meta, "attributes": ["a"]}))
    with pytest.raises(InputError, match="do not match the 2 columns"):
        run_ranks(ranks, lambda comm: read_npy(str(npy), comm))
    # damaged extremes for this very file: scanned again, not trusted and not a traceback
    side.write_text(json.dumps({**meta, "extremes": {**meta["extremes"], "min": ["zz", "1"]}}))
    parts = run_ranks(ranks, lambda comm: read_npy(str(npy), comm))
    assert list(parts[0].mins) == [1.0, 2.0] and list(parts[0].maxs) == [6.0, 7.0]
    side.write_text(good)
    np.save(wfile, np.ones(2))  # a row short
    with pytest.raises(InputError, match="expected 3 float64 weights") as err:
        run_ranks(ranks, lambda comm: read_npy(str(npy), comm))
    assert err.value.collective
    r = run_cli(["run", npy, "-k", 2], np=ranks)
    assert r.code == 3 and "expected 3 float64 weights" in r.err and "Traceback" not in r.err


@pytest.mark.parametrize("ranks", [1, 3])
def test_extremes_from_convert_are_trusted_only_for_the_file_it_wrote(tmp_path, ranks):
    npy = _convert_arff(tmp_path, "e", "@relation r\n@attribute a numeric\n@attribute b numeric\n@data\n"
                        "1,-0.0\n-2.5,0\n7,3e-300\n0.5,-1e300\n")
    src = npy.with_suffix(".arff")
    meta = json.loads((tmp_path / "e.npy.json").read_text())
    assert meta["extremes"]["min"] == [(-2.5).hex(), (-1e300).hex()]
    ref = run_ranks(ranks, lambda comm: read_arff(str(src), comm))[0]
    got = run_ranks(ranks, lambda comm: read_npy(str(npy), comm))
    for part in got:  # the sidecar's extremes: no pass over the rows, the same bits
        assert part.mins.tobytes() == ref.mins.tobytes() and part.maxs.tobytes() == ref.maxs.tobytes()
    x = np.load(npy, mmap_mode="r+")
    x[2, 1] = np.nan  # the file changed after convert: its values are checked again
    x.flush()
    del x
    import os
    st = os.stat(npy)
    os.utime(npy, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))
    with pytest.raises(InputError, match="not finite"):
        run_ranks(ranks, lambda comm: read_npy(str(npy), comm))


def _convert_arff(tmp_path, stem, text):
    """``stem.arff`` holding ``text``, converted to ``stem.npy``; the .npy's path."""
    src, npy = tmp_path / f"{stem}.arff", tmp_path / f"{stem}.npy"
    src.write_text(text)
    r = run_cli(["convert", src, npy])
    assert r.code == 0, r.err
    return npy


def _converted(tmp_path, n=3000, m=7):
    x = np.random.default_rng(5).normal(size=(n, m))
    npy = _convert_arff(tmp_path, "m", "@relation r\n" + "".join(f"@attribute a{j} numeric\n" for j in range(m))
                        + "@data\n" + "".join(",".join(repr(float(v)) for v in row) + "\n" for row in x))
    return npy, x


@pytest.mark.parametrize("ranks", [1, 2, 3])
def test_mapped_rows_are_the_files_and_private(tmp_path, ranks):
    npy, x = _converted(tmp_path)
    before = npy.read_bytes()
    parts = run_ranks(ranks, lambda comm: read_npy(str(npy), comm, threads=2))
    assert np.array_equal(np.concatenate([p.x for p in parts]), x)
    for p in parts:  # a job scales its rows in place: its own copy of those pages, never the file
        assert p.x.flags.writeable and p.x.flags.c_contiguous
        base = p.x
        while isinstance(base, np.ndarray):
            base = base.base
        assert isinstance(base.obj if isinstance(base, memoryview) else base, mmap.mmap)  # the page cache's pages, not a copy
        p.x *= 2.0
    assert npy.read_bytes() == before


def test_a_job_keeps_its_rows_when_convert_replaces_the_file(tmp_path):
    npy, x = _converted(tmp_path)
    part = run_ranks(1, lambda comm: read_npy(str(npy), comm))[0]
    other = tmp_path / "other.arff"
    other.write_text("@relation r\n" + "".join(f"@attribute a{j} numeric\n" for j in range(7)) + "@data\n"
                     + "1,2,3,4,5,6,7\n" * 10)
    r = run_cli(["convert", other, npy, "--overwrite"])
    assert r.code == 0, r.err
    assert np.load(npy).shape == (10, 7)
    assert np.array_equal(part.x, x)  # the mapping is of the file convert replaced (renamed over)


def test_rows_are_read_where_the_file_cannot_be_mapped(tmp_path, monkeypatch):
    from mpikmeans.io import binary

    npy, x = _converted(tmp_path)
    monkeypatch.setattr(binary, "map_rows", lambda *a: None)
    for threads in (1, 3):
        parts = run_ranks(2, lambda comm: read_npy(str(npy), comm, threads=threads))
        assert np.array_equal(np.concatenate([p.x for p in parts]), x)


def test_fault_in_reads_every_stride_of_every_block():
    from mpikmeans.io.binary import fault_in

    flat = np.random.default_rng(1).integers(0, 1000, 10_000).astype(np.float64)  # sums exact in any order
    for parts in (1, 3, 64):
        assert fault_in(flat, 1, parts) == flat.sum()
        starts = [10_000 * t // parts for t in range(parts)] + [10_000]
        # each block from its own first value: no page of a block is left out
        assert fault_in(flat, 512, parts) == sum(flat[a:b:512].sum() for a, b in zip(starts, starts[1:]))
