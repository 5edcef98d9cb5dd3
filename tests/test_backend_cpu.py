"""Tests for :mod:`mpikmeans.backends.cpu` against a NumPy brute-force reference: labels and
distances bit for bit, the step's sums and SSE the fixed-point limbs of those labels, limb for limb."""

from __future__ import annotations

import numba
import numpy as np
import pytest

from mpikmeans import cpus
from mpikmeans.backends import Backend, StepResult, farthest_rows, make_backend
from mpikmeans.backends.cpu import CPUBackend
from mpikmeans.fixedsums import LIMB, LIMB_MASK, VBITS, Scales, decode, scale_factors


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


def scales_of(x, weights=None):
    """The run's scales for these rows (one rank's rows are all the rows here)."""
    return Scales.of(np.abs(x).max(axis=0, initial=0.0), 1.0 if weights is None else float(weights.max()))


def encoded_limbs(values, f1, f2):
    """Each value's four limbs, ``values`` (..., c) at factors ``f1``, ``f2`` (c,): the encoding of
    :mod:`mpikmeans.fixedsums` written again with NumPy (``t = v f1 f2``, ``h = floor(t)``,
    ``l = floor((t - h) 2**VBITS)``), shape (..., c, 4)."""
    t = values * f1 * f2
    h = np.floor(t)
    lo = np.floor((t - h) * float(1 << VBITS))
    h, lo = h.astype(np.int64), lo.astype(np.int64)
    return np.stack([h >> LIMB, h & LIMB_MASK, lo >> LIMB, lo & LIMB_MASK], axis=-1)


def limbs_of_labels(x, labels, k, scales, weights=None):
    """The step's sums for these labels, brute force: every row's limbs of ``w x_j`` and ``w``, added
    to its cluster (k, m + 1, 4)."""
    n, m = x.shape
    vals = np.hstack([x, np.ones((n, 1))])
    if weights is not None:
        vals = weights[:, None] * vals
    out = np.zeros((k, m + 1, 4), dtype=np.int64)
    np.add.at(out, labels, encoded_limbs(vals, scales.factors[:, 0], scales.factors[:, 1]))
    return out


def sse_limbs(labels, dist2, k, exponent, weights=None):
    """Per cluster, the limbs of ``sum(w d²)`` at ``exponent`` (k, 4), brute force."""
    v = dist2 if weights is None else weights * dist2
    f1, f2 = scale_factors(exponent)
    out = np.zeros((k, 4), dtype=np.int64)
    np.add.at(out, labels, encoded_limbs(v[:, None], np.array([f1]), np.array([f2]))[:, 0])
    return out


def reference(x, centres, weights=None, scales=None):
    """Brute force: labels, distances, the sums' and the SSE's limbs, and plain float64 sums, counts and SSE."""
    n, m = x.shape
    k = centres.shape[0]
    scales = scales or scales_of(x, weights)
    labels, dist2 = nearest_exact(x, centres)
    w = np.ones(n) if weights is None else weights
    sums = np.zeros((k, m))
    np.add.at(sums, labels, w[:, None] * x)
    counts = np.bincount(labels, weights=w, minlength=k).astype(np.float64)
    sse = float((w * dist2).sum())
    limbs = limbs_of_labels(x, labels, k, scales, weights)
    sse_l = sse_limbs(labels, dist2, k, scales.sse_exponent(centres), weights)
    return labels, dist2, sums, counts, sse, limbs, sse_l


def rel_err(a, b):
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    scale = max(np.abs(b).max(initial=0.0), 1e-300)
    return np.abs(a - b).max(initial=0.0) / scale


def loaded(x, threads=1, weights=None):
    b = CPUBackend(threads=threads)
    b.load(x, weights)
    return b


def decoded(r, scales, centres):
    """A step's sums (k, m), counts (k,) and SSE, decoded."""
    values = decode(r.sums, scales.columns)
    return values[:, :-1], values[:, -1], float(decode(r.sse.sum(axis=0), scales.sse_exponent(centres)))


@pytest.mark.parametrize("n, m, k, seed", [(1000, 5, 7, 0), (333, 1, 1, 1), (2000, 13, 20, 2), (70, 3, 64, 3)])
def test_step_and_assign_match_reference(n, m, k, seed):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, m)) * 3 + rng.integers(-5, 5, size=(n, 1))
    c = x[rng.choice(n, size=min(k, n), replace=False)] + 0.01 * rng.standard_normal((min(k, n), m))
    sc = scales_of(x)
    labels, dist2, sums, counts, sse, limbs, sse_l = reference(x, c, scales=sc)
    b = loaded(x)
    r = b.step(c, sc)
    assert isinstance(r, StepResult)
    assert r.sums.shape == (len(c), m + 1, 4) and r.sums.dtype == np.int64
    assert r.sse.shape == (len(c), 4) and r.sse.dtype == np.int64
    assert r.sums.tobytes() == limbs.tobytes() and r.sse.tobytes() == sse_l.tobytes()
    got_sums, got_counts, got_sse = decoded(r, sc, c)
    np.testing.assert_array_equal(got_counts, counts)
    assert rel_err(got_sums, sums) <= 1e-12
    assert abs(got_sse - sse) <= 1e-12 * sse
    assert r.changed == n and r.searched == n
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
    r = b.step(dup, scales_of(x))
    labels, _ = b.assign(dup)
    assert not np.isin(labels, [2, 5]).any()
    assert not r.sums[[2, 5]].any() and not r.sse[[2, 5]].any()  # no rows: no counts, sums or SSE
    np.testing.assert_array_equal(labels, reference(x, dup)[0])
    # all centres equal: everything in cluster 0
    labels, _ = loaded(x).assign(np.zeros((3, 3)))
    assert (labels == 0).all()


def test_thread_count_does_not_change_the_result():
    rng = np.random.default_rng(7)
    x = rng.standard_normal((20_000, 6)) * 10
    c = rng.standard_normal((9, 6)) * 5
    sc = scales_of(x)
    out = []
    for threads in (1, 2, 1):
        b = CPUBackend(threads=threads)
        assert numba.get_num_threads() == min(threads, numba.config.NUMBA_NUM_THREADS)
        b.load(x)
        r = b.step(c, sc)
        labels, d = b.assign(c)
        out.append((r.sums.tobytes(), r.sse.tobytes(), r.changed, labels.tobytes(), d.tobytes()))
    assert out[0] == out[1] == out[2]


def test_changed_counts():
    rng = np.random.default_rng(8)
    x = rng.standard_normal((400, 2))
    c1 = rng.standard_normal((5, 2))
    c2 = c1 + 0.3 * rng.standard_normal((5, 2))
    l1, l2 = reference(x, c1)[0], reference(x, c2)[0]
    assert (l1 != l2).sum() > 0, "test set-up"
    sc = scales_of(x)
    b = loaded(x)
    assert b.step(c1, sc).changed == 400  # the first step: every row is new
    assert b.step(c1, sc).changed == 0
    b.assign(c2)  # assign does not touch the labels that step keeps
    assert b.step(c1, sc).changed == 0
    assert b.step(c2, sc).changed == int((l1 != l2).sum())
    assert b.step(c2, sc).changed == 0
    b.load(x)  # a new load starts afresh
    assert b.step(c2, sc).changed == 400
    b.forget_labels()  # as after dropped clusters: every row counts as changed again
    assert b.step(c2, sc).changed == 400


def test_zero_rows():
    b = loaded(np.empty((0, 3)))
    assert b.magnitudes().tolist() == [0.0, 0.0, 0.0]
    r = b.step(np.ones((4, 3)), Scales.of(np.zeros(3)))
    assert r.sums.shape == (4, 4, 4) and not r.sums.any()
    assert r.sse.shape == (4, 4) and not r.sse.any()
    assert r.changed == 0 and r.searched == 0
    labels, d = b.assign(np.ones((4, 3)))
    assert labels.shape == (0,) and d.shape == (0,)
    assert labels.dtype == np.int32
    dist2, rows, lab = b.farthest(np.ones((4, 3)), 2)
    assert len(dist2) == len(rows) == len(lab) == 0


def test_weights():
    rng = np.random.default_rng(9)
    x = rng.standard_normal((800, 4))
    c = rng.standard_normal((6, 4))
    w = rng.uniform(0.1, 3.0, size=800)
    sc = scales_of(x, w)
    _, _, sums, counts, sse, limbs, sse_l = reference(x, c, w, scales=sc)
    r = loaded(x, weights=w).step(c, sc)
    assert r.sums.tobytes() == limbs.tobytes() and r.sse.tobytes() == sse_l.tobytes()
    got_sums, got_counts, got_sse = decoded(r, sc, c)
    assert rel_err(got_counts, counts) <= 1e-12
    assert rel_err(got_sums, sums) <= 1e-12
    assert abs(got_sse - sse) <= 1e-12 * sse
    # unit weights are the unweighted result, bit for bit
    sc1 = scales_of(x)
    r1 = loaded(x, weights=np.ones(800)).step(c, sc1)
    r0 = loaded(x).step(c, sc1)
    assert (r1.sums.tobytes(), r1.sse.tobytes()) == (r0.sums.tobytes(), r0.sse.tobytes())
    # integer weights are repeated rows (at scales of their own: the values compare, not the limbs)
    wi = rng.integers(1, 4, size=800)
    xr = np.repeat(x, wi, axis=0)
    rep = loaded(xr).step(c, scales_of(xr))
    scw = scales_of(x, wi.astype(np.float64))
    rw = loaded(x, weights=wi.astype(np.float64)).step(c, scw)
    rep_sums, rep_counts, rep_sse = decoded(rep, scales_of(xr), c)
    w_sums, w_counts, w_sse = decoded(rw, scw, c)
    np.testing.assert_array_equal(w_counts, rep_counts)
    assert rel_err(w_sums, rep_sums) <= 1e-12
    assert abs(w_sse - rep_sse) <= 1e-12 * rep_sse


def test_input_layouts():
    rng = np.random.default_rng(10)
    x = rng.standard_normal((300, 4))
    c = rng.standard_normal((3, 4))
    sc = scales_of(x)
    base = loaded(x).step(c, sc)
    # Fortran-ordered rows or centres are the same numbers: the same result
    for xv, cv in [(np.asfortranarray(x), c), (x, np.asfortranarray(c)), (x[::-1][::-1], c[:, :])]:
        r = loaded(xv).step(cv, sc)
        assert (r.sums.tobytes(), r.sse.tobytes()) == (base.sums.tobytes(), base.sse.tobytes())
    # float32 centres are widened to float64
    c32 = c.astype(np.float32)
    labels = reference(x, c32.astype(np.float64))[0]
    np.testing.assert_array_equal(loaded(x).assign(c32)[0], labels)


def test_magnitudes_are_the_rows_or_the_given_bound():
    rng = np.random.default_rng(14)
    x = rng.standard_normal((500, 3)) * np.array([1.0, 1e-5, 1e5])
    assert loaded(x).magnitudes().tobytes() == np.abs(x).max(axis=0).tobytes()
    b = CPUBackend(threads=1)
    b.load(x, magnitudes=np.array([2.0, 1.0, 1e6]))  # a global bound, as the runner passes
    assert b.magnitudes().tolist() == [2.0, 1.0, 1e6]


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
# still the sum of (x[i, j] - c[j])**2 over j in order, and ties go to the lowest index.  The
# sums are integers added after the labels: the limbs of the reference labels, limb for limb.
# So every comparison is ``tobytes()`` equality, on shapes chosen to hit every edge of the tiling.

def assert_exact(x, c, weights=None, threads=1):
    sc = scales_of(x, weights)
    labels, dist2, _, _, _, limbs, sse_l = reference(x, c, weights, scales=sc)
    b = loaded(x, threads=threads, weights=weights)
    r = b.step(c, sc)
    assert r.sums.tobytes() == limbs.tobytes()
    assert r.sse.tobytes() == sse_l.tobytes()
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
    # the backend keeps its sums between steps and moves only the rows whose label changed:
    # a new K, new scales or most rows changing start them again; every step's sums are still
    # the limbs of its labels
    rng = np.random.default_rng(31)
    x = rng.standard_normal((3000, 40)) * 4
    sc = scales_of(x)
    wide = Scales.of(sc.magnitudes * 8.0)  # other scales: the kept sums are at the old ones
    b = loaded(x, threads=threads)
    previous = None
    full = []
    for k, scales, nudge in ((50, sc, 0), (50, sc, 1e-2), (130, sc, 0), (130, sc, 1e-2), (130, wide, 1e-2),
                             (50, sc, 0), (7, sc, 0), (7, sc, 1e-3), (130, sc, 0)):
        if nudge and previous is not None and len(previous) == k:
            c = previous + nudge * rng.standard_normal(previous.shape)
        else:
            c = x[rng.choice(len(x), k, replace=False)] + 0.01
        labels, dist2, _, _, _, limbs, sse_l = reference(x, c, scales=scales)
        r = b.step(c, scales)
        assert r.sums.tobytes() == limbs.tobytes(), (k, nudge)
        assert r.sse.tobytes() == sse_l.tobytes()
        np.testing.assert_array_equal(b._labels, labels)
        full.append(b.full_sums)
        previous = c
    # the moves of few rows took the changed rows only; a new K or new scales all of them
    assert full == [True, False, True, False, True, True, True, False, True]


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


def test_seeding_distances_are_released_by_the_first_step_and_lower_d2_stays_exact():
    rng = np.random.default_rng(5)
    x = rng.standard_normal((2000, 7))
    b = loaded(x, threads=2)
    d2 = b.dist2_to(x[0])
    cands = x[[3, 70, 900]]
    b.potentials(d2, cands, None, 0)
    expected = np.minimum(d2, nearest_exact(x, cands[1:2])[1])
    assert b.lower_d2(d2, cands[1]).tobytes() == expected.tobytes()  # from the kept distances
    b.step(x[:4], scales_of(x))
    assert b._cand_dists is None  # t x n float64 not held through the iterations
    assert b.lower_d2(d2, cands[1]).tobytes() == expected.tobytes()  # computed again, same bits


# --- the empty clusters' candidates --------------------------------------------------------------

def test_farthest_rows_ties_to_the_lower_index():
    d = np.array([1.0, 5.0, 3.0, 5.0, 0.0, 5.0, 2.0])
    assert farthest_rows(d, 2).tolist() == [1, 3]
    assert farthest_rows(d, 4).tolist() == [1, 3, 5, 2]
    assert farthest_rows(d, 10).tolist() == [1, 3, 5, 2, 6, 0, 4]
    assert farthest_rows(d, 0).tolist() == [] and farthest_rows(d[:0], 3).tolist() == []
    rng = np.random.default_rng(15)
    d = rng.integers(0, 20, 5000).astype(np.float64)  # many ties
    for count in (1, 7, 300, 5000):
        want = sorted(range(len(d)), key=lambda i: (-d[i], i))[:count]
        assert farthest_rows(d, count).tolist() == want


def test_farthest_answers_from_the_last_step_as_from_a_new_assignment():
    rng = np.random.default_rng(16)
    x = rng.standard_normal((3000, 4))
    c = rng.standard_normal((6, 4))
    b = loaded(x, threads=2)
    b.step(c, scales_of(x))
    labels, dist2 = nearest_exact(x, c)
    want = sorted(range(len(x)), key=lambda i: (-dist2[i], i))[:5]
    for centres in (c, c + 0.5):  # the last step's centres, then others (a new assignment)
        if centres is not c:
            labels, dist2 = nearest_exact(x, centres)
            want = sorted(range(len(x)), key=lambda i: (-dist2[i], i))[:5]
        d, rows, lab = b.farthest(centres, 5)
        assert rows.tolist() == want
        assert d.tobytes() == dist2[want].tobytes() and lab.tolist() == labels[want].tolist()
