"""Tests for :mod:`mpikmeans.io.rowparse`: the one-pass row parser gives exactly what
the two-pass parser it replaced gave (values, row and line counts, error code,
line, attribute and token span) on valid rows and on rows mutated at random;
the line cutter and the column min/max are independent of the thread count.

The oracle below is the parser as it was before the one-pass fast path: every
token is first scanned to its delimiter, then parsed (``_scan_token`` and
``_value`` are the module's own).  The readers' tests (test_arff*.py) check the
messages built from these results.
"""

from __future__ import annotations

import random

import numpy as np
import pytest
from numba import njit

from mpikmeans.io import rowparse
from mpikmeans.io.numparse import data_pointer
from mpikmeans.io.rowparse import (
    _COMMA,
    _LBRACE,
    _NL,
    _PERCENT,
    _RBRACE,
    E_EMPTY,
    E_FEW,
    E_INDEX,
    E_MANY,
    E_NONE,
    E_QUOTE,
    E_SPARSE,
    KEEP,
    MISSING_ERROR,
    MISSING_NAN,
    SKIP,
    _blank,
    _scan_token,
    _skip_blanks,
    _value,
    _weight,
)


@njit(cache=True)
def oracle_parse_rows(text, kinds, outcol, missing_mode, out, weights):
    """The two-pass parser (before the one-pass fast path), as it was (bar the pointer)."""
    n = text.shape[0]
    buf = data_pointer(text)  # the module's helpers take the bytes by pointer
    a = kinds.shape[0]
    m = out.shape[1]
    i = 0
    rows = 0
    line = 0
    weighted = 0
    while i < n:
        i = _skip_blanks(buf, i, n)
        if i >= n:
            line += 1
            break
        c = buf[i]
        if c == _NL or c == _PERCENT:  # blank or comment line
            while i < n and buf[i] != _NL:
                i += 1
            i += 1
            line += 1
            continue
        weights[rows] = 1.0
        if c == _LBRACE:
            # sparse row: {index value, ...}
            for j in range(m):
                out[rows, j] = 0.0
            i = _skip_blanks(buf, i + 1, n)
            if i < n and buf[i] == _RBRACE:
                i += 1
            else:
                last = -1
                while True:
                    i = _skip_blanks(buf, i, n)
                    s = i
                    idx = 0
                    while i < n and 48 <= buf[i] <= 57:
                        if idx <= a:  # stop growing: any larger index is as wrong
                            idx = idx * 10 + (buf[i] - 48)
                        i += 1
                    if i > s and idx >= a:
                        return rows, line, weighted, E_INDEX, line, -1, s, i
                    if i == s or i >= n or not _blank(buf[i]):
                        while i < n and buf[i] != _COMMA and buf[i] != _RBRACE and buf[i] != _NL:
                            i += 1
                        return rows, line, weighted, E_SPARSE, line, -1, s, i
                    last = idx
                    kind = kinds[idx]
                    ts, te, i, ok = _scan_token(buf, i, n, kind == SKIP)
                    if not ok:
                        return rows, line, weighted, E_QUOTE, line, idx, ts, te
                    if kind == KEEP:
                        v, err = _value(buf, ts, te, KEEP, missing_mode)
                        if err != E_NONE:
                            return rows, line, weighted, err, line, idx, ts, te
                        out[rows, outcol[idx]] = v
                    elif te == ts:
                        return rows, line, weighted, E_EMPTY, line, idx, ts, te
                    i = _skip_blanks(buf, i, n)
                    if i < n and buf[i] == _COMMA:
                        i += 1
                        continue
                    if i < n and buf[i] == _RBRACE:
                        i += 1
                        break
                    return rows, line, weighted, E_SPARSE, line, last, s, i
        else:
            for j in range(a):
                kind = kinds[j]
                ts, te, i, ok = _scan_token(buf, i, n, kind == SKIP)
                if not ok:
                    return rows, line, weighted, E_QUOTE, line, j, ts, te
                if te == ts:
                    # (a line with nothing on it was taken as blank above, so an
                    # empty token is a real empty value: ",," or a trailing ",")
                    return rows, line, weighted, E_EMPTY, line, j, ts, te
                if kind == KEEP:
                    v, err = _value(buf, ts, te, KEEP, missing_mode)
                    if err != E_NONE:
                        return rows, line, weighted, err, line, j, ts, te
                    out[rows, outcol[j]] = v
                if j < a - 1:
                    i = _skip_blanks(buf, i, n)
                    if i >= n or buf[i] != _COMMA:
                        return rows, line, weighted, E_FEW, line, j + 1, ts, te
                    i += 1
        # after the values: an optional ", {weight}" (dense) or "{weight}"
        i = _skip_blanks(buf, i, n)
        if i < n and buf[i] == _COMMA:
            j = _skip_blanks(buf, i + 1, n)
            if j < n and buf[j] == _LBRACE:
                w, i, err, ts, te = _weight(buf, j, n)
                if err != E_NONE:
                    return rows, line, weighted, err, line, -1, ts, te
                weights[rows] = w
                weighted = 1
            else:
                return rows, line, weighted, E_MANY, line, a, i, i + 1
        elif i < n and buf[i] == _LBRACE:
            w, i, err, ts, te = _weight(buf, i, n)
            if err != E_NONE:
                return rows, line, weighted, err, line, -1, ts, te
            weights[rows] = w
            weighted = 1
        i = _skip_blanks(buf, i, n)
        if i < n and buf[i] != _NL and buf[i] != _PERCENT:
            te = i
            while te < n and buf[te] != _NL:
                te += 1
            return rows, line, weighted, E_MANY, line, a, i, te
        while i < n and buf[i] != _NL:
            i += 1
        i += 1
        rows += 1
        line += 1
    return rows, line, weighted, E_NONE, -1, -1, -1, -1


# --------------------------------------------------------------------------- fuzzing

ATTRS = [KEEP, SKIP, KEEP, KEEP]  # a skipped attribute between kept ones

GOOD_VALUES = ["1", "-2.5", "+.5", "5.", "1e5", "-1.25E-3", "0", "-0.0", "123456789.123456789",
               "9" * 25, "2.2250738585072011e-308", "-3.1415926536"]
GOOD_SKIPPED = ["a", "'b c'", '"d,e"', "x1", "'it\\'s'"]
NOISE = [" ", "\t", "\r", ",", "x", "e", ".", "-", "+", "%", "{", "}", "?", "'", '"', "\x00", "5", "\n", ",,",
         "1e400", "?"]


def _random_row(r: random.Random) -> str:
    kind = r.random()
    if kind < 0.1:
        return r.choice(["", "   ", "% comment", "  % indented", "\t"])
    if kind < 0.25:  # sparse
        items = [f"{i} {r.choice(GOOD_VALUES) if ATTRS[i] == KEEP else r.choice(GOOD_SKIPPED)}"
                 for i in sorted(r.sample(range(len(ATTRS)), r.randint(0, len(ATTRS))))]
        row = "{" + ", ".join(items) + "}"
    else:
        row = ",".join((" " * r.randint(0, 1)) + (r.choice(GOOD_VALUES) if k == KEEP else r.choice(GOOD_SKIPPED))
                       + (" " * r.randint(0, 1)) for k in ATTRS)
    if r.random() < 0.15:
        row += r.choice([", {2}", ",{0.5}", " % trailing", "\r"])
    return row


def _mutate(r: random.Random, text: str) -> str:
    chars = list(text)
    for _ in range(r.randint(1, 3)):
        at = r.randint(0, len(chars))
        what = r.random()
        if what < 0.5:
            chars.insert(at, r.choice(NOISE))
        elif chars and what < 0.8:
            del chars[min(at, len(chars) - 1)]
        elif chars:
            chars[min(at, len(chars) - 1)] = r.choice(NOISE)
    return "".join(chars)


def _run(parse, buf, missing_mode):
    kinds = np.array(ATTRS, dtype=np.int64)
    outcol = np.array([0, -1, 1, 2], dtype=np.int64)
    lines = int((buf == 10).sum()) + 1
    out = np.full((lines, 3), 7.0)
    weights = np.full(lines, 7.0)
    res = parse(buf, kinds, outcol, missing_mode, out, weights)
    return res, out[: res[0]], weights[: res[0]]


@pytest.mark.parametrize("missing_mode", [MISSING_ERROR, MISSING_NAN])
@pytest.mark.parametrize("seed", range(4))
def test_same_results_as_the_two_pass_parser(seed, missing_mode):
    r = random.Random(seed)
    checked = errors = 0
    for case in range(1500):
        rows = [_random_row(r) for _ in range(r.randint(1, 6))]
        if case % 3:
            k = r.randrange(len(rows))
            rows[k] = _mutate(r, rows[k])
        text = "\n".join(rows) + ("\n" if r.random() < 0.7 else "")
        buf = np.frombuffer(text.encode("utf-8", "surrogatepass"), dtype=np.uint8).copy()
        got, got_x, got_w = _run(rowparse.parse_rows, buf, missing_mode)
        want, want_x, want_w = _run(oracle_parse_rows, buf, missing_mode)
        assert tuple(got) == tuple(want), (text, got, want)
        assert got_x.tobytes() == want_x.tobytes(), text
        assert got_w.tobytes() == want_w.tobytes(), text
        checked += 1
        errors += got[3] != E_NONE
    assert errors > 300 and checked - errors > 300  # both kinds were exercised


@pytest.mark.parametrize("parts", [1, 2, 3, 7, 64])
def test_line_cuts(parts):
    r = random.Random(parts)
    text = "".join("x" * r.randint(0, 30) + "\n" for _ in range(200)) + "tail"
    buf = np.frombuffer(text.encode(), dtype=np.uint8)
    cuts, counts = rowparse.line_cuts(buf, parts)
    assert cuts[0] == 0 and cuts[-1] == len(buf) and (np.diff(cuts) >= 0).all()
    assert all(c == 0 or c == len(buf) or buf[c - 1] == 10 for c in cuts)
    assert [int((buf[a:b] == 10).sum()) for a, b in zip(cuts[:-1], cuts[1:])] == counts.tolist()
    assert rowparse.last_newline(buf, 0) == text.rindex("\n")
    assert rowparse.last_newline(buf[-4:], 0) == -1


def test_column_min_max_any_parts():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(1001, 5))
    x[::7, 1] = 0.0
    x[3::7, 1] = -0.0
    x[:, 2] = 0.0
    x[500, 2] = -0.0
    x[:, 3] = -0.0
    for parts in (1, 2, 3, 8, 2000):
        lo, hi = rowparse.column_min_max(x, parts)
        np.testing.assert_array_equal(lo, x.min(axis=0))
        np.testing.assert_array_equal(hi, x.max(axis=0))
        # -0.0 is below 0.0 whatever the blocks
        assert np.signbit(lo[2]) and not np.signbit(hi[2]) and np.signbit(lo[3]) and np.signbit(hi[3])
        if parts == 1:
            first = (lo.tobytes(), hi.tobytes())
        assert (lo.tobytes(), hi.tobytes()) == first
