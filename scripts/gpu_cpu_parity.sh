#!/usr/bin/env bash
# GPU and CPU backends through the real command line, under mpirun, on one generated file:
# labels identical, centres within 1e-9 relative (float64 on the GPU), SSE and sizes
# compared; float32 on the GPU is reported beside them.
#
#   NP=2 bash scripts/gpu_cpu_parity.sh RESULT_DIR        (N, M, K, SEED, DATA, RUN_ARGS override)
#   NUMBA_ENABLE_CUDASIM=1 NP=2 N=3000 M=4 K=3 RUN_ARGS=--share-gpus bash scripts/gpu_cpu_parity.sh /tmp/p
#
# Each rank takes its node-local GPU (--backend gpu); the CPU runs use the same ranks.
# Writes RESULT_DIR/parity.json and prints one line per comparison; exits 1 on a mismatch.
set -euo pipefail
cd "$(dirname "$0")/.."
RES=${1:-/tmp/gpu_cpu_parity}
NP=${NP:-2}
N=${N:-2000000}
M=${M:-20}
K=${K:-12}
SEED=${SEED:-3}
DATA=${DATA:-/tmp/gpu_cpu_parity.arff}
read -r -a EXTRA <<< "${RUN_ARGS:-}"
mkdir -p "$RES"
MPI=(mpirun --allow-run-as-root --oversubscribe --bind-to none -np "$NP" ${PYTHONPATH:+-x PYTHONPATH})
python3 -m mpikmeans gen-data "$DATA" -n "$N" -m "$M" -k "$K" --seed "$SEED" -q
for run in cpu:float64 gpu:float64 gpu:float32; do
    b=${run%%:*}; d=${run##*:}
    "${MPI[@]}" python3 -m mpikmeans run "$DATA" -k "$K" --seed 5 --backend "$b" --dtype "$d" \
        -o "$RES/${b}_${d}" --overwrite -q "${EXTRA[@]}"
done
python3 - "$RES" "$NP" <<'PY'
import json, sys
import numpy as np
res, np_ = sys.argv[1], int(sys.argv[2])
def load(name):
    d = f"{res}/{name}"
    s = json.load(open(f"{d}/summary.json"))
    return (np.loadtxt(f"{d}/labels.txt", dtype=np.int64), np.loadtxt(f"{d}/centers.csv", delimiter=",", skiprows=1,
            ndmin=2), s)
lc, cc, sc = load("cpu_float64")
out = {"ranks": np_, "n": sc["n"], "m": sc["m"], "k": sc["k"], "cpu": {"iterations": sc["iterations"],
       "inertia": sc["inertia"], "devices": sc["devices"]}, "gpu": {}}
ok = True
for d, tol in (("float64", 1e-9), ("float32", 1e-5)):
    lg, cg, sg = load(f"gpu_{d}")
    rel = float(np.abs(cg - cc).max() / np.abs(cc).max())
    r = {"labels_identical": bool(np.array_equal(lc, lg)), "centres_max_rel_diff": rel,
         "inertia_rel_diff": abs(sg["inertia"] - sc["inertia"]) / sc["inertia"],
         "sizes_equal": sg["sizes"] == sc["sizes"], "iterations": sg["iterations"], "devices": sg["devices"],
         "backend": sg["backend"], "dtype": sg["dtype"], "per_iteration_s": sg["timings"]["per_iteration_s"]}
    r["ok"] = r["labels_identical"] and rel <= tol and r["sizes_equal"] and sg["backend"] == "gpu"
    ok &= r["ok"]
    out["gpu"][d] = r
    print(f"np={np_} gpu {d} vs cpu float64: labels identical {r['labels_identical']}, centres max rel diff "
          f"{rel:.2e} (tol {tol:g}), inertia rel diff {r['inertia_rel_diff']:.2e}, iterations {r['iterations']} "
          f"vs {sc['iterations']}, devices {r['devices']}: {'OK' if r['ok'] else 'MISMATCH'}")
json.dump(out, open(f"{res}/parity.json", "w"), indent=1)
sys.exit(0 if ok else 1)
PY
