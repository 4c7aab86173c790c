#!/usr/bin/env bash
# SGLang in its own environment, .venv-sglang (called by scripts/setup.sh for SETUP_ENGINE=sglang or
# sglang-cpu, and with CI=true on a box without a GPU). Its torch pin (2.14.1) conflicts with vLLM's, so it
# never shares .venv. Constrained by constraints/sglang-TARGET.txt like every set-up (scripts/setup-lib.sh).
#
#   bash scripts/setup-sglang.sh gpu   # a CUDA box: sglang==0.5.23 with its own dependencies
#   bash scripts/setup-sglang.sh cpu   # a CPU box: the recipe below
#
# The CPU recipe (docs/design.md §2):
#   - torch==2.14.1 (SGLang's pin) and a matching torchvision from the registry (its CUDA build runs on CPU);
#   - sglang==0.5.23 without its dependencies, then its own dependency list minus the CUDA-only packages
#     below, constrained to that torch;
#   - scripts/sgl_kernel_standin: SGLang imports `sgl_kernel` while starting; the CPU build of that
#     package is not published, and the stand-in raises NotImplementedError if a kernel is ever called.
# Idempotent like setup.sh: a stamp of this script, the stand-in and the lock; ≈ 7 GB on first install.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/setup-lib.sh
start=$(date +%s)
PYTHON=${PYTHON:-python3}
target=${1:-cpu}
case "$target" in
    cpu|gpu) ;;
    *) echo "setup: scripts/setup-sglang.sh takes cpu or gpu (got '$target')" >&2; exit 1 ;;
esac
use_lock "sglang-$target"
SGLANG_VERSION=0.5.23
TORCH_VERSION=2.14.1
# Dependencies of sglang that are CUDA-only (or pull a second torch); none is imported on the CPU path.
CUDA_ONLY="apache-tvm-ffi cuda-python deepseek-recipe flash-attn-4 flashinfer-python humming-kernels
nvidia-cutlass-dsl nvidia-mathdx nvshmem4py-cu13 quack-kernels sgl-deep-ep sgl-deep-gemm sgl-flash-mla
sglang-kernel tilelang tml-renderers torch-memory-saver torchaudio torchcodec torch torchvision"

venv=.venv-sglang
py="$venv/bin/python"
stamp="$venv/.setup-stamp"
want="$(cat scripts/setup-sglang.sh scripts/setup-lib.sh scripts/sgl_kernel_standin/pyproject.toml \
    scripts/sgl_kernel_standin/sgl_kernel/__init__.py | sha256sum | cut -c1-16) sglang==$SGLANG_VERSION $target $LOCK_ID"
found="import importlib.util as u, sys; sys.exit(any(u.find_spec(m) is None for m in sys.argv[1:]))"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] && "$py" -c "$found" sglang sgl_kernel torch 2>/dev/null; then
    echo "setup: up to date (SGLang $SGLANG_VERSION, $target, $venv)"
    exit 0
fi

echo "setup: installing SGLang $SGLANG_VERSION ($target) into $venv (${LOCK:-newest versions, unlocked}; first time: several minutes, ≈ 7 GB)"
if [ ! -x "$py" ]; then
    # A full disk here stopped a CI run half-way through pip (2026-11-23): check first.
    need_disk 9 "SGLang for CPU in a fresh $venv"
    "$PYTHON" -m venv "$venv"
fi
pip_install "$py" --upgrade pip
if [ "$target" = gpu ]; then
    pip_install "$py" "sglang==$SGLANG_VERSION" nvidia-ml-py
    "$py" -c "import sgl_kernel, sglang.srt.server_args" || {
        echo "setup: SGLang does not import in $venv (see the error above)" >&2; exit 1; }
    echo "$want" > "$stamp"
    echo "setup: done in $(( $(date +%s) - start )) s (SGLang $SGLANG_VERSION, gpu, $venv)"
    exit 0
fi
pip_install "$py" "torch==$TORCH_VERSION" torchvision packaging
pip_install "$py" --no-deps "sglang==$SGLANG_VERSION"
# sglang's own (non-extra) requirements, minus the CUDA-only ones, pinned to the torch above.
"$py" - "$venv/sglang-cpu-requirements.txt" "$venv/sglang-cpu-constraints.txt" $CUDA_ONLY <<'PY'
import importlib.metadata as md
import sys

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

requirements_path, constraints_path, *skip = sys.argv[1:]
skipped = {canonicalize_name(name) for name in skip}
kept = []
for line in md.requires("sglang") or []:
    req = Requirement(line)
    if req.marker is not None and not req.marker.evaluate({"extra": ""}):
        continue
    if canonicalize_name(req.name) in skipped:
        continue
    req.marker = None
    kept.append(str(req))
with open(requirements_path, "w") as f:
    f.write("\n".join(kept) + "\n")
with open(constraints_path, "w") as f:
    f.write(f"torch=={md.version('torch')}\ntorchvision=={md.version('torchvision')}\n")
print(f"setup: {len(kept)} of sglang's requirements kept, {len(skipped)} CUDA-only ones left out")
PY
# pip then lists the CUDA-only requirements left out above as missing: that is on purpose, not shown.
PIP_HIDE="is ignored|^sglang $SGLANG_VERSION requires |^ERROR: pip's dependency resolver" \
    pip_install "$py" -r "$venv/sglang-cpu-requirements.txt" -c "$venv/sglang-cpu-constraints.txt"
pip_install "$py" --no-deps --force-reinstall ./scripts/sgl_kernel_standin
# The server's argument parser imports most of SGLang's server side.
SGLANG_USE_CPU_ENGINE=1 "$py" -c "import sgl_kernel, sglang.srt.server_args" || {
    echo "setup: SGLang does not import in $venv (see the error above)" >&2; exit 1; }
echo "$want" > "$stamp"
echo "setup: done in $(( $(date +%s) - start )) s (SGLang $SGLANG_VERSION, cpu, $venv)"
