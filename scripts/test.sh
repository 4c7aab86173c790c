#!/usr/bin/env bash
# Every test, in four passes (the README's test command; CI runs exactly it). Markers: pyproject.toml.
#   clock  - tests that read the clock against the simulated engine (step times, stalls, schedule delay),
#            two at a time (pytest -m "clock and not solo" -n 2): on a 2-core box they keep both cores busy.
#   solo   - clock tests that judge a fitted model against a tight bar (a 2% error, one run's 95% interval),
#            alone (pytest -m solo): beside another clock test their sim's steps and the client's stamps
#            carry its load (CI 16 and 18 of 2026-11-29 each failed one of them, in the two-at-a-time pass).
#   serial - tests that start a real engine (tests/conftest.py marks every e2e and gpu test), one at a time.
#   the rest (unit tests and the like: no clock read, no engine) - beside the serial pass at nice 19. A real
#            engine leaves most of a core idle (vLLM's CPU build steps on one thread); at nice 19 these take
#            that idle time and yield the core whenever an engine or its client wakes.
# Exits non-zero when any pass fails; a pass that collects no test (pytest's exit 5) fails too. Extra
# arguments go to every pass (e.g. -x).
set -uo pipefail
cd "$(dirname "$0")/.."
py=.venv/bin/python
# Python writes the bytecode of what it imports, whatever the caller's environment says: the set-up installs
# without compiling (scripts/setup-lib.sh), and with PYTHONDONTWRITEBYTECODE=1 (set on this project's boxes)
# each of the tests' few hundred Python processes (sims, CLIs, engines, xdist workers) compiled every module
# it imported from source again: the report's imports took 9.1 s that way against 3.0-4.8 s from bytecode
# (2-core box, 2026-11-29). The caches go to __pycache__ folders, which git ignores.
unset PYTHONDONTWRITEBYTECODE
if [ ! -x "$py" ]; then
    echo "test: $py is missing: run bash scripts/setup.sh first" >&2
    exit 1
fi
failed=()
judge() {  # judge NAME CODE
    case "$2" in
        0) ;;
        5) failed+=("$1 (collected no test)") ;;
        *) failed+=("$1 (exit $2)") ;;
    esac
}

"$py" -m pytest -m "clock and not solo" -n 2 "$@"
judge "clock pass" $?
"$py" -m pytest -m solo "$@"
judge "solo pass" $?

fast_log=$(mktemp)
trap 'rm -f "$fast_log"' EXIT
nice -n 19 "$py" -m pytest -m "not clock and not serial" -n 2 "$@" > "$fast_log" 2>&1 &
fast=$!
"$py" -m pytest -m serial "$@"
judge "serial pass" $?
wait "$fast"
fast_rc=$?
echo "test: the pass beside it (not clock and not serial, nice 19):"
cat "$fast_log"
judge "pass at nice 19" "$fast_rc"

if [ "${#failed[@]}" -gt 0 ]; then
    echo "test: failed: ${failed[*]}" >&2
    exit 1
fi
echo "test: every pass passed"
