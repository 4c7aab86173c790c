#!/usr/bin/env bash
# See the next break coming, and refresh the locks. Not part of the README's test command.
#
#   bash scripts/newest.sh            # install the newest versions in a throwaway copy, run the fast tiers,
#                                     # print what fails and which versions differ from constraints/*.txt
#   bash scripts/newest.sh --write    # the same, then write the new constraints/*.txt if the tiers pass:
#                                     # commit that alone ("Refresh the locks"), and let CI judge it
#   bash scripts/newest.sh --write --force   # write them even though a test failed: only after judging
#                                     # each failure unrelated to the versions (a timing test on a busy box)
#
# What it builds, all in a temporary folder it deletes at the end (≈ 12 GB while it runs):
#   cpu         .venv of a copy of this working tree: SETUP_UNLOCKED=1 SETUP_ENGINE=cpu scripts/setup.sh;
#               the fast tiers (NEWEST_TESTS, default: -m "not e2e") run in it
#   sglang-cpu  .venv-sglang of the same copy: SETUP_UNLOCKED=1 scripts/setup-sglang.sh cpu
#   gpu         CUDA vLLM with the suite's extras and nixl-cu13, and
#   sglang-gpu  SGLang's CUDA build: resolved by pip for this platform (x86-64 Linux, this Python) with
#               `pip install --dry-run --report`, not installed — no GPU here to run them on.
# A lock lists every distribution of its environment at the version installed (pip freeze, less the suite
# itself and local stand-ins): pip takes it with -c, so it pins what gets installed and adds nothing.
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$(pwd)
write=0
force=0
for arg in "$@"; do
    case "$arg" in
        --write) write=1 ;;
        --force) force=1 ;;
        *) echo "usage: bash scripts/newest.sh [--write [--force]]" >&2; exit 2 ;;
    esac
done
PYTHON=${PYTHON:-python3}
tests=${NEWEST_TESTS:-"-m 'not e2e'"}
source scripts/setup-lib.sh
need_disk 14 "the throwaway environments of scripts/newest.sh"
work=$(mktemp -d "${TMPDIR:-/tmp}/newest.XXXXXX")
trap 'rm -rf "$work"' EXIT
start=$(date +%s)

# A copy of the working tree as git sees it (tracked and untracked-not-ignored files), not the venvs.
git ls-files -z --cached --others --exclude-standard \
    | tar --null -T - --ignore-failed-read -cf - 2>/dev/null | tar -xf - -C "$work"
cd "$work"
mkdir -p new

freeze() {  # freeze PYTHON OUT: the environment's versions, less the suite and path installs
    "$1" -m pip freeze --exclude-editable 2>/dev/null | grep -v -E ' @ |^-e |^pd-interference-bench==' | sort -f > "$2"
}
resolve() {  # resolve OUT PIP-ARGS...: what pip would install here, from a dry run's report
    local out=$1
    shift
    .venv/bin/python -m pip install -q --dry-run --ignore-installed --report "$work/report.json" "$@" >/dev/null
    .venv/bin/python - "$work/report.json" <<'PY' | sort -f > "$out"
import json, sys
for item in json.load(open(sys.argv[1]))["install"]:
    meta = item["metadata"]
    if meta["name"] != "pd-interference-bench":
        print(f"{meta['name']}=={meta['version']}")
PY
}

echo "newest: cpu — setting up the suite with vLLM's CPU build, newest versions"
SETUP_UNLOCKED=1 SETUP_ENGINE=cpu CI= PYTHON="$PYTHON" bash scripts/setup.sh
freeze .venv/bin/python new/cpu.txt
echo "newest: sglang-cpu — SGLang's CPU recipe, newest versions"
SETUP_UNLOCKED=1 PYTHON="$PYTHON" bash scripts/setup-sglang.sh cpu
freeze .venv-sglang/bin/python new/sglang-cpu.txt

echo "newest: gpu and sglang-gpu — resolved by pip for this platform, not installed"
resolve new/gpu.txt -e ".[gpu,analysis,dev,ray]" "nixl-cu13==1.5.1" "nixl==1.5.1"
resolve new/sglang-gpu.txt "sglang==0.5.23" nvidia-ml-py

# The tiers run on the newest versions and judge the new locks too (tests/unit/test_setup_lib.py reads them).
mkdir -p constraints && cp new/*.txt constraints/
echo "newest: cpu — running the fast tiers: pytest $tests"
set +e
eval ".venv/bin/python -m pytest -q -p no:cacheprovider $tests" > "$work/tests.log" 2>&1
tests_rc=$?
set -e
grep -E "^(FAILED|ERROR) " "$work/tests.log" || true
tail -n 5 "$work/tests.log"

for name in cpu sglang-cpu gpu sglang-gpu; do
    old="$repo/constraints/$name.txt"
    diff_out=$(diff <(grep -v '^#' "$old" 2>/dev/null | sort -f) new/$name.txt | grep -E '^[<>]' || true)
    if [ -n "$diff_out" ]; then
        echo "newest: $name differs from constraints/$name.txt (< locked, > newest):"
        echo "$diff_out" | sed 's/^/    /'
    else
        echo "newest: $name: the lock is the newest"
    fi
done
echo "newest: done in $(( $(date +%s) - start )) s; fast tiers exit code $tests_rc"
if [ "$write" = 1 ]; then
    if [ "$tests_rc" -ne 0 ] && [ "$force" = 0 ]; then
        echo "newest: the fast tiers fail on the newest versions: the locks are left as they are" >&2
        exit 1
    fi
    for name in cpu sglang-cpu gpu sglang-gpu; do
        { echo "# The versions the suite was tested with (scripts/newest.sh --write, $(date -u +%F));"
          echo "# scripts/setup.sh passes this file to pip with -c."
          cat new/$name.txt; } > "$repo/constraints/$name.txt"
    done
    echo "newest: wrote constraints/{cpu,sglang-cpu,gpu,sglang-gpu}.txt: commit them alone and let CI judge"
fi
exit "$tests_rc"
