"""Compiled formatting of numbers into delimited text (ARFF rows, labels).

``numpy.savetxt`` formats one value at a time in Python; these routines write
integers and fixed-point decimals straight into a byte buffer with Numba.
"""

from __future__ import annotations

import numpy as np
from numba import njit

#: Widest field: sign, 19 digits of an int64, a decimal point, a separator.
_MAX_FIELD = 22


@njit(cache=True)
def _write_fixed(ticks, decimals, out):
    n, m = ticks.shape
    pos = 0
    digits = np.empty(20, dtype=np.uint8)
    for i in range(n):
        for j in range(m):
            v = ticks[i, j]
            if v < 0:
                out[pos] = 45  # '-'
                pos += 1
                u = np.uint64(-(v + 1)) + np.uint64(1)  # safe for INT64_MIN
            else:
                u = np.uint64(v)
            nd = 0
            while u > 0 or nd <= decimals:
                digits[nd] = np.uint8(48 + u % np.uint64(10))
                u //= np.uint64(10)
                nd += 1
            for d in range(nd - 1, -1, -1):
                out[pos] = digits[d]
                pos += 1
                if d == decimals and decimals > 0:
                    out[pos] = 46  # '.'
                    pos += 1
            out[pos] = 44 if j < m - 1 else 10  # ',' or '\n'
            pos += 1
    return pos


def format_fixed(ticks: np.ndarray, decimals: int = 0) -> np.ndarray:
    """Format integers as fixed-point decimals, comma-separated, one row per line.

    Parameters
    ----------
    ticks : ndarray, shape (n, m), int64
        Each value times ``10**decimals``.
    decimals : int
        Digits after the decimal point (0: plain integers, no point).

    Returns
    -------
    ndarray, shape (n_bytes,), uint8
        ``n`` lines, each ending in ``\\n``.  ``ticks = 12345, decimals = 3``
        gives ``12.345``; ``-5, 3`` gives ``-0.005``.
    """
    ticks = np.ascontiguousarray(ticks, dtype=np.int64)
    if ticks.ndim == 1:
        ticks = ticks.reshape(-1, 1)
    if not 0 <= decimals <= 18:
        raise ValueError("decimals must be in [0, 18]")
    out = np.empty(ticks.size * _MAX_FIELD + 1, dtype=np.uint8)
    used = _write_fixed(ticks, decimals, out)
    return out[:used]
