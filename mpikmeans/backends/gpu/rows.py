"""One rank's rows on the device: resident column-major, or streamed through in chunks.

The rows live on the device column-major (structure of arrays, ``m x ld``), so
that a warp reads one attribute of 32 consecutive rows in one transaction.  They
are transposed on the GPU (:func:`transpose_kernel`) from row-major float64
blocks.  Rows that do not fit in device memory (or any load with
``chunk_rows``) are kept on the host column-major by chunk, pinned, and stream
through two device buffers on two CUDA streams, the copy of one chunk
overlapping the kernels of the other.  The labels (two arrays: this step's and
the last one's) and the weights stay on the device in both cases.
"""

from __future__ import annotations

import functools
import logging
import os
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from .compiled import compiled
from .device import SIM, DeviceLimits, cuda
from .launch import launch, pinned

if cuda is not None:
    from numba import float32, float64

log = logging.getLogger("mpikmeans.backends.gpu")


def round_up(a: int, b: int) -> int:
    """``a`` rounded up to a multiple of ``b``."""
    return (a + b - 1) // b * b


@functools.lru_cache(maxsize=None)
def transpose_kernel(storage: str):
    """Row-major float64 block (rows x m) -> column-major storage dtype, 32 x 32 tiles.

    Arguments: src (rows * m,), rows, m, dst (m * ld,), ld, row0.
    """
    DT = float64 if storage == "float64" else float32

    def km_transpose(src, rows, m, dst, ld, row0):
        tile = cuda.shared.array((32, 33), dtype=float64)
        tx = cuda.threadIdx.x
        ty = cuda.threadIdx.y
        i0 = cuda.blockIdx.x * 32
        j0 = cuda.blockIdx.y * 32
        for q in range(ty, 32, 8):
            i = i0 + q
            j = j0 + tx
            if i < rows and j < m:
                tile[q, tx] = src[i * m + j]
        cuda.syncthreads()
        for q in range(ty, 32, 8):
            j = j0 + q
            i = i0 + tx
            if i < rows and j < m:
                dst[j * ld + row0 + i] = DT(tile[tx, q])

    return cuda.jit(km_transpose)


def transpose_args(dtype: str) -> tuple:
    """Example arguments of :func:`transpose_kernel` (the types it is compiled for)."""
    return (cuda.device_array(1, dtype=np.float64), 0, 0, cuda.device_array(1, dtype=dtype), 0, 0)


class DeviceRows:
    """The rows, labels and weights of one rank on one device.

    Parameters
    ----------
    dtype : {"float64", "float32"}
        Storage precision of the rows.
    limits : DeviceLimits

    Attributes
    ----------
    n, m : int
    ld : int
        Row stride of the column-major storage (of a chunk when streaming).
    streaming : bool
    dx : device array (m * ld,)
        The rows (resident), or None.
    labels, old : device arrays (n,), int32
        This step's labels and the last step's (-1: none); :meth:`swap_labels` exchanges them.
    dw : device array (n,), float64, or None
        The weights.
    chunk, nchunks : int
        Rows per chunk and chunks (streaming).
    """

    def __init__(self, dtype: str, limits: DeviceLimits):
        self.dtype = dtype
        self.limits = limits
        self._clear()

    def _clear(self) -> None:
        self.n = self.m = self.ld = 0
        self.streaming = False
        self.dx = self.labels = self.old = self.dw = None
        self.chunk = self.nchunks = 0
        self.host_soa = self.streams = self.dbuf = None

    @property
    def weighted(self) -> bool:
        return self.dw is not None

    def load(self, x: np.ndarray, weights: np.ndarray | None, chunk_rows: int | None) -> None:
        """Copy row-major host rows to the device (resident when they fit and no chunks are asked for).

        Parameters
        ----------
        x : ndarray, shape (n, m), float64, C-contiguous
        weights : ndarray, shape (n,), float64, or None
        chunk_rows : int or None
        """
        self._clear()
        n, m = x.shape
        self.n, self.m = n, m
        if n == 0:
            return
        self.labels = cuda.to_device(np.full(n, -1, dtype=np.int32))
        self.old = cuda.to_device(np.full(n, -1, dtype=np.int32))
        self.dw = cuda.to_device(np.ascontiguousarray(weights, dtype=np.float64)) if weights is not None else None
        row_bytes = m * np.dtype(self.dtype).itemsize + 4  # the rows and the recheck's list
        if chunk_rows is None and n * row_bytes <= 0.8 * self.limits.free_memory():
            self.ld = round_up(n, 32)
            self.dx = cuda.device_array(m * self.ld, dtype=self.dtype)
            upload_soa(x, self.dx, self.ld)
        else:
            self._setup_streaming(x, row_bytes, chunk_rows)

    def swap_labels(self) -> None:
        """This step's labels become the last step's (and their array the next step's output)."""
        self.labels, self.old = self.old, self.labels

    def forget_labels(self) -> None:
        """Every label back to -1 (unknown)."""
        if self.labels is not None:
            self.labels.copy_to_device(np.full(self.n, -1, dtype=np.int32))

    def _setup_streaming(self, x: np.ndarray, row_bytes: int, chunk_rows: int | None) -> None:
        n, m = self.n, self.m
        if chunk_rows is not None:
            cr = chunk_rows
        else:  # two chunk buffers in 35% of the free memory each
            cr = int(0.35 * self.limits.free_memory() // max(1, row_bytes))
            cr = max(1024, cr // 1024 * 1024)
        cr = max(1, min(cr, n))
        self.chunk = cr
        self.ld = round_up(cr, 32)
        self.nchunks = -(-n // cr)
        # the host copy of the rows column-major by chunk, pinned where possible, so each
        # step's copies run at full speed with no host-side work
        try:
            host = cuda.pinned_array((self.nchunks, m * self.ld), dtype=self.dtype)
        except Exception:  # pragma: no cover - pinning refused: pageable, slower copies
            log.warning("could not pin %.1f GB of host memory; streaming from pageable memory",
                        self.nchunks * m * self.ld * np.dtype(self.dtype).itemsize / 1e9)
            host = np.empty((self.nchunks, m * self.ld), dtype=self.dtype)
        self.host_soa = host
        self.streams = [cuda.stream(), cuda.stream()]
        self.dbuf = [cuda.device_array(m * self.ld, dtype=self.dtype) for _ in range(2)]
        s = self.streams[0]
        for c in range(self.nchunks):
            a = c * cr
            b = min(n, a + cr)
            upload_soa(x[a:b], self.dbuf[0], self.ld, 0, stream=s)
            self.dbuf[0].copy_to_host(host[c], stream=s)
        s.synchronize()
        self.streaming = True

    def chunks(self):
        """The row blocks a pass goes through: ``(stream, x, ld, a, b)`` each, ``x`` holding rows ``a .. b-1``.

        Resident: one block, the whole store, on the default stream.  Streaming:
        each chunk's copy is issued on its stream as the generator reaches it,
        alternating between two streams and two buffers; the caller launches the
        chunk's kernels on the same stream before asking for the next chunk.
        """
        if not self.streaming:
            yield 0, self.dx, self.ld, 0, self.n
            return
        for c in range(self.nchunks):
            s = c % 2
            a = c * self.chunk
            b = min(self.n, a + self.chunk)
            self.dbuf[s].copy_to_device(self.host_soa[c], stream=self.streams[s])
            yield self.streams[s], self.dbuf[s], self.ld, a, b

    def synchronize(self) -> None:
        """Wait for every stream the rows use."""
        if self.streaming:
            for stream in self.streams:
                stream.synchronize()
        cuda.synchronize()

    def close(self) -> None:
        """Drop every device and pinned buffer."""
        self._clear()


def upload_soa(x: np.ndarray, dst, ld: int, row0: int = 0, stream=0) -> None:
    """Copy row-major float64 host rows into the column-major device array ``dst`` (``dst[j * ld + row0 + i]``,
    in ``dst``'s dtype) via the GPU.

    Blocks of rows go through two pinned host buffers: threads copy a block into
    one (a pageable copy to the device runs at a sixth of a pinned one's speed)
    while the other's block crosses to the device and is transposed there.

    Parameters
    ----------
    x : ndarray, shape (n, m), float64, C-contiguous
    dst : device array, shape (>= m * ld,), float64 or float32
    ld, row0 : int
    stream : CUDA stream, or 0 (a stream of its own; the call returns once the copy is over)
    """
    n, m = x.shape
    if n == 0:
        return
    dtype = str(dst.dtype)
    block_rows = max(32, min(n, (32 << 20) // max(1, m * 8)))
    tk = transpose_kernel(dtype)
    stage = [cuda.device_array(block_rows * m, dtype=np.float64, stream=stream) for _ in range(2)]
    kobj = compiled("transpose", (dtype,), tk, transpose_args(dtype))
    if SIM:
        for a in range(0, n, block_rows):
            b = min(n, a + block_rows)
            stage[0][: (b - a) * m].copy_to_device(x[a:b].ravel())
            launch(tk, kobj, (stage[0], b - a, m, dst, ld, row0 + a), (-(-(b - a) // 32), -(-m // 32)),
                   (32, 8), stream)
        return
    host = [pinned(block_rows * m, np.float64) for _ in range(2)]
    done = [None, None]
    if stream == 0:  # asynchronous copies need a stream of their own
        stream = cuda.stream()
    threads = max(1, min(8, os.cpu_count() or 1))
    with ThreadPoolExecutor(threads) as pool:
        for q, a in enumerate(range(0, n, block_rows)):
            j = q % 2
            b = min(n, a + block_rows)
            rows = b - a
            if done[j] is not None:
                done[j].synchronize()  # the copy out of host[j] two blocks ago is over
            src = x[a:b].reshape(-1)
            cuts = [rows * m * t // threads for t in range(threads + 1)]
            # numpy releases the GIL while it copies: the slices copy at once
            list(pool.map(lambda t: np.copyto(host[j][cuts[t]:cuts[t + 1]], src[cuts[t]:cuts[t + 1]]),
                          range(threads)))
            stage[j][: rows * m].copy_to_device(host[j][: rows * m], stream=stream)
            launch(tk, kobj, (stage[j], rows, m, dst, ld, row0 + a), (-(-rows // 32), -(-m // 32)), (32, 8),
                   stream)
            done[j] = cuda.event()
            done[j].record(stream=stream)
    stream.synchronize()
