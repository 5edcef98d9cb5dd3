"""A GPU step's buffers: the centre data going up and the outputs coming down, one copy each way.

Both live as long as the step's K (:meth:`.backend.GPUBackend.warmup` makes them in a run's set-up);
each is one pinned host buffer and one device buffer with typed views of both.
"""

from __future__ import annotations

import numpy as np

from ...fixedsums import Scales
from .device import cuda
from .hostk import fill_centres
from .launch import pinned


class StepCentres:
    """A step's centre data: one pinned host buffer, one device buffer, typed views of both."""

    def __init__(self, k: int, m: int, dtype: str, tc: int):
        self.k, self.m = k, m
        ntiles = -(-k // tc)
        parts = [("cm", np.float32, ntiles * m * tc), ("cc", np.float32, ntiles * tc), ("zl", np.float32, 4),
                 ("sh", np.dtype(dtype), m), ("ct", np.float64, m * k), ("f1", np.float64, m + 1),
                 ("f2", np.float64, m + 1)]
        offsets, end = {}, 0
        for name, dt, count in parts:
            end = -(-end // 16) * 16
            offsets[name] = (end, np.dtype(dt), count)
            end += count * np.dtype(dt).itemsize
        self.host = pinned(end, np.uint8)
        self.host[:] = 0
        self.dev = cuda.device_array(end, dtype=np.uint8)
        self.h, self.d = {}, {}
        for name, (off, dt, count) in offsets.items():
            self.h[name] = self.host[off:off + count * dt.itemsize].view(dt)
            self.d[name] = self.dev[off:off + count * dt.itemsize].view(dt)
        self.h["cc"][:] = np.inf  # padding centres are never nearest
        self.cm3 = self.h["cm"].reshape(ntiles, m, tc)
        self.ct2 = self.h["ct"].reshape(m, k)

    def upload(self, centres: np.ndarray, f32: bool, scales: Scales | None = None) -> None:
        """The centres' data (and the sums' scale factors) to the device, in one copy."""
        fill_centres(np.ascontiguousarray(centres, dtype=np.float64), f32, self.h["sh"], self.h["cc"], self.cm3,
                     self.ct2, self.h["zl"])
        if scales is not None:
            self.h["f1"][:] = scales.factors[:, 0]
            self.h["f2"][:] = scales.factors[:, 1]
        self.dev.copy_to_device(self.host)


class StepOutputs:
    """A step's outputs on the device (sums, SSE, counters) and their pinned host mirror."""

    def __init__(self, k: int, m: int, streams: int):
        self.ns, self.nsse = k * (m + 1) * 4, k * 4
        # counters of each stream: rows listed for the recheck, labels changed, rows the bounds could not keep
        self.dev = cuda.device_array(self.ns + self.nsse + 3 * streams, dtype=np.int64)
        self.host = pinned(self.dev.size, np.int64)
        self.sums = self.dev[: self.ns]
        self.sse = self.dev[self.ns:self.ns + self.nsse]
        self.counters = [self.dev[self.ns + self.nsse + 3 * s:self.ns + self.nsse + 3 * s + 3] for s in range(streams)]
        # each stream's counter of the rows listed for the recheck, which every screen starts from zero
        self.listed = [c[:1] for c in self.counters]
        self.after_sums = self.dev[self.ns:]
