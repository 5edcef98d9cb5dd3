"""Tests for :mod:`mpikmeans.io.rowparse`: the compiled one-pass row parser gives
exactly what an independent pure-Python reference gives (values, nominal
attributes' one-hot blocks, weights, row and line counts, error code, line,
attribute and token span) on valid rows, on rows mutated at random and on
hand-picked edge cases, with and without nominal attributes, in both
tokenisations: ARFF's (Weka's: values separated by commas, blanks or both, a
comma at the end of a row, quoted numbers) and a CSV file's with each delimiter
(comma, tab, ';' or '|'); the line cutter and the column min/max are
independent of the thread count.

The reference, :func:`reference_parse_rows`, is written here from the format's
rules (listed in its comments) without Numba and without the parser's
helpers: it imports only the public constants of :mod:`mpikmeans.io.rowparse`
(the error codes ``E_*``, ``KEEP``/``SKIP``/``NOMINAL``, ``MISSING_*``,
``WEKA_TOKENS``/``CSV_TOKENS``) and
:data:`mpikmeans.nominal.ONE`, reads tokens with regular expressions on
``bytes``, turns numbers into floats with Python's own ``float()``, looks a
nominal value up among its attribute's categories (a list of ``str``, not the
parser's table: the compiled parser gets :func:`rowparse.nominal_table` of the
same list), and reports errors by raising.  Where the rules were not written
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

from mpikmeans.io import rowparse, split
from mpikmeans.io.rowparse import (
    E_EMPTY,
    E_FEW,
    E_INDEX,
    E_MANY,
    E_MISSING,
    E_NOMINAL,
    E_NONE,
    E_NUMBER,
    E_QUOTE,
    E_RANGE,
    E_SPARSE,
    E_WEIGHT,
    KEEP,
    MISSING_ERROR,
    MISSING_NAN,
    NOMINAL,
    SKIP,
    CSV_TOKENS,
    WEKA_TOKENS,
)
from mpikmeans.nominal import ONE

# --------------------------------------------------------------------------- the reference
#
# The format, as the reference reads it (bytes; D is the delimiter, ',' in ARFF
# and tab, ';' or '|' in a CSV file; "blank" is space, CR or tab, but not tab
# where D is tab: there a tab separates values and is never trimmed):
#
#   text      := line*                      lines end at '\n'; the last may not
#   line      := blank* ( '\n' | '%' ... )  a blank or comment line (not a row)
#              | blank* row trailer blank* ('%' ...)? '\n'?
#   row       := dense | sparse
#   dense     := value (D value)*           exactly one value per attribute
#   sparse    := '{' blank* '}' | '{' pair (D pair)* '}'
#   pair      := blank* digits blank+ value blank*
#   trailer   := blank* (D? blank* '{' weight '}')?   after the values
#   value     := blank* token blank*        token: see _plain and _quoted
#
# Where D is not ',', a comma is an ordinary byte of an unquoted token (so
# '1,5' is not a number: E_NUMBER), and so are the other delimiters' bytes.
#
# That is the CSV tokenisation.  ARFF's (weka=True; D is ','), as Weka's
# ArffLoader tokenizer reads a row, blanks and commas both separate tokens:
#
#   word      := a run of bytes none of blank , ' " { } % \n   (no blanks to trim)
#   dense     := value (sep value)*
#   sep       := blank* (',' blank*)?       may be empty (after or before a quote),
#                                           but not before the line end, '%', '{', '}'
#   trailer   := (blank | ',')* ('{' weight '}' (blank | ',')*)?
#   sparse    := '{' ((blank | ',')* digits (blank | ',')* value)* (blank | ',')* '}'
#
# so '1 2', '1\t2', '1,2,' and '1 , 2' are rows of two values; ',,' still leaves
# an empty value between the commas (E_EMPTY; Weka would skip it).
#
# In both, a kept value whose first byte is a quote is a quoted token whose
# inside, blanks trimmed, must be a number ('?' and '' are not: E_NUMBER).
#
# A sparse row sets every output column to 0.0, and each NOMINAL attribute's
# block to its first category; its pairs then overwrite what they give.
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
# Blanks (around values, before a sparse value, around a weight) and an
# unquoted token, which runs to the next delimiter, '}', '%' or newline; both
# per delimiter, see _Syntax.
# A quoted token: the quote, then escaped bytes ('\' and any byte, the newline
# included) or bytes that are neither that quote, '\' nor a newline.
_QUOTED = {q: re.compile(b"%c(?:\\\\.|[^%c\\\\\n])*" % (q, q), re.DOTALL) for q in b"'\""}
_DIGITS = re.compile(rb"[0-9]*")
# Inside quotes, '\' and the byte after it stand for that byte.
_ESCAPED = re.compile(rb"\\(.)", re.DOTALL)
DELIMITERS = [b",", b"\t", b";", b"|"]


class _Syntax:
    """What depends on the delimiter ``delim`` (one byte) and the tokenisation: the blanks and the unquoted token."""

    def __init__(self, delim, weka=False):
        assert isinstance(delim, bytes) and len(delim) == 1, delim
        assert delim == b"," or not weka, delim
        self.delim = delim
        self.weka = weka
        # a tab is a blank unless it is the delimiter
        self.blank_bytes = b" \r" if delim == b"\t" else b" \t\r"
        self.blank_set = tuple(bytes([c]) for c in self.blank_bytes)  # (b'' is in no tuple of these)
        self.blanks = re.compile(b"[" + re.escape(self.blank_bytes) + b"]*")
        self.separators = re.compile(b"[" + re.escape(self.blank_bytes + delim) + b"]*")
        ends = b" \t\r,'\"{}%\n" if weka else delim + b"}%\n"
        self.word_ends = tuple(bytes([c]) for c in ends)
        self.plain = re.compile(b"[^" + re.escape(ends) + b"]*")


_SYNTAX = {(d, False): _Syntax(d) for d in DELIMITERS}
_SYNTAX[b",", True] = _Syntax(b",", True)


class _Bad(Exception):
    """A malformed row: its error code, attribute index and token span."""

    def __init__(self, code, col, start, end):
        super().__init__(code, col, start, end)
        self.code, self.col, self.start, self.end = code, col, start, end


class _Reference:
    """Reads the rows of ``text`` (bytes) into ``out`` and ``weights``.

    ``categories`` gives each ``NOMINAL`` attribute's categories (``str``, in
    header order; None for the other attributes, or None for no nominal one);
    ``delim`` is the byte between values (``b","`` in ARFF; ``b"\\t"``,
    ``b";"`` or ``b"|"`` in a CSV file); ``weka``: ARFF's tokenisation.
    """

    def __init__(self, text, kinds, outcol, missing_mode, out, weights, categories=None, delim=b",", weka=False):
        self.t = bytes(text)
        self.syntax = _SYNTAX.get((delim, weka)) or _Syntax(delim, weka)
        self.weka = weka
        self.delim = delim
        self.kinds = [int(k) for k in kinds]
        self.outcol = [int(c) for c in outcol]
        categories = categories if categories is not None else [None] * len(self.kinds)
        self.categories = [None if c is None else [v.encode("utf-8") for v in c] for c in categories]
        self.missing_mode = missing_mode
        self.out = out
        self.weights = weights
        self.weighted = 0

    # ---- small readers: each takes a position and returns positions

    def _skip(self, p):
        return self.syntax.blanks.match(self.t, p).end()

    def _skip_separators(self, p):
        """Past blanks and delimiters."""
        return self.syntax.separators.match(self.t, p).end()

    def _at(self, p):
        """The byte at ``p`` as a one-byte string (b'' past the end)."""
        return self.t[p:p + 1]

    def _plain(self, p):
        """Unquoted token after the blanks at ``p``: ``(start, end, after)``.

        Rule: the span leaves out the blanks on both sides; ``after`` is the
        byte that ends it (CSV: the delimiter, '}', '%', newline or the end of
        the text; ARFF: any byte that is not part of a word).  An empty token
        has start == end there.
        """
        start = self._skip(p)
        after = self.syntax.plain.match(self.t, start).end()
        return start, start + len(self.t[start:after].rstrip(self.syntax.blank_bytes)), after

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
        return self._number_bytes(self.t[start:end])

    @staticmethod
    def _number_bytes(token):
        return float(token) if _NUMBER.fullmatch(token) else None

    # ---- values

    def _value(self, p, attr):
        """Read attribute ``attr``'s value after ``p``; return ``(start, end, after)``."""
        if self.kinds[attr] == KEEP:
            start = self._skip(p)
            if self._at(start) in (b"'", b'"'):
                # Rule: a quoted number: E_QUOTE if never closed, then its inside, blanks
                # trimmed, must be a number ('?' and '' are not); the span has the quotes
                end, closed = self._quoted(start)
                if not closed:
                    raise _Bad(E_QUOTE, attr, start, end)
                v = self._number_bytes(self.t[start + 1:end - 1].strip(b" \t\r"))
                if v is None:
                    raise _Bad(E_NUMBER, attr, start, end)
                if math.isinf(v):
                    raise _Bad(E_RANGE, attr, start, end)
                self.out[self.row, self.outcol[attr]] = v
                return start, end, end
            # Rule: otherwise checks in this order: empty, '?', number, range.
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
        start, end, after = self._token(p, attr)
        if self.kinds[attr] == NOMINAL:
            self._nominal(start, end, attr)
        return start, end, after

    def _token(self, p, attr):
        """A token of a skipped or nominal attribute after ``p``: ``(start, end, after)``.

        Rule: such a token is quoted if its first non-blank byte is a quote
        (E_QUOTE if never closed), else plain (E_EMPTY if empty; a quoted
        token is never empty: ``''`` is two bytes).
        """
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

    def _nominal(self, start, end, attr):
        """Write nominal attribute ``attr``'s block for its token ``t[start:end]``.

        Rule: an unquoted ``?`` alone is a missing value (E_MISSING, or NaN
        throughout the block); a quoted ``'?'`` is the category ``?``.  The
        value is the token itself, or for a quoted token the bytes between
        its quotes with each ``\\x`` read as ``x``; it must be one of the
        categories byte for byte in UTF-8 (no trimming inside the quotes, no
        case folding, no prefix match), else E_NOMINAL with the token's span
        (quotes included).  The block, ``len(categories)`` columns from the
        attribute's output column, gets ONE at the category's index and 0.0
        elsewhere.
        """
        token = self.t[start:end]
        categories = self.categories[attr]
        col = self.outcol[attr]
        if token == b"?":
            if self.missing_mode != MISSING_NAN:
                raise _Bad(E_MISSING, attr, start, end)
            self.out[self.row, col:col + len(categories)] = math.nan
            return
        value = _ESCAPED.sub(rb"\1", token[1:-1]) if token[:1] in (b"'", b'"') else token
        if value not in categories:
            raise _Bad(E_NOMINAL, attr, start, end)
        self.out[self.row, col:col + len(categories)] = 0.0
        self.out[self.row, col + categories.index(value)] = ONE

    def _dense(self, p):
        """A dense row from ``p``; returns the position after its last value."""
        start, end, p = self._value(p, 0)
        for attr in range(1, len(self.kinds)):
            sep = self._skip(p)
            if self.weka:
                # Rule (ARFF): blanks, one comma, blanks, or nothing (after or before a
                # quote); the row is short (E_FEW, as below) where the text, the
                # line or the values end ('%', '{', '}') first
                if self._at(sep) == b",":
                    sep = self._skip(sep + 1)
                if self._at(sep) in (b"", b"\n", b"%", b"{", b"}"):
                    raise _Bad(E_FEW, attr, start, end)
                start, end, p = self._value(sep, attr)
                continue
            # Rule: where the delimiter should separate two values and anything else
            # comes (the line end, '}', a byte after a closing quote), the row
            # is short: E_FEW for the attribute that is missing, with the span
            # of the last value read.
            if self._at(sep) != self.delim:
                raise _Bad(E_FEW, attr, start, end)
            start, end, p = self._value(sep + 1, attr)
        return p

    def _sparse(self, p):
        """A sparse row whose '{' is at ``p``; returns the position after its '}'."""
        self.out[self.row, :] = 0.0
        for attr, categories in enumerate(self.categories):
            if self.kinds[attr] == NOMINAL and categories:
                self.out[self.row, self.outcol[attr]] = ONE
        if self.weka:
            return self._sparse_weka(p + 1)
        p = self._skip(p + 1)
        if self._at(p) == b"}":
            return p + 1
        while True:
            pair = self._skip(p)
            digits_end = _DIGITS.match(self.t, pair).end()
            # Rule: the index check comes first (E_INDEX, attribute -1, the
            # span of the digits; leading zeros are fine); then the index must
            # exist and be followed by a blank (so not by a tab where the
            # delimiter is tab), else E_SPARSE (attribute -1, from the index
            # to the next delimiter, '}', newline or the end).
            if digits_end > pair and int(self.t[pair:digits_end]) >= len(self.kinds):
                raise _Bad(E_INDEX, -1, pair, digits_end)
            if digits_end == pair or self._at(digits_end) not in self.syntax.blank_set:
                stop = digits_end
                while self._at(stop) not in (b"", self.delim, b"}", b"\n"):
                    stop += 1
                raise _Bad(E_SPARSE, -1, pair, stop)
            attr = int(self.t[pair:digits_end])
            _, _, p = self._value(digits_end, attr)
            # Rule: indices need not be sorted nor distinct (the last value
            # wins).  After a value comes the delimiter or '}'; anything else
            # is E_SPARSE for that pair's attribute, spanning from the pair's
            # index to the offending byte.  (A delimiter before '}' makes the
            # next pair start at '}': E_SPARSE with an empty span there.)
            sep = self._skip(p)
            if self._at(sep) == b"}":
                return sep + 1
            if self._at(sep) != self.delim:
                raise _Bad(E_SPARSE, attr, pair, sep)
            p = sep + 1

    def _sparse_weka(self, p):
        """The pairs of an ARFF sparse row from ``p`` (past its '{'); returns the position after its '}'.

        Rule: blanks and commas separate everything (a comma may come before
        '}').  An index is digits (E_INDEX as below) ending where a word
        ends, else E_SPARSE (attribute -1, from the index to the next ',',
        '}', newline or the end).  Its value follows blanks and commas; where
        the text, the line or the pairs end first ('%', '{', '}'), E_SPARSE for
        that index, from it to there.
        """
        while True:
            pair = self._skip_separators(p)
            if self._at(pair) == b"}":
                return pair + 1
            digits_end = _DIGITS.match(self.t, pair).end()
            if digits_end > pair and int(self.t[pair:digits_end]) >= len(self.kinds):
                raise _Bad(E_INDEX, -1, pair, digits_end)
            if digits_end == pair or self._at(digits_end) not in self.syntax.word_ends:
                stop = digits_end
                while self._at(stop) not in (b"", b",", b"}", b"\n"):
                    stop += 1
                raise _Bad(E_SPARSE, -1, pair, stop)
            attr = int(self.t[pair:digits_end])
            value = self._skip_separators(digits_end)
            if self._at(value) in (b"", b"\n", b"%", b"{", b"}"):
                raise _Bad(E_SPARSE, attr, pair, value)
            _, _, p = self._value(value, attr)

    def _weight(self, brace):
        """The weight ``{w}`` whose '{' is at ``brace``; returns the position after '}'.

        Rule: the weight is an unquoted token, then blanks, then '}', and a
        number by the rule above, finite and > 0; otherwise E_WEIGHT, attribute
        -1, with the token's span (empty at the delimiter for '{}').
        """
        start, end, after = self._plain(brace + 1)
        after = self._skip(after)
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
        if self.weka:
            # Rule (ARFF): blanks and commas, an optional '{w}', blanks and commas
            sep = self._skip_separators(p)
            if self._at(sep) == b"{":
                sep = self._skip_separators(self._weight(sep))
            return self._line_end(sep)
        # Rule: after the values, an optional weight, '{w}' or ', {w}' (the
        # delimiter, then '{w}'; dense and sparse rows alike; but '{' does not
        # end an unquoted value, so '1,a,2,3 {2}' is E_NUMBER on '3 {2}': '{w}'
        # without the delimiter only follows a sparse row or a quoted last
        # value).  A delimiter not followed (after blanks) by '{' is E_MANY
        # spanning just that delimiter; anything else left before the line end
        # or a '%' is E_MANY spanning from it to the line end (not trimmed).
        sep = self._skip(p)
        if self._at(sep) == self.delim:
            brace = self._skip(sep + 1)
            if self._at(brace) != b"{":
                raise _Bad(E_MANY, len(self.kinds), sep, sep + 1)
            p = self._weight(brace)
        elif self._at(sep) == b"{":
            p = self._weight(sep)
        return self._line_end(p)

    def _line_end(self, p):
        """Where the line ends, after blanks and an optional '%' comment from ``p``; E_MANY for anything else."""
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


def reference_parse_rows(text, kinds, outcol, missing_mode, out, weights, categories=None, delim=b",", weka=False):
    """Pure-Python reference for :func:`rowparse.parse_rows`: the same arguments, except that
    the nominal attributes' categories come as a list (``str`` per category, None for an
    attribute that is not ``NOMINAL``), the delimiter as one byte (``bytes``) and the
    tokenisation as a bool, and the same results."""
    return _Reference(text, kinds, outcol, missing_mode, out, weights, categories, delim, weka).run()


def compiled_parse_rows(text, kinds, outcol, missing_mode, out, weights, categories=None, delim=b",", weka=False):
    """:func:`rowparse.parse_rows` with the tables :func:`rowparse.nominal_table` makes of ``categories``,
    the delimiter ``delim`` (one byte, ``bytes``) as its byte value and ``weka`` as its constant."""
    tables = rowparse.nominal_table(categories if categories is not None else [None] * len(kinds))
    return rowparse.parse_rows(text, kinds, outcol, missing_mode, out, weights, *tables, delim[0],
                               WEKA_TOKENS if weka else CSV_TOKENS)


# --------------------------------------------------------------------------- fuzzing


class _Layout:
    """A header for the tests: each attribute's kind and, for a NOMINAL one, its categories.

    The output columns follow the header: one per KEEP attribute, a block of
    one per category for a NOMINAL one, none for a SKIP one.
    """

    def __init__(self, kinds, categories=None):
        self.kinds = np.array(kinds, dtype=np.int64)
        self.categories = list(categories) if categories is not None else [None] * len(kinds)
        widths = [1 if k == KEEP else len(c) if k == NOMINAL else 0 for k, c in zip(kinds, self.categories)]
        starts = np.cumsum([0] + widths[:-1])
        self.outcol = np.array([-1 if k == SKIP else s for k, s in zip(kinds, starts)], dtype=np.int64)
        self.width = int(sum(widths))
        self.nominal = [j for j, k in enumerate(kinds) if k == NOMINAL]
        self.blocks = [slice(starts[j], starts[j] + widths[j]) for j in self.nominal]


NUMERIC = _Layout([KEEP, SKIP, KEEP, KEEP])  # a skipped attribute between kept ones

# A nominal attribute's categories: ones that must be quoted (a blank at an end
# would be trimmed, ',' and '%' end a plain token), one with a quote (written
# 'it\'s' or "it's" or bare), a non-ASCII one, and prefixes of one another.
CATEGORIES = ("a", "ab", "abc", "b c", "it's", "x,y", "\u00e9", "50%")
YES_NO = ("no", "yes")
# nominal attributes in the middle (before a skipped one) and last (before a weight)
WITH_NOMINAL = _Layout([KEEP, NOMINAL, SKIP, KEEP, NOMINAL], [None, CATEGORIES, None, None, YES_NO])

GOOD_VALUES = ["1", "-2.5", "+.5", "5.", "1e5", "-1.25E-3", "0", "-0.0", "123456789.123456789",
               "9" * 25, "2.2250738585072011e-308", "-3.1415926536"]
GOOD_SKIPPED = ["a", "'b c'", '"d,e"', "x1", "'it\\'s'"]
NOISE = [" ", "\t", "\r", ",", "x", "e", ".", "-", "+", "%", "{", "}", "?", "'", '"', "\x00", "5", "\n", ",,",
         "1e400", "?"]
# Per nominal attribute, tokens that are one of its categories, and tokens
# that are not or that are missing, empty or malformed.
NOMINAL_TOKENS = {
    CATEGORIES: (
        ["a", "'a'", '"a"', "ab", "'ab'", "abc", '"abc"', "b c", "'b c'", '"b c"', "it's", "'it\\'s'", '"it\'s"',
         '"it\\\'s"', "'x,y'", '"x,y"', "'x\\,y'", "\u00e9", "'\u00e9'", "'\\\u00e9'", "'50%'", '"50%"',
         "'\\a\\b'"],
        ["A", "b", "it", "x", "abcd", "ab c", "b  c", "'b  c'", "'ab '", "' a'", '"a "', "it\\'s", "x,y", "x\\,y",
         "50%", "e", "\u00c9", "e\u0301", "\u00e9\u00e9", "?", "'?'", '"?"', "", "''", "'abc", '"a', "'it\\'s",
         "'a\"", "\"b c'", "'a\\'", "1", "'a'b", "a'", "a b", "'it's'"],
    ),
    YES_NO: (
        ["no", "yes", "'yes'", '"no"', "'n\\o'"],
        ["Yes", "y", "nope", "ye", "?", "'?'", "", "'no", '"yes', "yes'"],
    ),
}
NOMINAL_NOISE = NOISE + ["\\", "\u00e9", "a", "b", " c", "''", "yes"]


class _Dialect:
    """What the fuzzing writes for the delimiter ``d`` (a one-character ``str``) and the tokenisation.

    For ',' exactly the lists above.  For another delimiter: a quoted skipped
    value holds the delimiter and unquoted ones a comma (an ordinary byte
    there); the unquoted nominal token ``x,y`` is a category; noise adds the
    delimiter (twice as likely), a doubled one, and every delimiter's byte
    (commas and tabs are in NOISE already).  In ARFF (``weka``) values are
    separated by commas, blanks or both, rows may end with a comma or a weight
    after blanks, and the nominal tokens Weka would cut in two (an unquoted
    blank or quote inside) are among the bad ones.
    """

    def __init__(self, d, weka=False):
        self.d = d
        self.weka = weka
        self.delim = d.encode()
        if d == ",":
            self.skipped, self.tokens = GOOD_SKIPPED, NOMINAL_TOKENS
            self.noise, self.nominal_noise = NOISE, NOMINAL_NOISE
        else:
            self.skipped = ["a", "'b,c'", f'"d{d}e"', "x,1", "'it\\'s'"]
            good, bad = NOMINAL_TOKENS[CATEGORIES]
            self.tokens = {
                CATEGORIES: (good + ["x,y"],
                             [t for t in bad if t != "x,y"] + [f"'x{d}y'", f"x{d}y", f"'a{d}'", "a,b"]),
                YES_NO: NOMINAL_TOKENS[YES_NO],
            }
            extra = [d, d, d + d, f" {d} ", ";", "|"]
            self.noise, self.nominal_noise = NOISE + extra, NOMINAL_NOISE + extra
        if weka:
            good, bad = NOMINAL_TOKENS[CATEGORIES]
            split = [t for t in good if t[0] not in "'\"" and re.search(r"[ '\"]", t)]
            self.tokens = {CATEGORIES: ([t for t in good if t not in split], bad + split),
                           YES_NO: NOMINAL_TOKENS[YES_NO]}
            # empty values come from two commas: more of them in the noise
            self.noise, self.nominal_noise = NOISE + [",,", ", ,"], NOMINAL_NOISE + [",,", ", ,", ",,"]
            self.separators = [",", ", ", " ,", " , ", " ", "\t", ",\t", "  "]
            self.trailers = [", {2}", ",{0.5}", " {2}", "\t{3}", ",", ", ", " ,", " % trailing", "\r"]
        else:
            self.separators = [d, d + " ", " " + d, " " + d + " "]
            self.trailers = [f"{d} {{2}}", f"{d}{{0.5}}", " % trailing", "\r"]
        # a sparse row's pair for a nominal attribute of WITH_NOMINAL
        self.nominal_pair = re.compile("[{" + re.escape(d) + r"]\s*[14]\s")


# (delimiter, ARFF's tokens): ARFF, and CSV with each delimiter
MODES = [(b",", True)] + [(d, False) for d in DELIMITERS]
DIALECTS = {(d, weka): _Dialect(d.decode(), weka) for d, weka in MODES}
DELIMITER_IDS = {b",": "comma", b"\t": "tab", b";": "semicolon", b"|": "bar"}
MODE_IDS = ["arff"] + [f"csv-{DELIMITER_IDS[d]}" for d in DELIMITERS]


def _random_token(r: random.Random, layout: _Layout, j: int, dialect: _Dialect) -> str:
    kind = layout.kinds[j]
    if kind == KEEP:
        value = r.choice(GOOD_VALUES)
        return value if r.random() > 0.1 else r.choice(["'%s'", '"%s"', "' %s '"]) % value
    if kind == SKIP:
        return r.choice(dialect.skipped)
    good, bad = dialect.tokens[layout.categories[j]]
    roll = r.random()
    return "?" if roll < 0.03 else "" if roll < 0.045 else r.choice(bad) if roll < 0.09 else r.choice(good)


def _random_row(r: random.Random, layout: _Layout, dialect: _Dialect) -> str:
    d = dialect.d
    kind = r.random()
    if kind < 0.1:
        # (with the tab delimiter, the line "\t" is a row of empty values)
        return r.choice(["", "   ", "% comment", "  % indented", "\t"])
    a = len(layout.kinds)
    if kind < 0.25:  # sparse
        items = [f"{i} {_random_token(r, layout, i, dialect)}" for i in sorted(r.sample(range(a), r.randint(0, a)))]
        row = "{" + (r.choice(dialect.separators) if dialect.weka else f"{d} ").join(items) + "}"
    else:
        tokens = [_random_token(r, layout, j, dialect) for j in range(a)]
        row = tokens[0]
        for j in range(1, a):
            # an empty value between commas (ARFF's blanks alone would close it up)
            row += "," if "" in tokens[j - 1:j + 1] else r.choice(dialect.separators)
            row += tokens[j]
        row = " " * r.randint(0, 1) + row
    if r.random() < 0.15:
        row += r.choice(dialect.trailers)
    return row


def _mutate(r: random.Random, text: str, noise: list) -> str:
    chars = list(text)
    for _ in range(r.randint(1, 3)):
        at = r.randint(0, len(chars))
        what = r.random()
        if what < 0.5:
            chars.insert(at, r.choice(noise))
        elif chars and what < 0.8:
            del chars[min(at, len(chars) - 1)]
        elif chars:
            chars[min(at, len(chars) - 1)] = r.choice(noise)
    return "".join(chars)


def _run(parse, buf, missing_mode, layout=NUMERIC, delim=b",", weka=False):
    lines = int((buf == 10).sum()) + 1
    out = np.full((lines, layout.width), 7.0)
    weights = np.full(lines, 7.0)
    res = parse(buf, layout.kinds, layout.outcol, missing_mode, out, weights, layout.categories, delim, weka)
    return res, out[: res[0]], weights[: res[0]]


def _same_as_the_reference(text, missing_mode, layout=NUMERIC, delim=b",", weka=False):
    """Parse ``text`` (str or bytes) with both, values separated by ``delim`` (ARFF's tokens
    where ``weka``); every result, value and weight must agree.

    Returns the results and the values.
    """
    data = text if isinstance(text, bytes) else text.encode("utf-8", "surrogatepass")
    buf = np.frombuffer(data, dtype=np.uint8).copy()
    got, got_x, got_w = _run(compiled_parse_rows, buf, missing_mode, layout, delim, weka)
    want, want_x, want_w = _run(reference_parse_rows, buf, missing_mode, layout, delim, weka)
    assert tuple(got) == tuple(want), (text, delim, weka, got, want)
    assert got_x.tobytes() == want_x.tobytes(), (text, delim, weka)
    assert got_w.tobytes() == want_w.tobytes(), (text, delim, weka)
    return got, got_x


FUZZ_CASES = 1500  # texts per seed, missing mode and tokenisation


def _fuzz_texts(seed, layout, dialect, nominal=False):
    """``FUZZ_CASES`` texts of 1 to 6 random rows, values separated by the dialect's
    delimiter (two texts in three with one row mutated by its noise, or its nominal noise)."""
    r = random.Random(seed)
    noise = dialect.nominal_noise if nominal else dialect.noise
    for case in range(FUZZ_CASES):
        rows = [_random_row(r, layout, dialect) for _ in range(r.randint(1, 6))]
        if case % 3:
            k = r.randrange(len(rows))
            rows[k] = _mutate(r, rows[k], noise)
        yield "\n".join(rows) + ("\n" if r.random() < 0.7 else "")


def _fuzz(seed, missing_mode, layout, delim=b",", nominal=False, weka=False):
    """The texts of :func:`_fuzz_texts`, each parsed by both parsers, which must agree:
    yields ``(text, results, values)``."""
    for text in _fuzz_texts(seed, layout, DIALECTS[delim, weka], nominal):
        yield (text, *_same_as_the_reference(text, missing_mode, layout, delim, weka))


@pytest.mark.parametrize("delim, weka", MODES, ids=MODE_IDS)
@pytest.mark.parametrize("missing_mode", [MISSING_ERROR, MISSING_NAN])
@pytest.mark.parametrize("seed", range(4))
def test_same_results_as_the_reference(seed, missing_mode, delim, weka):
    """Numeric and skipped attributes: on random rows, valid or not, in ARFF and with each CSV
    delimiter, the compiled parser gives the reference's results, values and weights bit for bit."""
    results = [got for _, got, _ in _fuzz(seed, missing_mode, NUMERIC, delim, weka=weka)]
    errors = sum(got[3] != E_NONE for got in results)
    assert errors > 300 and len(results) - errors > 300, errors  # both kinds were exercised


@pytest.mark.parametrize("delim, weka", MODES, ids=MODE_IDS)
@pytest.mark.parametrize("missing_mode", [MISSING_ERROR, MISSING_NAN])
@pytest.mark.parametrize("seed", range(4))
def test_nominal_same_results_as_the_reference(seed, missing_mode, delim, weka):
    """Nominal attributes among numeric and skipped ones: on random rows (categories quoted
    or not, escaped, non-ASCII; unknown values, prefixes of categories, '?', empty values,
    unclosed quotes; sparse rows with and without the nominal attributes), with each
    delimiter, the compiled parser gives the reference's results, values and weights bit
    for bit; each nominal error comes up, and so do valid rows, missing blocks (NaN mode
    only) and sparse rows that give or omit a nominal value."""
    errors = {E_NOMINAL: 0, E_EMPTY: 0, E_QUOTE: 0, E_MISSING: 0}
    good = nan_blocks = sparse_given = sparse_omitted = 0
    pair = DIALECTS[delim, weka].nominal_pair
    for text, got, x in _fuzz(seed, missing_mode, WITH_NOMINAL, delim, nominal=True, weka=weka):
        if got[3] == E_NONE:
            good += 1
            for line in text.split("\n"):
                if line.lstrip().startswith("{"):
                    if pair.search(line):
                        sparse_given += 1
                    else:
                        sparse_omitted += 1
        elif got[5] in WITH_NOMINAL.nominal and got[3] in errors:
            errors[got[3]] += 1
        for block in WITH_NOMINAL.blocks:
            nan_blocks += int(np.isnan(x[:, block]).all(axis=1).sum())
    assert good > 300 and sum(errors.values()) > 300, (good, errors)
    if missing_mode == MISSING_ERROR:
        assert min(errors.values()) > 20 and nan_blocks == 0, errors
    else:
        assert errors[E_MISSING] == 0 and min(errors[e] for e in (E_NOMINAL, E_EMPTY, E_QUOTE)) > 20, errors
        assert nan_blocks > 100, nan_blocks
    assert sparse_given > 50 and sparse_omitted > 50, (sparse_given, sparse_omitted)


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
    # ARFF's tokens: blanks separate, a comma may end a row, quoted numbers, a weight after blanks
    "1 a 2 3", "1\ta\t2\t3", "1 , a ,2,3,", "1,a,2,3,,", "1,a,2,3 ,{2},", "1 a 2 3 {2}", "1 a 2 3{2}", "1,a,2,3,{2} x",
    "1 a 2", "1,a,2 ,", "1 a 2 {3}", "1 a 2 3 4", "'1',a,'2',\"3\"", "' 1 ',a,\" 2\t\",'3'", "'1'a'2'3", "'1'\t'a' 2 3",
    "1,'a'2,3", "1'a'2 3", "'',a,2,3", "'?',a,2,3", "' ',a,2,3", "'1,5',a,2,3", "'1e400',a,2,3", "'1' x,2,3",
    "'1',a,2,'3", "\"1\\\"\",a,2,3", "1,a{2,3", "1,a}2,3", "1,a,2%,3", "1,a,2{2}", ",1,a,2,3", " , 1,a,2,3",
    "1,,a,2,3", "1 ,, a 2 3", "1,a,2,3\t,\t", "1\r,a\r,2\r,3\r",
    "{0 1 3 2}", "{0,1,3,2}", "{0 1,3 2,}", "{,0 1}", "{0  ,  1}", "{0'1'}", "{0\t1\t3\t2}", "{0 1 3}", "{0}",
    "{0 1 3 2} {2}", "{0 1 3 2},{2},", "{0 1 x 2}", "{0x 1}", "{0 {1}", "{0 1 % c}", "{3 '2'}", "{3 '2' 0 1}",
    "{1 a b}", "{1 'a b' 3 4}", "{0 1,, 3 2}", "{1 a,b 2}", "{0\n1}",
]
NUMBER_TOKENS_QUOTED = [q % tok for tok in NUMBER_TOKENS if "'" not in tok for q in ("'%s'", '"%s"')]


@pytest.mark.parametrize("weka", [False, True], ids=["csv", "arff"])
@pytest.mark.parametrize("missing_mode", [MISSING_ERROR, MISSING_NAN])
def test_edge_cases_same_as_the_reference(missing_mode, weka):
    """Rows at the edges of the rules for numeric and skipped attributes, read with commas between
    values in either tokenisation (ARFF's, a CSV file's): both parsers agree."""
    tokens = NUMBER_TOKENS + NUMBER_TOKENS_QUOTED
    texts = EDGE_ROWS + [f"1,a,2,{tok}" for tok in tokens] + [f"{{3 {tok}}}" for tok in tokens]
    texts += [f"{tok} a 2 3" for tok in tokens]
    for text in texts:
        _same_as_the_reference(text, missing_mode, weka=weka)


# Rows at the edges of the nominal rules, in WITH_NOMINAL.
NOMINAL_EDGE_ROWS = [
    # a quoted last value, then a weight, a comment, junk; a plain one runs to '}'
    "1,a,s,2,'yes'{2}", "1,a,s,2,'yes' {2} %c", "1,a,s,2,yes{2}", "1,a,s,2,yes }", "1,a,s,2,'yes'x",
    "1,a,s,2,yes%c", "1,a,s,2,'no'%c", "1,a,s,2,'no\\'%c", "1,a,s,2,\"yes\"\r\n", "1,a,s,2,yes,{3}",
    # escaped newlines inside quotes, blanks around values
    "1,'a\\\nb',s,2,yes\n1,a,s,2,no", "1,'a\\\n',s,2,yes", "1 , 'b c' , s , 2 , yes ", "1,\ta\t,s,2,\tno\r",
    "1,x,y,s,2,yes", "1,'x,y',s,2,yes", "?,?,?,?,?", "1,a,s,2", "1,a,s,2,", "1,a,s,2,yes,no",
    # sparse rows: nominal pairs, repeated (the last wins), omitted, malformed
    "{1 'b c'}", "{1 'b c' , 4 yes}", "{4 no, 1 \u00e9}", "{1 a, 1 ab}", "{1 ab, 1 ?}", "{1 ?, 1 ab}",
    "{1 a}{2}", "{1 'a'}", "{1 'a'x}", "{1 'a}", "{1 a b}", "{2 a b}", "{1 }", "{1 ,4 yes}", "{4 yes",
    "{01 abc}", "{}", "{ }\n{0 5, 3 6}", "{4 'yes'} {2}", "{1 ?}", "{4 ?, 0 ?}",
    # bytes that are not a category: a piece of a character, a character too many, a decomposed one
    b"1,\xc3,s,2,yes", b"1,'\xc3',s,2,yes", b"1,\xc3\xa9\xa9,s,2,yes", b"1,'\\\xc3\xa9',s,2,yes",
    b"1,e\xcc\x81,s,2,yes", b"{1 \xa9}",
    # ARFF's tokens: a quote or a blank ends an unquoted value; blanks and commas separate
    "1 a s 2 yes", "1 'b c' s 2 'yes'", "1 it's s 2 yes", "1 b c s 2 yes", "1,'a'\"s\"2 yes", "1 x,y s 2 yes",
    "1 a s 2 yes,", "1\tab\ts\t2\tno\t{2}", "{1 'b c' 4 yes}", "{1,abc,4,no}", "{4 'yes'0 1}", "{1 'a'x}",
]
# Categories that are odd to write (missing-looking, empty, a quote, a backslash, a
# leading blank), and a nominal attribute with no category at all.
ODD = _Layout([NOMINAL, NOMINAL, KEEP], [("?", "", "'", "\\", " lead", "a b", '"'), (), None])
ODD_ROWS = [
    "'?',?,1", "?,?,1", "'',?,1", '"",?,1', "'\\'',?,1", "\"'\",?,1", "\\,?,1", "'\\\\',?,1", "' lead',?,1",
    " lead,?,1", "a b,?,1", "'a b',?,1", "'a\\ b',?,1", "'\\\"',?,1", "\",?,1", "'\"',?,1", "?,x,1", "?,'',1",
    "?,,1", "{}", "{1 ?}", "{1 x}", "{0 ''}", "{0 ?, 2 5}", "{2 5}", "{0 \\}",
]


@pytest.mark.parametrize("weka", [False, True], ids=["csv", "arff"])
@pytest.mark.parametrize("missing_mode", [MISSING_ERROR, MISSING_NAN])
def test_nominal_edge_cases_same_as_the_reference(missing_mode, weka):
    """Rows at the edges of the nominal rules, and every good and bad nominal token of the
    fuzzing in each nominal column of dense and sparse rows: both parsers agree."""
    good, bad = NOMINAL_TOKENS[CATEGORIES]
    tokens = good + bad + ["'it\\\\'s'", "'a\\\"'", "\"a\\\"\"", "' '", " ", "'\\", "a\\", "{", "'{'"]
    texts = NOMINAL_EDGE_ROWS + [f"1,{tok},s,2,yes" for tok in tokens] + [f"{{1 {tok}}}" for tok in tokens]
    texts += [f"1,a,s,2,{tok}" for tok in sum(NOMINAL_TOKENS[YES_NO], [])]
    texts += [f"{{4 {tok}}}" for tok in sum(NOMINAL_TOKENS[YES_NO], [])]
    for text in texts:
        _same_as_the_reference(text, missing_mode, WITH_NOMINAL, weka=weka)
    for text in ODD_ROWS:
        _same_as_the_reference(text, missing_mode, ODD, weka=weka)


# Rows at the edges of the delimiter rules; "D" stands for the delimiter.  With a tab
# delimiter a tab is a value's end, never a blank; with any other one it is a blank.
# Other delimiters' bytes and commas are ordinary bytes of an unquoted token.
DELIM_EDGE_ROWS = [
    "D", "DD", " D ", "\t", " \t ", "\r\t", "\t1DaD2D3", "1DaD2D3D", "1DaD2D3 D ", "1D\tD2D3", "1 \tD a\tD2D3",
    "1\tDaD2D3", "1DaD2D3D{2}", "1DaD2D3 D {2}", "1DaD2D3D\t{2}", "1DaD2D3\t{2}", "1DaD2D3D{\t2\t}", "{0\t1}",
    "{0 1\t}", "{0 1D\t2 3}", "{0 1D2 3}", "{\t}", "{0 1}D{2}", "{0 1}\t{2}", "{0 1,5}", "{0 1D 3 2,5}", "1,5DaD2D3",
    "1DaD2D3,5", "1DaD2D3,", "1D'aDb'D2D3", "1D\"aDb\"D2D3", "1Da,bD2D3", "1D'a\\Db'D2D3", "1D'aDb\n2DbD3D4",
    "1;a|2\t3", "1,a;2|3", "1DaD2D3%cDx", "1DaD2D3 %D", "%D\n1DaD2D3",
]


@pytest.mark.parametrize("delim, weka", MODES, ids=MODE_IDS)
@pytest.mark.parametrize("missing_mode", [MISSING_ERROR, MISSING_NAN])
def test_delimiter_edge_cases_same_as_the_reference(missing_mode, delim, weka):
    """Rows at the edges of the delimiter rules; and for a delimiter other than ',', the
    edge rows of both layouts with their commas turned into that delimiter (quoted ones
    too), and as they are (their commas are then ordinary bytes): both parsers agree."""
    d = delim.decode()
    for text in DELIM_EDGE_ROWS:
        _same_as_the_reference(text.replace("D", d), missing_mode, NUMERIC, delim, weka)
        _same_as_the_reference(text.replace("D", d).replace("a", "ab"), missing_mode, WITH_NOMINAL, delim, weka)
    if delim == b",":
        return
    numeric = EDGE_ROWS + [f"1,a,2,{tok}" for tok in NUMBER_TOKENS] + [f"{{3 {tok}}}" for tok in NUMBER_TOKENS]
    for text in numeric:
        _same_as_the_reference(text, missing_mode, NUMERIC, delim)
        _same_as_the_reference(text.replace(",", d), missing_mode, NUMERIC, delim)
    for text in NOMINAL_EDGE_ROWS:
        _same_as_the_reference(text, missing_mode, WITH_NOMINAL, delim)
        translated = text.replace(b",", delim) if isinstance(text, bytes) else text.replace(",", d)
        _same_as_the_reference(translated, missing_mode, WITH_NOMINAL, delim)
    for text in ODD_ROWS:
        _same_as_the_reference(text.replace(",", d), missing_mode, ODD, delim)


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
    """Results worked out by hand from the rules: the reference and the compiled parser give them."""
    buf = np.frombuffer(text.encode(), dtype=np.uint8).copy()
    assert _run(reference_parse_rows, buf, MISSING_ERROR)[0] == want
    assert tuple(_run(compiled_parse_rows, buf, MISSING_ERROR)[0]) == want


_H = 1 / math.sqrt(2)  # a set one-hot entry (ONE), written out


def _nominal_row(k0, category, k3, yes_no):
    """A row of WITH_NOMINAL's output: the two numbers, and the two nominal values' blocks
    (a category's name, or None for a missing value)."""
    def block(categories, value):
        return [math.nan] * len(categories) if value is None else [_H * (c == value) for c in categories]
    return [k0] + block(CATEGORIES, category) + [k3] + block(YES_NO, yes_no)


_OK = (E_NONE, -1, -1, -1, -1)


@pytest.mark.parametrize("text, missing_mode, want, rows", [
    # (text, missing mode, (rows, lines, weighted, err, err_line, err_col, tok_start, tok_end),
    #  the rows' values), in WITH_NOMINAL [KEEP, NOMINAL of CATEGORIES, SKIP, KEEP, NOMINAL no/yes]
    ("1,'b c',s,2,yes\n", MISSING_ERROR, (1, 1, 0, *_OK), [_nominal_row(1, "b c", 2, "yes")]),
    ("1,'it\\'s',s,2,\"no\"", MISSING_ERROR, (1, 1, 0, *_OK), [_nominal_row(1, "it's", 2, "no")]),
    # unquoted it's; a quoted comma; a blank after an unquoted value is trimmed; a weight after a quote
    ("1,it's,s,2,no\n-1,\"x,y\",s,0,'yes'{3}\n5,ab ,s,6,no",
     MISSING_ERROR, (3, 3, 1, *_OK),
     [_nominal_row(1, "it's", 2, "no"), _nominal_row(-1, "x,y", 0, "yes"), _nominal_row(5, "ab", 6, "no")]),
    ("1,\u00e9,s,2,'yes'", MISSING_ERROR, (1, 1, 0, *_OK), [_nominal_row(1, "\u00e9", 2, "yes")]),
    # a prefix of "b c" is not a category; the span is the token's, the column the attribute's
    ("1,b,s,2,yes", MISSING_ERROR, (0, 0, 0, E_NOMINAL, 0, 1, 2, 3), []),
    # a quoted span includes the quotes; inside quotes nothing is trimmed
    ("1,a,s,2,yes\n1, 'ab ' ,s,2,yes", MISSING_ERROR, (1, 1, 0, E_NOMINAL, 1, 1, 15, 20),
     [_nominal_row(1, "a", 2, "yes")]),
    ("1,a,s,2,maybe", MISSING_ERROR, (0, 0, 0, E_NOMINAL, 0, 4, 8, 13), []),
    # "é" is 2 bytes: the span of "éé" is 4
    ("1,\u00e9\u00e9,s,2,no", MISSING_ERROR, (0, 0, 0, E_NOMINAL, 0, 1, 2, 6), []),
    # '?' alone is missing: a NaN block, or E_MISSING
    ("1,?,s,2,?", MISSING_NAN, (1, 1, 0, *_OK), [_nominal_row(1, None, 2, None)]),
    ("1,?,s,2,?", MISSING_ERROR, (0, 0, 0, E_MISSING, 0, 1, 2, 3), []),
    # a quoted '?' is a value (here not a category), a quoted empty value too
    ("1,'?',s,2,no", MISSING_NAN, (0, 0, 0, E_NOMINAL, 0, 1, 2, 5), []),
    ("1,'',s,2,no", MISSING_ERROR, (0, 0, 0, E_NOMINAL, 0, 1, 2, 4), []),
    ("1, ,s,2,yes", MISSING_ERROR, (0, 0, 0, E_EMPTY, 0, 1, 3, 3), []),
    ("1,'abc,s,2,yes", MISSING_ERROR, (0, 0, 0, E_QUOTE, 0, 1, 2, 14), []),
    # sparse: an omitted nominal value is the first category; a given one replaces it
    ("{0 1, 3 2}\n{}", MISSING_ERROR, (2, 2, 0, *_OK), [_nominal_row(1, "a", 2, "no"), _nominal_row(0, "a", 0, "no")]),
    ("{1 'x,y', 4 yes}", MISSING_ERROR, (1, 1, 0, *_OK), [_nominal_row(0, "x,y", 0, "yes")]),
    ("{4 ?}", MISSING_NAN, (1, 1, 0, *_OK), [_nominal_row(0, "a", 0, None)]),
    ("{1 abc, 4 maybe}", MISSING_ERROR, (0, 0, 0, E_NOMINAL, 0, 4, 10, 15), []),
])
def test_nominal_rows_worked_out_by_hand(text, missing_mode, want, rows):
    """Nominal values worked out by hand from the rules: both parsers give these results
    and these one-hot blocks (1/sqrt(2) at the category, NaN throughout when missing)."""
    buf = np.frombuffer(text.encode(), dtype=np.uint8).copy()
    for parse in (reference_parse_rows, compiled_parse_rows):
        got, x, _ = _run(parse, buf, missing_mode, WITH_NOMINAL)
        assert tuple(got) == want, parse
        np.testing.assert_array_equal(x, np.array(rows, dtype=np.float64).reshape(-1, WITH_NOMINAL.width))


TWO = _Layout([KEEP, KEEP])
KSK = _Layout([KEEP, SKIP, KEEP])


@pytest.mark.parametrize("text, delim, layout, want, rows, weights", [
    # (text, delimiter, layout, (rows, lines, weighted, err, err_line, err_col, tok_start, tok_end),
    #  the rows' values, their weights), worked out by hand; NUMERIC is [KEEP, SKIP, KEEP, KEEP]
    # tab: spaces and CRs around a value are blanks, a tab separates values
    (" 1.5 \t2\n", b"\t", TWO, (1, 1, 0, *_OK), [[1.5, 2]], [1]),
    (" 1.5 \t 2\r\n-3\t4", b"\t", TWO, (2, 2, 0, *_OK), [[1.5, 2], [-3, 4]], [1, 1]),
    # an empty value between two tabs: its span is empty, where it would start
    ("1\ta\t\t3", b"\t", NUMERIC, (0, 0, 0, E_EMPTY, 0, 2, 4, 4), [], []),
    ("1\ta\t \t3", b"\t", NUMERIC, (0, 0, 0, E_EMPTY, 0, 2, 5, 5), [], []),
    ("1\t\t2\t3", b"\t", NUMERIC, (0, 0, 0, E_EMPTY, 0, 1, 2, 2), [], []),
    ("\t1\t2", b"\t", TWO, (0, 0, 0, E_EMPTY, 0, 0, 0, 0), [], []),
    # ... while with commas a tab is a blank, trimmed
    ("1,a,\t,3", b",", NUMERIC, (0, 0, 0, E_EMPTY, 0, 2, 5, 5), [], []),
    ("1\ta\t2\t3\t{2}\n", b"\t", NUMERIC, (1, 1, 1, *_OK), [[1, 2, 3]], [2]),
    # a sparse index must be followed by a blank: not by the tab delimiter
    ("{0\t1}", b"\t", NUMERIC, (0, 0, 0, E_SPARSE, 0, -1, 1, 2), [], []),
    ("{0\t1}", b",", NUMERIC, (1, 1, 0, *_OK), [[1, 0, 0]], [1]),
    # ';': a comma is an ordinary byte, so '1,5' is not a number
    ("1,5;2", b";", TWO, (0, 0, 0, E_NUMBER, 0, 0, 0, 3), [], []),
    ("1;2,5", b";", TWO, (0, 0, 0, E_NUMBER, 0, 1, 2, 5), [], []),
    # a quoted skipped value holds the delimiter; an unquoted one a comma
    ("1;'a;b';2", b";", KSK, (1, 1, 0, *_OK), [[1, 2]], [1]),
    ("1;\"a;b\";2\n3;a,b;4", b";", KSK, (2, 2, 0, *_OK), [[1, 2], [3, 4]], [1, 1]),
    # '|': too many values, the extra delimiter's span; a weight after it
    ("1|a|2|3|4", b"|", NUMERIC, (0, 0, 0, E_MANY, 0, 4, 7, 8), [], []),
    ("1|a|2|3\n4|b|5|6|7|8\n", b"|", NUMERIC, (1, 1, 0, E_MANY, 1, 4, 15, 16), [[1, 2, 3]], [1]),
    ("1|a|2|3 | {0.5}", b"|", NUMERIC, (1, 1, 1, *_OK), [[1, 2, 3]], [0.5]),
    ("1|a|2|3,4", b"|", NUMERIC, (0, 0, 0, E_NUMBER, 0, 3, 6, 9), [], []),
    # sparse pairs separated by '|'; a comma there is in the value
    ("{0 1| 3 2}", b"|", NUMERIC, (1, 1, 0, *_OK), [[1, 0, 2]], [1]),
    ("{0 1, 3 2}", b"|", NUMERIC, (0, 0, 0, E_NUMBER, 0, 0, 3, 9), [], []),
    # an unquoted nominal value with a comma, a category where ',' does not separate
    ("1;x,y;s;2;yes", b";", WITH_NOMINAL, (1, 1, 0, *_OK), [_nominal_row(1, "x,y", 2, "yes")], [1]),
    ("1,x,y,s,2,yes", b",", WITH_NOMINAL, (0, 0, 0, E_NOMINAL, 0, 1, 2, 3), [], []),
])
def test_delimiter_rows_worked_out_by_hand(text, delim, layout, want, rows, weights):
    """Rows with each delimiter worked out by hand from its rule: both parsers give these
    results, values and weights."""
    buf = np.frombuffer(text.encode(), dtype=np.uint8).copy()
    for parse in (reference_parse_rows, compiled_parse_rows):
        got, x, w = _run(parse, buf, MISSING_ERROR, layout, delim)
        assert tuple(got) == want, parse
        np.testing.assert_array_equal(x, np.array(rows, dtype=np.float64).reshape(-1, layout.width))
        np.testing.assert_array_equal(w, np.array(weights, dtype=np.float64))


@pytest.mark.parametrize("text, layout, want, rows, weights", [
    # (text, layout, (rows, lines, weighted, err, err_line, err_col, tok_start, tok_end), the rows'
    #  values, their weights) in ARFF's tokens, worked out by hand; every good row here is one
    #  Weka's ArffLoader reads the same way (its tokenizer: blanks and commas separate, quotes)
    # values separated by blanks, tabs, commas with blanks
    ("1 2\n3\t4\n5 ,6\n", TWO, (3, 3, 0, *_OK), [[1, 2], [3, 4], [5, 6]], [1, 1, 1]),
    # a comma (and blanks) may end a row, before or after a weight
    ("1,2,\n3,4 ,\n", TWO, (2, 2, 0, *_OK), [[1, 2], [3, 4]], [1, 1]),
    ("1 2 {3}\n1,2,{0.5},", TWO, (2, 2, 1, *_OK), [[1, 2], [1, 2]], [3, 0.5]),
    # quoted numbers, blanks inside trimmed; none needs a separator after its closing quote
    ("'1.5',\"-2\"\n' 1.5 '2", TWO, (2, 2, 0, *_OK), [[1.5, -2], [1.5, 2]], [1, 1]),
    # sparse: blanks or commas between index and value and between pairs, a comma before '}'
    ("{0 1 1 2}\n{1,2}\n{0 7,}", TWO, (3, 3, 0, *_OK), [[1, 2], [0, 2], [7, 0]], [1, 1, 1]),
    # a quoted value holds blanks, an unquoted one ends at the blank
    ("1 'a b' 2", KSK, (1, 1, 0, *_OK), [[1, 2]], [1]),
    ("1,a b,2", KSK, (0, 0, 0, E_NUMBER, 0, 2, 4, 5), [], []),
    # two commas still leave an empty value between them (Weka would skip it)
    ("1,,2", TWO, (0, 0, 0, E_EMPTY, 0, 1, 2, 2), [], []),
    ("1 2 3", TWO, (0, 0, 0, E_MANY, 0, 2, 4, 5), [], []),
    # a quoted '?' or '' is not a number (Weka: "number expected"), nor a quoted decimal comma
    ("'?',2", TWO, (0, 0, 0, E_NUMBER, 0, 0, 0, 3), [], []),
    ("1 ''", TWO, (0, 0, 0, E_NUMBER, 0, 1, 2, 4), [], []),
    ("'1,5' 2", TWO, (0, 0, 0, E_NUMBER, 0, 0, 0, 5), [], []),
    # the values end before the row has them all: the missing attribute, the last value's span
    ("1 {2}", TWO, (0, 0, 0, E_FEW, 0, 1, 0, 1), [], []),
])
def test_arff_rows_worked_out_by_hand(text, layout, want, rows, weights):
    """ARFF's tokenisation (Weka's) worked out by hand from its rule: both parsers give these
    results, values and weights."""
    buf = np.frombuffer(text.encode(), dtype=np.uint8).copy()
    for parse in (reference_parse_rows, compiled_parse_rows):
        got, x, w = _run(parse, buf, MISSING_ERROR, layout, b",", True)
        assert tuple(got) == want, parse
        np.testing.assert_array_equal(x, np.array(rows, dtype=np.float64).reshape(-1, layout.width))
        np.testing.assert_array_equal(w, np.array(weights, dtype=np.float64))


def test_one_is_a_half_of_root_two():
    """The set entry of a one-hot block is 1/sqrt(2) (two categories differ by 1 squared)."""
    assert ONE == _H


@pytest.mark.parametrize("parts", [1, 2, 3, 7, 64])
def test_line_cuts(parts):
    r = random.Random(parts)
    text = "".join("x" * r.randint(0, 30) + "\n" for _ in range(200)) + "tail"
    buf = np.frombuffer(text.encode(), dtype=np.uint8)
    cuts, counts = split.line_cuts(buf, parts)
    assert cuts[0] == 0 and cuts[-1] == len(buf) and (np.diff(cuts) >= 0).all()
    assert all(c == 0 or c == len(buf) or buf[c - 1] == 10 for c in cuts)
    assert [int((buf[a:b] == 10).sum()) for a, b in zip(cuts[:-1], cuts[1:])] == counts.tolist()
    assert split.last_newline(buf, 0) == text.rindex("\n")
    assert split.last_newline(buf[-4:], 0) == -1


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
