python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD || exit 1
unset PYTHONDONTWRITEBYTECODE; export PYTHONPYCACHEPREFIX=/tmp/pycache PYTHONUNBUFFERED=1
python3 -c 'import sys; from mpikmeans.bench.bytecode import compile_packages; print(compile_packages(sys.argv[1:]))' numpy numba numba_cuda llvmlite scipy mpi4py click sklearn joblib threadpoolctl cuda mpikmeans
M="mpirun --allow-run-as-root --bind-to none --oversubscribe -x PYTHONPATH -x PYTHONUNBUFFERED -x PYTHONPYCACHEPREFIX"
D=/dev/shm/spec.arff
[ -f $D ] || $M -np 16 python3 -m mpikmeans gen-data $D -n 5000000 -m 100 -k 50 -q
python3 -m mpikmeans warmup $D -k 50 --gpu -q
[ -f /dev/shm/spec.npy ] || python3 -m mpikmeans convert $D /dev/shm/spec.npy -q
python3 bench/experiments/gpu_start_vs_read.py $D 50 3 $OUT/gsr_arff.json --no-load --variants=gpu,gpu-early,cpu | tee $OUT/gsr_arff.log
python3 bench/experiments/gpu_start_vs_read.py /dev/shm/spec.npy 50 3 $OUT/gsr_npy.json --no-load --variants=gpu,gpu-early | tee $OUT/gsr_npy.log
$M -np 1 python3 -X importtime -m mpikmeans run $D -k 50 -o /tmp/o --overwrite -q 2> $OUT/importtime.txt
$M -np 1 python3 -c "import time; t=time.perf_counter(); from mpi4py import MPI; print('mpi4py import + MPI_Init', time.perf_counter()-t)" | tee $OUT/mpi_init.txt
$M -np 1 python3 -m cProfile -o /tmp/run.prof -m mpikmeans run $D -k 50 -o /tmp/o --overwrite -q
python3 -c "import pstats; s=pstats.Stats('/tmp/run.prof'); s.sort_stats('cumulative').print_stats(90); s.sort_stats('tottime').print_stats(40)" > $OUT/profile_run_pyc.txt
python3 -c "import json; print(json.load(open('/tmp/o/summary.json'))['timings'])" | tee -a $OUT/profile_run_pyc.txt
