"""The centre data a GPU step reads, made on the host from the centres."""

from __future__ import annotations

import numpy as np

#: the certificate's bound on the centres, ``zl``: twice the largest ``|z|^2`` times ``1 + ZL_MARGIN`` (the
#: float32 rounding of the norms), at most ``ZL_CAP`` (float32 stays finite)
ZL_MARGIN = 1e-6
ZL_CAP = 3.0e38


def fill_centres(centres: np.ndarray, f32: bool, sh: np.ndarray, cc: np.ndarray, cm: np.ndarray, ct: np.ndarray,
                 zl: np.ndarray) -> None:
    """The screen's and the exact kernels' centre data, written into the given (pinned) arrays.

    Parameters
    ----------
    centres : ndarray, shape (k, m), float64
    f32 : bool
        The rows are float32: the shift is rounded to float32 first (the kernel
        subtracts exactly the value it is given).
    sh : ndarray, shape (m,)
        Out: ``s``, the mean of the centres, in the rows' dtype.
    cc : ndarray, shape (tiles * TC,), float32
        Out: ``|z|^2`` of each centre, ``z = float32(c - s)``; padding keeps +inf.
    cm : ndarray, shape (tiles, m, TC), float32
        Out: ``-2 z`` by tile, attribute and centre; padding keeps 0.
    ct : ndarray, shape (m, k), float64
        Out: the centres transposed.
    zl : ndarray, shape (>= 1,), float32
        Out: ``zl[0]``, twice the largest ``|z|^2`` (the certificate's bound), infinite
        when a centre is not finite (every row then takes the exact path).

    Notes
    -----
    The norms' and the shift's summation order is NumPy's: the certificate holds
    for any order, and only the screen reads them.
    """
    k, m = centres.shape
    tiles, _, tc = cm.shape
    shift = centres.mean(axis=0)
    if f32:
        shift = shift.astype(np.float32).astype(np.float64)
    sh[:] = shift
    # float32 values of the float64 differences (as ``(centres - shift).astype(float32)``), one array made
    z = np.empty((k, m), dtype=np.float32)
    np.subtract(centres, shift, out=z, casting="same_kind")
    z64 = z.astype(np.float64)
    norms = np.einsum("ij,ij->i", z64, z64)
    cc[:k] = norms
    # -2 z into the tiles' layout (tile, attribute, centre) through a view of it: padding keeps its zeros
    by_centre = cm.transpose(0, 2, 1)
    full, rest = divmod(k, tc)
    np.multiply(z[:full * tc].reshape(full, tc, m), np.float32(-2.0), out=by_centre[:full])
    if rest:
        np.multiply(z[full * tc:], np.float32(-2.0), out=by_centre[full, :rest])
    np.copyto(ct, centres.T)
    finite = bool(np.isfinite(centres).all())
    zl[0] = min(2.0 * float(norms.max()) * (1.0 + ZL_MARGIN), ZL_CAP) if finite else np.inf
