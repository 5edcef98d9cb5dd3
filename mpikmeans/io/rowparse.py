"""The compiled parser of ARFF data lines (dense and sparse rows, weights, quotes).

One pass over a buffer of whole lines, in Numba.  Each attribute has a kind:
``KEEP`` (a numeric attribute that is clustered: parsed exactly into its output
column), ``NOMINAL`` (a nominal attribute clustered as Weka does, see
:mod:`mpikmeans.nominal`: its value, quoted or not, is looked up among the
attribute's categories and written as a one-hot block of columns) or ``SKIP``
(nominal, string and date attributes otherwise, and numeric ones the user
ignores: the token is only scanned, quotes respected, so a quoted value with
commas inside does not shift the columns).

Accepted, as Weka's ArffLoader does: dense rows ``v1, v2, ...``; sparse rows
``{index value, ...}`` with 0-based indices (omitted values are 0, ``{}`` is a
row of zeros, a nominal attribute's first category); an instance weight
``{w}`` after the last value; ``?`` for a missing value; ``%`` comments at the end of a line (outside quotes); blanks
and tabs around values; CRLF line ends.
"""

from __future__ import annotations

import numpy as np
from ..jit import njit

from ..nominal import ONE
from .numparse import (
    PARSE_OK,
    PARSE_RANGE,
    data_pointer,
    parse_number_ptr,
    parse_prefix_ptr,
)

KEEP = 0
SKIP = 1
NOMINAL = 2

_NL = 10
_CR = 13
_SPACE = 32
_TAB = 9
_COMMA = 44
_PERCENT = 37
_LBRACE = 123
_RBRACE = 125
_QUESTION = 63
_SQUOTE = 39
_DQUOTE = 34
_BACKSLASH = 92

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
def _scan_token(p, i, n, quoted_ok, delim):
    """Span of the token at ``i``: ``(start, end, next, ok)``.

    A token ends before the delimiter (``,`` in ARFF), ``}``, ``%`` or the line end.  A quoted token
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
    while i < n:
        c = p[i]
        if c == delim or c == _NL or c == _PERCENT or c == _RBRACE:
            break
        i += 1
    te = i
    while te > ts and _blank(p[te - 1], delim):
        te -= 1
    return ts, te, i, True


# not inlined (unlike the helpers around it): only quoted, missing and malformed
# tokens get here, and another inlined copy of the number parser would only make
# the hot loop's code and the parser's first compile larger
@njit(cache=True)
def _value(p, ts, te, kind, missing_mode):
    """Parse one token of a kept attribute: ``(value, error code)``."""
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


@njit(cache=True, forceinline=True)
def _kept_token(p, i, n, missing_mode, delim):
    """Parse the token at ``i`` of a kept attribute: ``(value, error code, ts, te, next)``.

    One pass for the usual token: the number is read where it starts, and
    only if a delimiter (after optional blanks) does not follow it is the
    token scanned as :func:`_scan_token` does and judged by :func:`_value`,
    which gives the same token span and error as scanning first would.
    """
    i = _skip_blanks(p, i, n, delim)
    v, status, e = parse_prefix_ptr(p, i, n)
    if status == PARSE_OK:
        k = e
        while k < n and _blank(p[k], delim):
            k += 1
        if k >= n:
            return v, E_NONE, i, e, k
        c = p[k]
        if c == delim or c == _NL or c == _PERCENT or c == _RBRACE:
            return v, E_NONE, i, e, k
    ts, te, k, _ = _scan_token(p, i, n, False, delim)
    v, err = _value(p, ts, te, KEEP, missing_mode)
    return v, err, ts, te, k


@njit(cache=True)
def _kept_token_call(p, i, n, missing_mode, delim):
    """:func:`_kept_token` as a call, not inlined: for the values of sparse rows.

    Sparse rows are rare; each inlined copy of the number parser adds to the
    parser's code and its first compile, so only dense rows (the usual ones)
    inline it.
    """
    return _kept_token(p, i, n, missing_mode, delim)


@njit(cache=True)  # rare (weighted rows only), and not inlined for the same reason as _value
def _weight(p, i, n, delim):
    """Parse ``{w}`` at ``i``: ``(weight, next, error code, ts, te)``."""
    i += 1  # past '{'
    ts, te, i, ok = _scan_token(p, i, n, False, delim)
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
def _nominal_token(p, i, n, first, count, start, text, missing_mode, delim):
    """Look up the token at ``i`` among a nominal attribute's categories: ``(index, error code, ts, te, next)``.

    The token may be quoted (backslash escapes honoured, as the header's values
    are unquoted); ``?`` is a missing value: index -1 with ``MISSING_NAN``.
    """
    ts, te, k, ok = _scan_token(p, i, n, True, delim)
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


@njit(cache=True, nogil=True)
def parse_rows(text, kinds, outcol, missing_mode, out, weights, nom_first, nom_count, nom_start, nom_text, delim):
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
        The byte between values: ``,`` (44) in ARFF; a CSV file's own (tab,
        ``;``, ``|``).  A tab that is not the delimiter is a blank.

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
    m = out.shape[1]
    any_nominal = False
    for j in range(a):
        any_nominal = any_nominal or kinds[j] == NOMINAL
    i = 0
    rows = 0
    line = 0
    weighted = 0
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
            # sparse row: {index value, ...}; an omitted value is 0, a nominal one's first category
            for j in range(m):
                out[rows, j] = 0.0
            if any_nominal:
                for j in range(a):
                    if kinds[j] == NOMINAL and nom_count[j] > 0:
                        out[rows, outcol[j]] = ONE
            i = _skip_blanks(buf, i + 1, n, delim)
            if i < n and buf[i] == _RBRACE:
                i += 1
            else:
                last = -1
                while True:
                    i = _skip_blanks(buf, i, n, delim)
                    s = i
                    idx = 0
                    while i < n and 48 <= buf[i] <= 57:
                        if idx <= a:  # stop growing: any larger index is as wrong
                            idx = idx * 10 + (buf[i] - 48)
                        i += 1
                    if i > s and idx >= a:
                        return rows, line, weighted, E_INDEX, line, -1, s, i
                    if i == s or i >= n or not _blank(buf[i], delim):
                        while i < n and buf[i] != delim and buf[i] != _RBRACE and buf[i] != _NL:
                            i += 1
                        return rows, line, weighted, E_SPARSE, line, -1, s, i
                    last = idx
                    if kinds[idx] == KEEP:
                        v, err, ts, te, i = _kept_token_call(buf, i, n, missing_mode, delim)
                        if err != E_NONE:
                            return rows, line, weighted, err, line, idx, ts, te
                        out[rows, outcol[idx]] = v
                    elif kinds[idx] == NOMINAL:
                        cat, err, ts, te, i = _nominal_token(buf, i, n, nom_first[idx], nom_count[idx], nom_start,
                                                             nom_text, missing_mode, delim)
                        if err != E_NONE:
                            return rows, line, weighted, err, line, idx, ts, te
                        _put_category(out, rows, outcol[idx], nom_count[idx], cat)
                    else:
                        ts, te, i, ok = _scan_token(buf, i, n, True, delim)
                        if not ok:
                            return rows, line, weighted, E_QUOTE, line, idx, ts, te
                        if te == ts:
                            return rows, line, weighted, E_EMPTY, line, idx, ts, te
                    i = _skip_blanks(buf, i, n, delim)
                    if i < n and buf[i] == delim:
                        i += 1
                        continue
                    if i < n and buf[i] == _RBRACE:
                        i += 1
                        break
                    return rows, line, weighted, E_SPARSE, line, last, s, i
        else:
            for j in range(a):
                # (a line with nothing on it was taken as blank above, so an
                # empty token is a real empty value: ",," or a trailing ",")
                if kinds[j] == KEEP:
                    v, err, ts, te, i = _kept_token(buf, i, n, missing_mode, delim)
                    if err != E_NONE:
                        return rows, line, weighted, err, line, j, ts, te
                    out[rows, outcol[j]] = v
                elif kinds[j] == NOMINAL:
                    cat, err, ts, te, i = _nominal_token(buf, i, n, nom_first[j], nom_count[j], nom_start, nom_text,
                                                         missing_mode, delim)
                    if err != E_NONE:
                        return rows, line, weighted, err, line, j, ts, te
                    _put_category(out, rows, outcol[j], nom_count[j], cat)
                else:
                    ts, te, i, ok = _scan_token(buf, i, n, True, delim)
                    if not ok:
                        return rows, line, weighted, E_QUOTE, line, j, ts, te
                    if te == ts:
                        return rows, line, weighted, E_EMPTY, line, j, ts, te
                if j < a - 1:
                    i = _skip_blanks(buf, i, n, delim)
                    if i >= n or buf[i] != delim:
                        return rows, line, weighted, E_FEW, line, j + 1, ts, te
                    i += 1
        # after the values: an optional ", {weight}" (dense) or "{weight}"
        i = _skip_blanks(buf, i, n, delim)
        if i < n and buf[i] == delim:
            j = _skip_blanks(buf, i + 1, n, delim)
            if j < n and buf[j] == _LBRACE:
                w, i, err, ts, te = _weight(buf, j, n, delim)
                if err != E_NONE:
                    return rows, line, weighted, err, line, -1, ts, te
                weights[rows] = w
                weighted = 1
            else:
                return rows, line, weighted, E_MANY, line, a, i, i + 1
        elif i < n and buf[i] == _LBRACE:
            w, i, err, ts, te = _weight(buf, i, n, delim)
            if err != E_NONE:
                return rows, line, weighted, err, line, -1, ts, te
            weights[rows] = w
            weighted = 1
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


@njit(cache=True, nogil=True)
def span_cuts(buf, parts):
    """Cut ``buf`` into ``parts`` spans of whole lines, about equal in bytes.

    Returns
    -------
    cuts : ndarray, shape (parts + 1,), int64
        Span t is ``buf[cuts[t]:cuts[t + 1]]``; every cut is a line start.
    """
    n = buf.shape[0]
    cuts = np.empty(parts + 1, dtype=np.int64)
    cuts[0] = 0
    for t in range(1, parts):
        p = max(n * t // parts, cuts[t - 1])
        while p < n and p > 0 and buf[p - 1] != _NL:
            p += 1
        cuts[t] = p
    cuts[parts] = n
    return cuts


def line_cuts(buf, parts, pool=None):
    """Cut ``buf`` into ``parts`` spans of whole lines (:func:`span_cuts`); also count each span's newlines.

    The counts run on ``pool``'s threads, a span each (the kernel releases the
    GIL): one thread counts at its share of the memory bandwidth (about 5 GB/s on
    the H100 machine's VM, 1.3 s of a 6.8 GB read on 16 threads), the spans'
    threads together at the machine's.

    Returns
    -------
    cuts : ndarray, shape (parts + 1,), int64
    newlines : ndarray, shape (parts,), int64
    """
    cuts = span_cuts(buf, parts)

    def count(t):
        return _count_newlines(buf[cuts[t]:cuts[t + 1]])

    if pool is None or parts == 1:
        return cuts, np.array([count(t) for t in range(parts)], dtype=np.int64)
    return cuts, np.array(list(pool.map(count, range(parts))), dtype=np.int64)


@njit(cache=True, nogil=True)
def _count_newlines(buf):
    # a plain loop of its own: LLVM vectorises it (~20 GB/s), the same loop
    # inside a prange body does not (~1.6 GB/s)
    c = 0
    for i in range(buf.shape[0]):
        if buf[i] == _NL:
            c += 1
    return c


@njit(cache=True, nogil=True)
def last_newline(buf, lo):
    """Index of the last ``\n`` in ``buf[lo:]``, or -1."""
    i = buf.shape[0] - 1
    while i >= lo:
        if buf[i] == _NL:
            return i
        i -= 1
    return -1


def parse_parallel(buf, cuts, seg, kinds, outcol, missing_mode, out, weights, res, pool=None, nominal=None,
                   delim=_COMMA):
    """:func:`parse_rows` on each span ``buf[cuts[t]:cuts[t+1]]`` at once, one thread each.

    Span t writes its rows from ``out[seg[t]]`` on (``seg`` leaves room for
    as many rows as the span has lines); ``res[t]`` gets :func:`parse_rows`'
    eight results, token offsets counted from the start of ``buf``.  The
    caller moves the spans' rows together (only needed after a span with
    blank or comment lines) and reports the first error.

    ``nominal`` is the table of the ``NOMINAL`` attributes' categories
    (:func:`nominal_table`; default: none) and ``delim`` the byte between values.

    The spans run on ``pool``'s threads (a ``concurrent.futures`` executor; one
    after the other without one): :func:`parse_rows` releases the GIL.  Python
    threads rather than a Numba ``prange``: the same speed, and a parallel kernel
    around the parser would add seconds to its first compile on every new machine.
    """
    parts = cuts.shape[0] - 1
    nominal = nominal if nominal is not None else no_nominal(len(kinds))

    def span(t):
        r = parse_rows(buf[cuts[t]:cuts[t + 1]], kinds, outcol, missing_mode,
                       out[seg[t]:seg[t + 1]], weights[seg[t]:seg[t + 1]], *nominal, delim)
        res[t, :6] = r[:6]
        res[t, 6] = r[6] + cuts[t]
        res[t, 7] = r[7] + cuts[t]

    if pool is None or parts == 1:
        for t in range(parts):
            span(t)
    else:
        list(pool.map(span, range(parts)))


@njit(cache=True, nogil=True)
def _min_max_rows(x, a, b, lo, hi):  # pragma: no cover - compiled
    for j in range(x.shape[1]):
        lo[j] = np.inf
        hi[j] = -np.inf
    for i in range(a, b):
        for j in range(x.shape[1]):
            v = x[i, j]
            c = lo[j]
            if v < c or (v == c and np.signbit(v)):
                lo[j] = v
            c = hi[j]
            if v > c or (v == c and not np.signbit(v)):
                hi[j] = v


def column_min_max(x, parts):
    """Per-column minimum and maximum of ``x`` (shape (n, m), no NaN), in ``parts`` row blocks at once.

    ``-0.0`` counts as below ``0.0`` (``np.min`` would keep whichever it met
    first), so the result is the same bits whatever the blocks.  The blocks run
    on threads (the kernel releases the GIL).

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
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(parts) as pool:
            list(pool.map(block, range(parts)))
    return _combine_min_max(lo, hi)


@njit(cache=True, nogil=True)
def _combine_min_max(lo, hi):  # pragma: no cover - compiled
    # the blocks in order, with the same signed-zero rule as within a block
    parts, m = lo.shape
    mins = np.empty(m)
    maxs = np.empty(m)
    for j in range(m):
        a = np.inf
        b = -np.inf
        for t in range(parts):
            v = lo[t, j]
            if v < a or (v == a and np.signbit(v)):
                a = v
            v = hi[t, j]
            if v > b or (v == b and not np.signbit(v)):
                b = v
        mins[j] = a
        maxs[j] = b
    return mins, maxs
