"""Tests for :mod:`mpikmeans.io.numparse`.

Every accepted token is compared bit for bit with Python's ``float()``
(which is correctly rounded), both when ``parse_number`` is called from
Python and when it is called from an ``@njit`` loop over a packed buffer,
which is how the ARFF reader uses it.

Run ``python tests/test_numparse.py`` to print a throughput measurement.
"""

from __future__ import annotations

import math
import random
import time
from decimal import Decimal, localcontext
from fractions import Fraction

import numba
import numpy as np
import pytest

from mpikmeans.io import lemire, numparse
from mpikmeans.io.numparse import (
    PARSE_EMPTY,
    PARSE_OK,
    PARSE_RANGE,
    PARSE_SYNTAX,
    parse_number,
)

# Fixed seeds: a failure must be reproducible.
SEED = 20240611


# ---------------------------------------------------------------------------
# Helpers
# ---------------------------------------------------------------------------
@numba.njit(cache=True)
def _parse_all(buf, starts, ends):
    n = starts.size
    values = np.empty(n, dtype=np.float64)
    status = np.empty(n, dtype=np.int64)
    for k in range(n):
        v, s = parse_number(buf, starts[k], ends[k])
        values[k] = v
        status[k] = s
    return values, status


@numba.njit(cache=True)
def _sum_all(buf, starts, ends):
    # Consumes the results without writing an output array, for timing.
    total = 0.0
    bad = 0
    for k in range(starts.size):
        v, s = parse_number(buf, starts[k], ends[k])
        total += v
        bad += s
    return total, bad


def _pack(tokens, sep=b"7"):
    """Pack tokens into one writable uint8 buffer.

    The separator is a *digit* on purpose: a parser that reads even one byte
    past ``end`` (or before ``start``) would then produce a wrong value
    instead of stopping at a non-digit by luck.
    """
    encoded = [t.encode("utf-8") if isinstance(t, str) else t for t in tokens]
    lengths = np.fromiter((len(e) for e in encoded), dtype=np.int64, count=len(encoded))
    starts = np.empty(len(encoded), dtype=np.int64)
    if len(encoded):
        starts[0] = len(sep)
        starts[1:] = len(sep) + np.cumsum(lengths + len(sep))[:-1]
    ends = starts + lengths
    buf = np.frombuffer(sep + sep.join(encoded) + sep, dtype=np.uint8).copy()
    return buf, starts, ends


def _bits(values):
    return np.ascontiguousarray(values, dtype=np.float64).view(np.uint64)


def _float_bits(x):
    return int(np.array([x], dtype=np.float64).view(np.uint64)[0])


def _expected(tokens):
    """Reference values and statuses from Python's ``float()``."""
    values = np.array([float(t) for t in tokens], dtype=np.float64)
    status = np.where(np.isinf(values), PARSE_RANGE, PARSE_OK).astype(np.int64)
    return values, status


def _check_tokens(tokens):
    """Parse in one njit loop and compare bit for bit with ``float()``."""
    tokens = list(tokens)
    exp_values, exp_status = _expected(tokens)
    buf, starts, ends = _pack(tokens)
    values, status = _parse_all(buf, starts, ends)
    bad = np.flatnonzero((status != exp_status) | (_bits(values) != _bits(exp_values)))
    if bad.size:
        lines = [
            f"{tokens[k]!r}: got ({values[k]!r}, {status[k]}) "
            f"expected ({exp_values[k]!r}, {exp_status[k]})"
            for k in bad[:10]
        ]
        pytest.fail(f"{bad.size} of {len(tokens)} tokens wrong:\n" + "\n".join(lines))
    return len(tokens)


def _parse_py(token):
    """Call ``parse_number`` from Python on a read-only single-token buffer."""
    raw = token.encode("utf-8") if isinstance(token, str) else token
    buf = np.frombuffer(raw, dtype=np.uint8)
    return parse_number(buf, 0, len(raw))


def _random_finite_doubles(rng, n):
    """Uniformly random bit patterns, restricted to finite values."""
    x = rng.integers(0, 2**64, size=int(n * 1.01) + 16, dtype=np.uint64).view(np.float64)
    return x[np.isfinite(x)][:n]


def _exact_decimal(fr: Fraction) -> str:
    """Exact decimal expansion of a dyadic rational (denominator 2**k)."""
    num, den = fr.numerator, fr.denominator
    k = den.bit_length() - 1
    assert den == 1 << k
    sign = "-" if num < 0 else ""
    digits = str(abs(num) * 5**k)  # abs(num)/2**k == abs(num)*5**k / 10**k
    if k == 0:
        return sign + digits
    digits = digits.rjust(k + 1, "0")
    return f"{sign}{digits[:-k]}.{digits[-k:]}"


def _midpoint(x: float) -> Fraction:
    """Exact midpoint between positive finite ``x`` and the next double up."""
    return (Fraction(x) + Fraction(math.nextafter(x, math.inf))) / 2


# Boundary cases from the specification, all compared against float().
BOUNDARY_TOKENS = [
    "0", "-0", "+0", "0.0", "-0.0", "00000", "-.0", "0.", "0e0", "-0e-0",
    "+1", "-.5", ".5", "5.", "1e5", "1E+05", "0001.2500", "1.e3", "1.E-3",
    "1", "-1", "0.1", "0.2", "0.3", "1.5", "123456789", "3.141592653589793",
    "1e-400", "-1e-400", "-0e400", "4.9e-324", "-4.9e-324", "5e-324",
    "2.4703282292062328e-324", "2.4703282292062327e-324",
    "-2.4703282292062328e-324", "-2.4703282292062327e-324",
    "2.2250738585072011e-308", "2.2250738585072012e-308",
    "2.2250738585072014e-308", "2.225073858507201136057409796709131975934819546351645648e-308",
    "1.7976931348623157e308", "1.7976931348623158e308", "-1.7976931348623158e308",
    "1.7976931348623159e308", "-1.7976931348623159e308", "1e308", "1e309",
    "1e400", "-1e400", "1e-99999999999999999999", "-1e-99999999999999999999",
    "0e99999999999", "-0e99999999999", "0.000e+99999999999999999999999999",
    "1e99999999999999999999", "0.00000000000000000000000000000000001e35",
    # Exponents that would wrap around a 64-bit accumulator (2**63, 2**64+1,
    # ...): an unclamped parser turns these into small or negated exponents.
    "1e9223372036854775807", "1e9223372036854775808", "1e-9223372036854775809",
    "1e18446744073709551616", "1e18446744073709551617", "-1e18446744073709551618",
    "1e-18446744073709551615", "1e-18446744073709551616", "0.1e36893488147419103233",
    "1" + "0" * 30 + "e-18446744073709551616",
    "1000000000000000000000000000000000000e-36",
    "9007199254740992", "9007199254740993", "9007199254740994",
    "9007199254740995", "9007199254740993.0000000000000000001",
    "9007199254740992.9999999999999999999",
    "18446744073709551615", "18446744073709551616", "18446744073709551617",
    "9999999999999999999", "10000000000000000000", "99999999999999999999",
    "1e22", "1e23", "9007199254740991e22", "9007199254740993e22", "1e37",
    "123456789e22", "8.98846567431158e307", "1" + "0" * 400 + "e-400",
    "0." + "0" * 400 + "1e400", "1" * 300, "7" * 800 + "e-1100",
    "2." + "0" * 300 + "1", "1.00000000000000011102230246251565404236316680908203125",
    "1.00000000000000011102230246251565404236316680908203124",
    "1.00000000000000011102230246251565404236316680908203126",
    "0.1000000000000000055511151231257827021181583404541015625",
    # 2**1024 - 2**970: exactly halfway between DBL_MAX and 2**1024 -> inf.
    str(2**1024 - 2**970),
    str(2**1024 - 2**970 - 1),
]

SYNTAX_TOKENS = [
    "inf", "-inf", "+inf", "nan", "NaN", "-nan", "Infinity", "infinity",
    "1_000", "0x10", "0X1p3", "1,5", "1.2.3", "e5", "E5", ".", "-", "+", "-.",
    "+.", "1e", "1e+", "1e-", "1E", " 1", "1 ", " ", "1 2", "\t1", "1\t",
    "1\n", "1d5", "1D5", "1f", "1.5f", ".e1", "-.e1", "e", "--1", "+-1",
    "-+1", "1e5.0", "1e1e1", "1e+-1", "1.5e++3", "0b1", "1..2", "1.2.",
    "..1", "1-", "1+1", "1e5e", "\x001", "1\x00", "١", "1\u00a0",
]


# ---------------------------------------------------------------------------
# Table
# ---------------------------------------------------------------------------
def test_pow5_table_spot_values():
    """Entries published in the fast_float/Lemire table."""
    hi, lo = lemire._POW5_HI, lemire._POW5_LO
    assert hi.shape == lo.shape == (651,)
    spots = {
        -342: (0xEEF453D6923BD65A, 0x113FAA2906A13B3F),
        -18: (0x9392EE8E921D5D07, 0x3AFF322E62439FD0),
        0: (0x8000000000000000, 0x0),
        308: (0x8E679C2F5E44FF8F, 0x570F09EAA7EA7648),
    }
    for q, (h, l) in spots.items():
        assert (int(hi[q + 342]), int(lo[q + 342])) == (h, l), q
    # Every entry is normalised and approximates 5**q to within 2**-126
    # relative error (checked with exact rationals).
    for q in range(-342, 309):
        t = (int(hi[q + 342]) << 64) | int(lo[q + 342])
        assert t >> 127 == 1
        p = Fraction(5) ** q
        e = math.floor(math.log2(5) * q) if q else 0
        # T / 2**127 approximates p / 2**e for the exponent e that puts it in [1, 2).
        while p / Fraction(2) ** e >= 2:
            e += 1
        while p / Fraction(2) ** e < 1:
            e -= 1
        ratio = Fraction(t, 2**127) / (p / Fraction(2) ** e)
        assert abs(ratio - 1) < Fraction(1, 2**126), q


# ---------------------------------------------------------------------------
# Status codes and grammar
# ---------------------------------------------------------------------------
def test_status_constants():
    assert (PARSE_OK, PARSE_SYNTAX, PARSE_EMPTY, PARSE_RANGE) == (0, 1, 2, 3)


@pytest.mark.parametrize("token", SYNTAX_TOKENS)
def test_syntax_errors_from_python(token):
    value, status = _parse_py(token)
    assert status == PARSE_SYNTAX
    assert value == 0.0


def test_syntax_errors_in_njit_loop():
    buf, starts, ends = _pack(SYNTAX_TOKENS, sep=b",")
    _, status = _parse_all(buf, starts, ends)
    assert (status == PARSE_SYNTAX).all(), [
        t for t, s in zip(SYNTAX_TOKENS, status) if s != PARSE_SYNTAX
    ]


def test_empty():
    assert _parse_py("") == (0.0, PARSE_EMPTY)
    buf = np.frombuffer(b"12345", dtype=np.uint8)
    assert parse_number(buf, 3, 3)[1] == PARSE_EMPTY
    assert parse_number(buf, 5, 5)[1] == PARSE_EMPTY
    buf, starts, ends = _pack(["", "1", ""], sep=b",")
    _, status = _parse_all(buf, starts, ends)
    assert status.tolist() == [PARSE_EMPTY, PARSE_OK, PARSE_EMPTY]


@pytest.mark.parametrize(
    "token",
    ["1e400", "-1e400", "1.7976931348623159e308", "1e309", "-1e99999999999",
     "1e99999999999999999999", str(2**1024 - 2**970), "17976931348623158080e289"],
)
def test_range_errors(token):
    value, status = _parse_py(token)
    assert status == PARSE_RANGE
    assert math.isinf(value) and math.copysign(1.0, value) == math.copysign(1.0, float(token))


def test_slice_of_larger_buffer():
    # The token is only buf[start:end]; neighbouring digits must be ignored.
    buf = np.frombuffer(b"9991.25e3999", dtype=np.uint8)
    assert parse_number(buf, 3, 9) == (1250.0, PARSE_OK)
    assert parse_number(buf, 3, 4) == (1.0, PARSE_OK)
    assert parse_number(buf, 4, 7) == (0.25, PARSE_OK)
    assert parse_number(buf, 3, 8)[1] == PARSE_SYNTAX  # "1.25e"


def test_foreign_byte_anywhere_in_long_digit_runs():
    # Fraction digits are read 8 at a time; a single non-digit byte at any
    # position of the 8-byte window (including bytes just outside '0'..'9'
    # and bytes whose +6 would carry) must still be a syntax error.
    foreign = [b":", b"/", b"\x00", b"\xff", b"\xfa", b"\xb5", b"?", b"@", b" ",
               b"\x7f", b"\x10", b"\x3a", b"\xf3", b"_", b","]
    tokens = []
    for n in range(1, 26):
        digits = b"".join(bytes([48 + (k * 7 + n) % 10]) for k in range(n))
        for pos in range(n + 1):
            for f in foreign:
                for head in (b"", b"1.", b"-0.", b"."):
                    tokens.append(head + digits[:pos] + f + digits[pos:])
    buf, starts, ends = _pack(tokens, sep=b"5")
    _, status = _parse_all(buf, starts, ends)
    bad = [t for t, st in zip(tokens, status) if st != PARSE_SYNTAX]
    assert not bad, bad[:10]
    # And the same runs without the foreign byte are exact.
    clean = []
    for n in range(1, 41):
        digits = "".join(str((k * 7 + n) % 10) for k in range(n))
        clean += [digits, "0." + digits, "-." + digits, "1." + digits + "e-7"]
        clean.append(digits + "." + digits)
    _check_tokens(clean)


def test_rejects_non_contiguous_buffer():
    strided = np.frombuffer(b"1x2x3", dtype=np.uint8)[::2]
    with pytest.raises(numba.core.errors.TypingError, match="C-contiguous"):
        parse_number(strided, 0, 3)
    with pytest.raises(numba.core.errors.TypingError, match="uint8"):
        parse_number(np.zeros(4, dtype=np.int8), 0, 3)


@numba.njit(cache=True)
def _parse_values_nan_on_error(buf, starts, ends):
    out = np.empty(starts.size, dtype=np.float64)
    for k in range(starts.size):
        v, s = parse_number(buf, starts[k], ends[k])
        out[k] = v if s == PARSE_OK else np.nan
    return out


def test_other_index_types():
    tokens = ["1.5", "-2e3", "0.1", "123456789012345678901234567890", "4.9e-324"]
    buf, starts, ends = _pack(tokens, sep=b",")
    expected = [float(t) for t in tokens]
    # (int64 is what every other test uses.)
    for dtype in (np.int32, np.uint64):
        got = _parse_values_nan_on_error(buf, starts.astype(dtype), ends.astype(dtype))
        assert got.tolist() == expected, dtype


# ---------------------------------------------------------------------------
# Exactness
# ---------------------------------------------------------------------------
def test_boundary_cases_from_python():
    for token in BOUNDARY_TOKENS:
        value, status = _parse_py(token)
        expected = float(token)
        if math.isinf(expected):
            assert status == PARSE_RANGE, token
        else:
            assert status == PARSE_OK, token
        assert _float_bits(value) == _float_bits(expected), (token, value, expected)


def test_boundary_cases_in_njit_loop():
    _check_tokens(BOUNDARY_TOKENS)


def test_signed_zero():
    negative_zeros = ["-0", "-0.0", "-.0e5", "-1e-400", "-2.4703282292062327e-324",
                      "-0e99999999999"]
    for token in negative_zeros:
        value, status = _parse_py(token)
        assert status == PARSE_OK
        assert value == 0.0 and math.copysign(1.0, value) == -1.0, token
    for token in ["0", "+0", "1e-400", "0e-99999999999999999999999"]:
        value, status = _parse_py(token)
        assert value == 0.0 and math.copysign(1.0, value) == 1.0, token


def test_random_bit_patterns_repr():
    rng = np.random.default_rng(SEED)
    x = _random_finite_doubles(rng, 600_000)
    assert _check_tokens(map(repr, x.tolist())) == 600_000


def test_random_normals_repr():
    rng = np.random.default_rng(SEED + 1)
    x = np.concatenate([rng.normal(size=300_000), rng.normal(scale=1e3, size=50_000),
                        rng.normal(scale=1e-3, size=50_000)])
    assert _check_tokens(map(repr, x.tolist())) == 400_000


# format(v, ".17g") is the same as "%.17g" % v.
@pytest.mark.parametrize("fmt", [".15g", ".17g", ".20e", ".25g", "+.16e", ".3f"])
def test_random_doubles_other_formats(fmt):
    rng = np.random.default_rng(SEED + 2)
    x = _random_finite_doubles(rng, 75_000).tolist()
    x += rng.normal(size=25_000).tolist()
    _check_tokens([format(v, fmt) for v in x])


def test_python_calls_sample():
    # parse_number called from Python (read-only buffers), random sample.
    rng = np.random.default_rng(SEED + 3)
    x = _random_finite_doubles(rng, 2000).tolist() + rng.normal(size=1000).tolist()
    for v in x:
        for token in (repr(v), format(v, ".20e")):
            value, status = _parse_py(token)
            assert status == PARSE_OK
            assert _float_bits(value) == _float_bits(float(token)), token


def _random_decimal_token(r: random.Random) -> str:
    """A random token of the accepted grammar with a 1..40 digit significand."""
    nd = r.randint(1, 40)
    digits = "".join(r.choice("0123456789") for _ in range(nd))
    if r.random() < 0.2:
        digits = "0" * r.randint(1, 5) + digits  # leading zeros do not count
    point = r.randint(0, len(digits))
    form = r.random()
    if form < 0.3:
        mant = digits
    elif form < 0.9:
        mant = digits[:point] + "." + digits[point:]
    else:
        mant = "." + digits
    sign = r.choice(["", "", "-", "+"])
    exp = ""
    if r.random() < 0.85:
        e = r.randint(-350, 310)
        esign = "-" if e < 0 else r.choice(["", "+"])
        exp = r.choice("eE") + esign + str(abs(e)).zfill(r.choice([1, 1, 1, 3]))
    return sign + mant + exp


def test_random_decimal_strings():
    r = random.Random(SEED + 4)
    tokens = [_random_decimal_token(r) for _ in range(250_000)]
    assert _check_tokens(tokens) == 250_000


def test_random_short_decimal_strings_fast_path():
    # Short significands and small exponents exercise Clinger's fast path,
    # including its "disguised" extension for exponents 23..37.
    r = random.Random(SEED + 5)
    tokens = []
    for _ in range(100_000):
        digits = str(r.randint(0, 10 ** r.randint(1, 17)))
        tokens.append(f"{digits}e{r.randint(-30, 40)}")
    _check_tokens(tokens)


def test_subnormals_and_their_midpoints():
    rng = np.random.default_rng(SEED + 6)
    m = rng.integers(1, 2**52, size=30_000, dtype=np.uint64)
    sub = m.view(np.float64).tolist()
    tokens = [repr(v) for v in sub]
    tokens += [format(v, ".17g") for v in sub] + [format(v, ".25e") for v in sub]
    tokens += ["-" + t for t in tokens[:10_000]]
    # Exact midpoints (2k+1) * 2**-1075, ties to even, and tiny perturbations.
    for k in list(range(50)) + rng.integers(0, 2**52, size=1500).tolist():
        mid = Fraction(2 * k + 1, 2**1075)
        s = _exact_decimal(mid)
        tokens += [s, s + "000001", _exact_decimal(mid - Fraction(1, 2**1100))]
    # Around the normal/subnormal boundary.
    for k in range(-50, 50):
        tokens.append(repr(math.ldexp(1.0, -1022) + k * 5e-324))
    assert _check_tokens(tokens) >= 100_000


def test_exact_midpoints_round_to_even():
    rng = np.random.default_rng(SEED + 7)
    x = np.abs(_random_finite_doubles(rng, 2500))
    # Plus doubles of everyday magnitude, 2**-4 to 2**70, where the midpoints
    # are shortest (ties with at most 19 digits have their own test below).
    # Exact midpoints have 20+ digits, so they exercise the w / w+1 check and
    # the objmode fallback.
    y = np.ldexp(rng.uniform(1.0, 2.0, size=2500), rng.integers(-4, 70, size=2500))
    tokens = []
    with localcontext() as ctx:
        ctx.prec = 2000
        for v in x.tolist() + y.tolist():
            if v == 0.0 or math.isinf(math.nextafter(v, math.inf)):
                continue
            mid = _midpoint(v)
            exact = _exact_decimal(mid)
            tokens.append(exact)  # exact tie: must round to the even neighbour
            tokens.append("-" + exact)
            tokens.append(format(Decimal(exact), ".60e"))  # 61 digits, near-tie
            tokens.append(_exact_decimal(mid + Fraction(1, 2**1200)))  # just above
            tokens.append(_exact_decimal(mid - Fraction(1, 2**1200)))  # just below
            if "." in exact:
                stripped = exact.rstrip("0").rstrip(".")
                tokens.append(stripped)
    # Hand-picked ties: 2**53 + 1 rounds down to 2**53, 2**53 + 3 up.
    tokens += ["9007199254740993", "9007199254740995", "4503599627370496.5",
               "4503599627370497.5", "1.00000000000000011102230246251565404236316680908203125"]
    assert _check_tokens(tokens) > 20_000


def test_exact_ties_with_few_digits():
    # Decimals of at most 19 digits that are exactly halfway between two
    # doubles exist only for decimal exponents -4..23 (Lemire 2021, sec. 6);
    # Eisel-Lemire must detect them and round to even.  A tie is w * 10**q
    # whose binary significand has exactly 54 bits (the last one set):
    #   q >= 0: w = m * 2**j with m odd and m * 5**q of 54 bits;
    #   q < 0:  w = m * 5**-q with the odd part of m of 54 bits.
    r = random.Random(SEED + 11)
    tokens = []
    for q in range(-4, 24):
        for _ in range(60):
            if q >= 0:
                lo = -(-(1 << 53) // 5**q)  # ceil(2**53 / 5**q)
                hi = ((1 << 54) - 1) // 5**q
                if hi < lo:
                    continue
                m = r.randint(lo, hi) | 1
                if (m * 5**q).bit_length() != 54:
                    continue
                base = m
            else:
                base = (r.randint(1 << 52, (1 << 53) - 1) * 2 + 1) * 5**-q
            for j in range(70):
                w = base << j
                if w >= 10**19:
                    break
                tokens += [f"{w}e{q}", f"{w + 1}e{q}", f"{w - 1}e{q}", f"-{w}e{q}"]
    assert len(tokens) > 5000
    _check_tokens(tokens)


def test_huge_exponent_fields():
    # Exponent fields of 18 to 40 digits, any sign, on varied significands:
    # the accumulator must saturate instead of wrapping.
    r = random.Random(SEED + 12)
    tokens = []
    for _ in range(5000):
        e = str(r.randint(10**17, 10 ** r.randint(18, 40)))
        mant = r.choice(["1", "0", "0.000", "123.456", "9" * 30, "0." + "0" * 25 + "7"])
        tokens.append(f"{r.choice(['', '-'])}{mant}e{r.choice(['', '+', '-'])}{e}")
    _check_tokens(tokens)


def test_ties_are_resolved_to_even():
    # Independent of float(): the midpoint of a double with an even
    # significand and its successor must give the even one.
    for v in [1.0, 2.0**60, 3.0 * 2.0**40, 1e300, 5e-324 * 2, 2.0**-1022]:
        bits = _float_bits(v)
        lo = v if bits % 2 == 0 else math.nextafter(v, math.inf)
        hi = math.nextafter(lo, math.inf)
        assert _float_bits(lo) % 2 == 0
        value, status = _parse_py(_exact_decimal(_midpoint(lo)))
        assert status == PARSE_OK and value == lo
        # And the midpoint above the odd neighbour rounds up to the even one.
        odd_mid = _exact_decimal((Fraction(hi) + Fraction(math.nextafter(hi, math.inf))) / 2)
        value, status = _parse_py(odd_mid)
        assert value == math.nextafter(hi, math.inf)


def test_19_and_20_digit_significands_near_2_64():
    r = random.Random(SEED + 8)
    tokens = []
    bases = [2**64, 2**63, 10**19, 10**18, 2**53, 2**54]
    for base in bases:
        for delta in range(-300, 301):
            s = str(base + delta)
            tokens.append(s)
            tokens.append(f"{s}e{r.randint(-330, 300)}")
            tokens.append(f"{s[:1]}.{s[1:]}e{r.randint(-320, 300)}")
            tokens.append(f"0.{s}")
    for _ in range(50_000):
        nd = r.choice([17, 18, 19, 19, 20, 20, 21])
        s = str(r.randint(10 ** (nd - 1), 10**nd - 1))
        tokens.append(f"{s}e{r.randint(-345, 290)}")
    assert _check_tokens(tokens) > 50_000


def test_hundreds_of_digits():
    r = random.Random(SEED + 9)
    tokens = []
    for _ in range(3000):
        nd = r.randint(41, 800)
        digits = str(r.randint(1, 9)) + "".join(r.choice("0123456789") for _ in range(nd))
        e = r.randint(-1100, 300)
        tokens.append(f"{digits}e{e}")
        tokens.append(f"0.{digits}e{r.randint(-330, 310)}")
    # Long runs of zeros after the 19th digit (no dropped non-zero digit).
    tokens += [f"{r.randint(1, 10**19)}{'0' * r.randint(1, 300)}e-{r.randint(0, 600)}"
               for _ in range(3000)]
    _check_tokens(tokens)


def test_njit_caller_and_python_caller_agree():
    r = random.Random(SEED + 10)
    tokens = [_random_decimal_token(r) for _ in range(2000)] + BOUNDARY_TOKENS
    buf, starts, ends = _pack(tokens)
    values, status = _parse_all(buf, starts, ends)
    for k, token in enumerate(tokens):
        v, s = _parse_py(token)
        assert s == status[k]
        assert _float_bits(v) == _float_bits(values[k]), token


# ---------------------------------------------------------------------------
# Throughput (reported, not asserted)
# ---------------------------------------------------------------------------
def measure_throughput(n=2_000_000, repeats=5, seed=SEED):
    """Tokens per second for repr'd N(0, 1) doubles parsed in an njit loop.

    Returns
    -------
    float
        Best-of-``repeats`` tokens per second (single thread).
    """
    rng = np.random.default_rng(seed)
    tokens = list(map(repr, rng.normal(size=n).tolist()))
    buf, starts, ends = _pack(tokens, sep=b",")
    _sum_all(buf, starts, ends)  # compile / warm up
    best = math.inf
    for _ in range(repeats):
        t0 = time.perf_counter()
        _, bad = _sum_all(buf, starts, ends)
        best = min(best, time.perf_counter() - t0)
        assert bad == 0
    return n / best


def test_throughput_report(capsys):
    rate = measure_throughput(n=200_000, repeats=3)
    with capsys.disabled():
        print(f"\nnumparse throughput: {rate / 1e6:.1f} M tokens/s (repr of N(0,1), 1 thread)")
    assert rate > 0


if __name__ == "__main__":
    rate = measure_throughput()
    print(f"{rate / 1e6:.1f} million tokens/s (repr of N(0,1) doubles, one thread)")


# ---------------------------------------------------------------------------
# parse_prefix: the one-pass form the row parser uses
# ---------------------------------------------------------------------------
@numba.njit(cache=True)
def _prefix_all(buf, starts, limit):
    n = starts.size
    values = np.empty(n, dtype=np.float64)
    status = np.empty(n, dtype=np.int64)
    last = np.empty(n, dtype=np.int64)
    for k in range(n):
        v, s, e = numparse.parse_prefix(buf, starts[k], limit)
        values[k] = v
        status[k] = s
        last[k] = e
    return values, status, last


@pytest.mark.parametrize("delimiter", [b",", b"\n", b" ", b"%", b"}", b"x"])
def test_parse_prefix_agrees_with_parse_number(delimiter):
    # Whenever parse_number accepts a token (OK or RANGE), parse_prefix on the
    # token followed by a delimiter gives the same value and status and stops
    # right at the delimiter; whenever parse_number rejects it, parse_prefix
    # does not both succeed and stop at the token's end.
    r = random.Random(SEED + 11)
    rng = np.random.default_rng(SEED + 11)
    tokens = BOUNDARY_TOKENS + SYNTAX_TOKENS + [_random_decimal_token(r) for _ in range(20_000)]
    tokens += [repr(v) for v in _random_finite_doubles(rng, 20_000).tolist()]
    tokens += [format(v, ".10f") for v in rng.normal(scale=5.0, size=5_000).tolist()]
    tokens += ["1.5x", "12e", "1e5.", "7.", "-", "+.5e-3", "00.000", "9" * 25 + "e-3"]
    buf, starts, ends = _pack(tokens, sep=delimiter)
    exp_values, exp_status = _parse_all(buf, starts, ends)
    values, status, last = _prefix_all(buf, starts, len(buf))
    for k, t in enumerate(tokens):
        accepted = exp_status[k] in (PARSE_OK, PARSE_RANGE)
        reached = status[k] in (PARSE_OK, PARSE_RANGE) and last[k] == ends[k]
        assert accepted == reached, (t, exp_status[k], status[k], last[k] - starts[k])
        if accepted:
            assert status[k] == exp_status[k], t
            assert _float_bits(values[k]) == _float_bits(exp_values[k]), t
    # From Python, and the empty case
    assert numparse.parse_prefix(np.frombuffer(b"-2.5,7", dtype=np.uint8), 0, 6) == (-2.5, PARSE_OK, 4)
    assert numparse.parse_prefix(np.frombuffer(b"12", dtype=np.uint8), 2, 2)[1] == PARSE_EMPTY
