# predict of A (a K = 50 model) on the GPU and on the CPU backend, three whole commands each, after the run that makes
# the model; labels compared. Usage: bash bench/predict_runs.sh A.npy   (a warm cache: MPIKMEANS_CACHE_DIR as the runs)
A=$1
python3 -m mpikmeans run "$A" -k 50 --seed 1 -o /tmp/a50 --overwrite -q
for b in gpu cpu gpu cpu gpu cpu; do
  s=$(date +%s.%N)
  python3 -m mpikmeans predict /tmp/a50/model.json "$A" --backend $b -o /tmp/p_$b --overwrite -q
  e=$(date +%s.%N)
  python3 - "$b" "$s" "$e" /tmp/p_$b/summary.json <<'PY'
import json, sys
b, s, e, f = sys.argv[1], float(sys.argv[2]), float(sys.argv[3]), sys.argv[4]
t = json.load(open(f)).get("timings", {})
print(f"predict --backend {b}: whole command {e - s:.2f} s; " + ", ".join(f"{k} {v:.3f}" for k, v in t.items() if isinstance(v, (int, float))))
PY
done
cmp /tmp/p_gpu/labels.txt /tmp/p_cpu/labels.txt && echo "labels: GPU and CPU identical"
cmp /tmp/p_gpu/labels.txt /tmp/a50/labels.txt && echo "labels: the run's"
