"""The k-means++ passes of :class:`.backend.GPUBackend` on resident rows: D² stays on the device.

While k-means++ chooses its centres, D² (n float64) stays on the device: each choice is
one pass for all candidates' potentials and one to lower D², with the CPU's arithmetic
(see :mod:`.initk`).  Streamed rows, and a D² that is a host array, take the generic
host path of :class:`mpikmeans.backends.RowDistances` (``super()``).
"""

from __future__ import annotations

import numpy as np

from ...exact import BlockFixed, limbs_to_int, scale_factors
from . import initk
from .compiled import compiled
from .device import SIM, cuda
from .launch import launch_once


class DeviceInitPasses:
    """Mixin of :class:`.backend.GPUBackend` (before :class:`mpikmeans.backends.Backend` in its bases):
    the initialisations' row passes on the device.  Uses the backend's ``rows``, ``n``, ``m`` and
    ``limits``."""

    def _on_device(self, d2) -> bool:
        return d2 is not None and not isinstance(d2, np.ndarray)

    def _kernel(self, name: str, spec: tuple, kern, args: tuple, grid, block: int = initk.NT) -> None:
        launch_once(kern, compiled(name, spec, kern, args), args, grid, block)

    def _d2_pass(self, d2, centre: np.ndarray, lower: bool) -> None:
        rows = self.rows
        c = cuda.to_device(np.ascontiguousarray(centre, dtype=np.float64).ravel())
        kern = initk.d2_kernel(lower)
        self._kernel("d2", (lower,), kern, (rows.dx, self.n, rows.ld, self.m, c, d2), -(-self.n // initk.NT))

    def dist2_to(self, centre: np.ndarray):
        """D² to one point, kept on the device (see :meth:`RowDistances.dist2_to`)."""
        if self.n == 0 or self.rows.streaming:
            return super().dist2_to(centre)
        d2 = cuda.device_array(self.n, dtype=np.float64)
        self._d2_pass(d2, centre, lower=False)
        return d2

    def lower_d2(self, d2, centre: np.ndarray):
        """``min(D², squared distance to centre)``, in place on the device."""
        if not self._on_device(d2):
            return super().lower_d2(d2, centre)
        self._d2_pass(d2, centre, lower=True)
        return d2

    def nearest(self, points: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Nearest candidate with a kernel not specialised on their number (see :meth:`RowDistances.nearest`)."""
        if self.n == 0 or self.rows.streaming:
            return super().nearest(points)
        rows = self.rows
        pts = np.ascontiguousarray(points, dtype=np.float64)
        labels = cuda.device_array(self.n, dtype=np.int32)
        dist2 = cuda.device_array(self.n, dtype=np.float64)
        kern = initk.nearest_kernel()
        self._kernel("nearest", (), kern, (rows.dx, self.n, rows.ld, self.m, cuda.to_device(pts.ravel()), len(pts),
                                           labels, dist2), -(-self.n // initk.NT))
        return labels.copy_to_host(), dist2.copy_to_host()

    def d2_host(self, d2) -> np.ndarray:
        return d2.copy_to_host() if self._on_device(d2) else d2

    def _fixed_blocks(self, d2, weights, s: int):
        """Exact limb sums and the largest ``w * D²`` of consecutive row blocks, on the host."""
        rows = self.rows
        nb = max(1, min(1024, -(-self.n // initk.NT)))
        hi = cuda.device_array(nb, dtype=np.int64)
        lo = cuda.device_array(nb, dtype=np.int64)
        vmax = cuda.device_array(nb, dtype=np.float64)
        f1, f2 = scale_factors(s)
        weighted = weights is not None
        w = rows.dw if weighted else d2
        kern = initk.fixed_blocks_kernel(weighted)
        self._kernel("fixed_blocks", (weighted,), kern, (d2, w, self.n, nb, f1, f2, hi, lo, vmax), nb)
        return nb, hi.copy_to_host(), lo.copy_to_host(), vmax.copy_to_host()

    def d2_max(self, d2, weights: np.ndarray | None) -> float:
        if not self._on_device(d2):
            return super().d2_max(d2, weights)
        return float(self._fixed_blocks(d2, weights, 0)[3].max())

    def d2_fixed(self, d2, weights: np.ndarray | None, s: int):
        """Exact block totals on the device; a draw refines one block on the host (``exact.BlockFixed``)."""
        if not self._on_device(d2):
            return super().d2_fixed(d2, weights, s)
        nb, hi, lo, _ = self._fixed_blocks(d2, weights, s)
        return BlockFixed(initk.device_values(d2, weights), s, self.n, nb, [limbs_to_int(*p) for p in zip(hi, lo)])

    def potentials(self, d2, cands: np.ndarray, weights: np.ndarray | None, s: int) -> list:
        """All candidates' exact potentials in one pass over the rows on the device."""
        if not self._on_device(d2):
            return super().potentials(d2, cands, weights, s)
        rows = self.rows
        t = len(cands)
        dc = cuda.to_device(np.ascontiguousarray(cands, dtype=np.float64).ravel())
        hi = cuda.to_device(np.zeros(t, dtype=np.int64))
        lo = cuda.to_device(np.zeros(t, dtype=np.int64))
        vmax = cuda.to_device(np.zeros(t, dtype=np.float64))
        f1, f2 = scale_factors(s)
        weighted = weights is not None
        w = rows.dw if weighted else d2
        kern = initk.potentials_kernel(t, weighted)
        grid = 2 if SIM else max(1, min(-(-self.n // initk.NT), 8 * self.limits.sm_count))
        self._kernel("potentials", (t, weighted), kern,
                     (rows.dx, self.n, rows.ld, self.m, dc, d2, w, f1, f2, hi, lo, vmax), grid)
        h, l_, v = hi.copy_to_host(), lo.copy_to_host(), vmax.copy_to_host()
        return [(limbs_to_int(h[j], l_[j]), float(v[j])) for j in range(t)]
