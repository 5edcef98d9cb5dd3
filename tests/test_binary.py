"""mpikmeans convert: a .npy cache that gives the same results as the ARFF."""

from __future__ import annotations

import json

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
    src = tmp_path / "w.arff"
    src.write_text("@relation r\n@attribute 'a b' numeric\n@attribute c {x,y}\n@attribute d numeric\n@data\n"
                   "1,x,2,{3}\n4,y,5\n")
    r = run_cli(["convert", src, tmp_path / "w.npy"])
    assert r.code == 0, r.err
    for ranks in (1, 2):
        parts = run_ranks(ranks, lambda comm: read_npy(str(tmp_path / "w.npy"), comm))
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
def test_extremes_from_convert_are_trusted_only_for_the_file_it_wrote(tmp_path, ranks):
    src = tmp_path / "e.arff"
    src.write_text("@relation r\n@attribute a numeric\n@attribute b numeric\n@data\n"
                   "1,-0.0\n-2.5,0\n7,3e-300\n0.5,-1e300\n")
    npy = tmp_path / "e.npy"
    r = run_cli(["convert", src, npy])
    assert r.code == 0, r.err
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
