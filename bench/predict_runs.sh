# predict of A (a K = 50 model) as a user types it (no --backend: auto) and on each backend, three whole commands
# each, after the run that makes the model; labels compared. Usage: bash bench/predict_runs.sh A.npy
# (a warm cache: MPIKMEANS_CACHE_DIR as the runs)
A=$1
python3 -m mpikmeans run "$A" -k 50 --seed 1 -o /tmp/a50 --overwrite -q
for b in auto gpu cpu auto gpu cpu auto gpu cpu; do
  flag=(); [[ $b != auto ]] && flag=(--backend "$b")
  s=$(date +%s.%N)
  python3 -m mpikmeans predict /tmp/a50/model.json "$A" "${flag[@]}" -o /tmp/p_$b --overwrite -q
  e=$(date +%s.%N)
  python3 - "$b" "$s" "$e" /tmp/p_$b/summary.json <<'PY'
import json, sys
b, s, e, f = sys.argv[1], float(sys.argv[2]), float(sys.argv[3]), sys.argv[4]
summary = json.load(open(f))
t = summary.get("timings", {})
print(f"predict (--backend {b}, ran on {summary['backend']}): whole command {e - s:.2f} s; "
      + ", ".join(f"{k} {v:.3f}" for k, v in t.items() if isinstance(v, (int, float))))
PY
done
cmp /tmp/p_gpu/labels.txt /tmp/p_cpu/labels.txt && echo "labels: GPU and CPU identical"
cmp /tmp/p_auto/labels.txt /tmp/a50/labels.txt && echo "labels: the run's"
