"""Where the exact CPU step goes at small K x M (issue 17: 10^6 x 16, K = 8), part by part, one thread.

The step at K <= 8 and K x M <= 256 is the exact kernel (``backends/cpu/tiles.py: _lloyd_pass``):
per tile of 64 rows it transposes the rows (``_load_tile``), computes every distance in float64
(``_four_dists``, one vector lane per row), keeps the nearest (``_nearest_tile``), then adds the rows
to their clusters' sums.  Timed here, in one process, round-robin: the transposition alone, the
distances alone (one tile loaded once), ``_nearest_tile`` (both and the ranking), and the whole
pass; and two other ways to transpose a tile, which give the same tile: the loops swapped, and a
row at a time (the kernel's form before it took four rows at a time from this experiment).  Prints ns per row (min and median of the rounds).

    python bench/experiments/cpu_small_k_parts.py [N] [M] [K] [ROUNDS]
"""
import os
import sys
import time

import numba
import numpy as np
from numba import njit

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))
from mpikmeans.backends.cpu import tiles as T  # noqa: E402

n = int(float(sys.argv[1])) if len(sys.argv) > 1 else 200000
m = int(sys.argv[2]) if len(sys.argv) > 2 else 16
k = int(sys.argv[3]) if len(sys.argv) > 3 else 8
rounds = int(sys.argv[4]) if len(sys.argv) > 4 else 9
numba.set_num_threads(1)
rng = np.random.default_rng(0)
cen0 = rng.normal(size=(k, m)) * 3
x = cen0[rng.integers(0, k, n)] + rng.normal(size=(n, m))
cen = cen0 + 0.1
TILE = T._tile_rows(m)


@njit
def load_swapped(x, t0, rt, xt):
    for j in range(x.shape[1]):
        for r in range(rt):
            xt[j, r] = x[t0 + r, j]


@njit
def load_rows(x, t0, rt, xt):
    for r in range(rt):
        for j in range(x.shape[1]):
            xt[j, r] = x[t0 + r, j]


@njit
def loads(x, tile, how):
    n, m = x.shape
    xt = np.zeros((m, tile + 8))
    s = 0.0
    for t0 in range(0, n, tile):
        rt = min(tile, n - t0)
        if how == 0:
            T._load_tile(x, t0, rt, xt)
        elif how == 1:
            load_swapped(x, t0, rt, xt)
        else:
            load_rows(x, t0, rt, xt)
        s += xt[0, 0]
    return s


@njit
def only_dists(x, cen, tile):
    n, m = x.shape
    k = cen.shape[0]
    xt = np.zeros((m, tile + 8))
    acc = np.empty((4, tile))
    s = 0.0
    T._load_tile(x, 0, tile, xt)
    for t0 in range(0, n, tile):
        for c0 in range(0, k, 4):
            T._four_dists(xt, tile, cen, c0, min(c0 + 1, k - 1), min(c0 + 2, k - 1), min(c0 + 3, k - 1), acc)
        s += acc[0, 0]
    return s


@njit
def nearest(x, cen, tile):
    n, m = x.shape
    xt = np.zeros((m, tile + 8))
    acc = np.empty((4, tile))
    bd = np.empty(tile)
    b = np.empty(tile, np.int64)
    s = 0.0
    for t0 in range(0, n, tile):
        T._nearest_tile(x, t0, min(tile, n - t0), cen, xt, acc, bd, b)
        s += bd[0]
    return s


# the three transpositions give the same tile
xt_a, xt_b, xt_c = (np.zeros((m, TILE + 8)) for _ in range(3))
T._load_tile(x, 5, TILE - 3, xt_a)
load_swapped(x, 5, TILE - 3, xt_b)
load_rows(x, 5, TILE - 3, xt_c)
assert np.array_equal(xt_a, xt_b) and np.array_equal(xt_a, xt_c)

parts = (np.empty((T._BLOCKS, k, m)), np.empty((T._BLOCKS, k)), np.empty(T._BLOCKS), np.empty(T._BLOCKS, np.int64))
lab = np.full(n, -1, np.int32)
fs = {"transpose (_load_tile)": lambda: loads(x, TILE, 0), "transpose, loops swapped": lambda: loads(x, TILE, 1),
      "transpose, a row at a time": lambda: loads(x, TILE, 2), "distances (_four_dists)": lambda: only_dists(x, cen, TILE),
      "_nearest_tile": lambda: nearest(x, cen, TILE),
      "whole pass (_lloyd_pass)": lambda: T._lloyd_pass(x, cen, TILE, lab, np.ones(0), False, *parts)}
for f in fs.values():
    f()
res = {key: [] for key in fs}
for _ in range(rounds):
    for key, f in fs.items():
        t0 = time.perf_counter()
        f()
        res[key].append((time.perf_counter() - t0) / n * 1e9)
print(f"{n} rows x {m}, K = {k}, tile {TILE}, one thread")
for key, v in res.items():
    print(f"{key:28s} ns a row: min {min(v):6.2f} median {np.median(v):6.2f}")
