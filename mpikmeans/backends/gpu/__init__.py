"""GPU backend: one Lloyd iteration per rank on one NVIDIA GPU, with Numba CUDA kernels.

The package, by concern: :mod:`.device` (is a GPU usable, which one a rank takes),
:mod:`.plan` (tiles, block size and the memory layouts, from K, M, dtype and the
device), :mod:`.intrinsics` and :mod:`.kernels` (the kernel factories), :mod:`.launch`
(the step buffer and prepared launches), :mod:`.gemm` and :mod:`.sums` (the GEMM-shaped
and the split full steps), :mod:`.bounds` (the rows' kept bounds), :mod:`.rows` (the rows on the device,
resident or streamed) and :mod:`.backend` (``GPUBackend``: state between steps and
when a step is incremental).

Data layout and kernels (see ``bench/GPU_NOTES.md`` for the measurements behind them):

* The rank's rows live on the device column-major (structure of arrays, ``m x ld``),
  so that a warp reads one attribute of 32 consecutive rows in one transaction.
  They are copied once, in :meth:`GPUBackend.load`, and stay resident; data larger
  than the device (or any run with ``chunk_rows``) streams through in chunks from
  pinned host memory on two CUDA streams, the copy of one chunk overlapping the
  kernels on the other.
* **Assignment** (pass 1 of the fused step kernel): every thread owns ``R`` rows of a
  tile and keeps ``R x TC`` running distances in registers; the centres sit in shared
  memory and are read four at a time (one 16-byte broadcast load feeds ``4 R`` FMAs),
  so the K = 1000 case is arithmetic, not load, bound.  Distances are computed in
  float32 in the dot-product form ``|z|^2 - 2 y.z`` on data shifted by the mean of the
  centres (``y = x - s``, ``z = c - s``); the result is *certified*: each row keeps its
  best and second-best distance, and a row whose gap is not larger than a rigorous
  bound on the float32 rounding error is handed to an exact float64 kernel
  (``_recheck``), which evaluates ``sum((x - c)^2)`` with the CPU backend's
  tie-break.  Labels are therefore those of the exact float64 computation for either
  storage dtype, at float32 arithmetic speed.
* **Summing** (pass 2, fused, reading the tile again while it is still in L2): the
  tile's rows are counting-sorted by label in shared memory; each thread then owns
  one attribute and walks a slice of the sorted rows, accumulating runs of equal
  labels in float64 registers and flushing each run into per-block float64 partial
  sums in shared memory (the specification's calcSums).  What is summed is the
  deviation ``x - c`` from the row's centre (the raw sums are ``dev + n c``, formed on
  the host), so data far from the origin lose no digits.  The block adds its partial
  sums into the global float64 sums with one atomic per (cluster, attribute) when it
  finishes.  SSE is accumulated per element as ``(x - c)^2`` in float64, so it is the
  exact diff form, not the cancelling dot form.  Once labels settle, steps are
  incremental: only rows whose label changed touch the sums (see ``GPUBackend``'s
  notes).  When ``K x M`` float64 sums do not
  fit in shared memory, pass 2 adds into the global sums with atomics instead
  (slower, never a launch failure).
* **Split full step** (resident rows, at least ``2**24`` values, K x M sums that fit a
  block): pass 1 alone writes each row's certified label, and the summing kernel of
  :mod:`.sums` adds the rows with per-block float64 sums in shared memory at its own
  occupancy (pass 2 runs at pass 1's, which its registers hold to 8 warps per SM).
* **Kept bounds** (:mod:`.bounds`; resident rows, where a row costs pass 1 more than a
  test): pass 1 also writes each searched row's float32 upper bound on its distance to
  its centre and lower bound on its distance to every other; the next step tests them
  against the centres' moves in a kernel of its own, and pass 1 searches only the rows
  whose bounds fail.  Labels, sums and SSE are those of a step without bounds.
* **Per step on the host** (after the first step with a given number of centres):
  the centre data is written into a pinned host buffer that mirrors one device
  buffer (centre data, then zeros for the outputs); one asynchronous copy in, the
  fused and the recheck kernels launched with parameter blocks prepared once
  (``cuLaunchKernel``), one asynchronous copy of sums, counts, SSE and counters
  out, one synchronisation.  No allocation, no zeroing kernel, no host round trip
  before the recheck kernel (it reads the flagged count on the device).

Tie-breaking follows the backend contract: equal distances go to the lowest centre
index.  Sums, counts and SSE are always float64; ``dtype`` is the storage precision of
the rows on the device.
"""


from .backend import GPUBackend
from .device import SIM, device_descriptions, gpu_available, gpu_count, select_device_for
from .hostk import add_step, fill_centres

__all__ = ["GPUBackend", "SIM", "add_step", "device_descriptions", "fill_centres", "gpu_available", "gpu_count",
           "select_device_for"]
