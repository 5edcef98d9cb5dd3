"""The GPU backend's host-side compiled helpers: per-step work on the CPU between launches.

Kept apart from the backend's logic: they are Numba kernels, cached with the
other CPU kernels (whose cache is keyed by the sources of the modules that hold
kernels, see :mod:`mpikmeans.cache`).
"""

from __future__ import annotations

import numpy as np
from ...jit import njit


@njit(cache=True, nogil=True)
def fill_centres(centres, f32, sh, cc, cm, c64, zl):  # pragma: no cover - compiled
    """The step buffer's centre data, in one compiled pass (numpy took ~0.1 ms a step).

    ``sh`` (m,): ``s``, the mean of the centres (rounded to float32 first when the rows
    are float32: the kernel subtracts exactly the value it is given); ``cm``
    (tiles, m, TC): ``-2 z`` with ``z = float32(c - s)``; ``cc`` (k,): ``|z|^2``;
    ``zl``: twice the largest ``|z|^2`` (the certification bound), infinite when a
    centre is not finite (every row then takes the exact path); ``c64``: the centres.
    Padding centres keep what the buffer was set up with (``cc`` infinite, ``cm`` 0).
    """
    k, m = centres.shape
    TC = cm.shape[2]
    shift = np.empty(m)
    for j in range(m):
        t = 0.0
        for i in range(k):
            t += centres[i, j]
        t /= k
        if f32:
            t = np.float64(np.float32(t))
        shift[j] = t
        sh[j] = t
    finite = True
    zmax = 0.0
    for i in range(k):
        tile = i // TC
        c = i - tile * TC
        norm = 0.0
        for j in range(m):
            v = centres[i, j]
            c64[i, j] = v
            finite = finite and np.isfinite(v)
            z = np.float32(v - shift[j])
            norm += np.float64(z) * np.float64(z)
            cm[tile, j, c] = z * np.float32(-2.0)
        cc[i] = norm
        if norm > zmax:
            zmax = norm
    zl[0] = min(2.0 * zmax * (1.0 + 1e-6), 3.0e38) if finite else np.inf


@njit(cache=True, nogil=True)
def add_step(dev, counts, d_dev, d_counts, centres):  # pragma: no cover - compiled
    """``dev += d_dev``, ``counts += d_counts``; return the raw sums ``dev + counts c`` (k, m)."""
    k, m = dev.shape
    sums = np.empty((k, m))
    for i in range(k):
        n = counts[i] + d_counts[i]
        counts[i] = n
        for j in range(m):
            d = dev[i, j] + d_dev[i, j]
            dev[i, j] = d
            sums[i, j] = d + n * centres[i, j]
    return sums
