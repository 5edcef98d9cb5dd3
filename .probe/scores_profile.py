"""Where a GPU run's scores go: every DeviceScoreRows pass and kernel launch timed with a sync around it (scratch)."""
import sys
import time

import numpy as np
from numba import cuda

import os

import mpikmeans.scores as S
from mpikmeans.backends.gpu import GPUBackend, scorek
from mpikmeans.comm import SerialComm

scorek.QT = int(os.environ.get("QT", scorek.QT))
T = {}


def timed(owner, name, label=None):
    f = getattr(owner, name)

    def g(*a, **kw):
        cuda.synchronize()
        t = time.perf_counter()
        r = f(*a, **kw)
        cuda.synchronize()
        key = label(a) if label else name
        T[key] = T.get(key, 0.0) + time.perf_counter() - t
        return r
    setattr(owner, name, g)


timed(scorek, "launch", lambda a: "kernel " + a[0].py_func.__name__)
for name in ("cluster_sums", "silhouette_sums", "sample_sums"):
    timed(scorek.DeviceScoreRows, name, lambda a, name=name: "pass " + name)
timed(scorek.DeviceScoreRows, "__init__", lambda a: "pass labels upload")
timed(S, "_davies_bouldin")
for case in sys.argv[1:]:
  path, dtype, kk = case.split(":")
  ks = [int(v) for v in kk.split(",")]
  x = np.ascontiguousarray(np.load(path))
  be = GPUBackend(dtype=dtype)
  be.load(x, None)
  rng = np.random.default_rng(0)
  for k in ks:
      labels, _ = be.assign(np.ascontiguousarray(x[rng.choice(len(x), k, replace=False)]))
      labels = np.ascontiguousarray(labels, dtype=np.int32)
      mags = np.abs(x).max(axis=0)
      for rep in range(3):
          T.clear()
          t = time.perf_counter()
          rows = be.score_rows(labels, k)
          t1 = time.perf_counter()
          out = S.quality_scores(SerialComm(), x, labels, k, centres=None, magnitudes=mags, sample_size=10_000, seed=1,
                                 threads=16, rows=rows)
          total = time.perf_counter() - t
      print(f"QT={scorek.QT} {path.split('/')[-1]} {dtype} K={k}: quality_scores {total * 1e3:.1f} ms (score_rows {1e3 * (t1 - t):.1f}); "
            + ", ".join(f"{key} {v * 1e3:.1f}" for key, v in sorted(T.items(), key=lambda kv: -kv[1])), flush=True)

  be.close()
