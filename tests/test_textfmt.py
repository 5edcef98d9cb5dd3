"""Tests for :mod:`mpikmeans.io.textfmt`: compiled fixed-point formatting, checked
against Python's exact decimal formatting."""

from __future__ import annotations

from decimal import Decimal

import numpy as np
import pytest

from mpikmeans.io.textfmt import format_fixed

I64 = np.iinfo(np.int64)


def python_fixed(t: int, decimals: int) -> str:
    """The decimal ``t / 10**decimals`` written with exactly ``decimals`` digits."""
    return format(Decimal(int(t)).scaleb(-decimals), f".{decimals}f")


def expected_text(ticks: np.ndarray, decimals: int) -> bytes:
    return "".join(",".join(python_fixed(t, decimals) for t in row) + "\n" for row in ticks).encode()


def random_ticks(seed: int, shape=(40, 5)) -> np.ndarray:
    rng = np.random.default_rng(seed)
    parts = [
        rng.integers(-10, 10, size=shape),
        rng.integers(-10**6, 10**6, size=shape),
        rng.integers(-2**53, 2**53, size=shape),
        rng.integers(I64.min, I64.max, size=shape, endpoint=True),
    ]
    t = np.concatenate(parts)
    t[0, :3] = [I64.min, I64.max, 0]
    t[1, :3] = [-1, 1, -5]
    return t.astype(np.int64)


@pytest.mark.parametrize("decimals", range(0, 19))
def test_matches_python_formatting(decimals):
    ticks = random_ticks(decimals)
    out = format_fixed(ticks, decimals)
    assert out.dtype == np.uint8 and out.ndim == 1
    assert out.tobytes() == expected_text(ticks, decimals)


@pytest.mark.parametrize(
    "t, d, text",
    [
        (12345, 3, "12.345"),
        (-5, 3, "-0.005"),
        (5, 3, "0.005"),
        (0, 0, "0"),
        (0, 2, "0.00"),
        (-1, 1, "-0.1"),
        (-10, 1, "-1.0"),
        (100, 2, "1.00"),
        (-123, 0, "-123"),
        (I64.min, 0, "-9223372036854775808"),
        (I64.max, 0, "9223372036854775807"),
        (I64.min, 18, "-9.223372036854775808"),
        (1, 15, "0.000000000000001"),
        (-1, 15, "-0.000000000000001"),
    ],
)
def test_known_values(t, d, text):
    assert format_fixed(np.array([[t]], dtype=np.int64), d).tobytes() == (text + "\n").encode()


def test_layout_and_input_forms():
    assert format_fixed(np.array([[7, -7], [0, 12]]), 0).tobytes() == b"7,-7\n0,12\n"
    # one-dimensional: one value per line
    assert format_fixed(np.array([3, -4, 0]), 1).tobytes() == b"0.3\n-0.4\n0.0\n"
    # other integer types and non-contiguous arrays are converted
    t = np.arange(12, dtype=np.int32).reshape(3, 4)[:, ::2]
    assert format_fixed(t, 2).tobytes() == b"0.00,0.02\n0.04,0.06\n0.08,0.10\n"
    assert format_fixed(np.asfortranarray(np.array([[1, 2], [3, 4]])), 0).tobytes() == b"1,2\n3,4\n"
    # nothing to write
    assert format_fixed(np.zeros((0, 3), dtype=np.int64), 4).size == 0


@pytest.mark.parametrize("decimals", [-1, 19, 30])
def test_bad_decimals(decimals):
    with pytest.raises(ValueError):
        format_fixed(np.array([[1]]), decimals)


@pytest.mark.parametrize("decimals", [0, 1, 5, 10, 15])
def test_parses_back_to_the_intended_decimal(decimals):
    rng = np.random.default_rng(100 + decimals)
    ticks = rng.integers(-2**53, 2**53, size=(50, 4))
    ticks[:5] = rng.integers(-1000, 1000, size=(5, 4))
    text = format_fixed(ticks, decimals).tobytes().decode()
    tokens = [line.split(",") for line in text.splitlines()]
    assert len(tokens) == 50 and all(len(r) == 4 for r in tokens)
    for row_t, row_s in zip(ticks, tokens):
        for t, s in zip(row_t, row_s):
            assert Decimal(s) == Decimal(int(t)).scaleb(-decimals)
            # |t| <= 2**53 and 10**decimals exact: one correctly rounded division
            assert float(s) == float(int(t)) / 10.0**decimals
            if decimals:
                assert len(s.split(".")[1]) == decimals
            else:
                assert "." not in s
    values = np.loadtxt(text.splitlines(), delimiter=",", ndmin=2)
    assert values.tobytes() == (ticks.astype(np.float64) / 10.0**decimals).tobytes()


@pytest.mark.parametrize("decimals", [0, 1, 3, 8, 10, 14])
def test_blob_rows_equal_numpy_ticks(decimals):
    # the fused kernel gives the bytes of numpy's ticks through format_fixed,
    # and rows_text_bytes counts them, for every slice of rows
    from mpikmeans.io.textfmt import format_blob_rows, rows_text_bytes

    rng = np.random.default_rng(decimals)
    k, m, rows = 5, 7, 300
    centres = rng.uniform(-30, 30, size=(k, m))
    blob = rng.integers(0, k, size=rows)
    z = rng.standard_normal((rows, m))
    z[0, :3] = [0.0, -0.0, 1e-300]
    spread = 2.5
    ticks = np.rint((centres[blob] + spread * z) * 10.0**decimals).astype(np.int64)
    out = np.empty(rows * m * 22, dtype=np.uint8)
    for lo, hi in [(0, rows), (0, 1), (17, 123), (299, 300), (5, 5)]:
        used = format_blob_rows(centres, blob, z, lo, hi, spread, decimals, out)
        assert out[:used].tobytes() == format_fixed(ticks[lo:hi], decimals).tobytes()
        assert rows_text_bytes(centres, blob, z, lo, hi, spread, decimals) == used
