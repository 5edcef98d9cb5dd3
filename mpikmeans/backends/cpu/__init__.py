"""The CPU backend: Numba kernels over one rank's rows in host memory.

- :mod:`.backend`: :class:`CPUBackend`, what the Lloyd loop and the initialisation call,
  and how a shape searches for the nearest centre (:func:`.backend.search_plan`).
- :mod:`.bounds`: the step's and the assignment's labels: rows whose centre Hamerly's
  bounds keep are not searched; the others go to the plan's search.
- :mod:`.certified`: the search by float32 screening (a tile's products by
  ``sgemm``) certified against a rigorous error bound, exact float64 for the rows
  it cannot certify.
- :mod:`.blas`: that BLAS library on one thread per caller.
- :mod:`.tiles`: the exact float64 kernels (the search of small shapes, single-point
  distances, k-means++ potentials).
- :mod:`.seeding`: k-means++'s passes, screened in float32 once few rows are captured.

The step's sums are exact integers (:mod:`mpikmeans.fixedsums`), added after the labels.
"""

from .backend import CPUBackend

__all__ = ["CPUBackend"]
