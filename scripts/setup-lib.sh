# Shared by scripts/setup.sh and scripts/setup-sglang-cpu.sh (sourced, not run).

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

# pip_install PYTHON ARGS...: pip install -q, with lines matching the extended regex PIP_HIDE (default:
# pip's "is ignored" chatter) left out, and a failure stops the script with pip's exit status named (a
# filter on pip's output must not hide that it failed).
pip_install() {
    local py=$1 rc
    shift
    set +e
    "$py" -m pip install -q "$@" 2>&1 | grep -v -E "${PIP_HIDE:-is ignored}"
    rc=${PIPESTATUS[0]}
    set -e
    if [ "$rc" -ne 0 ]; then
        echo "setup: 'pip install $*' failed with exit code $rc (see pip's output above)" >&2
        exit 1
    fi
}
