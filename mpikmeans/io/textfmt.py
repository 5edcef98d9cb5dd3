"""Compiled formatting of numbers into delimited text (ARFF rows, labels).

``numpy.savetxt`` formats one value at a time in Python; these routines write
integers and fixed-point decimals straight into a byte buffer with Numba.
"""

from __future__ import annotations

import sys

import numpy as np
from numba import types
from numba.extending import intrinsic

from ..jit import njit
from .numparse import data_pointer

#: Widest field: sign, 19 digits of an int64, a decimal point, a separator.
MAX_FIELD = _MAX_FIELD = 22


#: "00" .. "99": two digits per division halves the divisions.
_PAIRS = np.frombuffer("".join(f"{i:02d}" for i in range(100)).encode(), dtype=np.uint8).copy()


@njit(cache=True, forceinline=True)
def _ndigits(u):
    n = 1
    while u >= 10:
        u //= np.uint64(10)
        n += 1
    return n


# The kernels below write through raw pointers (data_pointer): an array passed
# to an inlined helper costs a reference-count increment and decrement, two
# calls, per call, which was a third of the time of formatting a value.
@intrinsic
def _store_8_bytes(typingctx, ptr, index, word):
    """Store ``word`` at ``ptr + index`` (one unaligned 8-byte store, native byte order)."""
    if not isinstance(ptr, types.CPointer) or ptr.dtype != types.uint8:
        return None
    sig = types.void(ptr, types.intp, types.uint64)

    def codegen(context, builder, signature, args):
        import llvmlite.ir as llvmir

        address = builder.gep(args[0], [args[1]])
        builder.store(args[2], builder.bitcast(address, llvmir.IntType(64).as_pointer()), align=1)
        return context.get_dummy_value()

    return sig, codegen


#: Eight digits per store need the first digit in the lowest byte of a word.
_SWAR = sys.byteorder == "little"
_ZEROS8 = np.uint64(0x3030303030303030)
_TEN4 = np.uint64(10000)
_TEN8 = np.uint64(10**8)


@njit(cache=True, forceinline=True)
def _eight_digits(u):
    """The 8 decimal digits of ``u < 10**8`` as ASCII, first digit in the lowest byte.

    Two 4-digit halves go into the two 32-bit lanes of one word, each lane is
    split into two 2-digit values in 16-bit lanes and each of those into two
    digits in bytes, every split by a multiplication and a shift that divide
    exactly in the range they meet (x // 100 = x * 10486 >> 20 for x < 10**4,
    x // 10 = x * 103 >> 10 for x < 100).
    """
    hi = u // _TEN4
    x = hi | ((u - hi * _TEN4) << np.uint64(32))
    h = ((x * np.uint64(10486)) >> np.uint64(20)) & np.uint64(0x0000007F0000007F)
    x = h | ((x - h * np.uint64(100)) << np.uint64(16))
    h = ((x * np.uint64(103)) >> np.uint64(10)) & np.uint64(0x000F000F000F000F)
    x = h | ((x - h * np.uint64(10)) << np.uint64(8))
    return x + _ZEROS8


@njit(cache=True, forceinline=True)
def _write_width(out, end, u, width, pairs):
    """Write ``u < 10**width`` as exactly ``width`` digits ending just before ``end``."""
    p = end
    while width >= 2:
        q = u // np.uint64(100)
        r = u - q * np.uint64(100)
        p -= 2
        out[p] = pairs[2 * r]
        out[p + 1] = pairs[2 * r + 1]
        u = q
        width -= 2
    if width > 0:
        out[p - 1] = np.uint8(48 + u)


@njit(cache=True, forceinline=True)
def _put_fixed(out, pos, v, decimals, scale, pairs):
    """Write ``v / 10**decimals`` at ``out[pos]``; return the position after it.

    ``scale`` is ``10**decimals`` as a uint64.  The sign and an integer part
    below 100 are written without branches on the value (random signs and
    digit counts would otherwise be mispredicted about half the time), and the
    fraction eight digits at a time.
    """
    out[pos] = 45  # '-', kept only if negative
    negative = v < 0
    pos += np.int64(negative)
    u = (np.uint64(-(v + 1)) + np.uint64(1)) if negative else np.uint64(v)  # safe for INT64_MIN
    ip = u // scale
    fp = u - ip * scale
    if ip < np.uint64(100):
        one = np.int64(ip < np.uint64(10))
        out[pos] = pairs[2 * ip + one]  # the units digit when there is only one
        out[pos + 1] = pairs[2 * ip + 1]
        pos += 2 - one
    else:
        width = _ndigits(ip)
        pos += width
        _write_width(out, pos, ip, width, pairs)
    if decimals == 0:
        return pos
    out[pos] = 46  # '.'
    pos += 1 + decimals
    # the fraction from its last digit back: eight at a time, then the rest
    end = pos
    width = decimals
    while _SWAR and width >= 8:
        q = fp // _TEN8
        end -= 8
        _store_8_bytes(out, end, _eight_digits(fp - q * _TEN8))
        fp = q
        width -= 8
    _write_width(out, end, fp, width, pairs)
    return pos


@njit(cache=True, forceinline=True)
def _put_field(out, pos, t, last, delim, decimals, scale, pairs):
    """The value ``t / 10**decimals`` and the byte after it (``delim``, or a newline after a row's last)."""
    pos = _put_fixed(out, pos, t, decimals, scale, pairs)
    out[pos] = 10 if last else delim
    return pos + 1


@njit(cache=True, forceinline=True)
def _blob_tick(centres, z, b, i, j, spread, factor):
    # the same operations, in the same order, as
    # np.rint((centres[blob] + spread * z) * factor).astype(np.int64)
    return np.int64(np.rint((centres[b, j] + spread * z[i, j]) * factor))


@njit(cache=True, nogil=True)
def _write_fixed(ticks, decimals, text, table):
    n, m = ticks.shape
    scale = np.uint64(10) ** np.uint64(decimals)
    out = data_pointer(text)
    pairs = data_pointer(table)
    pos = 0
    for i in range(n):
        for j in range(m):
            pos = _put_field(out, pos, ticks[i, j], j == m - 1, 44, decimals, scale, pairs)
    return pos


@njit(cache=True, nogil=True)
def _write_blob_rows(centres, blob, z, lo, hi, spread, factor, decimals, text, table, delim):
    m = z.shape[1]
    scale = np.uint64(10) ** np.uint64(decimals)
    out = data_pointer(text)
    pairs = data_pointer(table)
    pos = 0
    for i in range(lo, hi):
        for j in range(m):
            t = _blob_tick(centres, z, blob[i], i, j, spread, factor)
            pos = _put_field(out, pos, t, j == m - 1, delim, decimals, scale, pairs)
    return pos


@njit(cache=True, nogil=True)
def _blob_rows_bytes(centres, blob, z, lo, hi, spread, factor, decimals):
    m = z.shape[1]
    scale = np.uint64(10) ** np.uint64(decimals)
    fixed = (decimals + 1 if decimals > 0 else 0) + 1  # point, fraction, separator
    total = 0
    for i in range(lo, hi):
        for j in range(m):
            v = _blob_tick(centres, z, blob[i], i, j, spread, factor)
            u = (np.uint64(-(v + 1)) + np.uint64(1)) if v < 0 else np.uint64(v)
            total += np.int64(v < 0) + _ndigits(u // scale) + fixed
    return total


def rows_text_bytes(centres: np.ndarray, blob: np.ndarray, z: np.ndarray, lo: int, hi: int,
                    spread: float, decimals: int) -> int:
    """Bytes :func:`format_blob_rows` would write for the same arguments, without writing them."""
    if not 0 <= decimals <= 18:
        raise ValueError("decimals must be in [0, 18]")
    return int(_blob_rows_bytes(centres, blob, z, lo, hi, float(spread), 10.0**decimals, decimals))


def format_blob_rows(centres: np.ndarray, blob: np.ndarray, z: np.ndarray, lo: int, hi: int,
                     spread: float, decimals: int, out: np.ndarray, delimiter: str = ",") -> int:
    """Rows ``lo..hi`` of Gaussian blobs, as :func:`format_fixed` writes their ticks.

    The text of ``format_fixed(np.rint((centres[blob] + spread * z) * 10.0**decimals)
    .astype(np.int64)[lo:hi], decimals)``, bit for bit, computed row by row
    without the intermediate arrays (with ``delimiter`` between values in place
    of its commas).  Releases the GIL.

    Parameters
    ----------
    centres : ndarray, shape (k, m), float64
    blob : ndarray, shape (rows,), int64
    z : ndarray, shape (rows, m), float64
    lo, hi : int
        The rows to write.
    spread : float
    decimals : int
        In [0, 18]; the values times ``10**decimals`` must fit in int64.
    out : ndarray, shape (>= (hi - lo) * m * 22,), uint8
    delimiter : str
        One byte between values.

    Returns
    -------
    int
        Bytes written at the start of ``out``.
    """
    if not 0 <= decimals <= 18:
        raise ValueError("decimals must be in [0, 18]")
    if out.dtype != np.uint8 or out.ndim != 1 or not out.flags.c_contiguous:
        raise ValueError("out must be a contiguous 1-D uint8 array")
    if len(out) < (hi - lo) * z.shape[1] * _MAX_FIELD:
        raise ValueError("output buffer too small")
    return _write_blob_rows(centres, blob, z, lo, hi, float(spread), 10.0**decimals, decimals, out, _PAIRS,
                            ord(delimiter))


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
