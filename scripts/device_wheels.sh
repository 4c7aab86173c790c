#!/usr/bin/env bash
# The wheels that scripts/device_checks.sh needs on a lent GPU machine, whose image has no registry and
# lacks some of the suite's packages (pydantic, msgspec) or has other versions: the import closure of the
# checks' parts (the sim, the load generator, the SSE client, the telemetry), each pinned to the version
# in this checkout's .venv, as manylinux x86-64 wheels for the machine's Python (3.12 on the H200 image).
# The HTTP stack (aiohttp, uvloop) is carried even where the image has it: the client measured there is
# the one measured here. numpy, pandas and their own needs are not: the image has them (numpy 2.5.2, a
# newer one, per /work/.library/device/KINDS.md), the checks only pass data through them, and their 29 MiB
# would not fit beside this tree. Nor is vLLM (gigabytes): the client check's `vllm` row needs only its
# request function, vllm/benchmarks/lib/endpoint_request_func.py, copied from .venv into DIR/vllm-client
# as a package of that one module (it imports aiohttp, regex and tqdm: the image has the last two).
# It checks that the wheels fit what a device call carries (64 MiB with the working tree), then tries
# them: a local Python of that version (on PATH or pyenv's, if there is one) installs them alone, with
# stand-ins for the image's numpy and pandas, into a scratch folder and runs the checks' load-generator
# part on them, with no other site-packages in the way.
#
#   bash scripts/device_wheels.sh [DIR] [PYVER]    # default build/wheels312 3.12 (build/ is ignored)
#
# A device run then carries DIR (about 11 MiB) and starts with:
#   python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site DIR/*.whl &&
#   PYTHONPATH=/tmp/site:DIR/vllm-client:$PWD bash scripts/device_checks.sh "$OUT" python3
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${1:-build/wheels312}
pyver=${2:-3.12}
venv_py=.venv/bin/python
[ -x "$venv_py" ] || { echo "device_wheels: no $venv_py: run scripts/setup.sh first" >&2; exit 2; }
# what the checks import, and what those import in turn (pip download --no-deps fetches nothing else)
packages=(aiohttp aiohappyeyeballs aiosignal attrs frozenlist multidict propcache yarl idna msgspec uvloop
    pydantic pydantic-core annotated-types typing-extensions typing-inspection prometheus-client psutil pyyaml
    filelock cloudpickle)
image=(numpy pandas python-dateutil tzdata regex tqdm)  # the image's own: fetched only to try the wheels here

pin() {  # pin NAME...: NAME==its version in .venv, one a word
    "$venv_py" -c '
import sys
from importlib.metadata import PackageNotFoundError, version

missing = []
for name in sys.argv[1:]:
    try:
        print(f"{name}=={version(name)}")
    except PackageNotFoundError:
        missing.append(name)
if missing:
    sys.exit(f"device_wheels: not in .venv: {chr(32).join(missing)}")
' "$@"
}

platforms=()
for p in manylinux_2_28 manylinux_2_27 manylinux_2_24 manylinux_2_17 manylinux2014 manylinux_2_12 manylinux2010 \
    manylinux_2_5 manylinux1; do
    platforms+=(--platform "${p}_x86_64")
done
download() {  # download DIR PIN...: the wheels of PIN... for the device's Python into DIR
    local to=$1
    shift
    "$venv_py" -m pip download -q --no-deps --only-binary=:all: --python-version "$pyver" --implementation cp \
        "${platforms[@]}" -d "$to" "$@" 2> >(grep -v "^WARNING: Location" >&2)
}

pins=$(pin "${packages[@]}")
rm -rf "$dir"
mkdir -p "$dir"
# shellcheck disable=SC2086  # one pin a word
download "$dir" $pins
count=$(find "$dir" -name '*.whl' | wc -l)
[ "$count" -eq "${#packages[@]}" ] || { echo "device_wheels: $count wheels for ${#packages[@]} packages" >&2; exit 1; }
client=$("$venv_py" -c 'import importlib.util as u; print(u.find_spec("vllm").submodule_search_locations[0])')
mkdir -p "$dir/vllm-client/vllm/benchmarks/lib"
touch "$dir/vllm-client/vllm/__init__.py" "$dir/vllm-client/vllm/benchmarks/__init__.py" \
    "$dir/vllm-client/vllm/benchmarks/lib/__init__.py"
cp "$client/benchmarks/lib/endpoint_request_func.py" "$dir/vllm-client/vllm/benchmarks/lib/"
# what a device call carries: the working tree (tracked and untracked-not-ignored files) and DIR
tree=$(git ls-files -z -co --exclude-standard | du -cb --files0-from=- | tail -1 | cut -f1)
wheels=$(du -sb "$dir" | cut -f1)
echo "device_wheels: $count wheels, $((wheels >> 20)) MiB, in $dir; with the working tree $(((tree + wheels) >> 20)) MiB"
[ $((tree + wheels)) -lt $((64 << 20)) ] || { echo "device_wheels: over the 64 MiB a device call carries" >&2; exit 1; }

py=""
for candidate in "$(command -v "python$pyver" || true)" "${PYENV_ROOT:-$HOME/.pyenv}"/versions/"$pyver".*/bin/python"$pyver"; do
    if [ -n "$candidate" ] && [ -x "$candidate" ] && "$candidate" -c '' 2> /dev/null; then
        py=$candidate
        break
    fi
done
if [ -z "$py" ]; then
    echo "device_wheels: no python$pyver here: the wheels are not tried" >&2
    exit 0
fi
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
image_pins=$(pin "${image[@]}")
# shellcheck disable=SC2086  # one pin a word
download "$scratch/image" $image_pins
PIP_ROOT_USER_ACTION=ignore "$py" -m pip install -q --no-index --no-deps --no-compile --target "$scratch/site" "$dir"/*.whl "$scratch"/image/*.whl
site=(env PYTHONPATH="$scratch/site:$dir/vllm-client:$PWD" "$py" -S)  # -S: no site-packages but these
"${site[@]}" -c 'import engine_harness.sim, engine_harness.telemetry, microbench.loadgen.workers
import vllm.benchmarks.lib.endpoint_request_func'
# the load generator's part of device_checks.sh, small
"${site[@]}" scripts/bench_loadgen_rate.py --server canned --sims 1 --workers 1 --rates 500 --seconds 0.5 \
    --reps 1 > "$scratch/run.log" 2>&1 ||
    { tail -20 "$scratch/run.log" >&2; echo "device_wheels: the wheels did not run the load generator" >&2; exit 1; }
echo "device_wheels: $("$py" -c 'import sys; print(sys.version.split()[0])') ran the load generator's check on them"
