"""mpikmeans.vectors: 512-bit vectors asked for only where the CPU has AVX-512, and never over a user's setting."""

from __future__ import annotations

import pytest

from mpikmeans import vectors

SKX = "+64bit,+avx,+avx2,+avx512f,+avx512bw,+fma,-amx-tile"
ZEN = "+64bit,+avx,+avx2,+fma,-avx512f,-avx512bw"


def test_wide_features_only_with_avx512():
    out = vectors.wide_features(SKX)
    assert out.split(",")[-1] == "-prefer-256-bit" and out.startswith(SKX)
    assert vectors.wide_features(ZEN) is None
    # an explicit setting of the preference is replaced, not doubled
    assert vectors.wide_features(SKX + ",+prefer-256-bit").count("prefer-256-bit") == 1


@pytest.fixture
def clean_env(monkeypatch):
    for var in ("NUMBA_CPU_FEATURES", "MPIKMEANS_SET_NUMBA_CPU_FEATURES", "MPIKMEANS_WIDE_VECTORS"):
        monkeypatch.delenv(var, raising=False)
    return monkeypatch


def test_no_avx512_leaves_numba_alone(clean_env):
    assert vectors.configure(flags={"avx2", "fma"}) is None
    import os

    assert "NUMBA_CPU_FEATURES" not in os.environ


def test_a_users_setting_and_the_switch_are_kept(clean_env):
    import os

    clean_env.setenv("NUMBA_CPU_FEATURES", "+avx2")
    assert vectors.configure(flags={"avx512f"}) is None and os.environ["NUMBA_CPU_FEATURES"] == "+avx2"
    clean_env.delenv("NUMBA_CPU_FEATURES")
    clean_env.setenv("MPIKMEANS_WIDE_VECTORS", "0")
    assert vectors.configure(flags={"avx512f"}) is None and "NUMBA_CPU_FEATURES" not in os.environ


def test_cpu_flags_reads_cpuinfo(tmp_path):
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nflags\t\t: fpu sse avx2 avx512f\n\nprocessor\t: 1\nflags\t\t: fpu\n")
    assert vectors._cpu_flags(str(info)) == {"fpu", "sse", "avx2", "avx512f"}
    assert vectors._cpu_flags(str(tmp_path / "missing")) == set()
