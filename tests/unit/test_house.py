"""The house is checked, not hoped for: import contracts (import-linter, pyproject.toml), module size, lint,
format and types (ruff and mypy at the versions the lock pins: a lint slip once landed with CI green)."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PACKAGES = ("benchcore", "engine_harness", "microbench", "analysis")


def _tool(name: str, *args: str, timeout: int = 120) -> subprocess.CompletedProcess[str]:
    """The venv's ``name`` run over the repository with ``args`` (the settings in pyproject.toml)."""
    tool = Path(sys.executable).with_name(name)
    return subprocess.run([str(tool), *args], cwd=REPO, capture_output=True, text=True, timeout=timeout)


def test_import_contracts_hold() -> None:
    out = _tool("lint-imports")
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-2000:]
    assert "0 broken" in out.stdout


def test_ruff_finds_nothing_and_the_code_is_formatted() -> None:
    for args in (("check", "."), ("format", "--check", ".")):
        out = _tool("ruff", *args)
        assert out.returncode == 0, f"ruff {' '.join(args)}:\n" + out.stdout[-3000:] + out.stderr[-2000:]


def test_mypy_finds_no_type_error() -> None:
    out = _tool("mypy", timeout=600)  # ~30 s without its cache (.mypy_cache), ~2 s with it
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-2000:]


def _modules() -> list[Path]:
    return [p for pkg in PACKAGES for p in (REPO / pkg).rglob("*.py")]


def test_no_module_over_400_lines() -> None:
    big = {str(p.relative_to(REPO)): n for p in _modules() if (n := len(p.read_text().splitlines())) > 400}
    assert not big, f"modules over 400 lines: {big}"


def test_no_function_over_80_lines_in_the_derivation_and_the_runners() -> None:
    scope = [REPO / "microbench" / "results", *(REPO / "microbench").glob("*/runner.py")]
    files = [p for s in scope for p in ([s] if s.is_file() else s.rglob("*.py"))]
    long = []
    for path in files:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                n = (node.end_lineno or node.lineno) - node.lineno + 1
                if n > 80:
                    long.append(f"{path.relative_to(REPO)}:{node.lineno} {node.name} ({n} lines)")
    assert not long, long
