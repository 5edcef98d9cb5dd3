"""Tests for :mod:`mpikmeans.backends.cpu.certified`: the float32-screened search gives the exact
kernels' labels and distances, bit for bit, and so the same step."""

import numpy as np
import pytest

from mpikmeans.backends.cpu import CPUBackend
from mpikmeans.backends.cpu import certified as C
from mpikmeans.backends.cpu import tiles as T
from mpikmeans.backends.cpu.bounds import assign_pass, step_pass
from mpikmeans.fixedsums import Scales

#: row blocks of the passes here (the backend's STEP_BLOCKS)
NB = 64


def _plan(cen, screen):
    """The search plan of :func:`mpikmeans.backends.cpu.backend.search_plan`, screened or exact, whatever
    the shape."""
    k, m = cen.shape
    if screen:
        return (True, *C.centre_data(cen))
    return (False, np.zeros(m), np.zeros((k, m), np.float32), np.zeros(k, np.float32), np.float32(0),
            np.float32(0))


def _both_steps(x, cen, tile=None):
    """(exact plan's labels, distances and changed; the screened plan's; rows the screen rechecked) of one
    step from no labels and no bounds."""
    n, m = x.shape
    k = len(cen)
    tile = tile or T._tile_rows(m)
    outs = []
    for screen in (False, True):
        old = np.full(n, -1, np.int32)
        lab, d2 = np.full(n, -7, np.int32), np.full(n, np.nan)
        changed, searched, rechecked = (np.zeros(NB, np.int64) for _ in range(3))
        step_pass(x, cen, _plan(cen, screen), tile, old, np.zeros(n), False, np.zeros(k), np.zeros(k), lab, d2,
                  changed, searched, rechecked)
        assert searched.sum() == n and changed.sum() == n and (old == -1).all()
        assert screen or rechecked.sum() == 0
        outs.append((lab, d2, int(changed.sum())))
    return outs[0], outs[1], int(rechecked.sum())


def _assert_same(a, b):
    for u, v in zip(a, b):
        assert np.asarray(u).tobytes() == np.asarray(v).tobytes(), "certified step differs from the exact kernels"


def _both_assigns(x, cen):
    n, m = x.shape
    out = []
    none = np.full(n, -1, np.int32)
    for screen in (False, True):
        lab, d = np.empty(n, np.int32), np.empty(n)
        assign_pass(x, cen, _plan(cen, screen), T._tile_rows(m), none, np.zeros(n), False, np.zeros(len(cen)),
                    np.zeros(len(cen)), lab, d)
        out.append((lab, d))
    return out


@pytest.mark.parametrize("n,m,k,offset", [(3000, 7, 3, 0.0), (2500, 16, 8, 0.0), (1000, 5, 1, 0.0),
                                          (2000, 33, 13, 1e4), (2000, 9, 11, 1e5), (800, 3, 50, 0.0),
                                          (1500, 130, 6, 0.0), (777, 257, 9, 1e3)])
def test_step_equals_exact_kernels(n, m, k, offset):
    rng = np.random.default_rng(n + m + k)
    x = rng.normal(size=(n, m)) + offset
    cen = x[rng.choice(n, k, replace=False)].copy()
    exact, cert, _ = _both_steps(x, cen)
    _assert_same(exact, cert)
    (la, da), (lb, db) = _both_assigns(x, cen)
    assert np.array_equal(la, lb) and da.tobytes() == db.tobytes()
    assert la.tobytes() == exact[0].tobytes() and da.tobytes() == exact[1].tobytes()


def test_ties_are_rechecked_and_go_to_the_lowest_index():
    # integer data and two identical centres: many exact ties, which float32 cannot certify
    rng = np.random.default_rng(1)
    x = rng.integers(0, 3, size=(2000, 4)).astype(float)
    cen = np.array([[1, 1, 1, 1], [1, 1, 1, 1], [0, 1, 2, 1], [2, 2, 0, 0.0]])
    exact, cert, rechecked = _both_steps(x, cen)
    _assert_same(exact, cert)
    assert rechecked > 0
    assert not (cert[0] == 1).any(), "a tie went to the higher of two equal centres"


def test_well_separated_rows_need_no_recheck():
    rng = np.random.default_rng(2)
    true = rng.normal(size=(5, 6)) * 100
    x = true[rng.integers(0, 5, 4000)] + rng.normal(size=(4000, 6))
    exact, cert, rechecked = _both_steps(x, true.copy())
    _assert_same(exact, cert)
    assert rechecked == 0


@pytest.mark.parametrize("scale", [1e-30, 1e18, 1e25])
def test_extreme_magnitudes(scale):
    # 1e18^2 overflows float32 (the exact path); 1e-30 underflows it (near-zero gaps: rechecked)
    rng = np.random.default_rng(3)
    x = rng.normal(size=(1200, 5)) * scale
    cen = x[:7].copy()
    exact, cert, _ = _both_steps(x, cen)
    _assert_same(exact, cert)


def test_near_ties_at_a_large_offset():
    # rows halfway between two centres far from the origin: float32 alone would misorder them
    rng = np.random.default_rng(4)
    base = np.full(8, 1e6)
    cen = np.stack([base, base + 1e-3, base + 2e-3])
    x = base + 5e-4 + rng.normal(size=(3000, 8)) * 1e-9
    exact, cert, rechecked = _both_steps(x, cen)
    _assert_same(exact, cert)
    assert rechecked > 0


@pytest.mark.parametrize("tile", [32, 64])
def test_any_tile_and_odd_row_counts(tile):
    rng = np.random.default_rng(5)
    x = rng.normal(size=(1001, 12))
    exact, cert, _ = _both_steps(x, x[:5].copy(), tile=tile)
    _assert_same(exact, cert)


def test_many_small_tiles_per_block():
    # 20,011 rows in 64 blocks of ~313, tiles of 8: ~40 tiles per block, the last one short
    rng = np.random.default_rng(9)
    x = rng.normal(size=(20011, 3)) * 1e3 + rng.normal(size=(20011, 1)) * 1e-3
    exact, cert, _ = _both_steps(x, x[:7].copy(), tile=8)
    _assert_same(exact, cert)


def test_backend_threads_do_not_change_bits():
    rng = np.random.default_rng(6)
    x = rng.normal(size=(5000, 20))
    cen = x[:10].copy()
    sc = Scales.of(np.abs(x).max(axis=0))
    results = []
    for threads in (1, 2):
        b = CPUBackend(threads=threads)
        b.load(x)
        r = b.step(cen, sc)
        labels, d2 = b.assign(cen)
        results.append((r.sums.tobytes(), r.sse.tobytes(), r.changed, labels.tobytes(), d2.tobytes()))
    assert results[0] == results[1]


def test_centre_data():
    cen = np.arange(15.0).reshape(5, 3)
    shift, zt, cc, zlim, tolf = C.centre_data(cen)
    assert zt.shape == (5, 3) and zt.dtype == np.float32 and cc.shape == (5,) and cc.dtype == np.float32
    assert np.array_equal(zt, (-2 * (cen - shift)).astype(np.float32))
    assert np.allclose(cc, ((cen - shift) ** 2).sum(axis=1))
    assert np.allclose(shift, cen.mean(axis=0))
    assert zlim > 0 and 0 < tolf < 1e-5
    _, _, _, zlim, _ = C.centre_data(np.array([[np.inf, 0.0]]))
    assert np.isinf(zlim)


@pytest.mark.parametrize("k,m", [(1, 1), (8, 16), (50, 100), (1000, 257), (100000, 3)])
def test_screen_rows_keep_a_tile_in_l2(k, m):
    rows = C.screen_rows(k, m)
    assert C._MIN_ROWS <= rows <= 512 and rows % 16 == 0
    assert rows == C._MIN_ROWS or 4 * rows * (k + m) <= C._TILE_BYTES


def test_blas_runs_on_the_calling_thread_inside_the_step_only():
    # a program's own BLAS threads are its business outside the step
    from threadpoolctl import threadpool_info

    from mpikmeans.backends.cpu.blas import one_thread

    def blas_threads():
        return [i["num_threads"] for i in threadpool_info() if i["user_api"] == "blas"]

    import scipy.linalg.cython_blas  # noqa: F401 - the library the screen calls, loaded as the step loads it

    before = blas_threads()
    with one_thread():
        inside = blas_threads()
    assert inside and set(inside) == {1}
    assert blas_threads() == before


@pytest.mark.parametrize("k,m,screen", [(1, 1, False), (7, 3, False), (8, 16, False), (4, 64, False), (8, 32, False),
                                        (8, 64, True), (12, 24, True), (16, 16, True), (64, 4, True),
                                        (50, 100, True), (1000, 257, True)])
def test_the_step_screens_where_it_is_the_faster(k, m, screen):
    from mpikmeans.backends.cpu.backend import screened

    assert screened(k, m) == screen


@pytest.mark.parametrize("k,m", [(8, 16), (30, 20)])
def test_either_plan_gives_the_backend_the_same_bits(monkeypatch, k, m):
    from mpikmeans.backends.cpu import backend as B

    rng = np.random.default_rng(k + m)
    x = rng.normal(size=(4000, m))
    cen = x[rng.choice(len(x), k, replace=False)].copy()
    w = rng.random(len(x)) + 0.5
    sc = Scales.of(np.abs(x).max(axis=0), float(w.max()))
    plan = B.screened
    out = []
    for flip in (False, True):
        monkeypatch.setattr(B, "screened", (lambda a, b: not plan(a, b)) if flip else plan)
        assert B.search_plan(cen)[0][0] == (plan(k, m) != flip)
        be = B.CPUBackend(threads=2)
        be.load(x, w)
        steps = []
        c = cen
        for _ in range(3):  # the second and third steps with bounds: the plan searches the rows they let through
            r = be.step(c, sc)
            labels, d2 = be.assign(c)
            steps.append((r.sums.tobytes(), r.sse.tobytes(), r.changed, labels.tobytes(), d2.tobytes()))
            c = c + 0.05
        out.append(steps)
    assert out[0] == out[1]
