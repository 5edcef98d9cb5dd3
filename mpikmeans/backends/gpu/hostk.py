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

    Every loop walks memory in order (K x M = 257,000 on the H100 host: 2.1 ms a
    step when the shift summed down columns and ``cm`` was written a centre at a
    time): the shift adds the centres row by row (each attribute's sum still in
    centre order), and ``cm`` and the norms go a tile of centres at a time, the
    centres innermost (each norm still summed in attribute order: the same bits).
    """
    k, m = centres.shape
    nct, _, TC = cm.shape
    shift = np.zeros(m)
    for i in range(k):
        for j in range(m):
            shift[j] += centres[i, j]
    for j in range(m):
        t = shift[j] / k
        if f32:
            t = np.float64(np.float32(t))
        shift[j] = t
        sh[j] = t
    c64[:, :] = centres
    bad = 0
    for i in range(k):
        for j in range(m):
            v = centres[i, j]
            bad |= (v - v) != 0.0  # inf - inf and NaN - NaN are NaN
    norms = np.zeros(nct * TC)
    for tile in range(nct):
        lo = tile * TC
        hi = min(lo + TC, k)
        for j in range(m):
            s = shift[j]
            row = cm[tile, j]
            for c in range(hi - lo):
                z = np.float32(centres[lo + c, j] - s)
                norms[lo + c] += np.float64(z) * np.float64(z)
                row[c] = z * np.float32(-2.0)
    zmax = 0.0
    for i in range(k):
        cc[i] = norms[i]
        zmax = max(zmax, norms[i])
    zl[0] = min(2.0 * zmax * (1.0 + 1e-6), 3.0e38) if bad == 0 else np.inf


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


@njit(cache=True, nogil=True, fastmath={"reassoc", "contract"})
def carry_kept(dev, counts, old_centres, centres, new_dev, new_counts):  # pragma: no cover - compiled
    """The kept rows' deviation sums about new centres; returns how much their SSE grows.

    ``new_dev = dev + counts (c - c')``, ``new_counts = counts`` and the SSE's change
    ``2 (c - c').dev + sum counts |c - c'|^2`` (``c`` the ``old_centres``, ``c'`` the
    ``centres``): exact algebra, each term small when the centres move little (see
    :class:`.kept.KeptSums`).  Compiled, in place and without temporaries: at K x M =
    257,000 numpy's form allocated three K x M arrays a step.  The two sums may be
    reordered (``reassoc``: vectorised); they are float64 sums of small terms.
    """
    k, m = dev.shape
    cross = 0.0
    spread = 0.0
    for i in range(k):
        n = counts[i]
        new_counts[i] = n
        sq = 0.0
        for j in range(m):
            mv = old_centres[i, j] - centres[i, j]
            cross += mv * dev[i, j]
            sq += mv * mv
            new_dev[i, j] = dev[i, j] + n * mv
        spread += n * sq
    return 2.0 * cross + spread
