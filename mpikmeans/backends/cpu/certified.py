"""The search for each row's nearest centre by float32 screening, certified, so the labels are the exact ones.

Finding each row's nearest of K centres is the bulk of a full Lloyd step (N K M
operations).  Here it is done as the GPU does it (see
:mod:`mpikmeans.backends.gpu`): on data shifted by the mean of the centres
(``y = x - s``, ``z = c - s``), in float32, in the dot-product form
``|z|^2 - 2 y.z``.  The products ``-2 z . y`` of a tile of rows and every
centre are one float32 matrix product, by the BLAS library (``sgemm`` through
Numba's ``np.dot``, one thread per caller: the backend's threads each make
their own), whose register-blocked kernels run near the core's multiply-add
peak.  Each row keeps its best and second-best estimate; when their gap
exceeds a rigorous bound on the float32 rounding error (the GPU's; it holds
for any order of the additions, so for any BLAS), the best is certainly the
nearest.  A row whose gap does not (ties, near-ties, huge values) gets every
distance again in exact float64, in attribute order, lowest index on ties.  The
labels are therefore those of the exact float64 computation.

The step around the search (:mod:`.bounds`) sums what the exact kernels sum:
every row's exact float64 squared distance to its centre (attribute order) and
its values, block by block, rows in order, as
:func:`mpikmeans.backends.cpu.tiles._lloyd_pass` does.  So a screened step gives
the same bits as the exact kernels, faster.  The same bound also gives a row
a lower bound on its distance to every other centre (:func:`gap_bound`), which
the next step's bounds start from.
"""

from __future__ import annotations

import numpy as np

from ...jit import njit
from ..serial import _nearest_row as _exact_nearest  # every distance in float64, lowest index on ties

#: float32 unit roundoff; the bound is the GPU kernel's (kernels.py): tol = TOLF (|y|^2 + zlim) + tiny
_U32 = 2.0 ** -24
#: rows whose |y|^2 + 2 max|z|^2 exceeds this take the exact path (float32 overflow guard)
_BIG = np.float32(1.0e30)
_TINY = np.float32(1.0e-36)
#: bytes of one tile's float32 rows and estimates ((rows + centres) x 4): with the tile's float64
#: rows and the next tile's, asked for ahead, well inside a core's L2 (2-core Xeon, 2 MB L2:
#: 2 10^5 x 100, K = 50 on two threads 34 ms a step with 512 KB, 25 with 128 KB)
_TILE_BYTES = 1 << 17
#: the fewest rows of a tile: a matrix product of fewer rows pays its packing of the centres
#: for too little work (10^5 x 257, K = 1000 with 16-row tiles: 655 against 460 ms)
_MIN_ROWS = 96


def screen_rows(k: int, m: int) -> int:
    """Rows per tile of the screen: the tile's float32 rows (rows x m) and estimates (k x rows) in L2.

    Multiples of 16 (whole vectors of the ranking loop), 96 to 512.
    """
    rows = _TILE_BYTES // (4 * max(1, k + m))
    return int(min(512, max(_MIN_ROWS, rows - rows % 16)))


def centre_data(centres: np.ndarray) -> tuple:
    """What the float32 screen needs of the centres.

    Parameters
    ----------
    centres : ndarray, shape (k, m), float64

    Returns
    -------
    shift : ndarray, shape (m,), float64
        ``s``, the mean of the centres.
    zt : ndarray, shape (k, m), float32
        ``-2 z`` with ``z = float32(c - s)``.
    cc : ndarray, shape (k,), float32
        ``|z|^2``.
    zlim : float
        ``2 max |z|^2`` with a margin, the bound's centre term (inf when a centre
        is not finite: every row then takes the exact path).
    tolf : float
        The bound's factor ``2.1 (m + 5) u``.
    """
    k, m = centres.shape
    # huge or non-finite centres overflow float32 here; zlim then sends every row to the exact path
    with np.errstate(over="ignore", invalid="ignore"):
        shift = centres.mean(axis=0)
        z = (centres - shift).astype(np.float32)
        z64 = z.astype(np.float64)
        norms = np.einsum("ij,ij->i", z64, z64)
        zt = np.multiply(z, np.float32(-2.0))
        cc = norms.astype(np.float32)
    finite = bool(np.isfinite(centres).all())
    zlim = min(2.0 * float(norms.max()) * (1.0 + 1e-6), 3.0e38) if finite else np.inf
    return shift, zt, cc, np.float32(zlim), np.float32(2.1 * (m + 5) * _U32)


@njit(cache=True, nogil=True, fastmath={"contract", "reassoc"})
def _shifted_row(xr, shift, yr):  # pragma: no cover - compiled
    """One row ``xr`` (m,) as float32 ``y = x - s`` into ``yr``; returns its ``|y|^2`` (float32).

    Compiled on its own so that only these float32 operations may be fused and
    reordered (``contract``, ``reassoc``): the float64 arithmetic of the callers
    stays one rounding per operation in attribute order.  The bound holds for any
    order of the additions.
    """
    acc = np.float32(0.0)
    for j in range(xr.shape[0]):
        v = np.float32(xr[j] - shift[j])
        yr[j] = v
        acc += v * v
    return acc


@njit(cache=True, nogil=True)
def _shifted_rows(x, t0, rt, shift, ys, yy):  # pragma: no cover - compiled
    """Rows ``t0..t0+rt-1`` as float32 ``y = x - s`` into ``ys[:rt]``, and their ``|y|^2`` (float32) into ``yy``."""
    for r in range(rt):
        yy[r] = _shifted_row(x[t0 + r], shift, ys[r])


@njit(cache=True, nogil=True)
def _rank(est, cc, rt, b1, b2, i1):  # pragma: no cover - compiled
    """Best (``b1``, its centre ``i1``) and second-best (``b2``) of ``cc[c] + est[c, r]`` for rows ``r < rt``.

    Centres outside, rows inside: every operation is the same for each row, so
    the row loop runs in vectors, without branches (which centre is nearest
    follows the data: a branch on it is mispredicted often).  Strict '<': the
    lowest index wins, and an exact tie leaves a gap of 0, so the row is
    rechecked; a NaN estimate never certifies a row.
    """
    for r in range(rt):
        b1[r] = np.float32(np.inf)
        b2[r] = np.float32(np.inf)
        i1[r] = 0
    for c in range(est.shape[0]):
        row = est[c]
        w = cc[c]
        for r in range(rt):
            d = row[r] + w
            o1 = b1[r]
            nearer = d < o1
            b2[r] = min(b2[r], max(o1, d))  # d < o1: the old best; else min(o2, d)
            i1[r] = c if nearer else i1[r]
            b1[r] = d if nearer else o1


@njit(cache=True, forceinline=True)
def is_certified(b1, b2, yy, zlim, tolf):  # pragma: no cover - compiled
    """Whether float32's best centre of a row (best ``b1``, second ``b2``, ``|y|^2`` ``yy``) is certainly the nearest.

    True when the gap exceeds the bound (and nothing overflowed: NaN and huge
    values fail the test).
    """
    scale = yy + zlim
    return b2 - b1 > tolf * scale + _TINY and scale < _BIG


@njit(cache=True, forceinline=True)
def gap_bound(b1, b2, yy, zlim, tolf):  # pragma: no cover - compiled
    """A lower bound on ``|x - c_j|^2 - |x - c_best|^2`` over every other centre ``j`` of a certified row.

    Each estimate's error is within ``tolf (|y|^2 + zlim) / 2`` of its exact
    value (the certificate's bound covers two estimates and the gap), so the
    estimated gap less ``tolf (|y|^2 + zlim)`` bounds the true one; twice that
    is taken (float64 rounding of this arithmetic, and margin).  Negative
    values bound nothing useful; the caller clips them.
    """
    return (np.float64(b2) - np.float64(b1)) - 2.0 * np.float64(tolf) * (np.float64(yy) + np.float64(zlim))


@njit(cache=True, forceinline=True)
def screen_search(x, t0, rows, f, cen, shift, zt, cc, zlim, tolf, ys, est_flat, yy, b1, b2, i1):  # pragma: no cover
    """Nearest centres of rows ``t0 + rows[q]``, ``q < f``: float32 estimates, certified, else exact.

    The rows' float32 ``y = x - s`` go into ``ys[:f]``; their estimates
    ``zt @ ys[:f].T`` (k x f) are one ``sgemm`` into the front of ``est_flat``
    and are ranked (``b1``, ``b2``, ``i1``); a row whose ranking the bound
    cannot certify gets every distance again in float64 (:func:`_exact_nearest`).
    On return ``i1[q]`` is row ``q``'s exact label.  Returns how many rows took
    the exact path.
    """
    k = zt.shape[0]
    for q in range(f):
        yy[q] = _shifted_row(x[t0 + rows[q]], shift, ys[q])
    est = est_flat[:k * f].reshape((k, f))
    np.dot(zt, ys[:f].T, est)
    _rank(est, cc, f, b1, b2, i1)
    exact = 0
    for q in range(f):
        if not is_certified(b1[q], b2[q], yy[q], zlim, tolf):
            i1[q] = _exact_nearest(x, t0 + rows[q], cen)[0]
            exact += 1
    return exact
