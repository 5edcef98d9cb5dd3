#!/usr/bin/env bash
# One call on a lent GPU machine: its set-up, then the stages asked for. Orchestration only: every
# measurement is `python3 -m mpikmeans bench ...` (what users run) or `python3 bench/*.py` (the
# developers' scripts beside the package); BENCHMARKS.md says what each measures.
#
#   bash scripts/device_gpu.sh                                   # env,tests,runs; results under $OUT
#   STAGES=env,runs RUNS_ARGS="--shapes A,E,D" bash scripts/device_gpu.sh     # whole runs, empty and warm caches
#   STAGES=sweep SWEEP_K=2:64 bash scripts/device_gpu.sh        # one run per K on the specification's example
#   STAGES=fullstep FULLSTEP_ARGS="--shapes A,D" bash scripts/device_gpu.sh   # the step alone, PyTorch beside
#   STAGES=parity PARITY_ARGS="--np 2" bash scripts/device_gpu.sh             # GPU against CPU (2 GPUs)
#   STAGES=sweeps SWEEPS=procs,k SWEEP_ARGS="--iterations 3" bash scripts/device_gpu.sh  # the spec's sweeps
#   STAGES=step STEP_ARGS="--threads 1,2,all" bash scripts/device_gpu.sh      # the CPU step against scikit-learn
#   STAGES=ncu NCU_KERNEL=step NCU_ARGS="--shapes A --dtypes float32" bash scripts/device_gpu.sh  # one launch
#   STAGES=kernels KERNELS_ARGS="--shapes D --dtypes float32" bash scripts/device_gpu.sh         # every kernel
#
# MPIKMEANS_COMMIT names the commit measured in every result (the machine's copy has no .git):
#   MPIKMEANS_COMMIT=<sha> STAGES=... bash scripts/device_gpu.sh
# numpy 2.5 on the lent machines breaks numba-cuda: carry a numpy 2.4 wheel in .whl/ (and any other
# missing wheel; those with data files, as scikit-learn-intelex's, in .whl/prefix/); they are
# installed into /tmp/site (/tmp/prefix) first. Results go under $OUT (default bench/results/device_<date>).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
OUT=${OUT:-bench/results/device_$(date +%Y%m%d_%H%M%S)}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
export MPIKMEANS_COMMIT=${MPIKMEANS_COMMIT:-$(git rev-parse --short=12 HEAD 2>/dev/null || echo unknown)}
if ls .whl/*.whl >/dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/site .whl/*.whl || exit 1
    export PYTHONPATH=/tmp/site:$PWD
else
    export PYTHONPATH=$PWD
fi
if ls .whl/prefix/*.whl >/dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --prefix /tmp/prefix \
        .whl/prefix/*.whl || exit 1
    PYTHONPATH=$PYTHONPATH:$(python3 -c 'import sys; print(f"/tmp/prefix/lib/python{sys.version_info[0]}.{sys.version_info[1]}/site-packages")')
    export LD_LIBRARY_PATH=/tmp/prefix/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
fi
# Byte-compiled modules, as `pip install` leaves a package: the machines' image sets
# PYTHONDONTWRITEBYTECODE=1 and ships packages without .pyc, so every process would compile the
# sources of numpy, numba, scipy and mpikmeans again (most of a run's launch and start-up). Once,
# into a cache outside the packages.
unset PYTHONDONTWRITEBYTECODE
export PYTHONPYCACHEPREFIX=${PYTHONPYCACHEPREFIX:-/tmp/pycache}
packages=$(python3 -c 'import importlib.util, sys
for name in sys.argv[1:]:
    spec = importlib.util.find_spec(name)
    print("\n".join(spec.submodule_search_locations or []) if spec else "")' \
    numpy numba numba_cuda llvmlite scipy mpi4py click sklearn joblib threadpoolctl cuda mpikmeans)
t0=$SECONDS
python3 -m compileall -q -j 0 $packages >/dev/null 2>&1   # a file of another Python version's syntax: skipped
echo "bytecode ($PYTHONPYCACHEPREFIX): $(echo $packages | wc -w) package folders in $((SECONDS - t0)) s"
STAGES=${STAGES:-env,tests,runs}
DATA_DIR=${DATA_DIR:-/tmp/mpikmeans-bench-data}       # the generated inputs, reused by later stages
CACHE_DIR=${CACHE_DIR:-/tmp/mpikmeans-cache-warm}     # the warm runs' kernel cache: empty on a fresh machine
RUNS_ARGS=${RUNS_ARGS:-}                              # mpikmeans bench runs options (the matrix)
SWEEP_K=${SWEEP_K:-2:64}                              # mpikmeans bench runs --sweep
SWEEP_RUN_ARGS=${SWEEP_RUN_ARGS:-}                    # more options of the K sweep
FULLSTEP_ARGS=${FULLSTEP_ARGS:-}                      # bench/fullstep.py options
PARITY_ARGS=${PARITY_ARGS:---np 1}                    # bench/parity.py options (one GPU per rank)
SWEEPS=${SWEEPS:-procs,n,m,k}                         # mpikmeans bench run --sweeps
SWEEP_ARGS=${SWEEP_ARGS:-}
STEP_ARGS=${STEP_ARGS:-}                              # bench/step.py options
GPU_TESTS=${GPU_TESTS:-tests/test_backend_gpu.py tests/test_cache.py}  # the files whose gpu tests run
GPU_TESTS_K=${GPU_TESTS_K:-}                          # a pytest -k expression selecting among them
NCU_KERNEL=${NCU_KERNEL:-.}                           # ncu: the kernel (a regex), its launches skipped, the step run
NCU_SKIP=${NCU_SKIP:-3}
NCU_ARGS=${NCU_ARGS:---shapes A --dtypes float32}
KERNELS_ARGS=${KERNELS_ARGS:---shapes D --dtypes float32}
rc=0

has() { [[ ",$STAGES," == *",$1,"* ]]; }

if has env; then
    {
        nvidia-smi --query-gpu=index,name,memory.total,driver_version,clocks.sm,clocks.max.sm --format=csv
        python3 -c 'import sys, numpy, numba, numba_cuda; print(sys.version); print("numpy", numpy.__version__, "numba", numba.__version__, "numba-cuda", numba_cuda.__version__)'
        python3 -m mpikmeans info
        echo "commit $MPIKMEANS_COMMIT"
    } 2>&1 | tee "$OUT/env.txt"
fi

if has tests; then
    echo "== GPU tests"
    python3 -m pytest -q -p no:cacheprovider -m gpu $GPU_TESTS ${GPU_TESTS_K:+-k "$GPU_TESTS_K"} -rs --durations 5 2>&1 \
        | tee "$OUT/tests.log"
    [[ ${PIPESTATUS[0]} -eq 0 ]] || rc=1
fi

if has runs; then
    echo "== whole runs: mpikmeans bench runs $RUNS_ARGS"
    python3 -m mpikmeans bench runs -o "$OUT/runs.json" --data-dir "$DATA_DIR" --cache-dir "$CACHE_DIR" $RUNS_ARGS 2>&1 \
        | tee "$OUT/runs.log"
    [[ ${PIPESTATUS[0]} -eq 0 ]] || rc=1
fi

if has sweep; then
    echo "== one run per K: mpikmeans bench runs --sweep $SWEEP_K"
    python3 -m mpikmeans bench runs --sweep "$SWEEP_K" -o "$OUT/sweep.json" --data-dir "$DATA_DIR" \
        --cache-dir "$CACHE_DIR" $SWEEP_RUN_ARGS 2>&1 | tee "$OUT/sweep.log"
    [[ ${PIPESTATUS[0]} -eq 0 ]] || rc=1
fi

if has fullstep; then
    echo "== the step alone: bench/fullstep.py $FULLSTEP_ARGS"
    python3 bench/fullstep.py --out "$OUT/fullstep.json" $FULLSTEP_ARGS 2>&1 | tee "$OUT/fullstep.log"
    [[ ${PIPESTATUS[0]} -eq 0 ]] || rc=1
fi

if has parity; then
    echo "== GPU against CPU through the command line: bench/parity.py $PARITY_ARGS"
    python3 bench/parity.py /tmp/mpikmeans-parity $PARITY_ARGS 2>&1 | tee "$OUT/parity.log"
    [[ ${PIPESTATUS[0]} -eq 0 ]] || rc=1
    cp /tmp/mpikmeans-parity/parity.json "$OUT/" 2>/dev/null
fi

if has sweeps; then
    echo "== the specification's sweeps: $SWEEPS"
    # no matplotlib there: the plots are drawn afterwards with `mpikmeans bench plot DIR`
    python3 -m mpikmeans bench run --full --sweeps "$SWEEPS" -o "$OUT/sweeps" --no-plots --data-dir "$DATA_DIR" \
        $SWEEP_ARGS 2>&1 | tee "$OUT/sweeps.log"
    [[ ${PIPESTATUS[0]} -eq 0 ]] || rc=1
fi

if has step; then
    echo "== the CPU step against scikit-learn and oneDAL: bench/step.py $STEP_ARGS"
    python3 bench/step.py --out "$OUT/step.json" $STEP_ARGS 2>&1 | tee "$OUT/step.log"
    [[ ${PIPESTATUS[0]} -eq 0 ]] || rc=1
fi

if has ncu && command -v ncu >/dev/null; then
    # one launch of a kernel inside bench/fullstep.py's steps: its sections
    echo "== ncu: kernel $NCU_KERNEL, launch $NCU_SKIP, in python3 bench/fullstep.py $NCU_ARGS"
    ncu --clock-control none --kernel-name "regex:$NCU_KERNEL" --launch-skip "$NCU_SKIP" --launch-count 1 \
        --section SpeedOfLight --section MemoryWorkloadAnalysis --section ComputeWorkloadAnalysis \
        --section Occupancy --section WarpStateStats --section LaunchStats --section SchedulerStats \
        --section InstructionStats python3 bench/fullstep.py --iters 4 --no-torch --no-parity --out /tmp/ncu_fs.json \
        $NCU_ARGS > "$OUT/ncu.txt" 2>&1 || rc=1
    grep -E "Duration|Throughput|Registers|Achieved Occupancy|Issued Ipc|No Eligible" "$OUT/ncu.txt" | head -20
fi

if has kernels && command -v ncu >/dev/null; then
    # every kernel of the steps, in launch order: which one a step waits for
    echo "== every kernel's time in python3 bench/fullstep.py $KERNELS_ARGS"
    ncu --clock-control none --cache-control none --metrics gpu__time_duration.sum --csv --page raw \
        python3 bench/fullstep.py --iters 4 --no-torch --no-parity --out /tmp/kernels_fs.json $KERNELS_ARGS \
        > /tmp/kernels.csv 2>&1 || rc=1
    python3 - /tmp/kernels.csv > "$OUT/kernels.log" <<'PY'
import csv, sys
lines = open(sys.argv[1]).read().splitlines()
head = [i for i, line in enumerate(lines) if line.startswith('"ID"')]
rows = list(csv.reader(lines[head[0]:])) if head else []
if rows:
    h = rows[0]
    ki, ti, gi = h.index("Kernel Name"), h.index("gpu__time_duration.sum"), h.index("Grid Size")
    print(len(rows) - 2, "kernels (grid, ns)")
    for r in rows[2:]:
        print(r[ki].split("[")[0], r[gi], r[ti])
else:
    print("\n".join(lines[-20:]))
PY
    head -40 "$OUT/kernels.log"
fi
exit $rc
