#!/usr/bin/env bash
# One call on a GPU machine: GPU tests, benchmark, an ncu profile, and optionally the
# CPU read/gen throughput and the BENCHMARKS.md sweeps. Device orchestration only: every
# measurement is `python3 -m mpikmeans bench ...` (mpikmeans/bench/).
#
#   bash scripts/device_gpu.sh                  # env,tests,bench,ncu; results under $OUT
#   STAGES=bench BENCH_ARGS="--cases A" BENCH_VARIANTS='[{}, {"blocks": 3}]' bash scripts/device_gpu.sh
#   STAGES=cpu,sweeps SWEEPS=n,m,k bash scripts/device_gpu.sh
#   STAGES=parity,mpigpu MPI_GPU_NP="1 2" bash scripts/device_gpu.sh   # 2 GPUs
#   STAGES=tts TTS_ARGS="--repeats 2" bash scripts/device_gpu.sh      # time to solution, spec example
#   STAGES=step STEP_ARGS="--iterations 10" bash scripts/device_gpu.sh # CPU step against scikit-learn (and oneDAL)
#   STAGES=compile COMPILE_ARGS="--gpu 50,100" bash scripts/device_gpu.sh  # every kernel's first compile
#   STAGES=fullstep FULLSTEP_ARGS="--cases A,D" bash scripts/device_gpu.sh  # full steps against floor, PyTorch
#   STAGES=tests,ncu GPU_TESTS_K=split NCU_KERNEL=km_sums bash scripts/device_gpu.sh  # some tests; another kernel
#   STAGES=kernels KERNELS_ARGS="--cases D --dtype float32 --repeats 1" bash scripts/device_gpu.sh  # each step's kernels
#   STAGES=ncufs NCUFS_CASE=B NCUFS_KERNEL=km_tf32_screen NCUFS_SKIP=1 bash scripts/device_gpu.sh  # one launch of a
#       real full step under ncu (sections, per-SASS counters, their instruction mix: ncufs_*)
#
# On the project's lent GPU machines (numpy 2.5 there breaks numba-cuda) carry a numpy
# 2.4 wheel in .whl/ (see bench/GPU_NOTES.md); it is installed into /tmp/site first.
# Writes env.txt, tests.log, bench.json, bench.log, ncu_*.txt (and cpu.*, sweeps/, parity/,
# mpi_gpu_np*.json with their logs for the optional stages) under $OUT
# (default bench/results/device_<date>).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
OUT=${OUT:-bench/results/device_$(date +%Y%m%d_%H%M%S)}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
if ls .whl/*.whl >/dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/site .whl/*.whl || exit 1
    export PYTHONPATH=/tmp/site:$PWD
else
    export PYTHONPATH=$PWD
fi
# optional wheels with data files (scikit-learn-intelex for bench step: daal, tbb, tcmlib carry
# their shared libraries as data, which --target drops): a prefix install
if ls .whl/prefix/*.whl >/dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --prefix /tmp/prefix \
        .whl/prefix/*.whl || exit 1
    PYTHONPATH=$PYTHONPATH:$(python3 -c 'import sys; print(f"/tmp/prefix/lib/python{sys.version_info[0]}.{sys.version_info[1]}/site-packages")')
    export LD_LIBRARY_PATH=/tmp/prefix/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
fi
# Byte-compiled modules, as `pip install` leaves a package: the lent machines' image sets
# PYTHONDONTWRITEBYTECODE=1 and its packages have no .pyc, so every process compiled the
# sources of numpy, numba, scipy and mpikmeans again (0.6-1.0 s of each run's launch and start-up,
# bench/results/gpu_start_vs_read_H100_2026-11-25.log). A cache outside the packages, filled once.
unset PYTHONDONTWRITEBYTECODE
export PYTHONPYCACHEPREFIX=${PYTHONPYCACHEPREFIX:-/tmp/pycache}
python3 -c 'import sys
from mpikmeans.bench.bytecode import compile_packages
done, failed, seconds = compile_packages(sys.argv[1:])
print(f"bytecode cache ({sys.pycache_prefix}): {len(done)} packages in {seconds:.1f} s; incomplete: {failed}")' \
    numpy numba numba_cuda llvmlite scipy mpi4py click sklearn joblib threadpoolctl cuda mpikmeans || exit 1
STAGES=${STAGES:-env,tests,bench,ncu}
BENCH_ARGS=${BENCH_ARGS:-}
BENCH_VARIANTS=${BENCH_VARIANTS:-'[{}]'}   # JSON, see mpikmeans bench gpu --variants
NCU_CASES=${NCU_CASES:-A:float32}
NCU_VARIANTS=${NCU_VARIANTS:-'[{}]'}      # the tune profiled (mpikmeans bench gpu --variants)
NCU_SOURCE=${NCU_SOURCE:-0}               # 1: per-line SASS sampling (lineinfo), ncu_*_source.csv
SWEEPS=${SWEEPS:-procs,n,m,k}             # mpikmeans bench run --sweeps
SWEEP_ARGS=${SWEEP_ARGS:-}
# mpikmeans bench cpu options (lists as `--ranks 1 2 4` or `--ranks 1,2,4`)
CPU_ARGS=${CPU_ARGS:---rows 5000000 --attrs 16 -k 8 --ranks 1 2 4 8 16 --gen-ranks 1 2 4 --repeats 3 --iterations 2 --references}
PARITY_ARGS=${PARITY_ARGS:---np 2}        # mpikmeans bench parity options (one GPU per rank)
MPI_GPU_NP=${MPI_GPU_NP:-1 2}             # mpikmeans bench mpi-gpu rank counts; the others are compared with the first
MPI_GPU_ARGS=${MPI_GPU_ARGS:-}            # e.g. --iters 12
TTS_ARGS=${TTS_ARGS:-}                    # mpikmeans bench tts options
STEP_ARGS=${STEP_ARGS:-}                  # mpikmeans bench step options
COMPILE_ARGS=${COMPILE_ARGS:---gpu 50,100} # mpikmeans bench compile options
FULLSTEP_ARGS=${FULLSTEP_ARGS:---stream 50000000x32x16 --chunk-rows 5000000}  # mpikmeans bench fullstep options
KERNELS_ARGS=${KERNELS_ARGS:---cases D --dtype float32 --repeats 1}  # the fullstep runs whose kernels ncu times
GPU_TESTS=${GPU_TESTS:-tests/test_backend_gpu.py tests/test_cache.py}  # the files whose gpu tests run
GPU_TESTS_K=${GPU_TESTS_K:-}              # a pytest -k expression selecting among them
NCU_KERNEL=${NCU_KERNEL:-km_fused}        # the kernel ncu profiles (a regex: km_fused, km_sums, ...)
NCUFS_CASE=${NCUFS_CASE:-A}               # ncufs: the bench fullstep case, its dtype, the kernel (a regex)
NCUFS_DTYPE=${NCUFS_DTYPE:-float32}
NCUFS_KERNEL=${NCUFS_KERNEL:-km_sums}
NCUFS_SKIP=${NCUFS_SKIP:-6}               # ... and the launches of it skipped first (A's km_sums: a late step)
rc=0

has() { [[ ",$STAGES," == *",$1,"* ]]; }

if has env; then
    {
        nvidia-smi --query-gpu=index,name,memory.total,driver_version,clocks.sm,clocks.max.sm --format=csv
        python3 -c 'import sys, numpy, numba, numba_cuda, torch; print(sys.version); print("numpy", numpy.__version__, "numba", numba.__version__, "numba-cuda", numba_cuda.__version__, "torch", torch.__version__)'
        python3 -c 'from mpikmeans.backends import gpu; print(gpu.device_descriptions())'
    } 2>&1 | tee "$OUT/env.txt"
fi

if has tests; then
    echo "== GPU tests"
    python3 -m pytest -q -p no:cacheprovider -m gpu $GPU_TESTS ${GPU_TESTS_K:+-k "$GPU_TESTS_K"} -rs --durations 5 2>&1 \
        | tee "$OUT/tests.log"
    [[ ${PIPESTATUS[0]} -eq 0 ]] || rc=1
fi

if has bench; then
    echo "== benchmark"
    python3 -m mpikmeans bench gpu --out "$OUT/bench.json" --variants "$BENCH_VARIANTS" $BENCH_ARGS 2>&1 | tee "$OUT/bench.log"
    [[ ${PIPESTATUS[0]} -eq 0 ]] || rc=1
fi

if has ncu && command -v ncu >/dev/null; then
    for cd in $NCU_CASES; do
        c=${cd%%:*}; d=${cd##*:}
        echo "== ncu $c $d"
        extra=()
        variants=$NCU_VARIANTS
        if [[ $NCU_SOURCE == 1 ]]; then
            extra=(--section SourceCounters --import-source no -f -o /tmp/ncu_${c}_${d})
            variants=$(python3 -c 'import json,sys; print(json.dumps([dict(v, lineinfo=True) for v in json.loads(sys.argv[1])]))' "$variants")
        fi
        ncu --clock-control none --kernel-name regex:$NCU_KERNEL --launch-skip 3 --launch-count 1 \
            --section SpeedOfLight --section MemoryWorkloadAnalysis --section ComputeWorkloadAnalysis \
            --section Occupancy --section WarpStateStats --section LaunchStats --section SchedulerStats \
            "${extra[@]}" \
            python3 -m mpikmeans bench gpu --cases "$c" --dtype "$d" --repeats 1 --iters 1 --no-torch \
            --variants "$variants" --out /tmp/ncu_bench.json > "$OUT/ncu_${c}_${d}.txt" 2>&1 || rc=1
        if [[ $NCU_SOURCE == 1 ]]; then
            ncu -i /tmp/ncu_${c}_${d}.ncu-rep --page details --print-details all > "$OUT/ncu_${c}_${d}.txt" 2>&1
            ncu -i /tmp/ncu_${c}_${d}.ncu-rep --page source --csv --print-source sass \
                > "$OUT/ncu_${c}_${d}_source.csv" 2>&1 || rc=1
        fi
        grep -E "Duration|Throughput|Registers|Achieved Occupancy|Theoretical Occupancy|Issued Ipc|No Eligible|Block Limit" \
            "$OUT/ncu_${c}_${d}.txt" | head -30
    done
fi
if has ncufs && command -v ncu >/dev/null; then
    # one launch of a kernel inside bench fullstep's Lloyd run (bench gpu's first launches are its warm-up's)
    tag=ncufs_${NCUFS_CASE}_${NCUFS_DTYPE}_${NCUFS_KERNEL}
    echo "== ncu $NCUFS_KERNEL in bench fullstep $NCUFS_CASE $NCUFS_DTYPE (launch $NCUFS_SKIP)"
    ncu --clock-control none --kernel-name "regex:$NCUFS_KERNEL" --launch-skip "$NCUFS_SKIP" --launch-count 1 \
        --section SpeedOfLight --section MemoryWorkloadAnalysis --section ComputeWorkloadAnalysis \
        --section Occupancy --section WarpStateStats --section LaunchStats --section SchedulerStats \
        --section InstructionStats --section SourceCounters --import-source no -f -o "/tmp/$tag" \
        python3 -m mpikmeans bench fullstep --cases "$NCUFS_CASE" --dtype "$NCUFS_DTYPE" --iters 8 --repeats 1 \
        --no-torch --out "/tmp/$tag.json" > "$OUT/${tag}_run.log" 2>&1 || rc=1
    ncu -i "/tmp/$tag.ncu-rep" --page details --print-details all > "$OUT/$tag.txt" 2>&1 || rc=1
    ncu -i "/tmp/$tag.ncu-rep" --page source --csv --print-source sass > "/tmp/${tag}_source.csv" 2>&1 || rc=1
    python3 bench/experiments/ncu_sass_mix.py "/tmp/${tag}_source.csv" > "$OUT/${tag}_mix.txt" 2>&1 || rc=1
    grep -E "Duration|Issued Ipc|No Eligible|Registers Per|Achieved Occupancy" "$OUT/$tag.txt" | head -8
    head -14 "$OUT/${tag}_mix.txt"
fi
if has kernels && command -v ncu >/dev/null; then
    # every kernel of a step, in launch order, through whole Lloyd runs: which one a step waits for
    echo "== kernels of the steps: bench fullstep $KERNELS_ARGS"
    ncu --clock-control none --cache-control none --kernel-name regex:km_ --metrics gpu__time_duration.sum \
        --csv --page raw python3 -m mpikmeans bench fullstep $KERNELS_ARGS --no-torch --out /tmp/kernels_fs.json \
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
if has cpu; then
    echo "== CPU read / gen-data throughput"
    python3 -m mpikmeans bench cpu $CPU_ARGS --json "$OUT/cpu.json" 2>&1 | tee "$OUT/cpu.log"
    [[ ${PIPESTATUS[0]} -eq 0 ]] || rc=1
fi

if has parity; then
    echo "== GPU against CPU through the command line"
    python3 -m mpikmeans bench parity "$OUT/parity" $PARITY_ARGS 2>&1 | tee "$OUT/parity.log"
    [[ ${PIPESTATUS[0]} -eq 0 ]] || rc=1
fi

if has mpigpu; then
    echo "== GPUs under MPI: $MPI_GPU_NP ranks"
    read -r -a nps <<< "$MPI_GPU_NP"
    for np in "${nps[@]}"; do
        mpirun --allow-run-as-root --oversubscribe --bind-to none -np "$np" -x PYTHONPATH \
            python3 -m mpikmeans bench mpi-gpu --out "$OUT/mpi_gpu_np$np.json" $MPI_GPU_ARGS 2>&1 | tee -a "$OUT/mpi_gpu.log"
        [[ ${PIPESTATUS[0]} -eq 0 ]] || rc=1
    done
    for np in "${nps[@]:1}"; do
        python3 -m mpikmeans bench mpi-gpu --compare "$OUT/mpi_gpu_np${nps[0]}.json" "$OUT/mpi_gpu_np$np.json" \
            2>&1 | tee -a "$OUT/mpi_gpu.log"
        [[ ${PIPESTATUS[0]} -eq 0 ]] || rc=1
    done
fi

if has sweeps; then
    echo "== sweeps: $SWEEPS"
    # plots are drawn where matplotlib is (mpikmeans bench plot DIR)
    python3 -m mpikmeans bench run --full --sweeps "$SWEEPS" -o "$OUT/sweeps" --no-plots \
        --data-dir /tmp/mpikmeans-bench-data $SWEEP_ARGS 2>&1 | tee "$OUT/sweeps.log"
    [[ ${PIPESTATUS[0]} -eq 0 ]] || rc=1
fi
if has tts; then
    echo "== time to solution"
    python3 -m mpikmeans bench tts --out "$OUT/tts.json" $TTS_ARGS 2>&1 | tee "$OUT/tts.log"
    [[ ${PIPESTATUS[0]} -eq 0 ]] || rc=1
fi
if has compile; then
    echo "== first compile of every kernel"
    python3 -m mpikmeans bench compile --threads "$(nproc)" --out "$OUT/compile.json" $COMPILE_ARGS 2>&1 | tee "$OUT/compile.log"
    [[ ${PIPESTATUS[0]} -eq 0 ]] || rc=1
fi
if has fullstep; then
    echo "== full Lloyd steps against the floor and PyTorch"
    python3 -m mpikmeans bench fullstep --out "$OUT/fullstep.json" $FULLSTEP_ARGS 2>&1 | tee "$OUT/fullstep.log"
    [[ ${PIPESTATUS[0]} -eq 0 ]] || rc=1
fi
if has step; then
    echo "== CPU step against scikit-learn and oneDAL"
    python3 -m mpikmeans bench step --json "$OUT/step.json" $STEP_ARGS 2>&1 | tee "$OUT/step.log"
    [[ ${PIPESTATUS[0]} -eq 0 ]] || rc=1
fi
exit $rc
