"""Synthetic input: Gaussian blobs around K random centres, written as ARFF.

The file depends only on (n, m, k, seed, spread, decimals), never on the number
of ranks that write it: rows are generated in fixed blocks of ``BLOCK_ROWS``,
each from its own random stream keyed by (seed, block index), and each rank
formats and writes its slice at offsets from an exchange of byte counts.

Values are written in fixed point with ``decimals`` digits after the point.
The data set *is* that text: parsing a value gives the float64 nearest to the
decimal written, and formatting that float64 again gives back the same text,
so the file round-trips through float64 exactly.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .arff import header_text
from .output import write_parallel
from .textfmt import format_fixed

#: Rows per random stream.  Part of the file format: changing it changes files.
BLOCK_ROWS = 1 << 16

#: Centres are drawn uniformly in [-CENTRE_BOX, CENTRE_BOX] per attribute.
CENTRE_BOX = 10.0


@dataclass
class GenSpec:
    """What to generate."""

    n: int
    m: int
    k: int
    seed: int = 0
    spread: float = 1.0
    decimals: int = 10
    relation: str = "mpikmeans-blobs"

    def validate(self) -> None:
        """Raise ValueError for settings that cannot make a file."""
        if self.n < 1 or self.m < 1 or self.k < 1:
            raise ValueError("n, m and k must be at least 1")
        if not np.isfinite(self.spread) or self.spread < 0:
            raise ValueError("spread must be a finite number >= 0")
        if not 0 <= self.decimals <= 14:
            raise ValueError("decimals must be in [0, 14]")
        # the largest |value| must stay an exact integer count of ticks in float64
        bound = (CENTRE_BOX + 40 * self.spread) * 10.0 ** self.decimals
        if bound >= 2.0**53:
            raise ValueError(
                f"spread {self.spread} with {self.decimals} decimals exceeds float64's exact range; "
                "lower --decimals or --spread"
            )


def blob_centres(spec: GenSpec) -> np.ndarray:
    """The true centres of the blobs.

    Returns
    -------
    ndarray, shape (k, m), float64
    """
    rng = np.random.default_rng([spec.seed, 0])
    return rng.uniform(-CENTRE_BOX, CENTRE_BOX, size=(spec.k, spec.m))


def generate_block(spec: GenSpec, block: int, centres: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Rows of one block as fixed-point ticks, and their true blob.

    Returns
    -------
    ticks : ndarray, shape (rows, m), int64
        Values times ``10**decimals``.
    blob : ndarray, shape (rows,), int64
    """
    lo = block * BLOCK_ROWS
    rows = min(BLOCK_ROWS, spec.n - lo)
    rng = np.random.default_rng([spec.seed, 1, block])
    blob = rng.integers(0, spec.k, size=rows)
    x = centres[blob] + spec.spread * rng.standard_normal((rows, spec.m))
    return np.rint(x * 10.0**spec.decimals).astype(np.int64), blob


def rows_of_rank(n: int, rank: int, size: int) -> tuple[int, int]:
    """The rows ``[lo, hi)`` rank ``rank`` of ``size`` generates."""
    return n * rank // size, n * (rank + 1) // size


def local_rows_text(spec: GenSpec, lo: int, hi: int) -> list:
    """The ARFF text of rows ``[lo, hi)``, in pieces of at most one block.

    Returns
    -------
    list of ndarray of uint8
    """
    centres = blob_centres(spec)
    pieces = []
    for block in range(lo // BLOCK_ROWS, (hi - 1) // BLOCK_ROWS + 1 if hi > lo else lo // BLOCK_ROWS):
        ticks, _ = generate_block(spec, block, centres)
        b0 = block * BLOCK_ROWS
        part = ticks[max(lo, b0) - b0 : min(hi, b0 + len(ticks)) - b0]
        pieces.append(format_fixed(part, spec.decimals))
    return pieces


def write_blobs(spec: GenSpec, path: str, comm) -> int:
    """Generate and write the data set, every rank its own slice (collective).

    Returns
    -------
    int
        Bytes written.
    """
    spec.validate()
    lo, hi = rows_of_rank(spec.n, comm.rank, comm.size)
    pieces = local_rows_text(spec, lo, hi)
    names = [f"X{j + 1}" for j in range(spec.m)]
    head = header_text(spec.relation, names) if comm.rank == 0 else b""
    return write_parallel(comm, path, head, pieces)
