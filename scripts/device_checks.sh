#!/usr/bin/env bash
# The checks that need a GPU or more cores than a 2-core box, in one run, for a GPU machine with many
# cores (written for one H200 with 16 cores; any CUDA machine with ≥ 10 cores does):
#   1. the machine: CPU model, cores, GPUs (nvidia-smi);
#   2. the GPU tier: pytest -m gpu (NVML telemetry through nvidia-ml-py) and the telemetry unit tests,
#      then NVML's cost per sample (NvmlSource.read over every metric of the engine's GPUs);
#   3. the load generator past one core (scripts/bench_loadgen_rate.py): 4 canned responders on the top 4
#      cores (one write of the sim's stream per request, ~25 us of CPU: the sims, 500-700 us a request,
#      were what fell behind on the H200 machines), 1, 2, 4 and 8 worker processes pinned to cores
#      0..N-1, rates up to 48000 req/s;
#   4. the SSE client against the bare stamping client and vllm bench serve's (scripts/bench_client.py
#      --quick), client on core 0, server on the last core.
# Each part has its own time limit and runs whether or not the one before passed; the exit status says
# whether every part passed. Writes OUT/{machine.txt, gpu.log, loadgen.json, loadgen.log, client.json,
# client.log}.
#
#   bash scripts/device_checks.sh OUT [PYTHON]     # PYTHON: default .venv/bin/python
# On the H200 image (no registry, no pydantic): build/wheels312 from scripts/device_wheels.sh here, then
# a device run that carries build/wheels312 and runs
#   python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site build/wheels312/*.whl &&
#   PYTHONPATH=/tmp/site:build/wheels312/vllm-client:$PWD bash scripts/device_checks.sh "$OUT" python3
#   LOADGEN_ARGS="--sims 1 --workers 1 --rates 500 --seconds 1 --reps 1" CLIENT_ARGS="--reps 2" \
#       bash scripts/device_checks.sh OUT              # a dry run of every part on a small box
set -uo pipefail
cd "$(dirname "$0")/.."
if [ $# -lt 1 ]; then
    echo "usage: bash scripts/device_checks.sh OUT [PYTHON]" >&2
    exit 2
fi
out=$1
py=${2:-.venv/bin/python}
mkdir -p "$out"
export PYTHONUNBUFFERED=1
failed=()
part() {  # part NAME SECONDS LOG COMMAND...: one part under its own limit, its output in LOG and here
    local name=$1 limit=$2 log=$3
    shift 3
    echo "== $name ($(date -u +%T), limit ${limit} s)"
    timeout --kill-after=10 "$limit" "$@" 2>&1 | tee -a "$log"
    local rc=${PIPESTATUS[0]}
    [ "$rc" -eq 0 ] || failed+=("$name (exit $rc)")
}

{
    echo "date: $(date -u +%FT%TZ)"
    echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ //'), $(nproc) cores usable"
    echo "memory: $(awk '/MemTotal/ {printf "%.0f GiB", $2 / 1048576}' /proc/meminfo)"
    echo "python: $("$py" -c 'import sys; print(sys.version.split()[0])')"
    nvidia-smi -L 2>&1 || echo "nvidia-smi: none"
    nvidia-smi --query-gpu=driver_version,clocks.sm,clocks.max.sm,power.draw,temperature.gpu --format=csv 2>&1
} | tee "$out/machine.txt"

part "GPU tier" 120 "$out/gpu.log" "$py" -m pytest tests/gpu tests/unit/test_telemetry.py -p no:cacheprovider \
    -o addopts="-ra --strict-markers" -v
nvidia-smi -L > /dev/null 2>&1 && part "NVML cost per sample" 60 "$out/gpu.log" "$py" - <<'EOF'
import time

import numpy as np

from engine_harness.telemetry import NvmlSource

src = NvmlSource()
src.read()
costs = []
for _ in range(300):
    t0 = time.perf_counter_ns()
    readings = src.read()
    costs.append(time.perf_counter_ns() - t0)
src.close()
us = np.array(costs) / 1e3
print(f"NvmlSource.read: {len(readings)} readings of {src.devices}; per sample p50 {np.median(us):.0f} us, "
      f"p99 {np.percentile(us, 99):.0f} us, over 300 samples; at the sampler's 50 ms: "
      f"{np.median(us) / 50_000:.2%} of a core")
EOF
loadgen_args=${LOADGEN_ARGS:-"--server canned --sims 4 --workers 1 2 4 8 --rates 4000 8000 16000 24000 \
32000 48000 --seconds 1.5 --reps 2"}
# shellcheck disable=SC2086  # the arguments are words
part "load generator past one core" 300 "$out/loadgen.log" "$py" scripts/bench_loadgen_rate.py $loadgen_args \
    --out "$out/loadgen.json"
# shellcheck disable=SC2086
part "client ingest and fidelity" 200 "$out/client.log" "$py" scripts/bench_client.py --quick ${CLIENT_ARGS:-} \
    --out "$out/client.json"

if [ "${#failed[@]}" -gt 0 ]; then
    echo "device checks: failed: ${failed[*]}" >&2
    exit 1
fi
echo "device checks: every part passed"
