#!/usr/bin/env bash
# Whole GPU runs through the command line at K x M = 257,000 (3e5 x 257, K = 1000, 20 iterations
# from --init sample), with glibc's default malloc and with freed memory kept in the process
# (MALLOC_MMAP_THRESHOLD_ / MALLOC_TRIM_THRESHOLD_): the Lloyd loop's host work makes K x M
# arrays afresh each iteration, whose pages the kernel maps again when glibc gave them back.
# Prints summary.json's per-iteration figures.  On a GPU machine (PYTHONPATH set as
# scripts/device_gpu.sh sets it):  bash bench/experiments/gpu_run_malloc.sh
set -u
python3 -c "
import numpy as np
r=np.random.default_rng(0); c=r.normal(size=(1000,257))*3
x=c[r.integers(0,1000,300000)]+r.normal(size=(300000,257))*2
np.save('/tmp/d.npy',x)"
for dt in float32 float64; do for env in plain malloc; do
  if [ $env = malloc ]; then E="MALLOC_MMAP_THRESHOLD_=268435456 MALLOC_TRIM_THRESHOLD_=536870912"; else E=""; fi
  for rep in 1 2; do
    env $E python3 -m mpikmeans run /tmp/d.npy -k 1000 --init sample --backend gpu --dtype $dt --max-iter 20 -o /tmp/o_${dt}_${env} --overwrite -q
    python3 -c "
import json,sys; s=json.load(open('/tmp/o_${dt}_${env}/summary.json'))
t=s.get('timings',s.get('timing',{}))
import statistics as st; h=[r['seconds'] for r in s.get('history',[])]
print('$dt $env rep $rep', 'iters', s.get('iterations'), 'per_iteration_ms', round(1e3*t.get('per_iteration_s',float('nan')),3), 'median iteration ms', round(1e3*st.median(h),3) if h else None, {k:round(v,3) for k,v in t.items() if isinstance(v,float)})"
  done
done; done
