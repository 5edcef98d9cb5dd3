"""Tests for :mod:`mpikmeans.io.gen`: the generated file is the same bytes whatever
the number of ranks writing it (ranks simulated with threads), deterministic for
a seed, in the specification's appendix-2 layout, and its values are exactly the
fixed-point decimals written."""

from __future__ import annotations

import io
import sys
from decimal import Decimal
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from threadcomm import run_ranks  # noqa: E402

from mpikmeans.io import gen  # noqa: E402
from mpikmeans.io.arff import read_arff  # noqa: E402
from mpikmeans.io.gen import GenSpec, blob_centres, write_blobs  # noqa: E402


def generate(tmp_path, spec: GenSpec, ranks: int, name: str | None = None) -> bytes:
    path = tmp_path / (name or f"g-{ranks}.arff")
    sizes = run_ranks(ranks, lambda comm: write_blobs(GenSpec(**vars(spec)), str(path), comm))
    raw = path.read_bytes()
    assert sizes == [len(raw)] * ranks, "every rank returns the file size"
    leftovers = [p.name for p in tmp_path.iterdir() if ".tmp" in p.name]
    assert not leftovers, leftovers
    return raw


def split_file(raw: bytes, m: int):
    lines = raw.decode().split("\n")
    head, rows = lines[: m + 2], lines[m + 2 :]
    assert rows[-1] == "", "the file ends in a newline"
    return head, rows[:-1]


@pytest.mark.parametrize(
    "n, m, k, block_rows",
    [
        (50, 3, 4, 7),  # several blocks, 50 not divisible by 3
        (3, 2, 2, 2),  # fewer rows than ranks
        (1, 4, 1, 1000),
        (64, 1, 3, 16),  # block boundaries on rank boundaries at 2 ranks
        (97, 5, 6, 10),
    ],
)
def test_same_bytes_for_any_rank_count(tmp_path, monkeypatch, n, m, k, block_rows):
    monkeypatch.setattr(gen, "BLOCK_ROWS", block_rows)
    spec = GenSpec(n=n, m=m, k=k, seed=11, decimals=6)
    files = {r: generate(tmp_path, spec, r) for r in (1, 2, 3, 5)}
    assert len(set(files.values())) == 1, {r: len(b) for r, b in files.items()}
    head, rows = split_file(files[1], m)
    assert len(rows) == n


def test_same_bytes_default_block_rows(tmp_path):
    spec = GenSpec(n=2 * gen.BLOCK_ROWS + 5, m=1, k=3, seed=2, decimals=3)
    a = generate(tmp_path, spec, 1)
    b = generate(tmp_path, spec, 3)
    assert a == b
    assert len(split_file(a, 1)[1]) == spec.n


def test_row_text_does_not_depend_on_the_slices(tmp_path, monkeypatch):
    # rows [lo, hi) are the same text whatever slices they are generated in,
    # including empty slices and slices that cut blocks
    monkeypatch.setattr(gen, "BLOCK_ROWS", 5)
    spec = GenSpec(n=23, m=2, k=2, seed=4)
    whole = b"".join(p.tobytes() for p in gen.local_rows_text(spec, 0, 23))
    parts = b"".join(p.tobytes() for lo, hi in [(0, 3), (3, 11), (11, 11), (11, 23)]
                     for p in gen.local_rows_text(spec, lo, hi))
    assert whole == parts


def test_deterministic_and_seeded(tmp_path):
    spec = GenSpec(n=200, m=3, k=4, seed=5)
    a = generate(tmp_path, spec, 2, "a.arff")
    b = generate(tmp_path, spec, 2, "b.arff")
    c = generate(tmp_path, GenSpec(n=200, m=3, k=4, seed=6), 2, "c.arff")
    assert a == b
    assert a != c
    assert split_file(a, 3)[0] == split_file(c, 3)[0]  # same header
    assert set(split_file(a, 3)[1]).isdisjoint(split_file(c, 3)[1])  # rows differ


def test_header_layout(tmp_path):
    raw = generate(tmp_path, GenSpec(n=5, m=4, k=2, seed=0), 2)
    head, _ = split_file(raw, 4)
    assert head == ["@relation mpikmeans-blobs", "@attribute X1 numeric", "@attribute X2 numeric",
                    "@attribute X3 numeric", "@attribute X4 numeric", "@data"]


@pytest.mark.parametrize("decimals", [0, 3, 10, 14])
def test_values_are_the_decimals_written(tmp_path, decimals):
    spec = GenSpec(n=300, m=3, k=3, seed=9, decimals=decimals, spread=0.5)
    raw = generate(tmp_path, spec, 3)
    head, rows = split_file(raw, 3)
    values = np.loadtxt(io.StringIO("\n".join(rows)), delimiter=",", ndmin=2)
    assert values.shape == (300, 3)
    for line, vrow in zip(rows, values):
        tokens = line.split(",")
        for tok, v in zip(tokens, vrow):
            if decimals:
                assert len(tok.split(".")[1]) == decimals, tok
            else:
                assert "." not in tok, tok
            ticks = int(Decimal(tok).scaleb(decimals))
            assert Decimal(ticks).scaleb(-decimals) == Decimal(tok)
            assert v == ticks / 10.0**decimals  # exact: |ticks| < 2**53
            assert f"{v:.{decimals}f}" == tok  # and formatting the float64 gives the text back
    # the reader gives the same values at any split
    path = tmp_path / "g-3.arff"
    parts = run_ranks(2, lambda comm: read_arff(str(path), comm))
    assert np.concatenate([p.x for p in parts]).tobytes() == values.tobytes()
    assert parts[0].header.names == ["X1", "X2", "X3"]


def test_liac_arff_reads_it(tmp_path):
    import arff as liac

    raw = generate(tmp_path, GenSpec(n=40, m=3, k=2, seed=1), 2)
    doc = liac.loads(raw.decode())
    assert doc["relation"] == "mpikmeans-blobs"
    assert [a[0] for a in doc["attributes"]] == ["X1", "X2", "X3"]
    _, rows = split_file(raw, 3)
    expected = np.loadtxt(io.StringIO("\n".join(rows)), delimiter=",", ndmin=2)
    np.testing.assert_array_equal(np.array(doc["data"], dtype=np.float64), expected)


def test_blobs_around_the_centres(tmp_path):
    spec = GenSpec(n=2000, m=4, k=5, seed=3, spread=0.05, decimals=8)
    raw = generate(tmp_path, spec, 2)
    _, rows = split_file(raw, 4)
    x = np.loadtxt(io.StringIO("\n".join(rows)), delimiter=",", ndmin=2)
    c = blob_centres(spec)
    assert c.shape == (5, 4) and np.all(np.abs(c) <= gen.CENTRE_BOX)
    d = np.sqrt(((x[:, None, :] - c[None]) ** 2).sum(axis=2))
    nearest = d.min(axis=1)
    assert nearest.max() < 10 * spec.spread * np.sqrt(spec.m)
    # every blob is used, and each blob's mean is close to its centre
    lab = d.argmin(axis=1)
    assert set(lab) == set(range(5))
    for j in range(5):
        assert np.abs(x[lab == j].mean(axis=0) - c[j]).max() < 0.02


def test_spread_zero_gives_the_centres(tmp_path):
    spec = GenSpec(n=100, m=2, k=3, seed=8, spread=0.0, decimals=4)
    _, rows = split_file(generate(tmp_path, spec, 3), 2)
    x = np.loadtxt(io.StringIO("\n".join(rows)), delimiter=",", ndmin=2)
    expected = np.rint(blob_centres(spec) * 1e4) / 1e4
    assert {tuple(r) for r in x} <= {tuple(r) for r in expected}


@pytest.mark.parametrize(
    "changes",
    [
        {"n": 0}, {"m": 0}, {"k": 0}, {"n": -5},
        {"spread": -1.0}, {"spread": float("nan")}, {"spread": float("inf")},
        {"decimals": -1}, {"decimals": 16},
        {"decimals": 15, "spread": 1.0},  # beyond float64's exact integers
        {"decimals": 12, "spread": 1e6},
    ],
)
def test_validate_errors(tmp_path, changes):
    spec = GenSpec(**{"n": 10, "m": 2, "k": 2, **changes})
    with pytest.raises(ValueError):
        spec.validate()
    # every rank refuses, before any collective: no hang, no file
    path = tmp_path / "v.arff"
    out = run_ranks(3, lambda comm: write_blobs(GenSpec(**vars(spec)), str(path), comm), return_exceptions=True)
    assert all(isinstance(e, ValueError) for e in out)
    assert not path.exists()


def test_validate_accepts_sensible_settings():
    GenSpec(n=1, m=1, k=1).validate()
    GenSpec(n=10**9, m=100, k=50, spread=5.0, decimals=10).validate()
    GenSpec(n=10, m=2, k=2, spread=0.0, decimals=0).validate()


def reference_text(spec: GenSpec) -> bytes:
    """The file as the first implementation wrote it: numpy ticks of each block, then format_fixed."""
    from mpikmeans.io.header import header_text
    from mpikmeans.io.textfmt import format_fixed

    centres = blob_centres(spec)
    body = b"".join(format_fixed(gen.generate_block(spec, b, centres)[0], spec.decimals).tobytes()
                    for b in range((spec.n + gen.BLOCK_ROWS - 1) // gen.BLOCK_ROWS))
    return header_text(spec.relation, [f"X{j + 1}" for j in range(spec.m)]) + body


@pytest.mark.parametrize("ranks, threads", [(1, 1), (1, 3), (1, 8), (2, 2), (3, 1), (3, 4), (4, 3)])
def test_same_bytes_for_any_threads(tmp_path, monkeypatch, ranks, threads):
    # the threaded, chunked writer gives the reference bytes, whether each thread
    # learns its block's offset from the block before (one rank) or from the
    # counts exchanged first (several ranks); more threads than blocks too
    monkeypatch.setattr(gen, "BLOCK_ROWS", 9)
    monkeypatch.setattr(gen, "CHUNK_VALUES", 8)  # 2 rows of 4 values per draw
    spec = GenSpec(n=100, m=4, k=3, seed=21, decimals=5, spread=3.0)
    path = tmp_path / "t.arff"
    sizes = run_ranks(ranks, lambda comm: write_blobs(GenSpec(**vars(spec)), str(path), comm, threads=threads))
    raw = path.read_bytes()
    assert raw == reference_text(spec)
    assert sizes == [len(raw)] * ranks


@pytest.mark.parametrize("decimals", [0, 1, 7, 8, 9, 14])
def test_reference_bytes_default_blocks(tmp_path, decimals):
    # several default-size blocks with the rows split mid-block at 2 ranks
    spec = GenSpec(n=gen.BLOCK_ROWS + 1234, m=2, k=4, seed=decimals, decimals=decimals,
                   spread=4.0 if decimals < 14 else 0.5)
    path = tmp_path / "d.arff"
    run_ranks(2, lambda comm: write_blobs(GenSpec(**vars(spec)), str(path), comm, threads=2))
    assert path.read_bytes() == reference_text(spec)


def test_write_error_on_every_rank(tmp_path):
    # a directory that cannot be written: every rank raises the same error, no file, no hang
    from mpikmeans.errors import RunError

    target = tmp_path / "missing-dir" / "x.arff"
    out = run_ranks(3, lambda comm: write_blobs(GenSpec(n=50, m=2, k=2), str(target), comm, threads=2),
                    return_exceptions=True)
    assert all(isinstance(e, RunError) for e in out), out
    assert len({str(e) for e in out}) == 1
    assert not target.exists()


@pytest.mark.parametrize("ranks", [1, 2])
def test_a_failing_block_stops_the_writers(tmp_path, monkeypatch, ranks):
    # a thread that fails while making its block must not leave the threads
    # after it waiting for that block's offset: the error comes out, no hang
    monkeypatch.setattr(gen, "BLOCK_ROWS", 5)
    real = gen._Maker.text

    def text(self, block, bufs):
        if block == 3:
            raise ValueError("block 3 broke")
        return real(self, block, bufs)

    monkeypatch.setattr(gen._Maker, "text", text)
    path = tmp_path / "f.arff"
    out = run_ranks(ranks, lambda comm: write_blobs(GenSpec(n=60, m=2, k=2), str(path), comm, threads=3),
                    return_exceptions=True, timeout=30)
    assert any(isinstance(e, ValueError) and "block 3" in str(e) for e in out), out
    assert not path.exists()


def test_the_failing_block_is_reported_not_its_consequences(tmp_path, monkeypatch):
    # block 1 is slow and block 3 fails meanwhile: block 2, waiting for block 1's
    # offset, must not give up (its error would come first in block order and hide
    # the cause); only blocks after 3 stop
    import time

    monkeypatch.setattr(gen, "BLOCK_ROWS", 5)
    real = gen._Maker.text

    def text(self, block, bufs):
        if block == 1:
            time.sleep(0.5)
        if block == 3:
            raise ValueError("block 3 broke")
        return real(self, block, bufs)

    monkeypatch.setattr(gen._Maker, "text", text)
    path = tmp_path / "f.arff"
    out = run_ranks(1, lambda comm: write_blobs(GenSpec(n=60, m=2, k=2), str(path), comm, threads=3),
                    return_exceptions=True, timeout=30)
    assert isinstance(out[0], ValueError) and "block 3" in str(out[0]), out
    assert not path.exists()


def test_default_threads_follow_the_node_share(monkeypatch):
    # gen-data's threads are the reader's: the rank's CPU share, lowered by OMP_NUM_THREADS
    from mpikmeans.comm import SerialComm

    comm = SerialComm()
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.delenv("NUMBA_NUM_THREADS", raising=False)
    comm.cpus_per_rank = 3
    assert gen.default_threads(comm) == 3
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    assert gen.default_threads(comm) == 2


_WARM_CHECK = r"""
import json, os, sys
sys.path.insert(0, sys.argv[2])
from threadcomm import run_ranks
from mpikmeans.io import gen, textfmt
from mpikmeans.comm import SerialComm

KERNELS = ("_write_blob_rows", "_blob_rows_bytes")
count = lambda: {name: len(getattr(textfmt, name).overloads) for name in KERNELS}
gen.prepare(SerialComm())
loaded = count()
cases = []
for spec in (gen.GenSpec(n=70_000, m=3, k=4, decimals=10), gen.GenSpec(n=5, m=1, k=1, decimals=0, spread=0.0)):
    for threads in (1, 2):
        gen.write_blobs(spec, os.path.join(sys.argv[1], "f.arff"), SerialComm(), threads=threads)
        cases.append(count())
        # several ranks first count their bytes (the other kernel), then write
        run_ranks(2, lambda comm: gen.write_blobs(spec, os.path.join(sys.argv[1], "g.arff"), comm, threads=threads))
        cases.append(count())
print(json.dumps({"after_warm_up": loaded, "after_writes": cases}))
"""


def test_warm_up_loads_every_kernel_the_writer_calls(tmp_path):
    # gen-data times the writing apart from the start-up: after prepare, writing
    # (one block or several, 1 or 2 threads, 1 or 2 ranks) loads or compiles no other kernel version
    import json
    import os
    import subprocess

    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)}
    tests = str(Path(__file__).resolve().parent)
    p = subprocess.run([sys.executable, "-c", _WARM_CHECK, str(tmp_path), tests], capture_output=True, text=True,
                       timeout=300, env=env)
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout.strip().splitlines()[-1])
    assert all(v >= 1 for v in out["after_warm_up"].values()), out
    assert all(case == out["after_warm_up"] for case in out["after_writes"]), out


def test_prepare_is_collective():
    # every rank warms up, then all meet at a barrier
    calls = []

    class Comm:
        def barrier(self):
            calls.append("barrier")

    gen.prepare(Comm())
    assert calls == ["barrier"]
