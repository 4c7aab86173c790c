#!/usr/bin/env bash
# The calibration loop on the embedded default (README "Observe, predict, calibrate"), in one step: the fit
# sweep (sweeps/calibrate-vllm-cpu.yaml), the engine observed under both workloads right after it (same
# settings: chunk 2048, max_model_len 16384, every step logged, the worker isolated on its core with the
# client beside the engine's other processes), then predictions and reports.
#
#   bash scripts/calibrate_vllm_cpu.sh OUT     # OUT: a new folder, e.g. results/calibrate-vllm-cpu-new
#
# About 11 minutes on a 2-core box (sweep ≈ 2.5 min with its engine start, the engine start ≈ 1 min, two
# 90 s workloads each run twice, predictions in seconds). Run it on a quiet machine: on a shared 2-core box the load
# moves the engine's decode steps by up to 2× in stretches of seconds (README), more than the model
# misses. The box's load average is sampled every 5 s into OUT/loadavg.txt; say it next to the figures.
# Writes OUT/{fit, serve, observe-W, predict-W, report-W} for W in poisson, bursty, poisson-repeat,
# bursty-repeat, and OUT/*.log.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ $# -ne 1 ]; then
    echo "usage: bash scripts/calibrate_vllm_cpu.sh OUT" >&2
    exit 2
fi
out=$1
if [ -e "$out" ]; then
    echo "$out exists: give a new folder (nothing is overwritten)" >&2
    exit 2
fi
mkdir -p "$out"
py=.venv/bin/python
export PYTHONPATH=$PWD
port=${CALIBRATE_PORT:-8137}

(while true; do echo "$(date +%s) $(cat /proc/loadavg)"; sleep 5; done) > "$out/loadavg.txt" &
sampler=$!
serve=""
cleanup() {
    kill "$sampler" 2>/dev/null || true
    if [ -n "$serve" ]; then kill -TERM "$serve" 2>/dev/null || true; wait "$serve" 2>/dev/null || true; fi
}
trap cleanup EXIT

echo "fit sweep: $(date -u +%T), load $(cut -d' ' -f1-3 /proc/loadavg)"
$py -m microbench.sweep --config sweeps/calibrate-vllm-cpu.yaml --out "$out/fit" > "$out/sweep.log" 2>&1

$py -m engine_harness serve --chunk 2048 --max-model-len 16384 --log-iteration-details --isolate-worker \
    --port "$port" --out "$out/serve" > "$out/serve.log" 2>&1 &
serve=$!
for _ in $(seq 300); do
    grep -q "ready in" "$out/serve.log" && break
    kill -0 "$serve" 2>/dev/null || { echo "the engine did not start: $out/serve.log" >&2; exit 1; }
    sleep 1
done
grep -q "ready in" "$out/serve.log" || { echo "the engine was not ready in 300 s: $out/serve.log" >&2; exit 1; }
# the client on the engine's host cores, off its worker's (serve --isolate-worker prints them)
client_cores=$(sed -n 's/.*, the rest on \([0-9,-]*\): .*/\1/p' "$out/serve.log")

# each workload twice, same seeded schedule, a new prompt salt (cold): the repeat is the engine against
# itself, the floor no deterministic prediction gets under on this box (report --repeat)
for w in poisson bursty poisson-repeat bursty-repeat; do
    echo "observe $w: $(date -u +%T), load $(cut -d' ' -f1-3 /proc/loadavg)"
    taskset -c "$client_cores" $py -m microbench.loadgen run --workload "sweeps/workloads/calibrate-${w%-repeat}.yaml" \
        --url "http://127.0.0.1:$port" --duration 90s --warmup-requests 8 --out "$out/observe-$w" > "$out/loadgen-$w.log" 2>&1
done
kill -TERM "$serve"
wait "$serve" || true
serve=""

for w in poisson bursty poisson-repeat bursty-repeat; do
    $py -m analysis.calibrate predict "$out/observe-$w" --model "$out/fit" --out "$out/predict-$w" \
        > "$out/predict-$w.log" 2>&1
done
for w in poisson bursty; do
    for pair in "$w $w-repeat" "$w-repeat $w"; do
        set -- $pair
        $py -m analysis.calibrate report "$out/observe-$1" "$out/predict-$1" --repeat "$out/observe-$2" \
            --engine-log "$out/serve/engine.log" --out "$out/report-$1" > "$out/report-$1.log" 2>&1
        echo "== $1"
        grep -A5 "^| metric" "$out/report-$1/calibration.md"
        grep -A8 "^## Repeatability" "$out/report-$1/calibration.md"
    done
done
echo "done: $(date -u +%T), load $(cut -d' ' -f1-3 /proc/loadavg); the run's load: $out/loadavg.txt"
