"""Attribute scaling before clustering: ``--normalize none|minmax|zscore`` (collective fit).

``minmax`` is what Weka's ``EuclideanDistance`` does by default: every
attribute becomes ``(x - min) / (max - min)`` with the global min and max, and
an attribute whose min equals its max becomes 0 (Weka's
``NormalizableDistance.norm``).  The same expression in the same IEEE
arithmetic gives the very values Weka computes, so a Weka clustering can be
checked against this tool bit for bit.

``zscore`` is ``(x - mean) / std`` with the population standard deviation
(ddof = 0, as scikit-learn's ``StandardScaler``); a constant attribute becomes
0.  Mean and variance are computed in two passes with exact fixed-point sums
(:func:`mpikmeans.exact.limb_sums`) rounded once, so they are the same bits
for any number of ranks and within an ulp or two of NumPy's on the whole
array.

Centres found in the scaled space go back to data units with
:meth:`Scaler.inverse`; the SSE stays in scaled units.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .choices import NORMALIZE_METHODS as METHODS
from .errors import InputError, UsageError
from .exact import exact_column_means, exact_column_sums
from .init import global_extent


@dataclass
class Scaler:
    """A fitted per-attribute affine scaling, the same on every rank.

    ``transform(x) = (x - offset) / scale``, with constant attributes set to 0;
    ``inverse(c) = c * scale + offset``.

    Attributes
    ----------
    method : {"none", "minmax", "zscore"}
    offset : ndarray, shape (m,), float64
        Global min (minmax), mean (zscore) or 0.
    scale : ndarray, shape (m,), float64
        Global max - min (minmax), std (zscore) or 1; 1 for a constant attribute.
    constant : ndarray, shape (m,), bool
        Attributes with min == max: always 0 after scaling (Weka's rule).
    """

    method: str
    offset: np.ndarray
    scale: np.ndarray
    constant: np.ndarray

    @property
    def m(self) -> int:
        return self.offset.shape[0]

    def transform(self, x: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        """Scaled copy of ``x`` (or in ``out``, which may be ``x`` itself).

        Parameters
        ----------
        x : ndarray, shape (n, m)
        out : ndarray, shape (n, m), float64, optional

        Returns
        -------
        ndarray, shape (n, m), float64, C-contiguous
            ``x`` itself (as float64) when the method is ``none`` and no ``out`` is given.
        """
        x = np.asarray(x)
        if x.ndim != 2 or x.shape[1] != self.m:
            raise UsageError(f"expected rows of {self.m} attributes, got an array of shape {x.shape}")
        if self.method == "none":
            if out is None:
                return np.ascontiguousarray(x, dtype=np.float64)
            if out is not x:  # in place is a no-op (a copy of the whole data onto itself otherwise)
                out[...] = x
            return out
        if out is None:
            out = np.empty(x.shape, dtype=np.float64)
        # division, not a product with 1/scale: Weka divides, and so every
        # scaled value is the one Weka's distance function sees
        np.subtract(x, self.offset, out=out)
        np.divide(out, self.scale, out=out)
        if self.constant.any():
            out[:, self.constant] = 0.0
        return out

    def inverse(self, centres: np.ndarray) -> np.ndarray:
        """Centres (or rows) back in the data's units.

        Parameters
        ----------
        centres : ndarray, shape (k, m)

        Returns
        -------
        ndarray, shape (k, m), float64
            A constant attribute gets its value back.
        """
        c = np.asarray(centres, dtype=np.float64)
        if self.method == "none":
            return c.copy()
        return c * self.scale + self.offset

    def to_dict(self) -> dict:
        """The scaling for summary.json."""
        return {"method": self.method, "offset": self.offset.tolist(), "scale": self.scale.tolist(),
                "constant": [int(j) for j in np.flatnonzero(self.constant)]}


def global_means(comm, x: np.ndarray, mins: np.ndarray | None = None, maxs: np.ndarray | None = None) -> np.ndarray:
    """Per-attribute mean of the rows of all ranks, the same bits for any split (collective).

    For instance Weka's "Full Data" column (unweighted).

    Parameters
    ----------
    x : ndarray, shape (n_local, m), float64
    mins, maxs : ndarray, shape (m,), optional
        The global per-attribute extremes, when known: they bound the values, so
        the sum is one compiled pass and one collective.

    Returns
    -------
    ndarray, shape (m,), float64
        NaN when there are no rows.
    """
    x = np.asarray(x, dtype=np.float64)
    n = int(comm.allreduce(np.array([len(x)], dtype=np.int64), "sum")[0])
    vmax = _largest(mins, maxs)
    if n == 0:
        exact_column_sums(comm, x, vmax)  # the same collectives as the other ranks
        return np.full(x.shape[1], np.nan)
    return exact_column_means(comm, x, n, vmax)


def _largest(mins, maxs):
    """Each column's largest magnitude from its extremes (None when they are not given)."""
    if mins is None or maxs is None:
        return None
    return np.maximum(np.abs(np.where(np.isfinite(mins), mins, 0.0)), np.abs(np.where(np.isfinite(maxs), maxs, 0.0)))


def fit_scaler(comm, x: np.ndarray, method: str, mins: np.ndarray | None = None,
               maxs: np.ndarray | None = None, numeric: np.ndarray | None = None) -> Scaler:
    """Global scaling statistics of the rows of all ranks (collective).

    Parameters
    ----------
    comm : Comm or SerialComm
    x : ndarray, shape (n_local, m), float64
        This rank's rows (may be empty).
    method : {"none", "minmax", "zscore"}
    mins, maxs : ndarray, shape (m,), optional
        The global per-attribute extremes, when known (the reader's): no pass
        over the rows to find them.
    numeric : ndarray, shape (m,), bool, optional
        The columns to scale; the others (a nominal attribute's one-hot block,
        see :mod:`mpikmeans.nominal`) are left as they are, as Weka leaves its
        0/1 nominal distance.  Default: all.

    Returns
    -------
    Scaler
        Bit-for-bit the same for any number of ranks and split of the rows.

    Raises
    ------
    UsageError
        Unknown method.
    InputError
        No rows at all.
    """
    if method not in METHODS:
        raise UsageError(f"--normalize {method!r}: expected one of {', '.join(METHODS)}")
    x = np.asarray(x, dtype=np.float64)
    m = x.shape[1]
    if method == "none":
        return Scaler("none", np.zeros(m), np.ones(m), np.zeros(m, dtype=bool))
    scaler = _fit(comm, x, method, mins, maxs)
    if numeric is not None and not numeric.all():
        # (x - 0) / 1 is x exactly: the one-hot blocks pass through unchanged
        scaler.offset = np.where(numeric, scaler.offset, 0.0)
        scaler.scale = np.where(numeric, scaler.scale, 1.0)
        scaler.constant = scaler.constant & numeric
    return scaler


def _fit(comm, x: np.ndarray, method: str, mins, maxs) -> Scaler:
    n = int(comm.allreduce(np.array([len(x)], dtype=np.int64), "sum")[0])
    if n == 0:
        raise InputError("no rows to scale")
    if mins is None or maxs is None:
        mins, maxs = global_extent(comm, x)
    constant = mins == maxs
    if method == "minmax":
        width = np.where(constant, 1.0, maxs - mins)
        return Scaler("minmax", mins, width, constant)
    mean = global_means(comm, x, mins, maxs)
    # (x - mean)**2 is largest at an extreme (rounding is monotone): its bound needs no pass
    dev2_max = np.maximum((maxs - mean) ** 2, (mins - mean) ** 2)
    std = np.sqrt(exact_column_means(comm, x, n, dev2_max, center=mean))
    # exact means make a constant column's deviations exactly 0; min == max
    # says so without trusting that
    std = np.where(constant | (std == 0.0), 1.0, std)
    return Scaler("zscore", mean, std, constant | (std == 0.0))
