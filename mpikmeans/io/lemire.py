"""Correctly rounded float64 from a decimal significand and exponent: Eisel–Lemire.

``_eisel_lemire(w, q)`` gives the binary64 nearest to ``w * 10**q`` (ties to
even) from a 128-bit table of powers of five and at most two 64x64-bit products
(Lemire, "Number parsing at a gigabyte per second", 2021; the table definition
and the proof that no fallback is needed for 19-digit significands are Mushtak
& Lemire's); :mod:`mpikmeans.io.numparse` reads the digits and calls it.
"""

from __future__ import annotations

import numpy as np

from ..jit import njit

# ---------------------------------------------------------------------------
# Constants.  Everything that meets a uint64 in the jitted code is itself a
# np.uint64: Numba types a mixed uint64/int64 operation as float64, which
# would silently destroy the exact integer arithmetic.
# ---------------------------------------------------------------------------
_U0 = np.uint64(0)
_U1 = np.uint64(1)
_U3 = np.uint64(3)
_U9 = np.uint64(9)
_U10 = np.uint64(10)
_U32 = np.uint64(32)
_U48 = np.uint64(48)  # ord('0')
_U52 = np.uint64(52)
_U63 = np.uint64(63)
_MASK32 = np.uint64(0xFFFFFFFF)
_MASK52 = np.uint64((1 << 52) - 1)
_BIT52 = np.uint64(1 << 52)
_BIT53 = np.uint64(1 << 53)
_NOT_ONE = np.uint64((1 << 64) - 2)
_SIGN_BIT = np.uint64(1 << 63)
_TEN19 = np.uint64(10**19)
_TEN18 = np.uint64(10**18)
# Low 9 bits of the high product word: 64 - (52 + 3) = 9 bits below the 55
# bits that determine the result.  If they are all ones, the truncated table
# entry might have caused a carry to be lost, so the second product is needed.
_PRECISION_MASK = np.uint64(0x1FF)

_SMALLEST_POW10 = -342
_LARGEST_POW10 = 308
_EXP_ROUND_TO_EVEN_MIN = -4
_EXP_ROUND_TO_EVEN_MAX = 23
_INFINITE_POWER = 0x7FF
_MIN_EXPONENT = -1023
# Exponent-field saturation; see the module docstring.
_EXP_SATURATE = 10**17

# Exactly representable powers of ten for Clinger's fast path (10**22 is the
# largest power of ten that is an exact double).
_EXACT_POW10 = np.array([10.0**k for k in range(23)], dtype=np.float64)
_EXACT_POW10_INT = np.array([10**k for k in range(16)], dtype=np.uint64)
# For the "disguised" fast path with 22 < q <= 37: the largest w such that
# w * 10**(q - 22) is still <= 2**53 (so the integer product is exact).
_DISGUISED_MAX_W = np.array([(1 << 53) // 10**k for k in range(16)], dtype=np.uint64)


def _normalize_128(c: int) -> int:
    """Scale ``c`` by a power of two so that it has exactly 128 bits.

    Shifting right truncates, which is what the table definition requires.
    """
    n = c.bit_length()
    return c << (128 - n) if n <= 128 else c >> (n - 128)


def _build_pow5_table() -> tuple[np.ndarray, np.ndarray]:
    """Build the 128-bit powers-of-five table for q in [-342, 308].

    Returns
    -------
    hi, lo : numpy.ndarray of uint64
        ``T[q] = hi[q + 342] * 2**64 + lo[q + 342]``, normalised so that the
        most significant bit of ``hi`` is set.

    Notes
    -----
    The definition (Lemire 2021, Appendix B) matters bit for bit: the proof
    that no fallback is needed (Mushtak & Lemire) is about exactly these
    values.  For negative q the reciprocal is rounded *up* (``floor + 1``;
    5**k never divides a power of two, so this is the ceiling) and, for
    q < -27, the extra-precision quotient is afterwards truncated to 128 bits.
    """
    n = _LARGEST_POW10 - _SMALLEST_POW10 + 1
    hi = np.empty(n, dtype=np.uint64)
    lo = np.empty(n, dtype=np.uint64)
    mask64 = (1 << 64) - 1
    for q in range(_SMALLEST_POW10, _LARGEST_POW10 + 1):
        if q >= 0:
            c = _normalize_128(5**q)
        else:
            p = 5**-q
            b = p.bit_length()  # == ceil(log2(p)) since p is not a power of 2
            if q >= -27:
                c = (1 << (b + 127)) // p + 1
                assert (1 << 127) <= c < (1 << 128)
            else:
                c = _normalize_128((1 << (2 * b + 128)) // p + 1)
        hi[q - _SMALLEST_POW10] = c >> 64
        lo[q - _SMALLEST_POW10] = c & mask64
    return hi, lo


_POW5_HI, _POW5_LO = _build_pow5_table()


# ---------------------------------------------------------------------------
# Count leading zeros.  Numba ships an LLVM ctlz intrinsic in a semi-private
# module; fall back to a branchy portable version if it ever moves.
# ---------------------------------------------------------------------------
try:  # pragma: no cover - depends on the Numba version
    from numba.cpython.unsafe.numbers import leading_zeros as _ctlz

    @njit(cache=True, forceinline=True)
    def _clz64(x):
        return np.int64(_ctlz(x))

except ImportError:  # pragma: no cover

    @njit(cache=True)
    def _clz64(x):
        n = 0
        if x <= np.uint64(0x00000000FFFFFFFF):
            n += 32
            x = x << np.uint64(32)
        if x <= np.uint64(0x0000FFFFFFFFFFFF):
            n += 16
            x = x << np.uint64(16)
        if x <= np.uint64(0x00FFFFFFFFFFFFFF):
            n += 8
            x = x << np.uint64(8)
        if x <= np.uint64(0x0FFFFFFFFFFFFFFF):
            n += 4
            x = x << np.uint64(4)
        if x <= np.uint64(0x3FFFFFFFFFFFFFFF):
            n += 2
            x = x << np.uint64(2)
        if x <= np.uint64(0x7FFFFFFFFFFFFFFF):
            n += 1
        return np.int64(n)


@njit(cache=True, forceinline=True)
def _mul_64x64_128(a, b):
    """Full 64x64 -> 128-bit unsigned product as ``(high, low)``.

    Numba has no 128-bit integer type, so the product is assembled from four
    32x32 -> 64-bit partial products.  ``mid`` collects the carries into the
    upper half; it is at most ``3 * (2**32 - 1)`` and cannot overflow.
    """
    a_lo = a & _MASK32
    a_hi = a >> _U32
    b_lo = b & _MASK32
    b_hi = b >> _U32
    p00 = a_lo * b_lo
    p01 = a_lo * b_hi
    p10 = a_hi * b_lo
    p11 = a_hi * b_hi
    mid = (p00 >> _U32) + (p01 & _MASK32) + (p10 & _MASK32)
    low = (mid << _U32) | (p00 & _MASK32)
    high = p11 + (p01 >> _U32) + (p10 >> _U32) + (mid >> _U32)
    return high, low


# Deliberately not forceinline=True: inlining it (three call sites) was
# measured at only 5-10% faster on 17-digit tokens but doubled the compile
# time of every caller of parse_number.
@njit(cache=True)
def _eisel_lemire(w, q):
    """Correctly rounded binary64 for ``w * 10**q`` (``w`` > 0).

    Parameters
    ----------
    w : uint64
        Non-zero decimal significand (any value below 2**64).
    q : int64
        Decimal exponent.

    Returns
    -------
    mantissa : uint64
        The 52 explicit significand bits.
    power2 : int64
        The biased exponent field (0 for subnormals/zero, 0x7FF for
        infinity).
    """
    if q < _SMALLEST_POW10:
        return _U0, np.int64(0)
    if q > _LARGEST_POW10:
        return _U0, np.int64(_INFINITE_POWER)
    lz = _clz64(w)
    w = w << np.uint64(lz)
    idx = q - _SMALLEST_POW10
    high, low = _mul_64x64_128(w, _POW5_HI[idx])
    if (high & _PRECISION_MASK) == _PRECISION_MASK:
        # The bits that decide rounding might still change by a carry from
        # the lower 64 bits of the table entry; include them.
        high2, _low2 = _mul_64x64_128(w, _POW5_LO[idx])
        low = low + high2  # wraps modulo 2**64, carry detected below
        if high2 > low:
            high = high + _U1
    upper = np.int64(high >> _U63)
    shift = upper + 9
    mantissa = high >> np.uint64(shift)
    # floor(q * log2(10)) + 63, valid for |q| < 1700; plus the exponent bias.
    power2 = (((217706 * q) >> 16) + 63) + upper - lz - _MIN_EXPONENT

    if power2 <= 0:
        # Subnormal (or zero).  A 19-digit decimal cannot be exactly halfway
        # between two subnormals (those midpoints need ~750 digits), so
        # rounding half up here is correct.
        s = 1 - power2
        if s >= 64:
            return _U0, np.int64(0)
        mantissa = mantissa >> np.uint64(s)
        mantissa = mantissa + (mantissa & _U1)
        mantissa = mantissa >> _U1
        # Rounding up may have produced the smallest normal number.
        if mantissa < _BIT52:
            return mantissa, np.int64(0)
        return mantissa & _MASK52, np.int64(1)

    # Exact ties are only possible for -4 <= q <= 23.  A tie shows up as a
    # product whose bits below the rounding bit are all zero; then undo the
    # round-up if the kept significand is even (round half to even).
    if (
        low <= _U1
        and q >= _EXP_ROUND_TO_EVEN_MIN
        and q <= _EXP_ROUND_TO_EVEN_MAX
        and (mantissa & _U3) == _U1
        and (mantissa << np.uint64(shift)) == high
    ):
        mantissa = mantissa & _NOT_ONE
    mantissa = mantissa + (mantissa & _U1)
    mantissa = mantissa >> _U1
    if mantissa >= _BIT53:
        # Rounding carried into a new binade.
        mantissa = _BIT52
        power2 += 1
    mantissa = mantissa & _MASK52
    if power2 >= _INFINITE_POWER:
        return _U0, np.int64(_INFINITE_POWER)
    return mantissa, power2


@njit(cache=True, forceinline=True)
def _bits_to_float64(bits):
    """Reinterpret an IEEE-754 bit pattern (uint64) as float64."""
    # Numba only accepts the scalar ``.view`` on a freshly typed NumPy
    # scalar with a single definition, hence the wrapper.
    return np.uint64(bits).view(np.float64)
