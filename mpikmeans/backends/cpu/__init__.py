"""The CPU backend: Numba kernels over one rank's rows in host memory.

- :mod:`.backend`: :class:`CPUBackend`, what the Lloyd loop and the initialisation call,
  and how a shape searches for the nearest centre (:func:`.backend.search_plan`).
- :mod:`.bounds`: the step and the assignment: rows whose centre Hamerly's bounds
  keep are not searched; the others go to the plan's search; sums in a fixed order.
- :mod:`.certified`: the search by float32 screening (a tile's products by
  ``sgemm``) certified against a rigorous error bound, exact float64 for the rows
  it cannot certify.
- :mod:`.blas`: that BLAS library on one thread per caller.
- :mod:`.tiles`: the exact float64 kernels (the reference of every step, the
  search of small shapes, single-point distances, k-means++ potentials) and
  :func:`label_sums`.
- :mod:`.seeding`: k-means++'s passes, screened in float32 once few rows are captured.
"""

from .backend import CPUBackend
from .tiles import _BLOCKS, label_sums

__all__ = ["CPUBackend", "label_sums", "_BLOCKS"]
