"""Tests for :mod:`mpikmeans.scaling`: ``minmax`` is Weka's normalisation and
``zscore`` NumPy's standardisation of the whole array, both bit-for-bit the same
for any number of ranks (threads); ``inverse`` takes centres back to data units."""

from __future__ import annotations

import sys
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from threadcomm import run_ranks  # noqa: E402

from mpikmeans.comm import SerialComm  # noqa: E402
from mpikmeans.errors import InputError, UsageError  # noqa: E402
from mpikmeans.exact import exact_column_sums  # noqa: E402
from mpikmeans.scaling import fit_scaler, global_means  # noqa: E402

SPLITS = [[0, 1001], [0, 500, 1001], [0, 0, 1, 700, 1001], [0, 250, 250, 600, 1001], [0, 1, 2, 3, 4, 1001]]


@pytest.fixture(scope="module")
def x():
    """Attributes of very different scales and offsets, a constant one, and a -0.0."""
    rng = np.random.default_rng(0)
    x = rng.normal([3.0, -250.0, 1e-3, 7.0, 1e6], [1.0, 100.0, 1e-5, 1.0, 1e2], size=(1001, 5))
    x[:, 3] = 0.1  # constant, and not a dyadic number
    x[17, 0] = -0.0
    return x


def fitted_on_splits(x, method):
    """The scaler every rank gets, for each split of the rows in SPLITS."""
    out = []
    for cuts in SPLITS:
        ranks = len(cuts) - 1

        def body(comm, cuts=cuts):
            return fit_scaler(comm, x[cuts[comm.rank]:cuts[comm.rank + 1]], method)

        out += run_ranks(ranks, body)
    return out


@pytest.mark.parametrize("method", ["minmax", "zscore"])
def test_statistics_independent_of_ranks(x, method):
    scalers = fitted_on_splits(x, method)
    ref = scalers[0]
    for s in scalers:
        assert s.method == method
        assert s.offset.tobytes() == ref.offset.tobytes()
        assert s.scale.tobytes() == ref.scale.tobytes()
        assert s.constant.tolist() == ref.constant.tolist() == [False, False, False, True, False]


def test_global_means(x):
    ref = global_means(SerialComm(), x)
    assert ref.tobytes() == fit_scaler(SerialComm(), x, "zscore").offset.tobytes()
    for cuts in SPLITS[1:]:
        def body(comm, cuts=cuts):
            return global_means(comm, x[cuts[comm.rank]:cuts[comm.rank + 1]])

        for got in run_ranks(len(cuts) - 1, body):
            assert got.tobytes() == ref.tobytes()
    assert np.isnan(global_means(SerialComm(), x[:0])).all()


def test_minmax_is_wekas_normalisation(x):
    s = fit_scaler(SerialComm(), x, "minmax")
    lo, hi = x.min(axis=0), x.max(axis=0)
    assert s.offset.tobytes() == lo.tobytes()
    with np.errstate(invalid="ignore"):
        expected = (x - lo) / (hi - lo)  # Weka's NormalizableDistance.norm: (x - min) / width
    expected[:, 3] = 0.0  # ... and 0 where min == max
    z = s.transform(x)
    assert z.tobytes() == expected.tobytes()
    assert z.min() == 0.0 and z.max() == 1.0
    # other data (predict): the same formula with the fitted bounds, a constant attribute stays 0
    other = x[:5] + 1.0
    zo = s.transform(other)
    assert zo[:, 3].tolist() == [0.0] * 5
    assert zo[:, :3].tobytes() == ((other[:, :3] - lo[:3]) / (hi[:3] - lo[:3])).tobytes()


def test_zscore_matches_numpy(x):
    s = fit_scaler(SerialComm(), x, "zscore")
    mean, std = x.mean(axis=0), x.std(axis=0)  # population std (ddof=0), as scikit-learn's StandardScaler
    varying = [0, 1, 2, 4]
    # against the exact mean: each value is rounded to 2**-53 of the column's
    # largest magnitude (at most half of that off), then the mean is rounded once
    for j in varying:
        exact = sum(Fraction(v) for v in x[:, j].tolist()) / len(x)
        bound = Fraction(2.0**-54 * np.abs(x[:, j]).max()) + Fraction(np.spacing(abs(float(exact))))
        assert abs(Fraction(s.offset[j]) - exact) <= bound, j
    assert np.all(np.abs(s.offset - mean)[varying] <= 1e-15 * np.abs(x[:, varying]).max(axis=0))
    np.testing.assert_allclose(s.scale[varying], std[varying], rtol=1e-13)
    assert s.offset[3] == 0.1 and s.scale[3] == 1.0  # the exact mean of a constant column
    z = s.transform(x)
    np.testing.assert_allclose(z[:, varying], ((x - mean) / std)[:, varying], rtol=1e-9, atol=1e-9)
    assert z[:, 3].tolist() == [0.0] * len(x)
    np.testing.assert_allclose(z.mean(axis=0), 0.0, atol=1e-11)
    np.testing.assert_allclose(z[:, varying].std(axis=0), 1.0, rtol=1e-12)


def test_zscore_mean_is_exact_where_float_sums_are_not():
    # 1 + 2**-52 added to itself: a float sum rounds at every step; the
    # fixed-point sum is exact, and the mean is the value itself
    v = np.full((999, 1), 1.0 + 2.0**-52)
    v[::2] = 1.0
    s = fit_scaler(SerialComm(), v, "zscore")
    exact = (500 * Fraction(1) + 499 * Fraction(1.0 + 2.0**-52)) / 999
    assert s.offset[0] == float(exact)  # every value is on the grid: the mean is the exact one, rounded once
    (total, scale), = exact_column_sums(SerialComm(), v)
    assert total == 500 * 2**52 + 499 * (2**52 + 1) and scale == 52


@pytest.mark.parametrize("method", ["none", "minmax", "zscore"])
def test_inverse_round_trip(x, method):
    s = fit_scaler(SerialComm(), x, method)
    back = s.inverse(s.transform(x))
    assert np.all(np.abs(back - x) <= 1e-15 * np.abs(x).max(axis=0))  # an ulp or so of the column
    assert back[:, 3].tolist() == [0.1] * len(x)  # the constant comes back exactly
    # centres are what inverse is for: means in scaled units -> means in data units
    labels = np.arange(len(x)) % 3
    cz = np.array([s.transform(x)[labels == j].mean(axis=0) for j in range(3)])
    cx = np.array([x[labels == j].mean(axis=0) for j in range(3)])
    np.testing.assert_allclose(s.inverse(cz), cx, rtol=1e-12)


def test_transform_in_place_and_none(x):
    s = fit_scaler(SerialComm(), x, "minmax")
    y = x.copy()
    out = s.transform(y, out=y)
    assert out is y and y.tobytes() == s.transform(x).tobytes()
    n = fit_scaler(SerialComm(), x, "none")
    assert n.transform(x) is x  # no copy of the data when nothing is scaled
    assert n.inverse(x[:3]).tobytes() == x[:3].tobytes()
    d = s.to_dict()
    assert d["method"] == "minmax" and d["constant"] == [3] and len(d["offset"]) == 5


def test_errors(x):
    with pytest.raises(UsageError, match="--normalize"):
        fit_scaler(SerialComm(), x, "l2")
    with pytest.raises(InputError):
        fit_scaler(SerialComm(), np.empty((0, 3)), "zscore")
    s = fit_scaler(SerialComm(), x, "zscore")
    with pytest.raises(UsageError, match="5 attributes"):
        s.transform(x[:, :4])


@pytest.mark.parametrize("method", ["minmax", "zscore"])
def test_known_extremes_give_the_same_bits(method):
    """With the reader's global min and max (no pass to find them) the fit is bit-identical."""
    rng = np.random.default_rng(11)
    x = rng.normal(size=(3000, 5)) * np.array([1.0, 1e-200, 1e150, 3.0, 0.0]) + np.array([5.0, 0.0, 0.0, -1e6, 2.0])
    mins, maxs = x.min(axis=0), x.max(axis=0)
    a = fit_scaler(SerialComm(), x, method)
    b = fit_scaler(SerialComm(), x, method, mins, maxs)
    assert a.offset.tobytes() == b.offset.tobytes() and a.scale.tobytes() == b.scale.tobytes()
    assert global_means(SerialComm(), x).tobytes() == global_means(SerialComm(), x, mins, maxs).tobytes()
