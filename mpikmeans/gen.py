"""Synthetic input: Gaussian blobs around K random centres, written as ARFF.

The file depends only on (n, m, k, seed, spread, decimals), never on the number
of ranks that write it: rows are generated in fixed blocks of ``BLOCK_ROWS``,
each from its own random stream keyed by (seed, block index), and each rank
formats and writes its slice at offsets from an exchange of byte counts.

Writing streams: rank 0 knows where its rows go (right after the header) and
writes each block as soon as it is formatted; the other ranks keep up to
``HOLD_BYTES`` of text while they wait for the byte counts of the ranks before
them, and generate the rest a second time once they know their offsets.
Blocks are generated and formatted by a pool of threads (the random draws and
the compiled formatter release the GIL), and the file is written while the
next blocks are made.  The bytes never depend on the number of ranks or
threads.

Values are written in fixed point with ``decimals`` digits after the point.
The data set *is* that text: parsing a value gives the float64 nearest to the
decimal written, and formatting that float64 again gives back the same text,
so the file round-trips through float64 exactly.
"""

from __future__ import annotations

import os
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np

from .arff import header_text
from .errors import RunError
from .output import _tmp_name, publish, pwrite_all, remove_quietly
from .textfmt import MAX_FIELD, format_blob_rows, rows_text_bytes

#: Rows per random stream.  Part of the file format: changing it changes files.
BLOCK_ROWS = 1 << 16

#: Centres are drawn uniformly in [-CENTRE_BOX, CENTRE_BOX] per attribute.
CENTRE_BOX = 10.0

#: Bytes of formatted text a rank other than 0 keeps while it waits for its
#: offset in the file; blocks past it are generated again afterwards.
HOLD_BYTES = 512 << 20

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

    def __init__(self, spec: GenSpec, lo: int, hi: int):
        self.spec, self.lo, self.hi = spec, lo, hi
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
                                    bufs.text[pos:])
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
    """The ARFF text of rows ``[lo, hi)``, in pieces of at most one block.

    Returns
    -------
    list of ndarray of uint8
    """
    maker = _Maker(spec, lo, hi)
    bufs = maker.buffers()
    return [maker.text(block, bufs).copy() for block in _blocks(lo, hi)]


def _in_order(pool, fn, items, ahead: int):
    """``fn(item)`` for each item on ``pool``, results in order, at most ``ahead`` running."""
    items = iter(items)
    running: deque = deque()
    for item in items:
        running.append(pool.submit(fn, item))
        if len(running) >= ahead:
            break
    while running:
        result = running.popleft().result()
        for item in items:
            running.append(pool.submit(fn, item))
            break
        yield result


def default_threads(comm) -> int:
    """Threads per rank: the node's cores shared by its ranks (as the CPU backend)."""
    from .backends.cpu import default_threads as cores_per_rank

    return cores_per_rank(comm.node_size)


def write_blobs(spec: GenSpec, path: str, comm, threads: int | None = None) -> int:
    """Generate and write the data set, every rank its own slice (collective).

    Parameters
    ----------
    spec : GenSpec
    path : str
        Appears only once the whole file is written.
    comm : Comm or SerialComm
    threads : int, optional
        Threads making this rank's blocks; default: the node's cores
        divided by its ranks.  The bytes do not depend on it.

    Returns
    -------
    int
        Bytes written.

    Raises
    ------
    ValueError
        ``spec`` is invalid (on every rank, before any collective).
    RunError
        On every rank, if any rank could not write.
    """
    spec.validate()
    threads = max(1, threads or default_threads(comm))
    lo, hi = rows_of_rank(spec.n, comm.rank, comm.size)
    maker = _Maker(spec, lo, hi)
    blocks = _blocks(lo, hi)
    head = header_text(spec.relation, [f"X{j + 1}" for j in range(spec.m)])
    block_bytes = maker.block_rows * spec.m * MAX_FIELD  # one text buffer
    ahead = max(2, min(threads + 1, BUFFER_BYTES // block_bytes))  # blocks in flight
    workers = min(threads, ahead)

    free: list = []  # buffers not in use; a block takes one while it is made

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

    pool = ThreadPoolExecutor(max_workers=workers) if workers > 1 and len(blocks) > 1 else None

    def ordered(fn, items):
        return map(fn, items) if pool is None else _in_order(pool, fn, items, ahead)

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
        sizes: list = []  # bytes of each of this rank's blocks
        held: list = []  # (buffers, text) of the first blocks, until the offset is known
        n_held = 0
        try:
            if comm.rank == 0:
                # rank 0's rows follow the header: write them as they come
                at = len(head)
                for bufs, text in ordered(text_of, blocks):
                    pwrite_all(fd, text, at)
                    at += len(text)
                    sizes.append(len(text))
                    free.append(bufs)
            else:
                # keep the text that fits in HOLD_BYTES; of the rest, only its length for now
                n_held = min(len(blocks), HOLD_BYTES // block_bytes)
                held = list(ordered(text_of, blocks[:n_held]))
                sizes = [len(text) for _, text in held] + list(ordered(size_of, blocks[n_held:]))
        except OSError as exc:
            error = RunError(f"{path}: cannot write: {exc.strerror}")
        comm.agree(error)
        counts = comm.allgather(sum(sizes))
        total = len(head) + sum(counts)
        try:
            if comm.rank != 0 and sum(sizes):
                fd = os.open(tmp, os.O_WRONLY)
                starts = len(head) + sum(counts[: comm.rank]) + np.concatenate([[0], np.cumsum(sizes)])
                for k, (bufs, text) in enumerate(held):
                    pwrite_all(fd, text, int(starts[k]))
                    free.append(bufs)
                held = []

                def write(k: int) -> None:
                    bufs, text = text_of(blocks[k])
                    try:
                        if len(text) != sizes[k]:  # the two kernels must agree, or the file is garbled
                            raise RuntimeError(f"gen-data: block {blocks[k]} has {len(text)} bytes, "
                                               f"{sizes[k]} were counted")
                        pwrite_all(fd, text, int(starts[k]))
                    finally:
                        free.append(bufs)

                for _ in ordered(write, range(n_held, len(blocks))):
                    pass
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
