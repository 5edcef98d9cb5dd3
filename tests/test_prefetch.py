"""Tests for :mod:`mpikmeans.backends.cpu.prefetch`: the hint reaches the machine code and changes nothing."""

import platform

import numpy as np
import pytest
from numba import njit

from mpikmeans.backends.cpu.prefetch import prefetch


@njit
def _sum_with_hints(x, ahead):
    s = 0.0
    flat = x.reshape(-1)
    for i in range(flat.size):
        if i + ahead < flat.size:
            prefetch(flat, i + ahead)
        s += flat[i]
    return s


def test_prefetch_changes_no_result():
    x = np.random.default_rng(0).normal(size=(300, 7))
    assert _sum_with_hints(x, 64) == _sum_with_hints(x, 10**9)


@pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64"), reason="x86 instruction names")
def test_prefetch_is_a_prefetch_instruction():
    x = np.zeros((4, 4))
    _sum_with_hints(x, 8)
    asm = _sum_with_hints.inspect_asm(_sum_with_hints.signatures[0])
    assert "prefetcht0" in asm


def test_prefetch_refuses_what_it_cannot_address():
    @njit
    def bad(x):
        prefetch(x, 1.5)

    with pytest.raises(Exception, match="prefetch"):
        bad(np.zeros(3))
