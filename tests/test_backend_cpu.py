"""Tests for :mod:`mpikmeans.backends.cpu` against a NumPy brute-force reference."""

from __future__ import annotations

import numba
import numpy as np
import pytest

from mpikmeans.backends import Backend, StepResult, make_backend
from mpikmeans import cpus
from mpikmeans.backends.cpu import CPUBackend


def nearest_exact(x, centres):
    """Nearest centre and its squared distance, summed over attributes in order as
    (x - c)**2: the float64 numbers the backend computes.  argmin takes the first
    minimum, so ties go to the lowest centre index.

    Returns labels (n,) int64 and dist2 (n,) float64."""
    n, m = x.shape
    d = np.zeros((n, centres.shape[0]))
    for j in range(m):
        t = x[:, j, None] - centres[None, :, j]
        d = d + t * t
    labels = np.argmin(d, axis=1) if n else np.zeros(0, dtype=np.int64)
    return labels, d[np.arange(n), labels]


def reference(x, centres, weights=None):
    """Brute force.  Distances summed over attributes in order, as (x - c)**2, so
    they are the same float64 numbers the backend computes; argmin takes the
    first minimum, i.e. ties go to the lowest centre index."""
    n, m = x.shape
    k = centres.shape[0]
    labels, dist2 = nearest_exact(x, centres)
    w = np.ones(n) if weights is None else weights
    sums = np.zeros((k, m))
    np.add.at(sums, labels, w[:, None] * x)
    counts = np.bincount(labels, weights=w, minlength=k).astype(np.float64)
    sse = float((w * dist2).sum())
    return labels, dist2, sums, counts, sse


def rel_err(a, b):
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    scale = max(np.abs(b).max(initial=0.0), 1e-300)
    return np.abs(a - b).max(initial=0.0) / scale


def loaded(x, threads=1, weights=None):
    b = CPUBackend(threads=threads)
    b.load(x, weights)
    return b


@pytest.mark.parametrize("n, m, k, seed", [(1000, 5, 7, 0), (333, 1, 1, 1), (2000, 13, 20, 2), (70, 3, 64, 3)])
def test_step_and_assign_match_reference(n, m, k, seed):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, m)) * 3 + rng.integers(-5, 5, size=(n, 1))
    c = x[rng.choice(n, size=min(k, n), replace=False)] + 0.01 * rng.standard_normal((min(k, n), m))
    labels, dist2, sums, counts, sse = reference(x, c)
    b = loaded(x)
    r = b.step(c)
    assert isinstance(r, StepResult)
    assert r.sums.shape == (len(c), m) and r.sums.dtype == np.float64
    assert r.counts.shape == (len(c),) and r.counts.dtype == np.float64
    np.testing.assert_array_equal(r.counts, counts)
    assert rel_err(r.sums, sums) <= 1e-12
    assert abs(r.sse - sse) <= 1e-12 * sse
    assert r.changed == n
    got_labels, got_d = b.assign(c)
    assert got_labels.dtype == np.int32 and got_d.dtype == np.float64
    np.testing.assert_array_equal(got_labels, labels)
    assert got_d.tobytes() == dist2.tobytes()


def test_ties_go_to_the_lowest_index():
    x = np.array([[0.0], [5.0], [-5.0], [2.0]])
    for c in (np.array([[1.0], [-1.0]]), np.array([[-1.0], [1.0]])):
        labels, _ = loaded(x).assign(c)
        assert labels[0] == 0  # exactly between the two centres
    # duplicate centres: the second copy never wins
    rng = np.random.default_rng(5)
    x = rng.standard_normal((500, 3))
    c = rng.standard_normal((4, 3))
    dup = np.vstack([c[:2], c[1:2], c[2:], c[0:1]])  # centres 2 and 5 repeat 1 and 0
    b = loaded(x)
    r = b.step(dup)
    labels, _ = b.assign(dup)
    assert not np.isin(labels, [2, 5]).any()
    assert r.counts[2] == 0 and r.counts[5] == 0
    np.testing.assert_array_equal(labels, reference(x, dup)[0])
    # all centres equal: everything in cluster 0
    labels, _ = loaded(x).assign(np.zeros((3, 3)))
    assert (labels == 0).all()


def test_thread_count_does_not_change_the_result():
    rng = np.random.default_rng(7)
    x = rng.standard_normal((20_000, 6)) * 10
    c = rng.standard_normal((9, 6)) * 5
    out = []
    for threads in (1, 2, 1):
        b = CPUBackend(threads=threads)
        assert numba.get_num_threads() == min(threads, numba.config.NUMBA_NUM_THREADS)
        b.load(x)
        r = b.step(c)
        labels, d = b.assign(c)
        out.append((r.sums.tobytes(), r.counts.tobytes(), r.sse, r.changed, labels.tobytes(), d.tobytes()))
    assert out[0] == out[1] == out[2]


def test_changed_counts():
    rng = np.random.default_rng(8)
    x = rng.standard_normal((400, 2))
    c1 = rng.standard_normal((5, 2))
    c2 = c1 + 0.3 * rng.standard_normal((5, 2))
    l1, l2 = reference(x, c1)[0], reference(x, c2)[0]
    assert (l1 != l2).sum() > 0, "test set-up"
    b = loaded(x)
    assert b.step(c1).changed == 400  # the first step: every row is new
    assert b.step(c1).changed == 0
    b.assign(c2)  # assign does not touch the labels that step keeps
    assert b.step(c1).changed == 0
    assert b.step(c2).changed == int((l1 != l2).sum())
    assert b.step(c2).changed == 0
    b.load(x)  # a new load starts afresh
    assert b.step(c2).changed == 400


def test_zero_rows():
    b = loaded(np.empty((0, 3)))
    r = b.step(np.ones((4, 3)))
    assert r.sums.shape == (4, 3) and not r.sums.any()
    assert r.counts.shape == (4,) and not r.counts.any()
    assert r.sse == 0.0 and r.changed == 0
    labels, d = b.assign(np.ones((4, 3)))
    assert labels.shape == (0,) and d.shape == (0,)
    assert labels.dtype == np.int32


def test_weights():
    rng = np.random.default_rng(9)
    x = rng.standard_normal((800, 4))
    c = rng.standard_normal((6, 4))
    w = rng.uniform(0.1, 3.0, size=800)
    _, _, sums, counts, sse = reference(x, c, w)
    r = loaded(x, weights=w).step(c)
    assert rel_err(r.counts, counts) <= 1e-12
    assert rel_err(r.sums, sums) <= 1e-12
    assert abs(r.sse - sse) <= 1e-12 * sse
    # unit weights are the unweighted result, bit for bit
    r1 = loaded(x, weights=np.ones(800)).step(c)
    r0 = loaded(x).step(c)
    assert (r1.sums.tobytes(), r1.counts.tobytes(), r1.sse) == (r0.sums.tobytes(), r0.counts.tobytes(), r0.sse)
    # integer weights are repeated rows
    wi = rng.integers(1, 4, size=800)
    rep = loaded(np.repeat(x, wi, axis=0)).step(c)
    rw = loaded(x, weights=wi.astype(np.float64)).step(c)
    np.testing.assert_array_equal(rw.counts, rep.counts)
    assert rel_err(rw.sums, rep.sums) <= 1e-12


def test_input_layouts():
    rng = np.random.default_rng(10)
    x = rng.standard_normal((300, 4))
    c = rng.standard_normal((3, 4))
    base = loaded(x).step(c)
    # Fortran-ordered rows or centres are the same numbers: the same result
    for xv, cv in [(np.asfortranarray(x), c), (x, np.asfortranarray(c)), (x[::-1][::-1], c[:, :])]:
        r = loaded(xv).step(cv)
        assert (r.sums.tobytes(), r.counts.tobytes(), r.sse) == (base.sums.tobytes(), base.counts.tobytes(), base.sse)
    # float32 centres are widened to float64
    c32 = c.astype(np.float32)
    labels = reference(x, c32.astype(np.float64))[0]
    np.testing.assert_array_equal(loaded(x).assign(c32)[0], labels)


def test_default_threads_without_a_communicator(monkeypatch):
    # CPUBackend() alone takes what a one-rank run would: this process's CPUs within
    # its quota, lowered by OMP_NUM_THREADS (the runner passes the rank's figure in)
    pool = numba.config.NUMBA_NUM_THREADS
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.delenv("NUMBA_NUM_THREADS", raising=False)
    assert CPUBackend().threads == min(cpus.process_threads(), pool)
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    b = CPUBackend()
    assert b.threads == 1 and b.info().threads == 1 and numba.get_num_threads() == 1
    # an explicit count (--threads) overrides OMP_NUM_THREADS, up to Numba's pool
    assert CPUBackend(threads=2).threads == min(2, pool)
    monkeypatch.delenv("OMP_NUM_THREADS")
    monkeypatch.setattr(cpus, "usable_cpus", lambda: frozenset({0}))  # bound to one core
    assert CPUBackend().threads == 1
    monkeypatch.setattr(cpus, "usable_cpus", lambda: frozenset(range(64)))
    monkeypatch.setattr(cpus, "cgroup_cpu_limit", lambda: 1.0)  # a one-CPU quota
    assert CPUBackend().threads == 1
    monkeypatch.setattr(cpus, "cgroup_cpu_limit", lambda: None)
    assert CPUBackend().threads == pool


def test_threads_option_and_info():
    b = CPUBackend(threads=10_000)
    assert b.threads == numba.config.NUMBA_NUM_THREADS
    info = b.info()
    assert info.name == "cpu" and info.threads == b.threads and info.dtype == "float64"
    assert CPUBackend(threads=1).info().threads == 1


def test_make_backend():
    b = make_backend("cpu", threads=1)
    assert isinstance(b, CPUBackend) and isinstance(b, Backend)
    with pytest.raises(ValueError, match="unknown backend"):
        make_backend("tpu")


# --- the tiled kernel, pinned bit for bit ------------------------------------------------------
#
# The kernel computes distances for a tile of rows and four centres at a time, with the
# attribute loop unrolled by four.  None of that may change a single bit: each distance is
# still the sum of (x[i, j] - c[j])**2 over j in order, ties go to the lowest index, and the
# partial sums follow the fixed row blocks.  The reference below does exactly that with
# NumPy, so every comparison is ``tobytes()`` equality, on shapes chosen to hit every edge
# of the tiling.

def exact_reference(x, centres, weights=None, blocks=None):
    """Bit-for-bit what a step must return, computed plainly.

    Distances: ``d = d + (x[:, j] - c[j])**2`` for j in order (NumPy rounds each
    operation once, no FMA).  Labels: ``argmin``, the first minimum.  Sums, counts and
    SSE: rows added one after another (``np.add.at`` and ``cumsum`` are sequential)
    within each of the backend's row blocks, the blocks' partials then added in block
    order.
    """
    from mpikmeans.backends.cpu import _BLOCKS

    nb = _BLOCKS if blocks is None else blocks
    n, m = x.shape
    k = centres.shape[0]
    labels, dist2 = nearest_exact(x, centres)
    w = np.ones(n) if weights is None else weights
    parts = []
    for b in range(nb):
        lo, hi = n * b // nb, n * (b + 1) // nb
        s = np.zeros((k, m))
        np.add.at(s, labels[lo:hi], w[lo:hi, None] * x[lo:hi])
        cnt = np.zeros(k)
        np.add.at(cnt, labels[lo:hi], w[lo:hi])
        sse = np.cumsum(w[lo:hi] * dist2[lo:hi])[-1] if hi > lo else 0.0
        parts.append((s, cnt, sse))
    sums, counts, sse = parts[0][0].copy(), parts[0][1].copy(), parts[0][2]
    for s, cnt, e in parts[1:]:
        sums += s
        counts += cnt
        sse += e
    return labels, dist2, sums, counts, float(sse)


def assert_exact(x, c, weights=None, threads=1):
    labels, dist2, sums, counts, sse = exact_reference(x, c, weights)
    b = loaded(x, threads=threads, weights=weights)
    r = b.step(c)
    assert r.sums.tobytes() == sums.tobytes()
    assert r.counts.tobytes() == counts.tobytes()
    assert np.float64(r.sse).tobytes() == np.float64(sse).tobytes()
    assert r.changed == x.shape[0]
    np.testing.assert_array_equal(b._labels, labels)
    got_labels, got_d = b.assign(c)
    np.testing.assert_array_equal(got_labels, labels)
    assert got_d.tobytes() == dist2.tobytes()
    return labels


@pytest.mark.parametrize("n, m, k", [
    (1, 1, 1), (5, 1, 1), (7, 1, 3), (200, 1, 1), (63, 2, 2),  # m = 1, k = 1, n below one tile
    (64, 3, 4), (65, 4, 5), (129, 5, 6), (500, 7, 7),          # n just around a tile; k % 4 = 0..3
    (6437, 9, 13), (5000, 16, 8), (3000, 31, 33),              # several tiles per row block, ragged
    (777, 100, 50), (300, 129, 9), (257, 200, 3),              # wide rows: the 32-row tile
    (40, 6, 100),                                              # more centres than rows
])
def test_tiled_kernel_is_bit_identical_to_the_plain_sum(n, m, k):
    rng = np.random.default_rng(1000 * m + k)
    x = rng.standard_normal((n, m)) * rng.uniform(0.1, 100, size=m) + rng.integers(-3, 3, size=(n, 1))
    c = rng.standard_normal((k, m)) * (x.std(axis=0) + 1.0) + x.mean(axis=0)
    assert_exact(x, c)
    assert_exact(x, c, weights=rng.uniform(0.1, 5.0, size=n))


@pytest.mark.parametrize("threads", [1, 2])
def test_one_backend_steps_through_changing_k_with_exact_sums(threads):
    # the backend keeps its per-block partials between steps: each K x M must still get
    # buffers of its own shape, and the parallel block reduction (several chunks of the
    # flattened sums at K x M = 5200) must add the blocks in order
    rng = np.random.default_rng(31)
    x = rng.standard_normal((3000, 40)) * 4
    b = loaded(x, threads=threads)
    for k in (50, 130, 50, 7, 130):
        c = x[rng.choice(len(x), k, replace=False)] + 0.01
        labels, _, sums, counts, sse = exact_reference(x, c)
        r = b.step(c)
        assert r.sums.tobytes() == sums.tobytes() and r.counts.tobytes() == counts.tobytes()
        assert np.float64(r.sse).tobytes() == np.float64(sse).tobytes()
        np.testing.assert_array_equal(b._labels, labels)
        r.sums[:] = np.nan  # what a step returns is the caller's: the next step must not see it


def test_tiled_kernel_ties_go_to_the_lowest_index_in_every_group_position():
    # duplicate centres in every position of a group of four and across group boundaries:
    # the first copy always wins, with the same distance
    rng = np.random.default_rng(11)
    x = rng.standard_normal((1000, 5))
    base = rng.standard_normal((6, 5))
    order = [0, 1, 1, 2, 3, 0, 4, 4, 4, 5, 2, 3, 5, 1]  # 14 centres: 4 + 4 + 4 + 2
    dup = base[order]
    labels = assert_exact(x, dup)
    first = {}
    for idx, src in enumerate(order):
        first.setdefault(src, idx)
    assert set(np.unique(labels)) <= set(first.values())
    # all centres equal: every row goes to centre 0
    assert (assert_exact(x, np.repeat(base[:1], 9, axis=0)) == 0).all()


def test_tiled_kernel_exact_ties_between_distinct_centres():
    # integer data, centres symmetric about the rows: many distances are exactly equal
    rng = np.random.default_rng(12)
    x = rng.integers(-4, 5, size=(3000, 3)).astype(np.float64)
    c = np.array([[1.0, 0, 0], [-1.0, 0, 0], [0, 1.0, 0], [0, -1.0, 0], [0, 0, 1.0], [0, 0, -1.0], [0, 0, 0]])
    d = ((x[:, None, :] - c[None]) ** 2).sum(axis=2)  # small integers: exact
    nearest = d == d.min(axis=1, keepdims=True)
    assert (nearest.sum(axis=1) > 1).sum() > 100, "test set-up: many rows have several nearest centres"
    labels = assert_exact(x, c)
    np.testing.assert_array_equal(labels, nearest.argmax(axis=1))  # the first of them
    assert_exact(x, c[::-1].copy())


def test_tiled_kernel_thread_count_and_ragged_blocks():
    # rows not a multiple of the blocks or the tiles; the result must not depend on threads
    rng = np.random.default_rng(13)
    x = rng.standard_normal((64 * 97 + 13, 11)) * 4
    c = rng.standard_normal((10, 11)) * 3
    w = rng.uniform(0.5, 2.0, size=len(x))
    assert_exact(x, c, weights=w, threads=1)
    assert_exact(x, c, weights=w, threads=2)


@pytest.mark.parametrize("weighted", [False, True])
def test_label_sums_are_the_step_sums_for_any_threads(weighted):
    """label_sums (the centres at a fixed point, recomputed in a fixed order) is the step's summation."""
    import numba

    from mpikmeans.backends.cpu import label_sums

    rng = np.random.default_rng(5)
    x = rng.normal(size=(5000, 7)) * 100
    c = x[:6].copy()
    w = rng.uniform(0.5, 2.0, len(x)) if weighted else None
    b = CPUBackend(threads=2)
    b.load(x, w)
    step = b.step(c)
    labels, _ = b.assign(c)
    got = []
    for threads in (1, 2):
        numba.set_num_threads(threads)
        got.append(label_sums(x, labels, 6, w))
    for sums, counts in got:
        assert sums.tobytes() == step.sums.tobytes() and counts.tobytes() == step.counts.tobytes()


def test_seeding_distances_are_released_by_the_first_step_and_lower_d2_stays_exact():
    rng = np.random.default_rng(5)
    x = rng.standard_normal((2000, 7))
    b = loaded(x, threads=2)
    d2 = b.dist2_to(x[0])
    cands = x[[3, 70, 900]]
    b.potentials(d2, cands, None, 0)
    expected = np.minimum(d2, nearest_exact(x, cands[1:2])[1])
    assert b.lower_d2(d2, cands[1]).tobytes() == expected.tobytes()  # from the kept distances
    b.step(x[:4])
    assert b._cand_dists is None  # t x n float64 not held through the iterations
    assert b.lower_d2(d2, cands[1]).tobytes() == expected.tobytes()  # computed again, same bits


@pytest.mark.parametrize("k,m", [(8, 16), (70, 64)])  # one thread's reduction, and chunks on the threads
def test_block_reduction_adds_the_blocks_in_order_on_one_thread_or_many(k, m):
    """The step's partials reduced in block order, ``((p0 + p1) + p2) + ...``, whichever form runs:
    the serial one up to ``REDUCE_CHUNK`` elements, the parallel one past it, the same bits."""
    from mpikmeans.backends.cpu import partials as T

    rng = np.random.default_rng(17)
    nb = 13
    # magnitudes far apart, so that any other order of the additions shows in the bits
    ps = rng.normal(size=(nb, k, m)) * 10.0 ** rng.integers(-8, 9, size=(nb, 1, 1))
    pc = rng.integers(0, 50, size=(nb, k)).astype(np.float64)
    pse = rng.uniform(0, 1e6, nb)
    pch = rng.integers(0, 100, nb)
    want = ps[0].copy()
    for b in range(1, nb):
        want = want + ps[b]
    assert (k * m > T.REDUCE_CHUNK) == (m == 64)
    for reduce in (T.reduce_blocks, T.reduce_serial, T.reduce_parallel):
        sums, counts, sse, changed = reduce(ps, pc, pse, pch)
        assert sums.tobytes() == want.tobytes()
        assert counts.tobytes() == pc.sum(axis=0).tobytes() and changed == pch.sum()
        total = pse[0]
        for v in pse[1:]:
            total += v
        assert sse == total
