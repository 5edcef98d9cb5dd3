"""The CPU backend: Numba kernels over one rank's rows in host memory.

- :mod:`.backend`: :class:`CPUBackend`, what the Lloyd loop and the initialisation call,
  and which step a shape takes (:func:`.backend.screened`).
- :mod:`.certified`: the step and the assignment, float32 screening (a tile's
  products by ``sgemm``) certified against a rigorous error bound, exact float64
  for the rows it cannot certify.
- :mod:`.blas`: that BLAS library on one thread per caller.
- :mod:`.tiles`: the exact float64 kernels (the certified kernels' reference,
  single-point distances, k-means++ potentials) and :func:`label_sums`.
"""

from .backend import CPUBackend
from .tiles import _BLOCKS, label_sums

__all__ = ["CPUBackend", "label_sums", "_BLOCKS"]
