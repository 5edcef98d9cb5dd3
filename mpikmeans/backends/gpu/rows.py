"""One rank's rows on the device: resident column-major, or streamed through in chunks.

The rows live on the device column-major (structure of arrays, ``m x ld``), so
that a warp reads one attribute of 32 consecutive rows in one transaction.  They
are transposed on the GPU (:func:`transpose_kernel`) from row-major float64 blocks
and stay resident; rows that do not fit in device memory (or any load with
``chunk_rows``) are kept on the host in chunk-column-major order, pinned, and
stream through two device buffers on two CUDA streams, the copy of one chunk
overlapping the kernels on the other.
"""

from __future__ import annotations

import functools
import logging
import os
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from .compiled import compiled
from .device import SIM, DeviceLimits, cuda
from .launch import launch_once, pinned
from .plan import round_up

log = logging.getLogger("mpikmeans.backends.gpu")


@functools.lru_cache(maxsize=None)
def transpose_kernel(storage: str):
    """Row-major float64 block (rows x m) -> column-major storage dtype, 32 x 32 tiles.

    Arguments: src (rows * m,), rows, m, dst (m * ld,), ld, row0.
    """
    from numba import float32, float64

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


@functools.lru_cache(maxsize=None)
def row_major_kernel(storage: str):
    """Column-major rows (``m x ld``) -> a row-major copy (``n x m``), same dtype, 32 x 32 tiles.

    Arguments: src (m * ld,), n, m, ld, dst (n * m,).
    """
    from numba import float32, float64

    DT = float64 if storage == "float64" else float32

    def km_row_major(src, n, m, ld, dst):
        tile = cuda.shared.array((32, 33), dtype=DT)
        tx = cuda.threadIdx.x
        ty = cuda.threadIdx.y
        i0 = cuda.blockIdx.x * 32
        j0 = cuda.blockIdx.y * 32
        for q in range(ty, 32, 8):  # a warp reads 32 rows of one attribute
            i = i0 + tx
            j = j0 + q
            if i < n and j < m:
                tile[q, tx] = src[j * ld + i]
        cuda.syncthreads()
        for q in range(ty, 32, 8):  # ... and writes 32 attributes of one row
            i = i0 + q
            j = j0 + tx
            if i < n and j < m:
                dst[i * m + j] = tile[tx, q]

    return cuda.jit(km_row_major)


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
    weights_host : ndarray, shape (n,), float64, or None
    dx, labels, flags, dw : device arrays (resident)
        Rows, labels (-1: none yet), flagged-row indices, weights.
    dxr : device array (n * m,) or None
        A row-major copy of the resident rows, once :meth:`row_major` made it.
    chunk, nchunks : int (streaming)
    """

    def __init__(self, dtype: str, limits: DeviceLimits):
        self.dtype = dtype
        self.limits = limits
        self._clear()

    def _clear(self) -> None:
        self.n = self.m = self.ld = 0
        self.streaming = False
        self.weights_host = None
        self.dx = self.labels = self.flags = self.dw = self.dxr = None
        self.chunk = self.nchunks = 0
        self.host_soa = self.streams = self.host_labels = None
        self.dbuf = self.dlab = self.dflags = self.dwbuf = self.ddist = None

    @property
    def weighted(self) -> bool:
        return self.weights_host is not None

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
        self.weights_host = weights
        if n == 0:
            return
        dsize = np.dtype(self.dtype).itemsize
        row_bytes = m * dsize + 4 + 4 + (8 if self.weighted else 0)
        if chunk_rows is None and n * row_bytes <= 0.8 * self.limits.free_memory():
            self.ld = round_up(n, 32)
            self.dx = cuda.device_array(m * self.ld, dtype=self.dtype)
            self._upload_soa(x, self.dx, self.ld, 0)
            self.labels = cuda.to_device(np.full(n, -1, dtype=np.int32))
            self.flags = cuda.device_array(n, dtype=np.int32)
            self.dw = cuda.to_device(self.weights_host) if self.weighted else None
        else:
            self._setup_streaming(x, row_bytes, chunk_rows)

    def load_device(self, x_soa, weights: np.ndarray | None) -> None:
        """Take rows already on this device, column-major, shape (m, n) C-contiguous."""
        self._clear()
        arr = cuda.as_cuda_array(x_soa)
        m, n = arr.shape
        if str(arr.dtype) != self.dtype:
            raise ValueError(f"device data is {arr.dtype}, backend dtype is {self.dtype}")
        self.n, self.m = int(n), int(m)
        self.ld = int(n)
        self.dx = arr.reshape(m * n)
        self.labels = cuda.to_device(np.full(n, -1, dtype=np.int32))
        self.flags = cuda.device_array(max(n, 1), dtype=np.int32)
        self.weights_host = weights
        self.dw = cuda.to_device(weights) if weights is not None else None

    def _upload_soa(self, x: np.ndarray, dst, ld: int, row0: int, stream=0) -> None:
        """Copy row-major host rows into the column-major device array ``dst`` via the GPU.

        Blocks of rows go through two pinned host buffers: threads copy a block into
        one (a pageable copy to the device runs at a sixth of a pinned one's speed)
        while the other's block crosses to the device and is transposed there.
        """
        n, m = x.shape
        if n == 0:
            return
        block_rows = max(32, min(n, (32 << 20) // max(1, m * 8)))
        tk = transpose_kernel(self.dtype)
        stage = [cuda.device_array(block_rows * m, dtype=np.float64, stream=stream) for _ in range(2)]
        kobj = compiled("transpose", (self.dtype,), tk, (stage[0], 0, m, dst, ld, row0))
        if SIM:
            for a in range(0, n, block_rows):
                b = min(n, a + block_rows)
                stage[0][: (b - a) * m].copy_to_device(x[a:b].ravel())
                launch_once(tk, kobj, (stage[0], b - a, m, dst, ld, row0 + a), (-(-(b - a) // 32), -(-m // 32)),
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
                launch_once(tk, kobj, (stage[j], rows, m, dst, ld, row0 + a), (-(-rows // 32), -(-m // 32)),
                            (32, 8), stream)
                done[j] = cuda.event()
                done[j].record(stream=stream)
        stream.synchronize()

    def _setup_streaming(self, x: np.ndarray, row_bytes: int, chunk_rows: int | None) -> None:
        n, m = self.n, self.m
        dsize = np.dtype(self.dtype).itemsize
        if chunk_rows is not None:
            cr = chunk_rows
        else:
            # two chunk buffers (and their labels, flags) in 35% of free memory each
            cr = int(0.35 * self.limits.free_memory() // max(1, row_bytes))
            cr = max(1024, cr // 1024 * 1024)
        cr = max(1, min(cr, n))
        self.chunk = cr
        self.ld = round_up(cr, 32)
        nch = -(-n // cr)
        self.nchunks = nch
        # host copy of the rows in chunk-column-major order, pinned when possible, so
        # each iteration's copies run at full PCIe speed with no host-side work
        try:
            host = cuda.pinned_array((nch, m * self.ld), dtype=self.dtype)
        except Exception:  # pragma: no cover - pinning refused: pageable, slower copies
            log.warning("could not pin %.1f GB of host memory; streaming from pageable memory",
                        nch * m * self.ld * dsize / 1e9)
            host = np.empty((nch, m * self.ld), dtype=self.dtype)
        self.host_soa = host
        self.streams = [cuda.stream(), cuda.stream()]
        self.dbuf = [cuda.device_array(m * self.ld, dtype=self.dtype) for _ in range(2)]
        self.dlab = [cuda.device_array(self.ld, dtype=np.int32) for _ in range(2)]
        self.dflags = [cuda.device_array(self.ld, dtype=np.int32) for _ in range(2)]
        self.dwbuf = [cuda.device_array(self.ld, dtype=np.float64) for _ in range(2)] if self.weighted else None
        self.ddist = [cuda.device_array(self.ld, dtype=np.float64) for _ in range(2)]
        self.host_labels = pinned(n, np.int32)
        self.host_labels[:] = -1
        if self.weighted:
            # pinned too, so the per-chunk weight copies are asynchronous
            wp = pinned(n, np.float64)
            wp[:] = self.weights_host
            self.weights_host = wp
        # transpose each chunk on the device and keep the column-major copy on the host
        s = self.streams[0]
        for c in range(nch):
            a = c * cr
            b = min(n, a + cr)
            self._upload_soa(x[a:b], self.dbuf[0], self.ld, 0, stream=s)
            self.dbuf[0].copy_to_host(host[c], stream=s)
        s.synchronize()
        self.streaming = True

    def chunk_rows(self, c: int) -> int:
        """Rows in chunk ``c`` (streaming)."""
        return min(self.n, (c + 1) * self.chunk) - c * self.chunk

    def stream_through(self, launches: list, assign: bool, labels_out, dist_out) -> None:
        """Chunks alternate between two streams: the copy of chunk i+1 runs while chunk i computes.

        ``launches[c]`` is the (fused, recheck) pair prepared for chunk ``c``.  The
        streams synchronise with the legacy default stream, so the centre upload
        (issued before) is complete when a chunk starts, and the outputs' copy back
        (issued after) waits for every chunk.
        """
        n, cr = self.n, self.chunk
        for c in range(self.nchunks):
            s = c % 2
            stream = self.streams[s]
            a = c * cr
            b = min(n, a + cr)
            rows = b - a
            self.dbuf[s].copy_to_device(self.host_soa[c], stream=stream)
            if not assign:
                self.dlab[s][:rows].copy_to_device(self.host_labels[a:b], stream=stream)
            if self.weighted:
                self.dwbuf[s][:rows].copy_to_device(self.weights_host[a:b], stream=stream)
            fused, recheck = launches[c]
            fused()
            recheck()
            if assign:
                self.dlab[s][:rows].copy_to_host(labels_out[a:b], stream=stream)
                self.ddist[s][:rows].copy_to_host(dist_out[a:b], stream=stream)
            else:
                self.dlab[s][:rows].copy_to_host(self.host_labels[a:b], stream=stream)
        for stream in self.streams:
            stream.synchronize()

    def row_major(self, margin: int):
        """The resident rows row-major (``x[i * m + j]``, shape (n * m,)), made on the device the
        first time; None when streaming, without rows, or where it would leave less than ``margin``
        bytes of device memory free.

        Pass 1 on a list of scattered rows (:mod:`.bounds`) reads a row's attributes from the
        column-major store one 32-byte sector each; from this copy a row is ``m`` consecutive
        values (``bench/GPU_NOTES.md``, v15).
        """
        if self.dxr is None and not self.streaming and self.n > 0:
            need = self.n * self.m * np.dtype(self.dtype).itemsize
            if self.limits.free_memory() - need < margin:
                return None
            dxr = cuda.device_array(self.n * self.m, dtype=self.dtype)
            kern = row_major_kernel(self.dtype)
            args = (self.dx, int(self.n), int(self.m), int(self.ld), dxr)
            grid = (-(-self.n // 32), -(-self.m // 32))
            launch_once(kern, compiled("row_major", (self.dtype,), kern, args), args, grid, (32, 8))
            self.dxr = dxr
        return self.dxr

    def forget_labels(self) -> None:
        """Every label back to -1 (unknown)."""
        if self.streaming:
            self.host_labels[:] = -1
        elif self.labels is not None:
            self.labels.copy_to_device(np.full(self.n, -1, dtype=np.int32))

    def close(self) -> None:
        """Drop every device and pinned buffer."""
        self._clear()
