"""Synthetic input: Gaussian blobs around K random centres, written as ARFF (or CSV, TSV).

The file depends only on (n, m, k, seed, spread, decimals), never on the number
of ranks that write it: rows are generated in fixed blocks of ``BLOCK_ROWS``,
each from its own random stream keyed by (seed, block index), and each rank
formats and writes its slice at offsets from an exchange of byte counts.

Writing: a block's place in the file is the byte count of everything before
it.  With one rank, blocks are made by a pool of threads and each thread
writes its block itself as soon as the block before it is formatted (its
offset is then known).  With several ranks, a rank's offset is the byte count
of all the ranks before it, so every rank first counts the bytes of its blocks
(the same draws, only the lengths of the numbers), the counts are exchanged,
and then every rank makes and writes its blocks at once, each thread its own.
No rank waits for another's writes, and no rank keeps text in memory: the
count costs a second pass over the random draws, less than holding the text
and writing it only after the exchange (measured).  The random draws and the
compiled kernels release the GIL.  The bytes never depend on the number of
ranks or threads.

The file's name decides its header and delimiter (:func:`mpikmeans.io.formats.text_output`:
``*.csv`` a line of column names and commas, ``*.tsv`` the same with tabs,
any other name an ARFF header); the values are the same in each.

Values are written in fixed point with ``decimals`` digits after the point.
The data set *is* that text: parsing a value gives the float64 nearest to the
decimal written, and formatting that float64 again gives back the same text,
so the file round-trips through float64 exactly.
"""

from __future__ import annotations

import os
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np

from ..errors import RunError
from .formats import text_output
from .output import _tmp_name, publish, pwrite_all, remove_quietly
from .textfmt import MAX_FIELD, format_blob_rows, rows_text_bytes

#: Rows per random stream.  Part of the file format: changing it changes files.
BLOCK_ROWS = 1 << 16

#: Centres are drawn uniformly in [-CENTRE_BOX, CENTRE_BOX] per attribute.
CENTRE_BOX = 10.0

#: Random values drawn at a time within a block (bounds each thread's buffers).
CHUNK_VALUES = 1 << 19

#: Bytes of text buffers (one block each, room for 22 bytes a value) that one
#: rank's threads fill at once; fewer blocks are in flight when ``m`` is large.
BUFFER_BYTES = 2 << 30


@dataclass
class GenSpec:
    """What to generate."""

    n: int
    m: int
    k: int
    seed: int = 0
    spread: float = 1.0
    decimals: int = 10
    relation: str = "mpikmeans-blobs"

    def validate(self) -> None:
        """Raise ValueError for settings that cannot make a file."""
        if self.n < 1 or self.m < 1 or self.k < 1:
            raise ValueError("n, m and k must be at least 1")
        if not np.isfinite(self.spread) or self.spread < 0:
            raise ValueError("spread must be a finite number >= 0")
        if not 0 <= self.decimals <= 14:
            raise ValueError("decimals must be in [0, 14]")
        # the largest |value| must stay an exact integer count of ticks in float64
        bound = (CENTRE_BOX + 40 * self.spread) * 10.0 ** self.decimals
        if bound >= 2.0**53:
            raise ValueError(
                f"spread {self.spread} with {self.decimals} decimals exceeds float64's exact range; "
                "lower --decimals or --spread"
            )


def blob_centres(spec: GenSpec) -> np.ndarray:
    """The true centres of the blobs.

    Returns
    -------
    ndarray, shape (k, m), float64
    """
    rng = np.random.default_rng([spec.seed, 0])
    return rng.uniform(-CENTRE_BOX, CENTRE_BOX, size=(spec.k, spec.m))


def generate_block(spec: GenSpec, block: int, centres: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Rows of one block as fixed-point ticks, and their true blob.

    Returns
    -------
    ticks : ndarray, shape (rows, m), int64
        Values times ``10**decimals``.
    blob : ndarray, shape (rows,), int64
    """
    lo = block * BLOCK_ROWS
    rows = min(BLOCK_ROWS, spec.n - lo)
    rng = np.random.default_rng([spec.seed, 1, block])
    blob = rng.integers(0, spec.k, size=rows)
    x = centres[blob] + spec.spread * rng.standard_normal((rows, spec.m))
    return np.rint(x * 10.0**spec.decimals).astype(np.int64), blob


def rows_of_rank(n: int, rank: int, size: int) -> tuple[int, int]:
    """The rows ``[lo, hi)`` rank ``rank`` of ``size`` generates."""
    return n * rank // size, n * (rank + 1) // size


def _blocks(lo: int, hi: int) -> range:
    """The blocks that hold rows ``[lo, hi)``."""
    if hi <= lo:
        return range(0)
    return range(lo // BLOCK_ROWS, (hi - 1) // BLOCK_ROWS + 1)


class _Maker:
    """Makes the text (or only its length) of rows ``[lo, hi)`` one block at a time.

    A block's rows are drawn in chunks of about ``CHUNK_VALUES`` values from
    the block's stream (the same numbers as one draw of the whole block) and
    each chunk is formatted straight from the draws, so the buffers stay
    small whatever ``m``.  :meth:`text` and :meth:`size` may run in several
    threads at once, each with its own :class:`_Buffers`.
    """

    def __init__(self, spec: GenSpec, lo: int, hi: int, delimiter: str = ","):
        self.spec, self.lo, self.hi, self.delimiter = spec, lo, hi, delimiter
        self.centres = blob_centres(spec)
        self.block_rows = BLOCK_ROWS
        self.chunk = max(1, min(self.block_rows, CHUNK_VALUES // spec.m))

    def _chunks(self, block: int, z: np.ndarray):
        """``(blob, z, first, last)`` per chunk: draws of rows ``[r0, r1)``, write rows ``first..last`` of them."""
        spec = self.spec
        b0 = block * self.block_rows
        rows = min(self.block_rows, spec.n - b0)
        a, b = max(self.lo, b0) - b0, min(self.hi, b0 + rows) - b0
        rng = np.random.default_rng([spec.seed, 1, block])
        blob = rng.integers(0, spec.k, size=rows)
        for r0 in range(0, b, self.chunk):  # rows after b are never needed
            r1 = min(b, r0 + self.chunk)
            zc = z[: (r1 - r0) * spec.m].reshape(r1 - r0, spec.m)
            rng.standard_normal(out=zc)
            if r1 > a:
                yield blob[r0:r1], zc, max(a, r0) - r0, r1 - r0

    def buffers(self) -> _Buffers:
        return _Buffers(np.empty(self.chunk * self.spec.m),
                        np.empty(self.block_rows * self.spec.m * MAX_FIELD, dtype=np.uint8))

    def text(self, block: int, bufs: _Buffers) -> np.ndarray:
        """The block's text (its rows in ``[lo, hi)``), a view of ``bufs.text``."""
        spec, pos = self.spec, 0
        for blob, z, first, last in self._chunks(block, bufs.z):
            pos += format_blob_rows(self.centres, blob, z, first, last, spec.spread, spec.decimals,
                                    bufs.text[pos:], self.delimiter)
        return bufs.text[:pos]

    def size(self, block: int, bufs: _Buffers) -> int:
        """Bytes of the block's text, without writing it."""
        spec = self.spec
        return sum(rows_text_bytes(self.centres, blob, z, first, last, spec.spread, spec.decimals)
                   for blob, z, first, last in self._chunks(block, bufs.z))


@dataclass
class _Buffers:
    z: np.ndarray
    text: np.ndarray


def local_rows_text(spec: GenSpec, lo: int, hi: int) -> list:
    """The text of rows ``[lo, hi)`` (commas between values), in pieces of at most one block.

    Returns
    -------
    list of ndarray of uint8
    """
    maker = _Maker(spec, lo, hi)
    bufs = maker.buffers()
    return [maker.text(block, bufs).copy() for block in _blocks(lo, hi)]


def warm_up() -> None:
    """Pay the writer's one-time start-up now, on a one-value file, so no writing is timed with it.

    The first call of any Numba function in a process initialises Numba
    itself, and the first call of each kernel loads it from Numba's on-disk
    cache (see :func:`mpikmeans.io.arff.warm_up`): paid once per process whatever
    the file size.  Both formatting kernels (the text and the byte count) are
    called here with the argument types :func:`write_blobs` gives them.
    """
    maker = _Maker(GenSpec(n=1, m=1, k=1), 0, 1)
    bufs = maker.buffers()
    maker.text(0, bufs)
    maker.size(0, bufs)


def prepare(comm) -> None:
    """:func:`warm_up` on every rank, then a barrier, so the writing that follows starts on every rank at once.

    Collective.  ``gen-data`` times this apart from :func:`write_blobs`.
    """
    warm_up()
    comm.barrier()


def default_threads(comm) -> int:
    """Threads per rank: this rank's share of its node's CPUs, lowered by ``OMP_NUM_THREADS`` (as ``run`` uses)."""
    from ..comm import default_threads as threads_per_rank

    return threads_per_rank(comm)


class _Offsets:
    """Where each of a rank's blocks goes in the file, shared by the threads writing them.

    Known from the start (several ranks: the byte counts were exchanged), or
    learnt block after block (one rank: a block's offset is known once the
    block before it is formatted).  A thread that fails at block ``j`` wakes the
    waiting ones: those after ``j`` stop (their offset will never come), those
    before it go on, so the first error in block order is the cause, not a
    consequence.
    """

    def __init__(self, first: int, n: int, sizes: list | None = None):
        self._at = [None] * (n + 1)
        self._at[0] = first
        if sizes is not None:
            self._at[1:] = (first + np.cumsum(np.asarray(sizes, dtype=np.int64))).tolist()
        self._cond = threading.Condition()
        self._failed_at = n + 1  # the first block that failed (none yet)

    def place(self, k: int, size: int) -> int:
        """The offset of block ``k``, whose text has ``size`` bytes (waits for block ``k - 1``'s size)."""
        with self._cond:
            self._cond.wait_for(lambda: self._at[k] is not None or self._failed_at < k)
            if self._at[k] is None:
                raise RuntimeError(f"gen-data: block {self._failed_at} failed before block {k}")
            if self._at[k + 1] is None:
                self._at[k + 1] = self._at[k] + size
                self._cond.notify_all()
            elif self._at[k + 1] - self._at[k] != size:  # the two kernels must agree, or the file is garbled
                raise RuntimeError(f"gen-data: block {k} has {size} bytes, {self._at[k + 1] - self._at[k]} "
                                   "were counted")
            return self._at[k]

    def fail(self, k: int) -> None:
        """Block ``k`` will not be placed: blocks after it cannot be."""
        with self._cond:
            self._failed_at = min(self._failed_at, k)
            self._cond.notify_all()

    @property
    def end(self) -> int:
        return self._at[-1]


def write_blobs(spec: GenSpec, path: str, comm, threads: int | None = None) -> int:
    """Generate and write the data set, every rank its own slice (collective).

    Parameters
    ----------
    spec : GenSpec
    path : str
        Appears only once the whole file is written; its name decides the
        header and delimiter (:func:`mpikmeans.io.formats.text_output`).
    comm : Comm or SerialComm
    threads : int, optional
        Threads making and writing this rank's blocks; default:
        ``OMP_NUM_THREADS``, else the node's CPUs divided by its ranks
        (:func:`mpikmeans.comm.default_threads`).  The bytes do not depend on it.

    Returns
    -------
    int
        Bytes written.

    Raises
    ------
    ValueError
        ``spec`` is invalid (on every rank, before any collective).
    UsageError
        ``path`` names a binary or compressed file (on every rank, before any collective).
    RunError
        On every rank, if any rank could not write.
    """
    spec.validate()
    head, delimiter = text_output(path, spec.relation, [f"X{j + 1}" for j in range(spec.m)])
    threads = max(1, threads or default_threads(comm))
    lo, hi = rows_of_rank(spec.n, comm.rank, comm.size)
    maker = _Maker(spec, lo, hi, delimiter)
    blocks = _blocks(lo, hi)
    block_bytes = maker.block_rows * spec.m * MAX_FIELD  # one text buffer
    workers = max(1, min(threads, BUFFER_BYTES // block_bytes, len(blocks)))  # one buffer each
    free: list = []  # buffers not in use (list.pop and list.append are atomic)

    def take() -> _Buffers:
        try:
            return free.pop()
        except IndexError:
            return maker.buffers()

    def text_of(block: int):
        bufs = take()
        return bufs, maker.text(block, bufs)

    def size_of(block: int) -> int:
        bufs = take()
        try:
            return maker.size(block, bufs)
        finally:
            free.append(bufs)

    pool = ThreadPoolExecutor(max_workers=workers) if workers > 1 else None

    def each(fn, items) -> list:
        """``fn`` of every item on the pool's threads, results in order (the first error raised)."""
        return list(map(fn, items) if pool is None else pool.map(fn, items))

    error = None
    fd = None
    tmp = comm.bcast(_tmp_name(path) if comm.rank == 0 else None, root=0)
    try:
        if comm.rank == 0:
            try:
                fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
                pwrite_all(fd, head, 0)
            except OSError as exc:
                error = RunError(f"{path}: cannot write: {exc.strerror}")
        comm.agree(error)  # the file exists, or every rank stops here
        sizes, total = None, None
        if comm.size > 1:
            # this rank's rows start after the bytes of the ranks before it: count, exchange
            sizes = each(size_of, blocks)
            counts = comm.allgather(sum(sizes))
            total = len(head) + sum(counts)
        offsets = _Offsets(len(head) + (sum(counts[: comm.rank]) if sizes is not None else 0), len(blocks), sizes)

        def write(k: int) -> None:
            try:
                bufs, text = text_of(blocks[k])
                try:
                    pwrite_all(fd, text, offsets.place(k, len(text)))
                finally:
                    free.append(bufs)
            except BaseException:
                offsets.fail(k)  # no thread may wait for an offset after this block
                raise

        try:
            if fd is None and blocks:
                fd = os.open(tmp, os.O_WRONLY)
            # each thread writes the block it made: no thread waits for another's writes
            each(write, range(len(blocks)))
            if total is None:
                total = offsets.end
            if comm.rank == 0:
                os.ftruncate(fd, total)
            if fd is not None:
                os.fsync(fd)
        except OSError as exc:
            error = RunError(f"{path}: cannot write: {exc.strerror}")
        comm.agree(error)
    except RunError:
        if comm.rank == 0:
            remove_quietly(tmp)
        raise
    finally:
        if fd is not None:
            os.close(fd)
        if pool is not None:
            pool.shutdown(cancel_futures=True)
    publish(comm, tmp, path)
    return total
