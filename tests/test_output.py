"""Tests for :mod:`mpikmeans.io.output`: centres CSV round trip, atomic writes, the
collective file writer (ranks simulated with threads) and the result files."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from threadcomm import run_ranks  # noqa: E402

from mpikmeans.errors import RunError  # noqa: E402
from mpikmeans.io.output import (  # noqa: E402
    CENTERS,
    LABELS,
    SUMMARY,
    centres_csv,
    read_centres_csv,
    write_arrays,
    write_atomic,
    write_parallel,
    write_summary,
)


def temp_files(directory) -> list:
    return sorted(p.name for p in Path(directory).iterdir() if ".tmp" in p.name)


# --------------------------------------------------------------------------- centres CSV

def awkward_centres(seed=0, k=6, m=4) -> np.ndarray:
    rng = np.random.default_rng(seed)
    c = rng.standard_normal((k, m)) * 10.0 ** rng.integers(-300, 300, size=(k, m))
    c[0] = [0.1, -0.0, 1e-320, 1.7976931348623157e308][:m] + [0.0] * (m - 4)
    c[1] = [1 / 3, -2 / 3, 123456789.123456789, 5e-324][:m] + [1.0] * (m - 4)
    return c


@pytest.mark.parametrize("names", [["a", "b", "c", "d"], ["petal length", 'q"uote', "comma,name", "naïve"]])
def test_centres_round_trip_bit_exact(tmp_path, names):
    c = awkward_centres()
    path = tmp_path / CENTERS
    path.write_bytes(centres_csv(c, names))
    back, got_names = read_centres_csv(str(path))
    assert back.dtype == np.float64
    assert back.tobytes() == c.tobytes()
    assert got_names == names


def test_centres_csv_layout():
    text = centres_csv(np.array([[1.0, -0.5], [0.1, 2.0]]), ["X1", "X2"]).decode()
    assert text == "X1,X2\n1.0,-0.5\n0.1,2.0\n"


def test_centres_round_trip_numeric_names(tmp_path):
    # ARFF attribute names may look like numbers ('@attribute 1 numeric'): the
    # header line must still come back as names, not as a row of centres
    c = awkward_centres(1, k=3, m=3)
    path = tmp_path / CENTERS
    path.write_bytes(centres_csv(c, ["1", "2", "3"]))
    # names that look like numbers: the caller passes the data's names to recognise the header
    back, names = read_centres_csv(str(path), ["1", "2", "3"])
    assert back.shape == (3, 3)
    assert back.tobytes() == c.tobytes()
    assert names == ["1", "2", "3"]


def test_read_plain_csv(tmp_path):
    path = tmp_path / "plain.csv"
    path.write_text("1,2\n# a comment\n\n3.5,-4e-3\n")
    c, names = read_centres_csv(str(path))
    assert names is None
    assert c.tolist() == [[1.0, 2.0], [3.5, -4e-3]]


def test_read_ragged(tmp_path):
    path = tmp_path / "ragged.csv"
    path.write_text("a,b\n1,2\n3,4,5\n")
    with pytest.raises(ValueError, match="different numbers"):
        read_centres_csv(str(path))


def test_read_not_a_number_names_the_line(tmp_path):
    path = tmp_path / "bad.csv"
    path.write_text("a,b\n1,2\n3,x\n")
    with pytest.raises(ValueError, match=r"line 3\b"):
        read_centres_csv(str(path))
    path.write_text("1,2\nfoo,4\n")
    with pytest.raises(ValueError, match=r"line 2\b"):
        read_centres_csv(str(path))


def test_read_not_a_number_line_counts_skipped_lines(tmp_path):
    # comment and blank lines are skipped, but they are lines of the file: the
    # message must name the physical line (5 here), as an editor shows it
    path = tmp_path / "bad.csv"
    path.write_text("a,b\n# made by hand\n1,2\n\n3,x\n")
    with pytest.raises(ValueError, match=r"line 5\b"):
        read_centres_csv(str(path))


def test_read_empty(tmp_path):
    path = tmp_path / "empty.csv"
    path.write_text("a,b\n")
    with pytest.raises(ValueError, match="no rows"):
        read_centres_csv(str(path))


# --------------------------------------------------------------------------- write_atomic

def test_write_atomic_replaces(tmp_path):
    path = tmp_path / "f.txt"
    write_atomic(str(path), b"first version, quite long\n")
    assert path.read_bytes() == b"first version, quite long\n"
    with open(path, "rb") as old:
        write_atomic(str(path), b"second\n")
        # a rename, not an overwrite in place: a reader of the old file still
        # sees all of it
        assert old.read() == b"first version, quite long\n"
    assert path.read_bytes() == b"second\n"
    assert os.listdir(tmp_path) == ["f.txt"]


def test_write_atomic_failure_leaves_nothing(tmp_path):
    target = tmp_path / "adir"
    target.mkdir()
    (target / "keep").write_text("x")
    with pytest.raises(RunError) as info:
        write_atomic(str(target), b"data")  # cannot replace a directory by a file
    assert str(target) in info.value.message
    assert (target / "keep").read_text() == "x"
    assert temp_files(tmp_path) == []
    with pytest.raises(RunError):
        write_atomic(str(tmp_path / "missing" / "f.txt"), b"data")


# --------------------------------------------------------------------------- write_parallel

PIECES = {
    0: [b"alpha\n", np.frombuffer(b"beta\n", dtype=np.uint8)],
    1: [],
    2: [b"", b"gamma-gamma\n"],
    3: [np.frombuffer(b"d\n" * 1000, dtype=np.uint8), b"e\n"],
}


def _pieces(rank, size):
    # ranks beyond the table write nothing; rank size-1 always writes
    p = PIECES.get(rank, [])
    if rank == size - 1 and not p:
        p = [b"last\n"]
    return p


@pytest.mark.parametrize("ranks", [1, 2, 3, 4])
@pytest.mark.parametrize("head", [b"@relation h\n@data\n", b""])
def test_write_parallel_same_bytes_as_join(tmp_path, ranks, head):
    path = tmp_path / "out.txt"
    path.write_bytes(b"an old, longer file " * 1000)  # must be replaced entirely

    def body(comm):
        # only rank 0's head counts
        return write_parallel(comm, str(path), head if comm.rank == 0 else b"IGNORED", _pieces(comm.rank, comm.size))

    totals = run_ranks(ranks, body)
    expected = head + b"".join(bytes(p) for r in range(ranks) for p in _pieces(r, ranks))
    assert path.read_bytes() == expected
    assert totals == [len(expected)] * ranks
    assert temp_files(tmp_path) == []


def test_write_parallel_all_ranks_empty(tmp_path):
    path = tmp_path / "empty.txt"
    run_ranks(3, lambda comm: write_parallel(comm, str(path), b"", []))
    assert path.exists() and path.read_bytes() == b""


@pytest.mark.parametrize("ranks", [1, 3])
def test_write_parallel_missing_directory(tmp_path, ranks):
    path = tmp_path / "nope" / "out.txt"
    out = run_ranks(ranks, lambda comm: write_parallel(comm, str(path), b"h", [b"x"]), return_exceptions=True)
    assert all(isinstance(e, RunError) and e.collective for e in out), out
    assert len({e.message for e in out}) == 1 and str(path) in out[0].message
    assert not path.exists()


@pytest.mark.parametrize("ranks", [1, 3])
def test_write_parallel_rename_fails(tmp_path, ranks):
    path = tmp_path / "taken"
    path.mkdir()  # the final name is a directory: the rename fails after the writes
    (path / "inside").write_text("x")
    out = run_ranks(ranks, lambda comm: write_parallel(comm, str(path), b"h", [b"x" * 10]), return_exceptions=True)
    assert all(isinstance(e, RunError) and e.collective for e in out), out
    assert len({e.message for e in out}) == 1
    assert temp_files(tmp_path) == []
    assert (path / "inside").read_text() == "x"


@pytest.mark.parametrize("failing_rank", [0, 2])
def test_write_parallel_disk_full_on_one_rank(tmp_path, monkeypatch, failing_rank):
    import errno
    import threading

    real_pwrite = os.pwrite

    def pwrite(fd, data, offset):
        if threading.current_thread().name == f"rank-{failing_rank}" and len(data) > 0 and offset > 0:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real_pwrite(fd, data, offset)

    monkeypatch.setattr(os, "pwrite", pwrite)
    path = tmp_path / "out.txt"
    out = run_ranks(3, lambda comm: write_parallel(comm, str(path), b"head\n", [b"row %d\n" % comm.rank]),
                    return_exceptions=True)
    assert all(isinstance(e, RunError) and e.collective for e in out), out
    assert len({e.message for e in out}) == 1
    assert str(path) in out[0].message and os.strerror(errno.ENOSPC) in out[0].message
    assert not path.exists()
    assert temp_files(tmp_path) == []


@pytest.mark.skipif(hasattr(os, "geteuid") and os.geteuid() == 0, reason="root ignores directory permissions")
def test_write_parallel_read_only_directory(tmp_path):
    d = tmp_path / "ro"
    d.mkdir()
    d.chmod(0o500)
    try:
        out = run_ranks(3, lambda comm: write_parallel(comm, str(d / "f"), b"", [b"x"]), return_exceptions=True)
        assert all(isinstance(e, RunError) for e in out)
        assert os.listdir(d) == []
    finally:
        d.chmod(0o700)


# --------------------------------------------------------------------------- result files

@pytest.mark.parametrize("ranks", [1, 2, 3])
def test_write_arrays_and_summary(tmp_path, ranks):
    out_dir = tmp_path / "deep" / "res.mpikmeans"
    out_dir.mkdir(parents=True)
    (out_dir / SUMMARY).write_text('{"stale": true}\n')
    centres = awkward_centres(2, k=3, m=2)
    names = ["x", "y y"]
    labels = np.array([0, 2, 1, 1, 0, 2, 2, 0, 1, 10], dtype=np.int32)
    cuts = np.linspace(0, len(labels), ranks + 1).astype(int)
    cuts[1] = 0 if ranks > 2 else cuts[1]  # rank 0 holds no rows with 3 ranks

    def body(comm):
        mine = labels[cuts[comm.rank]:cuts[comm.rank + 1]]
        write_arrays(comm, str(out_dir), centres, names, mine)
        stale_gone = not (out_dir / SUMMARY).exists()
        comm.barrier()
        write_summary(comm, str(out_dir), {"k": 3, "ranks": comm.size})
        return stale_gone

    assert run_ranks(ranks, body) == [True] * ranks
    assert (out_dir / CENTERS).read_bytes() == centres_csv(centres, names)
    assert (out_dir / LABELS).read_text() == "".join(f"{v}\n" for v in labels)
    assert json.loads((out_dir / SUMMARY).read_text()) == {"k": 3, "ranks": ranks}
    assert temp_files(out_dir) == []


def test_write_arrays_creates_directory(tmp_path):
    out_dir = tmp_path / "a" / "b"
    run_ranks(2, lambda comm: write_arrays(comm, str(out_dir), np.zeros((1, 1)), ["v"],
                                           np.zeros(comm.rank + 1, dtype=np.int64)))
    assert (out_dir / LABELS).read_text() == "0\n0\n0\n"
    assert (out_dir / CENTERS).read_text() == "v\n0.0\n"


def test_write_arrays_output_dir_is_a_file(tmp_path):
    out_dir = tmp_path / "file"
    out_dir.write_text("not a directory")
    out = run_ranks(3, lambda comm: write_arrays(comm, str(out_dir), np.zeros((1, 1)), ["v"], np.zeros(2, dtype=int)),
                    return_exceptions=True)
    assert all(isinstance(e, RunError) and e.collective for e in out), out
    assert len({e.message for e in out}) == 1
    assert out_dir.read_text() == "not a directory"


def test_write_summary_failure_reaches_every_rank(tmp_path):
    out_dir = tmp_path / "gone"
    out = run_ranks(3, lambda comm: write_summary(comm, str(out_dir), {"k": 1}), return_exceptions=True)
    assert all(isinstance(e, RunError) and e.collective for e in out), out


# --------------------------------------------------------------------------- the results directory as a whole

from mpikmeans.errors import UsageError  # noqa: E402
from mpikmeans.io import output as output_module  # noqa: E402
from mpikmeans.io.output import CLUSTERED, ResultsDir, order_by_header  # noqa: E402


def _files(directory: Path) -> dict:
    return {p.name: p.read_bytes() for p in sorted(Path(directory).iterdir())}


def _publish(ranks: int, out: Path, overwrite: bool, files: dict, own=(), data=None, mode=None) -> list:
    """One run's results written through :class:`ResultsDir` by ``ranks`` ranks."""
    def body(comm):
        results = ResultsDir(comm, str(out), overwrite, own=own, data=data)
        if mode is not None:
            results._mode = mode
        staging = results.stage()
        if comm.rank == 0:
            for name, content in files.items():
                write_atomic(os.path.join(staging, name), content)
        comm.barrier()
        results.publish()
        return results.staging

    return run_ranks(ranks, body)


@pytest.mark.parametrize("ranks", [1, 3])
def test_results_dir_new_appears_whole(tmp_path, ranks):
    out = tmp_path / "a" / "b" / "res"
    _publish(ranks, out, False, {CENTERS: b"c\n", LABELS: b"0\n", SUMMARY: b"{}\n"})
    assert _files(out) == {CENTERS: b"c\n", LABELS: b"0\n", SUMMARY: b"{}\n"}
    assert sorted(p.name for p in (tmp_path / "a" / "b").iterdir()) == ["res"]  # no staging left


@pytest.mark.parametrize("mode", [None, "replace"])
@pytest.mark.parametrize("exchange", [True, False])
def test_results_dir_overwrite_replaces_the_whole_directory(tmp_path, monkeypatch, mode, exchange):
    if not exchange:  # a file system without renameat2's exchange: two renames
        monkeypatch.setattr(output_module, "_exchange", lambda a, b: False)
    out = tmp_path / "res"
    _publish(1, out, False, {CENTERS: b"old c\n", LABELS: b"old l\n", CLUSTERED: b"old arff\n", SUMMARY: b"{1}\n"})
    (out / "checkpoint.npz").write_bytes(b"a stopped run's state")
    _publish(3, out, True, {CENTERS: b"new c\n", LABELS: b"new l\n", SUMMARY: b"{2}\n"}, mode=mode)
    expected = {CENTERS: b"new c\n", LABELS: b"new l\n", SUMMARY: b"{2}\n"}
    if mode == "replace":  # file by file: only the results are replaced
        expected["checkpoint.npz"] = b"a stopped run's state"
    assert _files(out) == expected  # no stale clustered.arff
    assert sorted(p.name for p in tmp_path.iterdir()) == ["res"]


def test_results_dir_into_a_directory_without_results_keeps_its_files(tmp_path):
    out = tmp_path / "res"
    out.mkdir()
    (out / "notes.txt").write_text("mine\n")
    _publish(2, out, False, {CENTERS: b"c\n", SUMMARY: b"{}\n"})
    assert _files(out) == {CENTERS: b"c\n", SUMMARY: b"{}\n", "notes.txt": b"mine\n"}


def test_results_dir_refusals_name_the_files(tmp_path):
    out = tmp_path / "res"
    _publish(1, out, False, {CENTERS: b"c\n", SUMMARY: b'{"data": "/x/other.arff"}\n'})
    before = _files(out)
    errors = run_ranks(3, lambda comm: ResultsDir(comm, str(out), False, data="/x/this.arff"), return_exceptions=True)
    assert all(isinstance(e, UsageError) and e.collective for e in errors)
    assert "already holds results of another data file, /x/other.arff" in errors[0].message
    assert "--overwrite" in errors[0].message
    (out / "mine.txt").write_text("x")
    errors = run_ranks(2, lambda comm: ResultsDir(comm, str(out), True), return_exceptions=True)
    assert all(isinstance(e, UsageError) for e in errors) and "mine.txt" in errors[0].message
    # this run's own checkpoint may be there
    (out / "mine.txt").unlink()
    (out / "state.npz").write_bytes(b"s")
    run_ranks(2, lambda comm: ResultsDir(comm, str(out), True, own=[str(out / "state.npz")]))
    assert _files(out) == {**before, "state.npz": b"s"}
    file = tmp_path / "plain"
    file.write_text("x")
    errors = run_ranks(1, lambda comm: ResultsDir(comm, str(file), True), return_exceptions=True)
    assert isinstance(errors[0], UsageError) and "not a directory" in errors[0].message


def test_results_dir_discard_leaves_nothing(tmp_path):
    out = tmp_path / "x" / "y" / "res"

    def body(comm):
        results = ResultsDir(comm, str(out), False)
        staging = results.stage()
        if comm.rank == 0:
            write_atomic(os.path.join(staging, CENTERS), b"half\n")
        comm.barrier()
        results.discard()

    run_ranks(3, body)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("header, names, order", [
    (["a", "b", "c"], ["a", "b", "c"], [0, 1, 2]),
    (["c", "a", "b"], ["a", "b", "c"], [1, 2, 0]),
    ([" b ", "a"], ["a", "b"], [1, 0]),
])
def test_order_by_header(header, names, order):
    assert order_by_header(header, names, "f.csv") == order


@pytest.mark.parametrize("header, needle", [
    (["a", "b", "x"], "columns the data does not cluster: 'x'"),
    (["a", "b"], "no column for 'c'"),
    (["a", "a", "b", "c"], "columns named twice: 'a'"),
])
def test_order_by_header_names_the_mismatch(header, needle):
    with pytest.raises(ValueError, match=needle):
        order_by_header(header, ["a", "b", "c"], "f.csv")
