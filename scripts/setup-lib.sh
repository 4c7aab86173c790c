# Shared by scripts/setup.sh, scripts/setup-sglang.sh and scripts/newest.sh (sourced, not run).

# need_disk GIB WHAT: stop before installing when the disk holding the working tree (and pip's
# temporary files) has less than GIB GiB free. A full disk half-way through pip leaves a broken
# environment and an error ("No space left on device") that names neither the cause nor the fix.
need_disk() {
    local want_gib=$1 what=$2 dir free_kib
    for dir in . "${TMPDIR:-/tmp}"; do
        free_kib=$(df -Pk "$dir" | awk 'NR == 2 { print $4 }')
        if [ "$free_kib" -lt $(( want_gib * 1024 * 1024 )) ]; then
            echo "setup: $what needs about $want_gib GiB free, but $(( free_kib / 1024 / 1024 )) GiB are" \
                "free under $(cd "$dir" && pwd); free some space (old clones, caches) and run again" >&2
            exit 1
        fi
    done
}

# use_lock NAME: every later pip_install is constrained by constraints/NAME.txt, the versions the suite
# was tested with (scripts/newest.sh --write refreshes them). SETUP_UNLOCKED=1 installs the newest
# versions instead (what scripts/newest.sh does in its throwaway copy). LOCK_ID goes into set-up stamps.
use_lock() {
    if [ "${SETUP_UNLOCKED:-0}" = 1 ]; then
        LOCK=""
        LOCK_ID="unlocked"
        return
    fi
    LOCK="constraints/$1.txt"
    if [ ! -f "$LOCK" ]; then
        echo "setup: the lock file $LOCK is missing; restore it from git or run bash scripts/newest.sh --write" >&2
        exit 1
    fi
    LOCK_ID="$(sha256sum "$LOCK" | cut -c1-16)"
}

# pip_install PYTHON ARGS...: pip install -q, constrained by the lock chosen with use_lock, with lines
# matching the extended regex PIP_HIDE (default: pip's "is ignored" chatter) left out; a failure stops the
# script with pip's exit status named (a filter on pip's output must not hide that it failed). The lock
# goes on the command line (-c), which adds to a constraint file in pip's own configuration; the
# PIP_CONSTRAINT variable would replace it. --no-compile: pip byte-compiles every file it installs (58k
# files in the two environments), where Python compiles on first import only the modules a run loads. CI's
# set-up of both environments: 167-173 s with --no-compile, 281 s without (2-core box, 2026-11-29); the
# first start of each engine pays for its own modules once (CI: the shared vLLM engine 89 s against 54, the
# first SGLang test 122 s against 75), which leaves CI as a whole about even and a fresh set-up 2 min shorter.
# Once only where Python may write bytecode: under PYTHONDONTWRITEBYTECODE=1 every process compiles its
# imports again (scripts/test.sh unsets it for the tests).
pip_install() {
    local py=$1 rc
    shift
    local lock_args=()
    if [ -n "${LOCK:-}" ]; then lock_args=(-c "$LOCK"); fi
    set +e
    "$py" -m pip install -q --no-compile "${lock_args[@]}" "$@" 2>&1 | grep -v -E "${PIP_HIDE:-is ignored}"
    rc=${PIPESTATUS[0]}
    set -e
    if [ "$rc" -ne 0 ]; then
        echo "setup: 'pip install $*' failed with exit code $rc (see pip's output above)" >&2
        exit 1
    fi
}

has_gpu() { command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L 2>/dev/null | grep -q '^GPU'; }
