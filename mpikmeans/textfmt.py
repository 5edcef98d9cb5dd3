"""Compiled formatting of numbers into delimited text (ARFF rows, labels).

``numpy.savetxt`` formats one value at a time in Python; these routines write
integers and fixed-point decimals straight into a byte buffer with Numba.
"""

from __future__ import annotations

import numpy as np
from numba import njit

#: Widest field: sign, 19 digits of an int64, a decimal point, a separator.
_MAX_FIELD = 22


#: "00" .. "99": two digits per division halves the divisions.
_PAIRS = np.frombuffer("".join(f"{i:02d}" for i in range(100)).encode(), dtype=np.uint8).copy()


@njit(cache=True, inline="always")
def _write_digits(out, end, u, width, pairs):
    """Write ``u`` in decimal ending just before ``end``, zero-padded to ``width``; return the start."""
    p = end
    while u >= 100:
        q = u // np.uint64(100)
        r = u - q * np.uint64(100)
        p -= 2
        out[p] = pairs[2 * r]
        out[p + 1] = pairs[2 * r + 1]
        u = q
    if u >= 10:
        p -= 2
        out[p] = pairs[2 * u]
        out[p + 1] = pairs[2 * u + 1]
    else:
        p -= 1
        out[p] = np.uint8(48 + u)
    while end - p < width:
        p -= 1
        out[p] = 48
    return p


@njit(cache=True, inline="always")
def _ndigits(u):
    n = 1
    while u >= 10:
        u //= np.uint64(10)
        n += 1
    return n


@njit(cache=True)
def _write_fixed(ticks, decimals, out, pairs):
    n, m = ticks.shape
    scale = np.uint64(10) ** np.uint64(decimals)
    pos = 0
    for i in range(n):
        for j in range(m):
            v = ticks[i, j]
            if v < 0:
                out[pos] = 45  # '-'
                pos += 1
                u = np.uint64(-(v + 1)) + np.uint64(1)  # safe for INT64_MIN
            else:
                u = np.uint64(v)
            if decimals == 0:
                pos += _ndigits(u)
                _write_digits(out, pos, u, 1, pairs)
            else:
                ip = u // scale
                fp = u - ip * scale
                pos += _ndigits(ip)
                _write_digits(out, pos, ip, 1, pairs)
                out[pos] = 46  # '.'
                pos += 1 + decimals
                _write_digits(out, pos, fp, decimals, pairs)
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
    used = _write_fixed(ticks, decimals, out, _PAIRS)
    return out[:used]
