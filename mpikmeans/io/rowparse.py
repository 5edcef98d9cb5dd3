"""The compiled parser of data lines: ARFF's (dense and sparse rows, weights, quotes) and a CSV file's.

One pass over a buffer of whole lines, in Numba.  Each attribute has a kind:
``KEEP`` (a numeric attribute that is clustered: parsed exactly into its output
column), ``NOMINAL`` (a nominal attribute clustered as Weka does, see
:mod:`mpikmeans.nominal`: its value, quoted or not, is looked up among the
attribute's categories and written as a one-hot block of columns) or ``SKIP``
(nominal, string and date attributes otherwise, and numeric ones the user
ignores: the token is only scanned, quotes respected, so a quoted value with
commas inside does not shift the columns).

Two tokenisations (``weka``).  ARFF, as Weka's ArffLoader reads it (its
tokenizer takes blanks and commas alike as separators): values separated by a
comma, blanks (spaces, tabs) or both; an unquoted value ends at a blank, a
comma, a quote, ``{``, ``}`` or ``%``; a comma may end the row; two commas with
no value between them are an empty value, an error (Weka would skip it and
shift the later values one attribute to the left).  CSV: values separated by
the file's delimiter alone, blanks around a value trimmed.

Both accept dense rows ``v1, v2, ...``; sparse rows ``{index value, ...}``
with 0-based indices (omitted values are 0, ``{}`` is a row of zeros, a
nominal attribute's first category); an instance weight ``{w}`` after the last
value; ``?`` for a missing value; a quoted number (``'1.5'``, ``"1.5"``, blanks
inside trimmed: the same value as unquoted); ``%`` comments at the end of a
line (outside quotes); CRLF line ends.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import numpy as np

from ..jit import njit
from ..nominal import ONE
from .numparse import PARSE_OK, PARSE_RANGE, data_pointer, parse_number_ptr, parse_prefix_ptr

KEEP, SKIP, NOMINAL = 0, 1, 2

_NL, _CR, _SPACE, _TAB, _COMMA, _PERCENT = 10, 13, 32, 9, 44, 37
_LBRACE, _RBRACE, _QUESTION, _SQUOTE, _DQUOTE, _BACKSLASH = 123, 125, 63, 39, 34, 92

# error codes
E_NONE = 0
E_FEW = 1          # fewer values than attributes
E_MANY = 2         # more values than attributes
E_NUMBER = 3       # a token that is not a number
E_EMPTY = 4        # an empty value
E_RANGE = 5        # a value that overflows float64 (infinity)
E_MISSING = 6      # '?' while missing values are an error
E_QUOTE = 7        # a quote that is never closed
E_INDEX = 8        # a sparse index that is not an attribute number
E_SPARSE = 9       # a malformed sparse row
E_WEIGHT = 10      # a malformed or non-positive instance weight
E_NOMINAL = 11     # a value that is not one of a nominal attribute's categories

MISSING_ERROR = 0
MISSING_NAN = 1    # store NaN; the caller drops the row or fills in the mean

#: ``weka`` of :func:`parse_rows`: ARFF's tokens (Weka's), or a CSV file's.
CSV_TOKENS = 0
WEKA_TOKENS = 1


@njit(cache=True, forceinline=True)
def _blank(c, delim):
    # a tab is a blank around values, unless it is what separates them (a tab-separated file)
    return c == _SPACE or c == _CR or (c == _TAB and delim != _TAB)


@njit(cache=True, forceinline=True)
def _skip_blanks(p, i, n, delim):
    while i < n and _blank(p[i], delim):
        i += 1
    return i


@njit(cache=True, forceinline=True)
def _skip_separators(p, i, n, delim):
    """Past blanks and delimiters (ARFF after a row's last value, and inside a sparse row)."""
    while i < n and (p[i] == delim or _blank(p[i], delim)):
        i += 1
    return i


@njit(cache=True, forceinline=True)
def _word_end(c, delim, weka):
    """Whether an unquoted token ends before byte ``c``."""
    if c == delim or c == _NL or c == _PERCENT or c == _RBRACE:
        return True
    # Weka's tokenizer: a word is made of the bytes that are none of blank, comma,
    # quote, '{', '}' and '%'
    return weka != 0 and (c == _SPACE or c == _TAB or c == _CR or c == _LBRACE or c == _SQUOTE or c == _DQUOTE)


@njit(cache=True, forceinline=True)
def _scan_token(p, i, n, quoted_ok, delim, weka):
    """Span of the token at ``i``: ``(start, end, next, ok)``.

    An unquoted token ends where :func:`_word_end` says.  A quoted token
    (only where ``quoted_ok``) runs to its closing quote, backslash escapes
    honoured.  ``ok`` is False for a quote never closed on the line.
    """
    i = _skip_blanks(p, i, n, delim)
    ts = i
    if quoted_ok and i < n and (p[i] == _SQUOTE or p[i] == _DQUOTE):
        q = p[i]
        i += 1
        while i < n and p[i] != q and p[i] != _NL:
            if p[i] == _BACKSLASH:
                i += 1
            i += 1
        if i >= n or p[i] != q:
            return ts, i, i, False
        i += 1
        return ts, i, i, True
    while i < n and not _word_end(p[i], delim, weka):
        i += 1
    te = i
    while te > ts and _blank(p[te - 1], delim):
        te -= 1
    return ts, te, i, True


@njit(cache=True, forceinline=True)
def _separator(p, i, n, delim, weka):
    """Past the separator after a value that is not a row's last: ``(next, ok)``, ``ok`` False where the row
    ends first.  In ARFF a comma, blanks, or none after a quote (Weka's tokenizer needs none there)."""
    k = _skip_blanks(p, i, n, delim)
    if weka == 0:
        if k >= n or p[k] != delim:
            return k, False
        return k + 1, True
    if k < n and p[k] == delim:
        k += 1  # (the value's reader skips the blanks after it)
    # where the row ends here, the next value is empty: the caller says E_FEW then
    # (a test per value of the hot loop saved)
    return k, True


@njit(cache=True)
def _value_error(p, n, weka, err, j, pts, pte, ts, te):
    """Attribute ``j``'s error, its token at ``[ts, te)``, the last value's at ``[pts, pte)``: ``(code, j, ts, te)``.
    In ARFF an empty token where the text, the line or the values (``{``, ``}``) end is E_FEW, the row cut short."""
    if weka != 0 and err == E_EMPTY and j > 0 and (
            ts >= n or p[ts] == _NL or p[ts] == _PERCENT or p[ts] == _LBRACE or p[ts] == _RBRACE):
        return E_FEW, j, pts, pte
    return err, j, ts, te


# not inlined (unlike the helpers around it): only quoted, missing and malformed
# tokens get here, and another inlined copy of the number parser would only make
# the hot loop's code and the parser's first compile larger
@njit(cache=True)
def _value(p, ts, te, missing_mode):
    """Parse one unquoted token of a kept attribute: ``(value, error code)``."""
    if te == ts:
        return 0.0, E_EMPTY
    if te - ts == 1 and p[ts] == _QUESTION:
        if missing_mode == MISSING_NAN:
            return np.nan, E_NONE
        return 0.0, E_MISSING
    v, status = parse_number_ptr(p, ts, te)
    if status == PARSE_OK:
        return v, E_NONE
    if status == PARSE_RANGE:
        return 0.0, E_RANGE
    return 0.0, E_NUMBER


@njit(cache=True)  # not inlined, as _value
def _quoted_number(p, i, n, delim, weka):
    """The quoted number at ``i`` (``'1.5'``): ``(value, error code, ts, te, next)``.

    Blanks inside the quotes are trimmed (as Java's ``Double.valueOf``, which
    Weka calls); ``'?'``, ``''`` and anything else not a number are ``E_NUMBER``.
    """
    ts, te, k, ok = _scan_token(p, i, n, True, delim, weka)
    if not ok:
        return 0.0, E_QUOTE, ts, te, k
    a, b = ts + 1, te - 1
    while a < b and _blank(p[a], _COMMA):
        a += 1
    while b > a and _blank(p[b - 1], _COMMA):
        b -= 1
    if a == b or p[a] == _QUESTION:
        return 0.0, E_NUMBER, ts, te, k
    v, err = _value(p, a, b, MISSING_ERROR)
    return v, err, ts, te, k


@njit(cache=True, forceinline=True)
def _kept_token(p, i, n, missing_mode, delim, weka):
    """Parse the token at ``i`` of a kept attribute: ``(value, error code, ts, te, next)``.

    One pass for the usual token: the number is read where it starts, and
    only if the token goes on after it (CSV: no delimiter after optional
    blanks; ARFF: no end of a word) is the token scanned as :func:`_scan_token`
    does and judged by :func:`_value` (or, quoted, by :func:`_quoted_number`),
    which gives the same token span and error as scanning first would.
    """
    i = _skip_blanks(p, i, n, delim)
    v, status, e = parse_prefix_ptr(p, i, n)
    if status == PARSE_OK:
        if weka != 0:
            if e >= n or _word_end(p[e], delim, weka):
                return v, E_NONE, i, e, e
        else:
            k = _skip_blanks(p, e, n, delim)
            if k >= n or p[k] == delim or p[k] == _NL or p[k] == _PERCENT or p[k] == _RBRACE:
                return v, E_NONE, i, e, k
    if i < n and (p[i] == _SQUOTE or p[i] == _DQUOTE):
        return _quoted_number(p, i, n, delim, weka)
    ts, te, k, _ = _scan_token(p, i, n, False, delim, weka)
    v, err = _value(p, ts, te, missing_mode)
    return v, err, ts, te, k


@njit(cache=True)  # rare (weighted rows only), and not inlined for the same reason as _value
def _weight(p, i, n, delim, weka):
    """Parse ``{w}`` at ``i``: ``(weight, next, error code, ts, te)``."""
    i += 1  # past '{'
    ts, te, i, ok = _scan_token(p, i, n, False, delim, weka)
    i = _skip_blanks(p, i, n, delim)
    if i >= n or p[i] != _RBRACE or te == ts:
        return 1.0, i, E_WEIGHT, ts, te
    w, status = parse_number_ptr(p, ts, te)
    if status != PARSE_OK or not w > 0.0:
        return 1.0, i, E_WEIGHT, ts, te
    return w, i + 1, E_NONE, ts, te


def nominal_table(categories: list) -> tuple:
    """The parser's lookup of nominal categories: ``(first, count, start, text)``.

    Parameters
    ----------
    categories : list of tuple of str or None
        Per header attribute, the categories of a nominal attribute clustered
        (``NOMINAL``), None for the others.

    Returns
    -------
    first, count : ndarray, shape (a,), int64
        Index of the attribute's first category in the table (-1: none), and how many.
    start : ndarray, shape (c + 1,), int64
        Category ``v``'s UTF-8 bytes are ``text[start[v]:start[v + 1]]``.
    text : ndarray, shape (bytes,), uint8
    """
    a = len(categories)
    first = np.full(a, -1, dtype=np.int64)
    count = np.zeros(a, dtype=np.int64)
    blobs = []
    for j, values in enumerate(categories):
        if values is not None:
            first[j], count[j] = len(blobs), len(values)
            blobs += [v.encode("utf-8") for v in values]
    start = np.zeros(len(blobs) + 1, dtype=np.int64)
    start[1:] = np.cumsum([len(b) for b in blobs]) if blobs else []
    text = np.frombuffer(b"".join(blobs), dtype=np.uint8).copy() if blobs else np.zeros(0, dtype=np.uint8)
    return first, count, start, text


def no_nominal(a: int) -> tuple:
    """:func:`nominal_table` of ``a`` attributes none of which is clustered as nominal."""
    return nominal_table([None] * a)


@njit(cache=True)  # not inlined: nominal values are rarer than numbers, and the hot loop stays small
def _nominal_token(p, i, n, first, count, start, text, missing_mode, delim, weka):
    """Look up the token at ``i`` among a nominal attribute's categories: ``(index, error code, ts, te, next)``.

    The token may be quoted (backslash escapes honoured, as the header's values
    are unquoted); ``?`` is a missing value: index -1 with ``MISSING_NAN``.
    """
    ts, te, k, ok = _scan_token(p, i, n, True, delim, weka)
    if not ok:
        return -1, E_QUOTE, ts, te, k
    if te == ts:
        return -1, E_EMPTY, ts, te, k
    if te - ts == 1 and p[ts] == _QUESTION:
        if missing_mode == MISSING_NAN:
            return -1, E_NONE, ts, te, k
        return -1, E_MISSING, ts, te, k
    a, b = ts, te
    quoted = p[ts] == _SQUOTE or p[ts] == _DQUOTE
    if quoted:
        a, b = ts + 1, te - 1
    for v in range(first, first + count):
        q, e = start[v], start[v + 1]
        r = a
        same = True
        while r < b:
            c = p[r]
            if quoted and c == _BACKSLASH and r + 1 < b:
                r += 1
                c = p[r]
            if q >= e or text[q] != c:
                same = False
                break
            r += 1
            q += 1
        if same and q == e:
            return v - first, E_NONE, ts, te, k
    return -1, E_NOMINAL, ts, te, k


@njit(cache=True, forceinline=True)
def _put_category(out, row, col, count, idx):
    """A nominal value's one-hot block: ONE at its category, 0 elsewhere; NaN throughout when missing."""
    fill = np.nan if idx < 0 else 0.0
    for c in range(count):
        out[row, col + c] = fill
    if idx >= 0:
        out[row, col + idx] = ONE


@njit(cache=True)  # not inlined: a dense row's numbers take the inlined path, the rest comes here
def _put_value(p, i, n, kind, j, out, row, outcol, nom_first, nom_count, nom_start, nom_text, missing_mode, delim,
               weka):
    """Read attribute ``j``'s value at ``i`` into row ``row`` of ``out``: ``(error code, ts, te, next)``."""
    if kind == KEEP:
        v, err, ts, te, k = _kept_token(p, i, n, missing_mode, delim, weka)
        if err == E_NONE:
            out[row, outcol[j]] = v
        return err, ts, te, k
    if kind == NOMINAL:
        cat, err, ts, te, k = _nominal_token(p, i, n, nom_first[j], nom_count[j], nom_start, nom_text,
                                             missing_mode, delim, weka)
        if err == E_NONE:
            _put_category(out, row, outcol[j], nom_count[j], cat)
        return err, ts, te, k
    ts, te, k, ok = _scan_token(p, i, n, True, delim, weka)
    return (E_QUOTE if not ok else E_EMPTY if te == ts else E_NONE), ts, te, k


@njit(cache=True)  # sparse rows are rare: a call of its own keeps the dense loop small
def _sparse_row(p, i, n, kinds, outcol, out, row, nom_first, nom_count, nom_start, nom_text, missing_mode, delim,
                weka):
    """Read the sparse row whose ``{`` is at ``i`` into row ``row``: ``(error code, attribute, ts, te, next)``.

    An omitted value is 0, a nominal attribute's first category.  CSV: pairs
    ``index value`` (a blank between them) separated by the delimiter.  ARFF:
    Weka's tokens, so index and value are separated by blanks or a comma and so
    are the pairs, and a comma may come before the ``}``.
    """
    a = kinds.shape[0]
    out[row, :] = 0.0
    for j in range(a):
        if kinds[j] == NOMINAL and nom_count[j] > 0:
            out[row, outcol[j]] = ONE
    i += 1
    last = -1
    while True:
        i = _skip_separators(p, i, n, delim) if weka != 0 else _skip_blanks(p, i, n, delim)
        if i < n and p[i] == _RBRACE and (weka != 0 or last < 0):
            return E_NONE, -1, -1, -1, i + 1
        s = i
        idx = 0
        while i < n and 48 <= p[i] <= 57:
            if idx <= a:  # stop growing: any larger index is as wrong
                idx = idx * 10 + (p[i] - 48)
            i += 1
        if i > s and idx >= a:
            return E_INDEX, -1, s, i, i
        # after the index: a blank (CSV), the end of a word (ARFF)
        follows = i < n and (_word_end(p[i], delim, weka) if weka != 0 else _blank(p[i], delim))
        if i == s or not follows:
            while i < n and p[i] != delim and p[i] != _RBRACE and p[i] != _NL:
                i += 1
            return E_SPARSE, -1, s, i, i
        last = idx
        if weka != 0:
            i = _skip_separators(p, i, n, delim)
            if i >= n or p[i] == _NL or p[i] == _PERCENT or p[i] == _LBRACE or p[i] == _RBRACE:
                return E_SPARSE, idx, s, i, i
        err, ts, te, i = _put_value(p, i, n, kinds[idx], idx, out, row, outcol, nom_first, nom_count, nom_start,
                                    nom_text, missing_mode, delim, weka)
        if err != E_NONE:
            return err, idx, ts, te, i
        if weka != 0:
            continue
        i = _skip_blanks(p, i, n, delim)
        if i < n and p[i] == delim:
            i += 1
            continue
        if i < n and p[i] == _RBRACE:
            return E_NONE, -1, -1, -1, i + 1
        return E_SPARSE, last, s, i, i


@njit(cache=True, nogil=True)
def parse_rows(text, kinds, outcol, missing_mode, out, weights, nom_first, nom_count, nom_start, nom_text, delim,
               weka):
    """Parse whole data lines of ``text`` (compiled).

    Parameters
    ----------
    text : ndarray, shape (n_bytes,), uint8
        Whole lines (the last may lack its newline).
    kinds : ndarray, shape (a,), int64
        ``KEEP``, ``NOMINAL`` or ``SKIP`` per attribute of the header.
    outcol : ndarray, shape (a,), int64
        Output column of each kept attribute, the first of a nominal one's
        block (-1 for skipped ones).
    missing_mode : int
        ``MISSING_ERROR`` or ``MISSING_NAN``.
    out : ndarray, shape (>= rows, m), float64
        Kept values; m = number of kept attributes.
    weights : ndarray, shape (>= rows,), float64
        Instance weights (1 where a row has none).
    nom_first, nom_count, nom_start, nom_text : ndarray
        The categories of the ``NOMINAL`` attributes (:func:`nominal_table`).
    delim : int
        The byte between values: ``,`` in ARFF; a CSV file's own (tab, ``;``,
        ``|``).  A tab that is not the delimiter is a blank.
    weka : int
        ``WEKA_TOKENS`` (ARFF, ``delim`` a comma) or ``CSV_TOKENS`` (module docstring).

    Returns
    -------
    rows, lines, weighted, err, err_line, err_col, tok_start, tok_end : int
        Rows parsed; lines consumed (comment and blank lines included);
        whether any row had a weight; on error, its code, the 0-based line in
        ``text``, the 0-based attribute index and the offending token's span.
    """
    n = text.shape[0]
    # the bytes by raw pointer: an array passed to an inlined helper costs a
    # reference-count increment and decrement (two calls) per call
    buf = data_pointer(text)
    a = kinds.shape[0]
    i = rows = line = weighted = 0
    while i < n:
        i = _skip_blanks(buf, i, n, delim)
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
            err, col, ts, te, i = _sparse_row(buf, i, n, kinds, outcol, out, rows, nom_first, nom_count, nom_start,
                                              nom_text, missing_mode, delim, weka)
            if err != E_NONE:
                return rows, line, weighted, err, line, col, ts, te
        else:
            ts = te = 0
            for j in range(a):
                # (a line with nothing on it was taken as blank above, so an
                # empty token is a real empty value: ",," or a trailing ",")
                if kinds[j] == KEEP:
                    v, err, ts2, te2, i = _kept_token(buf, i, n, missing_mode, delim, weka)
                    if err != E_NONE:
                        err, col, ts, te = _value_error(buf, n, weka, err, j, ts, te, ts2, te2)
                        return rows, line, weighted, err, line, col, ts, te
                    out[rows, outcol[j]] = v
                else:
                    err, ts2, te2, i = _put_value(buf, i, n, kinds[j], j, out, rows, outcol, nom_first, nom_count,
                                                  nom_start, nom_text, missing_mode, delim, weka)
                    if err != E_NONE:
                        err, col, ts, te = _value_error(buf, n, weka, err, j, ts, te, ts2, te2)
                        return rows, line, weighted, err, line, col, ts, te
                ts, te = ts2, te2
                if j < a - 1:
                    i, ok = _separator(buf, i, n, delim, weka)
                    if not ok:
                        return rows, line, weighted, E_FEW, line, j + 1, ts, te
        # after the values: an optional weight; ARFF: "{w}" among blanks and commas,
        # CSV: "{w}" or "D {w}"
        brace = _skip_separators(buf, i, n, delim) if weka != 0 else _skip_blanks(buf, i, n, delim)
        i = brace
        if weka == 0 and i < n and buf[i] == delim:
            brace = _skip_blanks(buf, i + 1, n, delim)
            if brace >= n or buf[brace] != _LBRACE:
                return rows, line, weighted, E_MANY, line, a, i, i + 1
        if brace < n and buf[brace] == _LBRACE:
            w, i, err, ts, te = _weight(buf, brace, n, delim, weka)
            if err != E_NONE:
                return rows, line, weighted, err, line, -1, ts, te
            weights[rows] = w
            weighted = 1
            if weka != 0:
                i = _skip_separators(buf, i, n, delim)
        i = _skip_blanks(buf, i, n, delim)
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


def parse_parallel(buf, cuts, seg, kinds, outcol, missing_mode, out, weights, res, pool=None, nominal=None,
                   delim=_COMMA, weka=WEKA_TOKENS):
    """:func:`parse_rows` on each span ``buf[cuts[t]:cuts[t+1]]`` at once, one thread each.

    Span t writes its rows from ``out[seg[t]]`` on (``seg`` leaves room for as
    many rows as the span has lines); ``res[t]`` gets :func:`parse_rows`' eight
    results, token offsets counted from the start of ``buf``.  The caller moves
    the spans' rows together and reports the first error.  ``nominal``,
    ``delim`` and ``weka`` are :func:`parse_rows`' (default: no nominal attribute).

    The spans run on ``pool``'s threads (one after the other without one):
    :func:`parse_rows` releases the GIL.  Python threads rather than a Numba
    ``prange``: a parallel kernel around the parser would add seconds to its
    first compile on every new machine.
    """
    parts = cuts.shape[0] - 1
    nominal = nominal if nominal is not None else no_nominal(len(kinds))

    def span(t):
        r = parse_rows(buf[cuts[t]:cuts[t + 1]], kinds, outcol, missing_mode,
                       out[seg[t]:seg[t + 1]], weights[seg[t]:seg[t + 1]], *nominal, delim, weka)
        res[t, :6] = r[:6]
        res[t, 6:] = (r[6] + cuts[t], r[7] + cuts[t])

    if pool is None or parts == 1:
        for t in range(parts):
            span(t)
    else:
        list(pool.map(span, range(parts)))


@njit(cache=True, forceinline=True)
def _below(v, c):
    # -0.0 counts as below 0.0 (np.min keeps whichever it meets first): the same bits whatever the blocks
    return v < c or (v == c and np.signbit(v))


@njit(cache=True, forceinline=True)
def _above(v, c):
    return v > c or (v == c and not np.signbit(v))


@njit(cache=True, nogil=True)
def _min_max_rows(x, a, b, lo, hi):  # pragma: no cover - compiled
    lo[:] = np.inf
    hi[:] = -np.inf
    for i in range(a, b):
        for j in range(x.shape[1]):
            v = x[i, j]
            if _below(v, lo[j]):
                lo[j] = v
            if _above(v, hi[j]):
                hi[j] = v


def column_min_max(x, parts):
    """Per-column minimum and maximum of ``x`` (shape (n, m), no NaN), in ``parts`` row blocks at once.

    ``-0.0`` counts as below ``0.0``, so the result is the same bits whatever
    the blocks.  The blocks run on threads (the kernel releases the GIL).

    Returns
    -------
    mins, maxs : ndarray, shape (m,), float64
    """
    n, m = x.shape
    parts = max(1, min(parts, n)) if n else 1
    lo = np.empty((parts, m))
    hi = np.empty((parts, m))

    def block(t):
        _min_max_rows(x, n * t // parts, n * (t + 1) // parts, lo[t], hi[t])

    if parts == 1:
        block(0)
    else:
        with ThreadPoolExecutor(parts) as pool:
            list(pool.map(block, range(parts)))
    return _combine_min_max(lo, hi)


@njit(cache=True, nogil=True)
def _combine_min_max(lo, hi):  # pragma: no cover - compiled
    """The extremes of blocks' extremes ``lo``, ``hi`` (shape (parts, m)), in block order."""
    parts, m = lo.shape
    mins = np.full(m, np.inf)
    maxs = np.full(m, -np.inf)
    for t in range(parts):
        for j in range(m):
            if _below(lo[t, j], mins[j]):
                mins[j] = lo[t, j]
            if _above(hi[t, j], maxs[j]):
                maxs[j] = hi[t, j]
    return mins, maxs
