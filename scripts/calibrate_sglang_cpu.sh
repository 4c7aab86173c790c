#!/bin/bash
# Issue 36's calibration loop on CPU SGLang in one go, for a quiet box: the fit sweep
# (sweeps/calibrate-sglang-cpu.yaml), then each workload observed on a freshly started engine, predicted
# from the fit and compared (README "Observe, predict, calibrate"; results/README.md
# "calibrate-sglang-cpu"). /proc/loadavg is logged every 5 s to OUT/loadavg.txt: quote it with the figures.
#   flock /tmp/engine.lock scripts/calibrate_sglang_cpu.sh OUT [PRESET]   (OUT: a new folder, e.g. /tmp/calq-sgl)
# PRESET: sglang-cpu (default scheduling: a prefill step runs instead of the decodes) or sglang-cpu-mixed
# (--enable-mixed-chunk: the decodes ride in every prefill step); the fit and both engines use it.
# Holds the engine lock for about 24 min (sweep ≈ 3.5 min, two engines ≈ 1 min each to start, each workload
# observed twice on its engine: 4 × 280 s).
# Both the fit's engine and the observed ones isolate SGLang's scheduler on every core but the last, with
# the rest of the engine and the client on the last (isolate_worker).
# Every step's console output is in OUT/*.log; the reports are OUT/report-W/calibration.md for W in poisson,
# bursty, poisson-repeat, bursty-repeat (each run against the other as its repeat).
set -u
OUT=${1:?usage: scripts/calibrate_sglang_cpu.sh OUT [sglang-cpu|sglang-cpu-mixed]}
PRESET=${2:-sglang-cpu}
case "$PRESET" in sglang-cpu|sglang-cpu-mixed) ;; *) echo "PRESET must be sglang-cpu or sglang-cpu-mixed, not $PRESET" >&2; exit 2;; esac
cd "$(dirname "$0")/.."
export PYTHONPATH=$PWD
mkdir -p "$OUT"
(while true; do echo "$(date -u +%T) $(cat /proc/loadavg)"; sleep 5; done) > "$OUT/loadavg.txt" &
LOADAVG=$!
trap 'kill $LOADAVG 2>/dev/null' EXIT
echo "sweep start $(date -u +%T) $(cat /proc/loadavg)"
.venv/bin/python -m microbench.sweep --config sweeps/calibrate-sglang-cpu.yaml --preset "$PRESET" --out "$OUT/fit" > "$OUT/sweep.log" 2>&1 \
  || { echo "the sweep failed: $OUT/sweep.log"; exit 1; }
for W in poisson bursty; do
  .venv/bin/python -m engine_harness serve --engine sglang --preset "$PRESET" --chunk 2048 --max-model-len 16384 \
    --log-iteration-details --isolate-worker --out "$OUT/serve-$W" > "$OUT/serve-$W.log" 2>&1 &
  ENGINE=$!
  for _ in $(seq 200); do grep -q "ready in" "$OUT/serve-$W.log" && break; kill -0 $ENGINE 2>/dev/null || break; sleep 1; done
  URL=$(grep -o "ready in [0-9.]* s: http://[0-9.:]*" "$OUT/serve-$W.log" | grep -o "http://.*")
  [ -n "$URL" ] || { echo "the engine did not start: $OUT/serve-$W.log"; kill $ENGINE 2>/dev/null; exit 1; }
  # the client on the engine's host cores, off its scheduler's (serve --isolate-worker prints them)
  CORES=$(sed -n 's/.*, the rest on \([0-9,-]*\): .*/\1/p' "$OUT/serve-$W.log")
  # the workload twice on this engine, same seeded schedule, a new prompt salt (cold): the repeat is the
  # engine against itself, the floor no deterministic prediction gets under on this box (report --repeat)
  for T in "$W" "$W-repeat"; do
    echo "observe $T start $(date -u +%T) $(cat /proc/loadavg)"
    taskset -c "$CORES" .venv/bin/python -m microbench.loadgen run --workload "sweeps/workloads/calibrate-$W.yaml" --url "$URL" \
      --duration 280s --warmup-requests 8 --rate 0.75 --out "$OUT/observe-$T" > "$OUT/loadgen-$T.log" 2>&1
    echo "observe $T rc=$? end $(date -u +%T) $(cat /proc/loadavg)"
  done
  kill -TERM $ENGINE; wait $ENGINE
  for T in "$W" "$W-repeat"; do
    .venv/bin/python -m analysis.calibrate predict "$OUT/observe-$T" --model "$OUT/fit" --out "$OUT/predict-$T" \
      > "$OUT/predict-$T.log" 2>&1
  done
  for PAIR in "$W $W-repeat" "$W-repeat $W"; do
    set -- $PAIR
    .venv/bin/python -m analysis.calibrate report "$OUT/observe-$1" "$OUT/predict-$1" --repeat "$OUT/observe-$2" \
      --engine-log "$OUT/serve-$W/engine.log" --out "$OUT/report-$1" > "$OUT/report-$1.log" 2>&1
    echo "== $1"; cat "$OUT/predict-$1.log" "$OUT/report-$1.log"
  done
done
echo "done $(date -u +%T)"
