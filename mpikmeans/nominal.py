"""Nominal attributes clustered as Weka's SimpleKMeans clusters them (``--nominal weka``).

Weka's Euclidean distance adds, for a nominal attribute, 0 when two values are
the same category and 1 when they differ; a centroid's nominal value is the
mode of its cluster, the first (lowest) category on a tie.  Both fit the
backends as they are, with no kernel of their own:

* a nominal attribute of L categories becomes L columns, a one-hot block whose
  set entry is :data:`ONE` = 1/sqrt(2); two different categories then differ by
  ONE in two columns, ``2 ONE^2 = 1`` (to an ulp), and the same category by 0;
* the backend's per-cluster sums of a block are its categories' counts times
  ONE, so after each Lloyd update :meth:`Layout.project` replaces the block's
  mean by the one-hot of the largest count: the mode, ties to the lowest index.

Counts of unweighted rows are recovered exactly (``rint(sum / ONE)``: far from
any rounding for fewer than ~10^8 rows in a cluster; with float32 storage on the
GPU, whose ONE is 1.3e-8 smaller, for fewer than ~4·10^7), so the mode and its
tie rule do not depend on the order of the additions, hence not on the number
of ranks or the backend.  Weighted counts are compared as summed.

This module is pure NumPy: the reader builds a :class:`Layout`, the Lloyd loop
and the initialisations call :meth:`Layout.project`, the writers
:meth:`Layout.decode`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

#: The set entry of a one-hot block: two different categories are at squared distance 2 ONE^2 = 1.
#: (The parser's njit kernels compile it in: this module's source is part of their cache key.)
ONE = 1.0 / math.sqrt(2.0)


@dataclass
class Layout:
    """Where each clustered attribute lives among the data's columns.

    Attributes
    ----------
    names : list of str
        The clustered attributes, in header order.
    starts : list of int
        First column of each attribute (a numeric attribute has one column).
    values : list of tuple or None
        A nominal attribute's categories (its block has one column each); None
        for a numeric attribute.
    """

    names: list
    starts: list
    values: list

    @classmethod
    def numeric(cls, names: list) -> "Layout":
        """Every attribute numeric, one column each."""
        return cls(list(names), list(range(len(names))), [None] * len(names))

    @property
    def columns(self) -> int:
        """Columns of the data array."""
        return sum(1 if v is None else len(v) for v in self.values)

    @property
    def has_nominal(self) -> bool:
        return any(v is not None for v in self.values)

    def blocks(self) -> list:
        """``(attribute index, first column, categories)`` of every nominal attribute."""
        return [(a, s, v) for a, (s, v) in enumerate(zip(self.starts, self.values)) if v is not None]

    def numeric_columns(self) -> np.ndarray:
        """Mask over the columns, shape (columns,): True where a numeric attribute is."""
        mask = np.ones(self.columns, dtype=bool)
        for _, s, v in self.blocks():
            mask[s:s + len(v)] = False
        return mask

    def modes(self, block_sums: np.ndarray, weighted: bool = False) -> np.ndarray:
        """Index of each row's largest category count, the lowest on a tie.

        Parameters
        ----------
        block_sums : ndarray, shape (r, L)
            Sums of a block's columns (each set entry :data:`ONE`).
        weighted : bool
            Rows had instance weights: the sums are compared as they are.
            Otherwise they are counts times ONE, made whole counts again first.

        Returns
        -------
        ndarray, shape (r,), int64
        """
        counts = block_sums / ONE
        if not weighted:
            counts = np.rint(counts)
        return np.argmax(counts, axis=1)  # the first largest: Weka's Utils.maxIndex

    def project(self, centres: np.ndarray, sums: np.ndarray | None = None, weighted: bool = False) -> np.ndarray:
        """Each nominal block of ``centres`` set to the one-hot of its mode (in place; returned).

        Parameters
        ----------
        centres : ndarray, shape (k, columns), float64
        sums : ndarray, shape (k, columns), optional
            The clusters' sums the centres are the means of: the counts are
            taken from them (exact); default: from ``centres`` themselves.
        weighted : bool
            See :meth:`modes`.
        """
        if not self.has_nominal:
            return centres
        basis = centres if sums is None else sums
        for _, s, v in self.blocks():
            idx = self.modes(basis[:, s:s + len(v)], weighted or sums is None)
            centres[:, s:s + len(v)] = 0.0
            centres[np.arange(len(centres)), s + idx] = ONE
        return centres

    def decode(self, centres: np.ndarray) -> list:
        """Centres as attribute values: floats for numeric attributes, category names for nominal ones.

        Parameters
        ----------
        centres : ndarray, shape (k, columns)
            In data units (numeric columns unscaled), nominal blocks one-hot.

        Returns
        -------
        list of list
            ``k`` rows of ``len(names)`` values.
        """
        rows = []
        for c in np.asarray(centres, dtype=np.float64):
            row = []
            for s, v in zip(self.starts, self.values):
                row.append(float(c[s]) if v is None else v[int(np.argmax(c[s:s + len(v)]))])
            rows.append(row)
        return rows

    def encode(self, rows: list) -> np.ndarray:
        """Attribute values (numbers, or category names of the nominal attributes) as columns.

        Parameters
        ----------
        rows : list of list of str
            ``k`` rows of ``len(names)`` fields, as read from a file.

        Returns
        -------
        ndarray, shape (k, columns), float64

        Raises
        ------
        ValueError
            A field that is not a number of a numeric attribute, or not a category
            of a nominal one (the message names the row and the attribute).
        """
        out = np.zeros((len(rows), self.columns), dtype=np.float64)
        for i, fields in enumerate(rows):
            if len(fields) != len(self.names):
                raise ValueError(f"centre {i + 1} has {len(fields)} values, expected {len(self.names)}")
            for name, s, v, field in zip(self.names, self.starts, self.values, fields):
                field = field.strip()
                if v is None:
                    try:
                        out[i, s] = float(field)
                    except ValueError:
                        raise ValueError(f"centre {i + 1}, attribute {name!r}: {field!r} is not a number") from None
                else:
                    value = field[1:-1] if len(field) >= 2 and field[0] == field[-1] and field[0] in "'\"" else field
                    if value not in v:
                        raise ValueError(f"centre {i + 1}, attribute {name!r}: {value!r} is not one of "
                                         f"its categories ({', '.join(v[:6])}{', ...' if len(v) > 6 else ''})")
                    out[i, s + v.index(value)] = ONE
        return out
