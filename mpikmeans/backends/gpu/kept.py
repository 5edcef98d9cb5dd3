"""What an incremental GPU step builds on: the last step's sums, in host buffers reused from step to step.

After a step the backend keeps, in float64, each cluster's deviation sum
``sum w (x - c)`` and count, the total SSE and the centres ``c`` of that step.  An
incremental step carries them over to its new centres on the host while the GPU
works (:func:`.hostk.carry_kept`) and adds what the rows that changed label
moved.  Two sets of buffers per number of centres take turns (a step writes the
one the last step's sums are not in): at K x M = 257,000 the arrays a step made
afresh (the centres' copy, the deviation sums, the carried-over terms) were
3.7 ms of a 12.7 ms step on the H100 host (1.2 ms now), much of it the first
touch of new pages.
"""

from __future__ import annotations

import numpy as np

from .hostk import carry_kept


class Kept:
    """One step's kept sums: ``dev`` (k, m), ``counts`` (k,), ``centres`` (k, m), float64, and ``sse``;
    ``sums`` (k, m), the raw sums that step returned (:func:`.hostk.add_step`'s buffer)."""

    __slots__ = ("dev", "counts", "centres", "sse", "sums")

    def __init__(self, k: int, m: int):
        self.dev = np.zeros((k, m))
        self.counts = np.zeros(k)
        self.centres = np.zeros((k, m))
        self.sse = 0.0
        self.sums = np.zeros((k, m))

    def take(self, centres: np.ndarray) -> None:
        """This slot's centres (k, m): a copy of ``centres``."""
        np.copyto(self.centres, centres, casting="same_kind")

    def carry_from(self, old: "Kept") -> float:
        """This slot's deviation sums and counts: ``old``'s rows about this slot's centres; their SSE."""
        return old.sse + carry_kept(old.dev, old.counts, old.centres, self.centres, self.dev, self.counts)


class KeptSums:
    """The kept sums of the last step (:attr:`last`, None when there are none) and a spare slot."""

    def __init__(self):
        self.last = None
        self._slots = ()

    def fits(self, k: int) -> bool:
        """Whether sums are kept, and for ``k`` centres."""
        return self.last is not None and self.last.counts.shape[0] == k

    def spare(self, k: int, m: int) -> Kept:
        """A slot other than :attr:`last`, for ``k`` centres of ``m`` attributes (the caller copies the
        centres in: :meth:`Kept.take`)."""
        if not self._slots or self._slots[0].dev.shape != (k, m):
            self._slots = (Kept(k, m), Kept(k, m))
        return self._slots[1] if self.last is self._slots[0] else self._slots[0]

    def forget(self) -> None:
        """No sums kept: the next step is a full one."""
        self.last = None
