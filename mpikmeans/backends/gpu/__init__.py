"""GPU backend: one Lloyd iteration per rank on one NVIDIA GPU, with Numba CUDA kernels.

The package, by concern:

- :mod:`.device`: is a GPU usable, which one a rank takes, its limits;
- :mod:`.rows`: the rank's rows on the device, resident column-major or streamed in chunks;
- :mod:`.stepk`: the step's kernels (certified float32 screen, exact recheck, fixed-point
  accumulation), whose shape is a run-time argument;
- :mod:`.policy`: which step kind runs and with which tiles (pure functions, the tables of cases);
- :mod:`.hostk`: the centre data a step reads, made on the host;
- :mod:`.initk`: the initialisations' kernels (D², potentials, exact block sums);
- :mod:`.scorek`: the quality scores' passes over resident float64 rows (the host's bits);
- :mod:`.intrinsics`, :mod:`.launch`, :mod:`.compiled`: vector loads and unfused float64
  arithmetic, launching a compiled kernel, the store of compiled kernels;
- :mod:`.backend`: ``GPUBackend``, a step as named stages (centres, screen, recheck,
  accumulate, download) and the initialisations' passes.

Labels are those of the exact float64 distances of the stored values (ties to the
lowest index), and the sums exact integers (:mod:`mpikmeans.fixedsums`): a GPU run
gives the CPU's labels, centres and SSE to the last bit on float64 data.
"""

from .backend import GPUBackend, compile_kernels, initk_kernels
from .device import SIM, device_descriptions, gpu_available, gpu_count, select_device_for

__all__ = ["GPUBackend", "SIM", "compile_kernels", "device_descriptions", "gpu_available", "gpu_count",
           "initk_kernels", "select_device_for"]
