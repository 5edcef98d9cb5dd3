"""The centre data a GPU step reads, made on the host in one compiled pass.

Kept apart from the backend's logic: Numba kernels, cached with the other CPU
kernels (:mod:`mpikmeans.cache`).
"""

from __future__ import annotations

import numpy as np

from ...jit import njit, prange

#: the certificate's bound on the centres, ``zl``: twice the largest ``|z|^2`` times ``1 + ZL_MARGIN`` (the
#: float32 rounding of the norms), at most ``ZL_CAP`` (float32 stays finite)
ZL_MARGIN = 1e-6
ZL_CAP = 3.0e38
#: attributes a thread sums the shift of (in centre order: the same bits on any number of threads)
_SHIFT_BLOCK = 32


@njit(parallel=True, cache=True, nogil=True)
def fill_centres(centres, f32, sh, cc, cm, ct, zl):  # pragma: no cover - compiled
    """The screen's and the exact kernels' centre data from the centres (k, m), float64.

    ``sh`` (m,): ``s``, the mean of the centres (rounded to float32 first when the
    rows are float32: the kernel subtracts exactly the value it is given); ``cm``
    (tiles, m, TC) float32: ``-2 z`` with ``z = float32(c - s)``; ``cc`` (tiles * TC,)
    float32: ``|z|^2``; ``zl`` (1,) float32: twice the largest ``|z|^2`` (the
    certificate's bound), infinite when a centre is not finite (every row then
    takes the exact path); ``ct`` (m, k) float64: the centres transposed.  Padding
    centres keep what the buffers were set up with (``cc`` infinite, ``cm`` 0).
    Each attribute's shift is summed in centre order and each norm in attribute
    order: the same bits on any number of threads.
    """
    k, m = centres.shape
    TC = cm.shape[2]
    shift = np.zeros(m)
    for b in prange((m + _SHIFT_BLOCK - 1) // _SHIFT_BLOCK):
        j0 = b * _SHIFT_BLOCK
        j1 = min(j0 + _SHIFT_BLOCK, m)
        for i in range(k):
            for j in range(j0, j1):
                shift[j] += centres[i, j]
        for j in range(j0, j1):
            t = shift[j] / k
            if f32:
                t = np.float64(np.float32(t))
            shift[j] = t
            sh[j] = t
    norms = np.empty(k)
    bad = np.zeros(k, dtype=np.int64)
    for i in prange(k):
        tile = i // TC
        c = i - tile * TC
        nonfinite = 0
        norm = 0.0
        for j in range(m):
            v = centres[i, j]
            ct[j, i] = v
            nonfinite |= (v - v) != 0.0  # inf - inf and NaN - NaN are NaN
            z = np.float32(v - shift[j])
            norm += np.float64(z) * np.float64(z)
            cm[tile, j, c] = z * np.float32(-2.0)
        cc[i] = norm
        norms[i] = norm
        bad[i] = nonfinite
    zl[0] = min(2.0 * norms.max() * (1.0 + ZL_MARGIN), ZL_CAP) if bad.sum() == 0 else np.inf
