#!/usr/bin/env bash
# Temporary probe: the timeline of a D float32 run's iterations (a lent GPU machine).
set -u
D=/tmp/probe; mkdir -p $D
python3 - <<'PY'
import numpy as np, sys
sys.path.insert(0, ".")
from bench.fullstep import blobs, _torch
np.save("/tmp/probe/D.npy", blobs(300_000, 257, 1000, 1.0, 9, _torch()))
PY
python3 -m mpikmeans warmup --part gpu-float32 -q & 
python3 -m mpikmeans warmup --part cpu -q; wait
for i in 1 2; do
  echo "=== D K=1000 float32 sample seed 3, run $i"
  PYTHONPATH=bench/probe:$PYTHONPATH python3 -m mpikmeans run $D/D.npy -k 1000 --init sample --seed 3 --backend gpu \
     --dtype float32 --max-iter 5 --scores none -o $D/out --overwrite -vv 2>&1 | grep -E "probe|iter |timings|empty" | grep -v "gpu kernel" | cut -c1-170
done
