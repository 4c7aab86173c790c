"""scripts/setup-lib.sh: setup stops with a clear message on a short disk or a failed pip, never half-way.

A CI run once filled the disk inside pip; the old filter (`pip ... | grep -v ... || true`) hid pip's exit
status and the script went on to a Python traceback that named neither the cause nor the fix.
"""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent


def _bash(body: str) -> subprocess.CompletedProcess[str]:
    script = f"set -euo pipefail\nsource scripts/setup-lib.sh\n{body}\necho reached-the-end\n"
    return subprocess.run(["bash", "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=120)


def test_need_disk_stops_when_the_disk_is_short_and_says_what_to_do() -> None:
    short = _bash("need_disk 100000000 'SGLang for CPU'")
    assert short.returncode == 1
    assert "reached-the-end" not in short.stdout
    assert "SGLang for CPU needs about 100000000 GiB free" in short.stderr
    assert "free some space" in short.stderr


def test_need_disk_passes_when_there_is_room() -> None:
    room = _bash("need_disk 0 'anything'")
    assert room.returncode == 0, room.stderr
    assert "reached-the-end" in room.stdout


def test_a_failed_pip_install_stops_the_script_and_names_its_exit_code() -> None:
    # --no-index with a name no local index holds fails at once, without the network.
    failed = _bash(f"pip_install {sys.executable} --no-index no-such-package-for-setup-lib-test")
    assert failed.returncode == 1
    assert "reached-the-end" not in failed.stdout
    named = "'pip install --no-index no-such-package-for-setup-lib-test' failed with exit code"
    assert named in failed.stderr


def test_pip_install_hides_only_the_lines_named_in_pip_hide() -> None:
    install = f"pip_install {sys.executable} --no-index no-such-package-x"
    shown = _bash(f"PIP_HIDE='nothing-matches-this' {install}")
    assert "No matching distribution found for no-such-package-x" in shown.stdout
    hidden = _bash(f"PIP_HIDE='no-such-package-x' {install}")
    assert "No matching distribution" not in hidden.stdout
