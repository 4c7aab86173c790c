"""Which Python runs an engine, and questions asked of that Python (is the engine there, are its flags).

An engine may live in its own environment: SGLang's torch pin conflicts with vLLM's CPU build, so on a
CPU box it is set up in ``.venv-sglang`` (``SETUP_ENGINE=sglang-cpu bash scripts/setup.sh``). The suite
never imports an engine; it starts it with that environment's interpreter and asks that interpreter
small questions in a subprocess (``python -P -c …``: the current folder is not put on ``sys.path``, so
the suite's own packages cannot shadow the engine's imports). The variables it starts with are
``engine_env``'s: a short allow-list of the suite's, its environment first on ``PATH``, the kind's own.
"""

from __future__ import annotations

import getpass
import importlib.util
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from engine_harness.engines import EngineKind, EngineSpec

__all__ = ["REPO_ROOT", "EngineEnvError", "ask_python", "engine_env", "find_venv_python", "package_installed"]

REPO_ROOT = Path(__file__).resolve().parent.parent
_FIND = "import importlib.util as u, sys; sys.exit(0 if u.find_spec(sys.argv[1]) else 3)"
# Variables an engine inherits from the suite's environment; everything else is dropped so that a
# stray setting of the caller (or an API key) does not change the engine or leak into its log. Not
# TMPDIR: the launch gives each engine a scratch folder of its own (process_group.engine_scratch).
_ENV_ALLOW = (
    "PATH",
    "HOME",
    "USER",
    "LANG",
    "LC_ALL",
    "TERM",
    "PYTHONPATH",
    "VIRTUAL_ENV",
    "CUDA_VISIBLE_DEVICES",
    "NVIDIA_VISIBLE_DEVICES",
    "LD_LIBRARY_PATH",
    "HF_HOME",
    "OMP_NUM_THREADS",
    "PIP_FIND_LINKS",
    "TORCHINDUCTOR_CACHE_DIR",
    "TRITON_CACHE_DIR",
)
_ENV_ALLOW_PREFIXES = ("VLLM_", "SGLANG_", "NCCL_", "UCX_")


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


def engine_env(kind: EngineKind, spec: EngineSpec, python: str) -> dict[str, str]:
    """The variables a launched engine of ``kind`` and ``spec`` run by ``python`` starts with;
    ``EngineEnvError`` where ``spec.api_key_env`` names a variable that is not set."""
    env = {k: v for k, v in os.environ.items() if k in _ENV_ALLOW or k.startswith(_ENV_ALLOW_PREFIXES)}
    if python != sys.executable:
        # The engine's own environment first on PATH (its console scripts, the compilers it finds).
        venv = Path(python).parent.parent
        env["VIRTUAL_ENV"] = str(venv)
        env["PATH"] = os.pathsep.join([str(venv / "bin"), env.get("PATH", "")])
        env.pop("PYTHONPATH", None)  # the suite's packages, not the engine's
    # PyTorch's compile cache stays where it is by default (torch._inductor's default_cache_dir), kept
    # across starts, not in the engine's scratch folder that goes with it: an engine compiles once
    user = re.sub(r'[\\/:*?"<>|]', "_", getpass.getuser())
    env.setdefault("TORCHINDUCTOR_CACHE_DIR", os.path.join(tempfile.gettempdir(), f"torchinductor_{user}"))
    env.update(kind.env(spec))
    if spec.api_key_env and kind.api_key_var:  # EngineSpec refuses a key for a kind without one
        key = os.environ.get(spec.api_key_env)
        if not key:
            raise EngineEnvError(
                f"--api-key-env {spec.api_key_env}: that variable is not set; export it before the run"
            )
        env[kind.api_key_var] = key  # off the command line, so out of the engine's log
    env["PYTHONUNBUFFERED"] = "1"
    return env
