"""Tests for :mod:`mpikmeans.io.rowparse`: the compiled one-pass row parser gives
exactly what an independent pure-Python reference gives (values, weights, row
and line counts, error code, line, attribute and token span) on valid rows, on
rows mutated at random and on hand-picked edge cases; the line cutter and the
column min/max are independent of the thread count.

The reference, :func:`reference_parse_rows`, is written here from the format's
rules (listed in its comments) without Numba and without the parser's
helpers: it imports only the public constants of :mod:`mpikmeans.io.rowparse`
(the error codes ``E_*``, ``KEEP``/``SKIP``, ``MISSING_*``), reads tokens with
regular expressions on ``bytes``, turns numbers into floats with Python's own
``float()``, and reports errors by raising.  Where the rules were not written
down in rowparse's docstrings (which error wins, which span is reported) they
were found by probing ``parse_rows`` and are stated as rules below.  The
readers' tests (test_arff*.py) check the messages built from these results.
"""

from __future__ import annotations

import math
import random
import re

import numpy as np
import pytest

from mpikmeans.io import rowparse
from mpikmeans.io.rowparse import (
    E_EMPTY,
    E_FEW,
    E_INDEX,
    E_MANY,
    E_MISSING,
    E_NONE,
    E_NUMBER,
    E_QUOTE,
    E_RANGE,
    E_SPARSE,
    E_WEIGHT,
    KEEP,
    MISSING_ERROR,
    MISSING_NAN,
    SKIP,
)

# --------------------------------------------------------------------------- the reference
#
# The format, as the reference reads it (bytes; "blank" is space, tab or CR):
#
#   text      := line*                      lines end at '\n'; the last may not
#   line      := blank* ( '\n' | '%' ... )  a blank or comment line (not a row)
#              | blank* row trailer blank* ('%' ...)? '\n'?
#   row       := dense | sparse
#   dense     := value (',' value)*         exactly one value per attribute
#   sparse    := '{' blank* '}' | '{' pair (',' pair)* '}'
#   pair      := blank* digits blank+ value blank*
#   trailer   := blank* (','? blank* '{' weight '}')?   after the values
#   value     := blank* token blank*        token: see _plain and _quoted
#
# Each rule the parser follows that its docstrings leave open is written next
# to the code that applies it below ("Rule: ...").

# Rule (numbers, found by reading numparse and probing parse_rows): a kept
# value or a weight is a number only if it matches exactly, in ASCII,
#     [+-]? ( digits ('.' digits?)? | '.' digits ) ( [eE] [+-]? digits )?
# so '+1', '+.5', '5.', '5.e3', '00012' and '1E+5' are numbers; 'inf', 'nan',
# 'Infinity', '0x10', '1_000', '1d', '.', '+', '1e', '1e+', '.e3', '1 2' and
# non-ASCII digits are not (E_NUMBER), although float() takes several of them.
# The value is float() of the text; one that float() takes to +-inf is E_RANGE
# (also '1e99999999999999999999999'); one that underflows is 0.0 or a
# subnormal, not an error ('1e-400' -> 0.0, '0e999...' -> 0.0, '-0' -> -0.0).
_NUMBER = re.compile(rb"[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")
_BLANKS = re.compile(rb"[ \t\r]*")
# An unquoted token runs to the next ',', '}', '%' or newline.
_PLAIN = re.compile(rb"[^,}%\n]*")
# A quoted token: the quote, then escaped bytes ('\' and any byte, the newline
# included) or bytes that are neither that quote, '\' nor a newline.
_QUOTED = {q: re.compile(b"%c(?:\\\\.|[^%c\\\\\n])*" % (q, q), re.DOTALL) for q in b"'\""}
_DIGITS = re.compile(rb"[0-9]*")
_BLANK_BYTES = b" \t\r"


class _Bad(Exception):
    """A malformed row: its error code, attribute index and token span."""

    def __init__(self, code, col, start, end):
        super().__init__(code, col, start, end)
        self.code, self.col, self.start, self.end = code, col, start, end


class _Reference:
    """Reads the rows of ``text`` (bytes) into ``out`` and ``weights``."""

    def __init__(self, text, kinds, outcol, missing_mode, out, weights):
        self.t = bytes(text)
        self.kinds = [int(k) for k in kinds]
        self.outcol = [int(c) for c in outcol]
        self.missing_mode = missing_mode
        self.out = out
        self.weights = weights
        self.weighted = 0

    # ---- small readers: each takes a position and returns positions

    def _skip(self, p):
        return _BLANKS.match(self.t, p).end()

    def _at(self, p):
        """The byte at ``p`` as a one-byte string (b'' past the end)."""
        return self.t[p:p + 1]

    def _plain(self, p):
        """Unquoted token after the blanks at ``p``: ``(start, end, after)``.

        Rule: the span leaves out the blanks on both sides; ``after`` is the
        delimiter (or the end of the text).  An empty token has start == end at
        the delimiter.
        """
        start = self._skip(p)
        after = _PLAIN.match(self.t, start).end()
        return start, start + len(self.t[start:after].rstrip(_BLANK_BYTES)), after

    def _quoted(self, start):
        """The quoted token opening at ``start``: ``(end, closed)``.

        Rule: a '\' escapes the byte after it, whatever it is: an escaped quote
        does not close the token and an escaped newline does not end it (the
        row goes on on the next physical line and still counts as one line;
        parse_parallel, which cuts the text at newlines, can then disagree with
        one whole-text parse_rows call -- this is parse_rows' own behaviour).
        Unclosed (a bare newline or the end of the text comes first): the span
        runs from the opening quote to that newline or end, except that a '\'
        as the very last byte of the text still "consumes" the byte after it,
        so the span then ends at len(text) + 1.
        """
        end = _QUOTED[self.t[start]].match(self.t, start).end()
        if self._at(end) == self.t[start:start + 1]:
            return end + 1, True
        if self._at(end) == b"\\":  # only possible as the text's last byte
            return end + 2, False
        return end, False

    def _number(self, start, end):
        """float() of the token if it is a number by the rule above, else None."""
        token = self.t[start:end]
        return float(token) if _NUMBER.fullmatch(token) else None

    # ---- values

    def _value(self, p, attr):
        """Read attribute ``attr``'s value after ``p``; return ``(start, end, after)``."""
        if self.kinds[attr] == KEEP:
            # Rule: a kept (numeric) value is never quoted: a quote is just a
            # byte that makes the token not a number.  Checks in this order:
            # empty, '?', number, range.
            start, end, after = self._plain(p)
            token = self.t[start:end]
            if not token:
                raise _Bad(E_EMPTY, attr, start, end)
            if token == b"?":
                if self.missing_mode != MISSING_NAN:
                    raise _Bad(E_MISSING, attr, start, end)
                v = math.nan
            else:
                v = self._number(start, end)
                if v is None:
                    raise _Bad(E_NUMBER, attr, start, end)
                if math.isinf(v):
                    raise _Bad(E_RANGE, attr, start, end)
            self.out[self.row, self.outcol[attr]] = v
            return start, end, after
        # a skipped attribute: quoted if its first non-blank byte is a quote
        start = self._skip(p)
        if self._at(start) in (b"'", b'"'):
            end, closed = self._quoted(start)
            if not closed:
                raise _Bad(E_QUOTE, attr, start, end)
            # Rule: nothing else is checked after a closing quote here; what
            # follows is judged as a separator (E_FEW, E_SPARSE or E_MANY).
            return start, end, end
        start, end, after = self._plain(start)
        if end == start:
            raise _Bad(E_EMPTY, attr, start, end)
        return start, end, after

    def _dense(self, p):
        """A dense row from ``p``; returns the position after its last value."""
        start, end, p = self._value(p, 0)
        for attr in range(1, len(self.kinds)):
            # Rule: where a comma should separate two values and anything else
            # comes (the line end, '}', a byte after a closing quote), the row
            # is short: E_FEW for the attribute that is missing, with the span
            # of the last value read.
            sep = self._skip(p)
            if self._at(sep) != b",":
                raise _Bad(E_FEW, attr, start, end)
            start, end, p = self._value(sep + 1, attr)
        return p

    def _sparse(self, p):
        """A sparse row whose '{' is at ``p``; returns the position after its '}'."""
        self.out[self.row, :] = 0.0
        p = self._skip(p + 1)
        if self._at(p) == b"}":
            return p + 1
        while True:
            pair = self._skip(p)
            digits_end = _DIGITS.match(self.t, pair).end()
            # Rule: the index check comes first (E_INDEX, attribute -1, the
            # span of the digits; leading zeros are fine); then the index must
            # exist and be followed by a blank, else E_SPARSE (attribute -1,
            # from the index to the next ',', '}', newline or the end).
            if digits_end > pair and int(self.t[pair:digits_end]) >= len(self.kinds):
                raise _Bad(E_INDEX, -1, pair, digits_end)
            if digits_end == pair or self._at(digits_end) not in (b" ", b"\t", b"\r"):
                stop = digits_end
                while self._at(stop) not in (b"", b",", b"}", b"\n"):
                    stop += 1
                raise _Bad(E_SPARSE, -1, pair, stop)
            attr = int(self.t[pair:digits_end])
            _, _, p = self._value(digits_end, attr)
            # Rule: indices need not be sorted nor distinct (the last value
            # wins).  After a value comes ',' or '}'; anything else is
            # E_SPARSE for that pair's attribute, spanning from the pair's
            # index to the offending byte.  (A ',' before '}' makes the next
            # pair start at '}': E_SPARSE with an empty span there.)
            sep = self._skip(p)
            if self._at(sep) == b"}":
                return sep + 1
            if self._at(sep) != b",":
                raise _Bad(E_SPARSE, attr, pair, sep)
            p = sep + 1

    def _weight(self, brace):
        """The weight ``{w}`` whose '{' is at ``brace``; returns the position after '}'.

        Rule: the weight is an unquoted token closed by '}' and a number by the
        rule above, finite and > 0; otherwise E_WEIGHT, attribute -1, with the
        token's span (empty at the delimiter for '{}').
        """
        start, end, after = self._plain(brace + 1)
        w = self._number(start, end) if self._at(after) == b"}" else None
        if w is None or not 0.0 < w < math.inf:
            raise _Bad(E_WEIGHT, -1, start, end)
        self.weights[self.row] = w
        self.weighted = 1  # Rule: set as soon as read, even if the row then fails
        return after + 1

    def _row(self, p):
        """The row that starts (after blanks) at ``p``; returns where its line ends."""
        self.weights[self.row] = 1.0
        p = self._sparse(p) if self._at(p) == b"{" else self._dense(p)
        # Rule: after the values, an optional weight, '{w}' or ', {w}' (dense
        # and sparse rows alike; but '{' does not end an unquoted value, so
        # '1,a,2,3 {2}' is E_NUMBER on '3 {2}': '{w}' without the comma only
        # follows a sparse row or a quoted last value).  A ',' not followed
        # (after blanks) by '{' is E_MANY spanning just that comma; anything
        # else left before the line end or a '%' is E_MANY spanning from it to
        # the line end (not trimmed).
        sep = self._skip(p)
        if self._at(sep) == b",":
            brace = self._skip(sep + 1)
            if self._at(brace) != b"{":
                raise _Bad(E_MANY, len(self.kinds), sep, sep + 1)
            p = self._weight(brace)
        elif self._at(sep) == b"{":
            p = self._weight(sep)
        rest = self._skip(p)
        line_end = self.t.find(b"\n", rest)
        if line_end < 0:
            line_end = len(self.t)
        if rest < line_end and self._at(rest) != b"%":
            raise _Bad(E_MANY, len(self.kinds), rest, line_end)
        return line_end

    def run(self):
        t = self.t
        self.row = 0
        line = 0
        p = 0
        while p < len(t):
            first = self._skip(p)
            # Rule: a line of blanks only, or whose first non-blank byte is
            # '%', is not a row, but it counts as a line -- also blanks after
            # the last newline with no newline of their own.
            if first == len(t) or self._at(first) in (b"\n", b"%"):
                nl = t.find(b"\n", first)
                p = len(t) if nl < 0 else nl + 1
                line += 1
                continue
            try:
                p = self._row(first) + 1
            except _Bad as bad:
                return self.row, line, self.weighted, bad.code, line, bad.col, bad.start, bad.end
            self.row += 1
            line += 1
        return self.row, line, self.weighted, E_NONE, -1, -1, -1, -1


def reference_parse_rows(text, kinds, outcol, missing_mode, out, weights):
    """Pure-Python reference for :func:`rowparse.parse_rows` (same arguments, same results)."""
    return _Reference(text, kinds, outcol, missing_mode, out, weights).run()


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


def _same_as_the_reference(text, missing_mode):
    """Parse ``text`` with both; every result, value and weight must agree.  Returns the results."""
    buf = np.frombuffer(text.encode("utf-8", "surrogatepass"), dtype=np.uint8).copy()
    got, got_x, got_w = _run(rowparse.parse_rows, buf, missing_mode)
    want, want_x, want_w = _run(reference_parse_rows, buf, missing_mode)
    assert tuple(got) == tuple(want), (text, got, want)
    assert got_x.tobytes() == want_x.tobytes(), text
    assert got_w.tobytes() == want_w.tobytes(), text
    return got


@pytest.mark.parametrize("missing_mode", [MISSING_ERROR, MISSING_NAN])
@pytest.mark.parametrize("seed", range(4))
def test_same_results_as_the_reference(seed, missing_mode):
    r = random.Random(seed)
    checked = errors = 0
    for case in range(1500):
        rows = [_random_row(r) for _ in range(r.randint(1, 6))]
        if case % 3:
            k = r.randrange(len(rows))
            rows[k] = _mutate(r, rows[k])
        text = "\n".join(rows) + ("\n" if r.random() < 0.7 else "")
        got = _same_as_the_reference(text, missing_mode)
        checked += 1
        errors += got[3] != E_NONE
    assert errors > 300 and checked - errors > 300  # both kinds were exercised


# Tokens on either side of the number rule, in the last (kept) column.
NUMBER_TOKENS = ["+1", "+.5", ".5", "5.", "5.e3", "00012", "1E+5", "-0", "-0.0", "1e-400", "5e-324",
                 "0e99999999999999999999", "12345678901234567890123", "0.1000000000000000055511151231257827",
                 "inf", "-inf", "nan", "Infinity", "0x10", "1_000", "1d", "1f", ".", "+", "-", "1e", "1e+", ".e3",
                 "1 2", "?", "??", "'1'", "\u0661", "\uff11", "1\x00", "1e400", "-1e400",
                 "1e99999999999999999999999", " \t-2\r "]
# Rows at the edges of the format's rules (see the reference's comments).
EDGE_ROWS = [
    "", "\n", "  \n \n", "a,b\n  ", "%x", "  % c\n1,a,2,3", "1,a,2,3\r\n1,b,2,3\r\n", "1,a,2,3", ",", "}", "1,}",
    "1,a,2,3}", "1,a,2", "1,a,2,", "1,,2,3", "1,a b,2,3", "1,a'b,2,3",
    "1,'a\\\nb',2,3\n4,x,5,6\n1,?", "1,'a\\", "1,'a\\'", "1,'a\\',2,3", "1,'ab", "1,'ab\n2,c,3,4", "1,'a'b,2,3",
    "1,'a' ,2,3 ", "1,\"a,b\",2,3", "1,'',2,3", "1,\"it\\\"s\",2,3", "'1',a,2,3",
    "1,a,2,3,{ 2 }", "1,a,2,3 {2}", "1,a,2,3,{2,3}", "1,a,2,3,{}", "1,a,2,3,{2", "1,a,2,3,{0}", "1,a,2,3,{-1}",
    "1,a,2,3,{1e400}", "1,a,2,3,{?}", "1,a,2,3,{5e-324}", "1,a,2,3 {2} %c", "1,a,2,3 {2}{3}", "1,a,2,3 {2} x",
    "1,a,2,3 , \n", "1,a,2,3,4", "1,a,2,3 4",
    "{}", "{ }", "{0 1}{2}", "{0 1} , {2}x", "{0 1}, 5", "{2}", "{0 1,}", "{01 5}", "{9999999999999999999999 1}",
    "{4 1}", "{4x}", "{0 1\n", "{0 1", "{0 ", "{0", "{1 'a'x, 2 3}", "{-1 2}", "{1,2}", "{0 1, 0 2}", "{3 2, 0 1}",
    "{1 , 2 3}", "{1 \"a}\", 2 3}", "{0 ?}", "{0 1 2}", "{0\t1,2\r3}", "{1 'ab}", "{0 1}\n{}\n{3 1e400}",
]


@pytest.mark.parametrize("missing_mode", [MISSING_ERROR, MISSING_NAN])
def test_edge_cases_same_as_the_reference(missing_mode):
    texts = EDGE_ROWS + [f"1,a,2,{tok}" for tok in NUMBER_TOKENS] + [f"{{3 {tok}}}" for tok in NUMBER_TOKENS]
    for text in texts:
        _same_as_the_reference(text, missing_mode)


@pytest.mark.parametrize("text, want", [
    # (text, (rows, lines, weighted, err, err_line, err_col, tok_start, tok_end)), worked out by hand
    ("1,a,2,3\n% c\n\n4,'b,c',5,6, {2}\n", (2, 4, 1, E_NONE, -1, -1, -1, -1)),
    ("1,a,2,3 {2}", (0, 0, 0, E_NUMBER, 0, 3, 6, 10)),  # '{' does not end an unquoted value, '}' does
    ("1,a,2,inf\n", (0, 0, 0, E_NUMBER, 0, 3, 6, 9)),
    ("1,a,2,1e999", (0, 0, 0, E_RANGE, 0, 3, 6, 11)),
    ("1,a,2,?", (0, 0, 0, E_MISSING, 0, 3, 6, 7)),
    ("\n1,a,2\n", (0, 1, 0, E_FEW, 1, 3, 5, 6)),
    ("1,a,2,3,4", (0, 0, 0, E_MANY, 0, 4, 7, 8)),
    ("1,a,,3", (0, 0, 0, E_EMPTY, 0, 2, 4, 4)),
    ("1,'a,2,3", (0, 0, 0, E_QUOTE, 0, 1, 2, 8)),
    ("{0 1, 4 2}", (0, 0, 0, E_INDEX, 0, -1, 6, 7)),
    ("{1 'a' 2 2}", (0, 0, 0, E_SPARSE, 0, 1, 1, 7)),
    ("1,a,2,3,{0}", (0, 0, 0, E_WEIGHT, 0, -1, 9, 10)),
])
def test_reference_on_rows_worked_out_by_hand(text, want):
    buf = np.frombuffer(text.encode(), dtype=np.uint8).copy()
    assert _run(reference_parse_rows, buf, MISSING_ERROR)[0] == want
    assert tuple(_run(rowparse.parse_rows, buf, MISSING_ERROR)[0]) == want

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
