"""Which Python runs an engine, and questions asked of that Python (is the engine there, are its flags).

An engine may live in its own environment: SGLang's torch pin conflicts with vLLM's CPU build, so on a
CPU box it is set up in ``.venv-sglang`` (``SETUP_ENGINE=sglang-cpu bash scripts/setup.sh``). The suite
never imports an engine; it starts it with that environment's interpreter and asks that interpreter
small questions in a subprocess (``python -P -c …``: the current folder is not put on ``sys.path``, so
the suite's own packages cannot shadow the engine's imports).
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

__all__ = ["REPO_ROOT", "EngineEnvError", "ask_python", "find_venv_python", "package_installed"]

REPO_ROOT = Path(__file__).resolve().parent.parent
_FIND = "import importlib.util as u, sys; sys.exit(0 if u.find_spec(sys.argv[1]) else 3)"


class EngineEnvError(RuntimeError):
    """The engine's environment is missing, broken, or refuses the settings."""


def find_venv_python(venv: str) -> str | None:
    """``<venv>/bin/python`` in the repository or the current folder, unresolved (a venv's python is a
    symlink; resolving it would leave the environment), or None."""
    for root in (REPO_ROOT, Path.cwd()):
        candidate = root / venv / "bin" / "python"
        if candidate.exists():
            return os.path.abspath(candidate)
    return None


def ask_python(
    python: str, code: str, args: list[str], timeout_s: float = 180.0
) -> subprocess.CompletedProcess[str]:
    """Run ``python -P -c code args…`` and return its result (output captured as text)."""
    if python != sys.executable and not Path(python).exists():
        raise EngineEnvError(f"the engine's interpreter {python} does not exist")
    try:
        return subprocess.run(
            [python, "-P", "-c", code, *args],
            capture_output=True,
            text=True,
            timeout=timeout_s,
            stdin=subprocess.DEVNULL,
            check=False,
        )
    except subprocess.TimeoutExpired:
        raise EngineEnvError(f"{python} did not answer within {timeout_s:.0f} s") from None


def package_installed(python: str, package: str) -> bool:
    """Whether ``package`` is importable by ``python`` (found, not imported: engines import slowly)."""
    if python == sys.executable:
        return importlib.util.find_spec(package) is not None
    result = ask_python(python, _FIND, [package], timeout_s=60)
    if result.returncode not in (0, 3):
        raise EngineEnvError(
            f"{python} failed while looking for {package!r}:\n{result.stderr.strip()[-2000:]}"
        )
    return result.returncode == 0
