"""The GPU backend's host-side compiled helpers: per-step work on the CPU between launches.

Kept apart from the backend's logic: they are Numba kernels, cached with the
other CPU kernels (whose cache is keyed by the sources of the modules that hold
kernels, see :mod:`mpikmeans.cache`).
"""

from __future__ import annotations

import numpy as np
from ...jit import njit, prange
from .plan import ZL_CAP, ZL_MARGIN


#: K x M from which the per-step helpers run on the rank's threads: below it, waking the
#: threads costs more than they save (2e6 x 3, K = 7 on the H100: 0.12 -> 0.18 ms a step)
THREADS_MIN_VALUES = 1 << 15
#: attributes a thread sums the shift of (in centre order: the same bits on any number of threads)
_SHIFT_BLOCK = 32


def fill_centres(centres, f32, sh, cc, cm, c64, zl) -> None:
    """The step buffer's centre data, in one compiled pass (numpy took ~0.1 ms a step).

    ``sh`` (m,): ``s``, the mean of the centres (rounded to float32 first when the rows
    are float32: the kernel subtracts exactly the value it is given); ``cm``
    (tiles, m, TC): ``-2 z`` with ``z = float32(c - s)``; ``cc`` (k,): ``|z|^2``;
    ``zl``: twice the largest ``|z|^2`` (the certification bound), infinite when a
    centre is not finite (every row then takes the exact path); ``c64``: the centres.
    Padding centres keep what the buffer was set up with (``cc`` infinite, ``cm`` 0).

    From :data:`THREADS_MIN_VALUES` values on, the centres are filled by the rank's
    threads side by side (K x M = 257,000 took 1.8-2.2 ms a step on one thread of the
    H100 host, the GPU idle meanwhile; by tiles of centres, eight threads at most, 0.22
    ms), and the shift by blocks of attributes; each attribute's shift is summed in
    centre order, each norm in attribute order: the same bits on any number of threads.
    """
    fill = _fill_threads if centres.size >= THREADS_MIN_VALUES else _fill_one
    fill(centres, f32, sh, cc, cm, c64, zl)


@njit(inline="always")
def _shift(centres, f32, sh):  # pragma: no cover - compiled
    """The centres' mean into ``sh`` (rounded to float32 first where ``f32``); returned as float64."""
    k, m = centres.shape
    shift = np.zeros(m)
    for b in prange((m + _SHIFT_BLOCK - 1) // _SHIFT_BLOCK):  # blocks of attributes side by side
        j0 = b * _SHIFT_BLOCK
        j1 = min(j0 + _SHIFT_BLOCK, m)
        for i in range(k):  # each attribute's sum in centre order
            for j in range(j0, j1):
                shift[j] += centres[i, j]
        for j in range(j0, j1):
            t = shift[j] / k
            if f32:
                t = np.float64(np.float32(t))
            shift[j] = t
            sh[j] = t
    return shift


@njit(inline="always")
def _fill(centres, f32, sh, cc, cm, c64, zl):  # pragma: no cover - compiled
    k, m = centres.shape
    TC = cm.shape[2]
    shift = _shift(centres, f32, sh)
    norms = np.empty(k)
    bad = np.zeros(k, dtype=np.int64)
    for i in prange(k):
        tile = i // TC
        c = i - tile * TC
        nonfinite = 0
        norm = 0.0
        for j in range(m):
            v = centres[i, j]
            c64[i, j] = v
            nonfinite |= (v - v) != 0.0  # inf - inf and NaN - NaN are NaN
            z = np.float32(v - shift[j])
            norm += np.float64(z) * np.float64(z)
            cm[tile, j, c] = z * np.float32(-2.0)
        cc[i] = norm
        norms[i] = norm
        bad[i] = nonfinite
    zl[0] = min(2.0 * norms.max() * (1.0 + ZL_MARGIN), ZL_CAP) if bad.sum() == 0 else np.inf


def copy_centres(centres, c64) -> None:
    """The centres into the step buffer ``c64`` where the device makes the rest of its centre data
    (:func:`.gemmcentres.shift_kernel`, :func:`.gemmcentres.prep_kernel`): on the rank's threads from
    :data:`THREADS_MIN_VALUES` values."""
    copy = _copy_threads if centres.size >= THREADS_MIN_VALUES else _copy_one
    copy(centres, c64)


@njit(inline="always")
def _copy(centres, c64):  # pragma: no cover - compiled
    k, m = centres.shape
    for i in prange(k):
        for j in range(m):
            c64[i, j] = centres[i, j]


@njit(cache=True, nogil=True)
def _copy_one(centres, c64):  # pragma: no cover - compiled
    _copy(centres, c64)


@njit(cache=True, nogil=True, parallel=True)
def _copy_threads(centres, c64):  # pragma: no cover - compiled
    _copy(centres, c64)


@njit(cache=True, nogil=True)
def _fill_one(centres, f32, sh, cc, cm, c64, zl):  # pragma: no cover - compiled
    _fill(centres, f32, sh, cc, cm, c64, zl)


@njit(cache=True, nogil=True, parallel=True)
def _fill_threads(centres, f32, sh, cc, cm, c64, zl):  # pragma: no cover - compiled
    _fill(centres, f32, sh, cc, cm, c64, zl)


def add_step(dev, counts, d_dev, d_counts, centres, out, fresh: bool = False) -> np.ndarray:
    """``dev += d_dev``, ``counts += d_counts`` (``fresh``: ``dev = d_dev``, ``counts = d_counts``, a
    full step's sums); the raw sums ``dev + counts c`` into ``out`` (k, m), which is returned.

    ``out`` is a buffer the caller keeps from step to step: a K x M array made afresh every step
    had its pages faulted in again every other step (glibc hands the freed block back to the
    system): 0.3 ms of D's 1.3 ms late steps on the H100 host every other step, where the same
    sums into a kept buffer take 0.07 (``bench/experiments/host_profile.py``).
    Clusters side by side on the rank's threads from :data:`THREADS_MIN_VALUES` on (the
    GPU waits for the next step's centres meanwhile); every element is its own
    arithmetic, so the same bits.
    """
    add = _add_threads if dev.size >= THREADS_MIN_VALUES else _add_one
    add(dev, counts, d_dev, d_counts, centres, out, bool(fresh))
    return out


@njit(inline="always")
def _add(dev, counts, d_dev, d_counts, centres, sums, fresh):  # pragma: no cover - compiled
    k, m = dev.shape
    for i in prange(k):
        n = d_counts[i] if fresh else counts[i] + d_counts[i]
        counts[i] = n
        for j in range(m):
            d = d_dev[i, j] if fresh else dev[i, j] + d_dev[i, j]
            dev[i, j] = d
            sums[i, j] = d + n * centres[i, j]


@njit(cache=True, nogil=True)
def _add_one(dev, counts, d_dev, d_counts, centres, sums, fresh):  # pragma: no cover - compiled
    _add(dev, counts, d_dev, d_counts, centres, sums, fresh)


@njit(cache=True, nogil=True, parallel=True)
def _add_threads(dev, counts, d_dev, d_counts, centres, sums, fresh):  # pragma: no cover - compiled
    _add(dev, counts, d_dev, d_counts, centres, sums, fresh)


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
