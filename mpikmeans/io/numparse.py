"""Exact, allocation-free decimal-to-float64 parsing for Numba code.

The ARFF reader spends most of its time turning ASCII decimal tokens into
``float64``.  Python's ``float()`` is exact but needs a ``str``/``bytes``
object per token, which is out of the question inside an ``@njit`` loop over
~10^8 tokens.  :func:`parse_number` does the same job on a slice of a
``uint8`` buffer, is callable from both Python and ``@njit`` code, allocates
nothing, and returns a result that is bit-for-bit identical to ``float()``
(correct rounding, ties to even, subnormals, signed zero).

Accepted grammar
----------------
Exactly::

    [+-]? ( digits ( '.' digits? )? | '.' digits ) ( [eE] [+-]? digits )?

Everything else (``inf``, ``nan``, ``1_000``, ``0x10``, embedded or
surrounding blanks, ``1e``, ``.``, ...) is :data:`PARSE_SYNTAX`.  This is
deliberately stricter than ``float()``, which accepts underscores, blanks
and the special values.

Algorithm
---------
1. **Scan.**  One pass over the bytes accumulates the decimal significand
   ``w`` and the decimal exponent ``q`` such that the value is
   ``w * 10**q``.  Fraction digits are consumed eight at a time where
   possible (one 8-byte load, a branch-free "all digits?" test and three
   multiplications).  If the significand has more than 19 digits, it is
   re-read by a careful loop that keeps the first 19 *significant* digits
   (at most 10**19 - 1 < 2**64): leading zeros, in the integer or the
   fraction part, do not count; every digit after the first non-zero one
   does, trailing zeros included.  Dropped digits are only remembered as
   "a non-zero digit was dropped" (``truncated``).  The exponent field is
   accumulated with saturation at 10**17: a larger exponent can only mean
   zero or overflow for any token shorter than ~10**17 bytes, and
   saturating keeps ``q`` well inside ``int64`` (``1e-99999999999999999999``
   parses to 0.0 instead of wrapping around; ``0e99999999999`` is 0.0).

2. **Clinger's fast path.**  If nothing was dropped, ``w <= 2**53`` and
   ``-22 <= q <= 22``, both ``w`` and ``10**|q|`` are exact doubles and one
   IEEE multiplication or division gives the correctly rounded result.  If
   ``22 < q <= 37`` and ``w * 10**(q-22)`` still fits in 53 bits, that
   product is exact too and is multiplied by the exact ``1e22``.

3. **Eisel-Lemire.**  Otherwise ``w`` is normalised to 64 bits and
   multiplied by a 128-bit approximation ``T[q]`` of ``5**q`` (D. Lemire,
   "Number Parsing at a Gigabyte per Second", Software: Practice and
   Experience 51(8), 2021; the same algorithm as the fast_float library).
   The binary exponent comes from ``floor(q * log2(10))``; the top 54 bits
   of the product give the 53-bit significand plus a rounding bit.  Exact
   ties can only occur for ``-4 <= q <= 23`` and are detected by the low
   product bits being zero, in which case the round-up is cancelled when
   the kept significand is even.  N. Mushtak and D. Lemire, "Fast Number
   Parsing Without Fallback" (SP&E 2023) prove that with this exact table
   the 128-bit product is always sufficient for every ``w < 2**64``, so the
   original algorithm's "cannot decide" exit is never taken and is not
   implemented.

   ``T[q]`` for ``q`` in ``[-342, 308]`` is built at import time with
   Python integers, following Appendix B of the first paper: for
   ``q >= 0`` the top 128 bits of ``5**q`` (truncated); for
   ``-27 <= q < 0`` ``floor(2**(b + 127) / 5**-q) + 1`` with ``b`` the bit
   length of ``5**-q`` (a 128-bit value, i.e. the reciprocal rounded up);
   for ``q < -27`` the top 128 bits, truncated, of
   ``floor(2**(2b + 128) / 5**-q) + 1``.  Outside that range the value is
   0 (``q < -342``) or infinity (``q > 308``) for every non-zero ``w``.

4. **More than 19 significant digits.**  The true value lies strictly
   between ``w * 10**q`` and ``(w + 1) * 10**q`` when a non-zero digit was
   dropped.  Rounding is monotonic, so if Eisel-Lemire maps both ends to the
   same double, that double is the answer.  When they differ, the token is
   within one unit of its 19th significant digit of a rounding boundary
   (a midpoint between two doubles, or the overflow threshold), and we fall
   back to Python's exact ``float()`` through ``numba.objmode``.  That
   costs a few microseconds and takes the GIL, which is acceptable because
   it is rare: measured at about 1.5 per 1000 random significands of 20 to
   40 digits, and never for any number of digits printed from an actual
   double (``%.20e``, ``%.25g``, ...: such a string is within 10**-18
   relative of the double, far from the midpoints at 2**-54 relative or
   more).  Numbers of at most 19 significant digits never fall back.  This
   keeps the module free of an arbitrary-precision implementation.

Status codes
------------
``PARSE_OK`` (0), ``PARSE_SYNTAX`` (1), ``PARSE_EMPTY`` (2, ``start >=
end``), ``PARSE_RANGE`` (3, the value rounds to +-infinity; the returned
value is then +-inf).  Underflow to zero or to a subnormal is not an
error.

Implementation notes
--------------------
* ``buf`` must be a C-contiguous 1-D ``uint8`` array (anything else is a
  Numba typing error).  The bytes are read through a raw pointer taken once
  at entry, which keeps Numba from emitting two atomic reference-count
  updates per call (see ``_data_pointer``).
* :func:`parse_number` and its helpers are declared ``forceinline=True``:
  each is compiled once and LLVM inlines it into every jitted caller
  (``alwaysinline``), removing the per-token call overhead.  Numba's own
  ``inline="always"`` would do the same at its IR level, but copies and
  re-types the whole body in every caller: the parser's first compile took
  24 s that way, 5 s this way (2-core VM), for the same machine code speed.
* Nothing is allocated and the GIL is not needed except in the rare
  ``objmode`` fallback described in step 4.
"""

from __future__ import annotations

import ctypes
import sys

import llvmlite.ir as llvmir
import numba
import numpy as np
from numba.core import types
from numba.extending import intrinsic

from ..jit import njit
from .lemire import (
    _BIT53,
    _DISGUISED_MAX_W,
    _EXACT_POW10,
    _EXACT_POW10_INT,
    _EXP_SATURATE,
    _INFINITE_POWER,
    _SIGN_BIT,
    _TEN18,
    _TEN19,
    _U0,
    _U1,
    _U9,
    _U10,
    _U32,
    _U48,
    _U52,
    _bits_to_float64,
    _eisel_lemire,
)

__all__ = [
    "PARSE_EMPTY",
    "PARSE_OK",
    "PARSE_RANGE",
    "PARSE_SYNTAX",
    "data_pointer",
    "parse_number",
    "parse_number_ptr",
    "parse_prefix",
    "parse_prefix_ptr",
]

#: The token was parsed; the value is exact (bit-identical to ``float()``).
PARSE_OK = 0
#: The token does not match the accepted grammar.
PARSE_SYNTAX = 1
#: The token is empty (``start >= end``).
PARSE_EMPTY = 2
#: The token is a valid number whose magnitude rounds to infinity.
PARSE_RANGE = 3

# ---------------------------------------------------------------------------
# Raw access to the bytes.
#
# Why not simply index ``buf``?  Numba treats an array argument as an owned
# reference: it increments the array's reference count on entry and
# decrements it after the variable's last use.  Normally an optimisation
# pass removes such pairs, but in a function with many exits and loops such
# as parse_number the last use of ``buf`` differs between paths, and the
# pass gives up.  That leaves two atomic read-modify-write operations plus
# two out-of-line calls on every token, which costs more than parsing a
# short token.  Taking the data pointer once, in the first statement, ends
# the life of ``buf`` at once (the pair is then trivially removed) and as a
# bonus drops the negative-index wrap-around that array indexing does.
# ---------------------------------------------------------------------------
@intrinsic
def _data_pointer(typingctx, arr):
    """Pointer to the first byte of a C-contiguous 1-D uint8 array."""
    if not isinstance(arr, types.Array) or arr.ndim != 1 or arr.dtype != types.uint8:
        raise numba.core.errors.TypingError(
            f"parse_number: buf must be a 1-D uint8 array, got {arr}"
        )
    if arr.layout != "C":
        # Indexing the raw pointer assumes unit stride.
        raise numba.core.errors.TypingError(
            f"parse_number: buf must be C-contiguous, got {arr}"
        )
    sig = types.CPointer(types.uint8)(arr)

    def codegen(context, builder, signature, args):
        array = context.make_array(signature.args[0])(context, builder, args[0])
        return array.data

    return sig, codegen


@intrinsic
def _address(typingctx, ptr):
    """The address held by a pointer, as an intp (for the objmode fallback)."""
    sig = types.intp(ptr)

    def codegen(context, builder, signature, args):
        return builder.ptrtoint(args[0], context.get_value_type(types.intp))

    return sig, codegen


@intrinsic
def _load_8_bytes(typingctx, ptr, index):
    """The 8 bytes at ``ptr + index`` as a uint64 (unaligned native load)."""
    sig = types.uint64(ptr, types.intp)

    def codegen(context, builder, signature, args):
        address = builder.gep(args[0], [args[1]])
        i64 = llvmir.IntType(64)
        return builder.load(builder.bitcast(address, i64.as_pointer()), align=1)

    return sig, codegen


# Eight-digits-at-once ("SWAR") conversion.  It relies on the first byte of
# the token landing in the least significant byte of the loaded word, so it
# is only enabled on little-endian hosts; elsewhere the byte loop does all
# the work (the flag is a compile-time constant, the dead branch vanishes).
_SWAR = sys.byteorder == "little"
_ASCII_ZEROS = np.uint64(0x3030303030303030)
_HIGH_NIBBLES = np.uint64(0xF0F0F0F0F0F0F0F0)
_PLUS_SIX = np.uint64(0x0606060606060606)
_ALL_THREES = np.uint64(0x3333333333333333)
_PAIR_MASK = np.uint64(0x000000FF000000FF)
_MUL_100_1E6 = np.uint64(100 + (1000000 << 32))
_MUL_1_1E4 = np.uint64(1 + (10000 << 32))
_U8 = np.uint64(8)
_U16 = np.uint64(16)
_TEN8 = np.uint64(10**8)


@njit(cache=True, forceinline=True)
def _is_eight_digits(word):
    """True if all 8 bytes of ``word`` are ASCII digits.

    A byte is a digit iff its high nibble is 3 and stays 3 after adding 6
    (0x3A..0x3F move to 0x40..0x45).  A byte >= 0xFA carries into its
    neighbour, but it already fails on its own high nibble.
    """
    return (
        (word & _HIGH_NIBBLES) | (((word + _PLUS_SIX) & _HIGH_NIBBLES) >> np.uint64(4))
    ) == _ALL_THREES


@njit(cache=True, forceinline=True)
def _eight_digits_value(word):
    """Value of 8 ASCII digits packed little-endian (first digit lowest).

    After removing the ASCII offset, ``x * 10 + (x >> 8)`` puts each
    two-digit pair value into the even bytes; two multiplications then
    combine the four pairs as ``p0*10**6 + p1*10**4 + p2*100 + p3`` in the
    upper 32 bits (each partial sum is below 2**32, so nothing spills).
    """
    x = word - _ASCII_ZEROS
    x = x * _U10 + (x >> _U8)
    x = (
        (x & _PAIR_MASK) * _MUL_100_1E6 + ((x >> _U16) & _PAIR_MASK) * _MUL_1_1E4
    ) >> _U32
    return x


@njit(cache=True)
def _exact_fallback(address, length):
    """Python's exact ``float()`` on ``length`` bytes at ``address``.

    Used only for the rare ambiguous >19-digit significands.  Runs in object
    mode (takes the GIL).  The token has already been checked against the
    grammar, which is a subset of what ``float()`` accepts.

    The token is passed as a raw address (see :func:`_data_pointer`); the
    caller keeps the array alive for the duration.
    """
    with numba.objmode(v="float64"):
        v = float(ctypes.string_at(address, length))
    return v


@njit(cache=True)
def _long_significand(p, int_start, int_end, frac_start, frac_end):
    """Significand of more than 19 digits, truncated to 19 significant ones.

    Parameters
    ----------
    p : CPointer(uint8)
        The text (see :func:`_data_pointer`).
    int_start, int_end, frac_start, frac_end : int
        Bounds of the integer and fraction digit runs (either may be empty).

    Returns
    -------
    w : uint64
        The first 19 significant digits (fewer if there are fewer).  Leading
        zeros are not significant; every digit after the first non-zero one
        is, trailing zeros included.
    q : int64
        Decimal exponent such that the digits kept equal ``w * 10**q``.
    truncated : bool
        Whether a non-zero digit was dropped, i.e. whether the true value is
        strictly greater than ``w * 10**q`` in magnitude.
    """
    w = _U0
    nsig = 0
    q = 0
    truncated = False
    for i in range(int_start, int_end):
        d = np.uint64(p[i]) - _U48
        if nsig < 19:
            w = w * _U10 + d
            if w != _U0:
                nsig += 1
        else:
            # A dropped integer digit still scales the value by 10.
            q += 1
            if d != _U0:
                truncated = True
    for i in range(frac_start, frac_end):
        d = np.uint64(p[i]) - _U48
        if nsig < 19:
            w = w * _U10 + d
            q -= 1
            if w != _U0:
                nsig += 1
        elif d != _U0:
            truncated = True
    return w, q, truncated


@njit(cache=True, forceinline=True)
def _digits(p, i, stop, w):
    """The decimal digits from ``p[i]`` on, no further than ``stop``: ``(w * 10**k + their value, the end)``.

    The product wraps around harmlessly past 19 digits (see :func:`_parse_at`).
    """
    while i < stop:
        # uint64 wrap-around turns "not in '0'..'9'" into one comparison.
        d = np.uint64(p[i]) - _U48
        if d > _U9:
            break
        w = w * _U10 + d
        i += 1
    return w, i


# forceinline=True makes LLVM inline the compiled body into each jitted caller:
# the per-token call overhead (arguments and a status word passed through
# memory) is otherwise a sizeable part of parsing a short token.
@njit(cache=True, forceinline=True)
def _parse_at(p, start, stop):
    """The number that starts at ``p[start]``, read no further than ``stop``.

    Reads the longest run of bytes from ``start`` that follows the grammar and
    stops at the first byte that cannot continue it (or at ``stop``), so a
    caller that meets its delimiter there needs no separate pass to find the
    token's end.

    Returns
    -------
    value : float
        As :func:`parse_number` for the bytes ``[start, end)``.
    status : int
        ``PARSE_OK`` or ``PARSE_RANGE``; ``PARSE_SYNTAX`` when no digit was
        found or an exponent marker has no digits (``end`` is then where the
        scan stopped).
    end : int
        One past the last byte of the number.
    """
    i = np.int64(start)
    stop = np.int64(stop)
    negative = False
    c = p[i]
    if c == 45:  # '-'
        negative = True
        i += 1
    elif c == 43:  # '+'
        i += 1

    # Significand.  Almost every token has at most 19 digits, so the hot
    # loops accumulate unconditionally (uint64 arithmetic wraps harmlessly
    # if there are more) and only remember where the digits are; longer
    # significands are redone carefully by _long_significand below.
    int_start = i
    w, i = _digits(p, i, stop, _U0)
    int_end = i
    frac_start = i
    frac_end = i
    if i < stop and p[i] == 46:  # '.'
        i += 1
        frac_start = i
        if _SWAR:
            while i + 8 <= stop:
                word = _load_8_bytes(p, i)
                if not _is_eight_digits(word):
                    break
                w = w * _TEN8 + _eight_digits_value(word)
                i += 8
        w, i = _digits(p, i, stop, w)
        frac_end = i
    ndigits = (int_end - int_start) + (frac_end - frac_start)
    if ndigits == 0:
        return 0.0, PARSE_SYNTAX, i

    # Exponent part.
    q = 0
    if i < stop and (p[i] == 101 or p[i] == 69):  # 'e' or 'E'
        i += 1
        exp_negative = False
        if i < stop:
            c = p[i]
            if c == 45:
                exp_negative = True
                i += 1
            elif c == 43:
                i += 1
        exp_value = 0
        exp_digits = 0
        while i < stop:
            d = np.uint64(p[i]) - _U48
            if d > _U9:
                break
            if exp_value < _EXP_SATURATE:
                exp_value = exp_value * 10 + np.int64(d)
            i += 1
            exp_digits += 1
        if exp_digits == 0:
            return 0.0, PARSE_SYNTAX, i
        if exp_negative:
            q -= exp_value
        else:
            q += exp_value

    q -= frac_end - frac_start
    truncated = False  # a non-zero digit was dropped
    if ndigits > 19:
        w, q_digits, truncated = _long_significand(
            p, int_start, int_end, frac_start, frac_end
        )
        q += q_digits + (frac_end - frac_start)

    if w == _U0:
        # All digits are zero: +-0 whatever the exponent (no range error).
        return (-0.0 if negative else 0.0), PARSE_OK, i

    if not truncated:
        if w <= _BIT53:
            # w fits in int64 here; converting from a signed integer is a
            # single instruction on x86-64, from uint64 it is a sequence.
            if q >= 0 and q <= 22:
                v = np.float64(np.int64(w)) * _EXACT_POW10[q]
                return (-v if negative else v), PARSE_OK, i
            if q < 0 and q >= -22:
                v = np.float64(np.int64(w)) / _EXACT_POW10[-q]
                return (-v if negative else v), PARSE_OK, i
            if q > 22 and q <= 37 and w <= _DISGUISED_MAX_W[q - 22]:
                v = np.float64(w * _EXACT_POW10_INT[q - 22]) * _EXACT_POW10[22]
                return (-v if negative else v), PARSE_OK, i
        mantissa, power2 = _eisel_lemire(w, q)
    else:
        mantissa, power2 = _eisel_lemire(w, q)
        w_up = w + _U1
        q_up = q
        if w_up == _TEN19:
            # Keep the significand at 19 digits (same value).
            w_up = _TEN18
            q_up = q + 1
        mantissa_up, power2_up = _eisel_lemire(w_up, q_up)
        if mantissa_up != mantissa or power2_up != power2:
            first = np.int64(start)
            v = _exact_fallback(_address(p) + first, i - first)
            if np.isinf(v):
                return v, PARSE_RANGE, i
            return v, PARSE_OK, i

    if power2 == _INFINITE_POWER:
        return (-np.inf if negative else np.inf), PARSE_RANGE, i
    bits = mantissa | (np.uint64(power2) << _U52)
    if negative:
        bits = bits | _SIGN_BIT
    return _bits_to_float64(bits), PARSE_OK, i


# Called from Python it behaves like any other jitted function.
@njit(cache=True, forceinline=True)
def parse_number(buf, start, end):
    """Parse the decimal number ``buf[start:end]`` exactly.

    Parameters
    ----------
    buf : numpy.ndarray
        C-contiguous 1-D ``uint8`` array holding ASCII text (read-only is
        fine).
    start, end : int
        Token bounds (``end`` exclusive); any integer type.  Not
        bounds-checked: the caller guarantees ``0 <= start`` and
        ``end <= len(buf)``.  Surrounding blanks must already be stripped;
        a blank inside the token is a syntax error.

    Returns
    -------
    value : float
        The parsed value, bit-identical to ``float(token)``; ``0.0`` on
        ``PARSE_SYNTAX``/``PARSE_EMPTY`` and +-inf on ``PARSE_RANGE``.
    status : int
        ``PARSE_OK``, ``PARSE_SYNTAX``, ``PARSE_EMPTY`` or ``PARSE_RANGE``.

    Notes
    -----
    No allocation happens unless a significand with more than 19 digits is
    ambiguous after truncation, in which case ``float()`` is called through
    ``numba.objmode`` (see the module docstring).
    """
    # Read the bytes through a raw pointer; see _data_pointer for why.
    return parse_number_ptr(_data_pointer(buf), start, end)


@njit(cache=True, forceinline=True)
def parse_number_ptr(p, start, end):
    """:func:`parse_number` on the bytes at a raw pointer (see :func:`data_pointer`).

    For compiled callers that take the pointer once and pass it around:
    passing an array to an inlined helper costs a reference-count increment
    and decrement per call (two atomic operations and two calls).
    """
    # Fixed-width signed indices whatever the caller passes (a uint64 index
    # would turn the mixed arithmetic below into float64).
    i = np.int64(start)
    stop = np.int64(end)
    if i >= stop:
        return 0.0, PARSE_EMPTY
    v, status, last = _parse_at(p, i, stop)
    if status == PARSE_SYNTAX or last != stop:
        return 0.0, PARSE_SYNTAX
    return v, status


@njit(cache=True, forceinline=True)
def parse_prefix(buf, start, end):
    """Parse the number that starts at ``buf[start]``, stopping where it ends.

    For a caller scanning delimited text: one pass finds both the value and
    the token's end, and the caller checks that a delimiter follows.  When it
    does (and the status is ``PARSE_OK``), the value is the one
    :func:`parse_number` gives for ``buf[start:last]``.

    Parameters
    ----------
    buf : numpy.ndarray
        C-contiguous 1-D ``uint8`` array.
    start, end : int
        Where the number starts, and a bound the scan never passes.

    Returns
    -------
    value : float
    status : int
        ``PARSE_OK``, ``PARSE_RANGE``, ``PARSE_SYNTAX`` (no digits, or an
        exponent marker without digits) or ``PARSE_EMPTY`` (``start >= end``).
    last : int
        One past the last byte read as part of the number.
    """
    return parse_prefix_ptr(_data_pointer(buf), start, end)


@njit(cache=True, forceinline=True)
def parse_prefix_ptr(p, start, end):
    """:func:`parse_prefix` on the bytes at a raw pointer (see :func:`parse_number_ptr`)."""
    i = np.int64(start)
    stop = np.int64(end)
    if i >= stop:
        return 0.0, PARSE_EMPTY, i
    return _parse_at(p, i, stop)


#: ``data_pointer(buf)`` in compiled code: the address of a C-contiguous 1-D
#: uint8 array's first byte, indexable like the array (``p[i]``), for
#: :func:`parse_number_ptr` and :func:`parse_prefix_ptr`.  The caller keeps
#: the array alive while the pointer is used.
data_pointer = _data_pointer
