"""An engine's log file as the suite reads it: the tail shown when a start fails, the errors it names."""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["log_errors", "log_tail"]


def log_tail(path: Path, lines: int = 40) -> str:
    """The last ``lines`` lines of a log file ('' if it does not exist)."""
    try:
        with path.open("rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - 64 * 1024))
            text = f.read().decode("utf-8", "replace")
    except FileNotFoundError:
        return ""
    return "\n".join(text.splitlines()[-lines:])


def log_errors(path: Path, limit: int = 5) -> list[str]:
    """Distinct lines of a log that name an exception (``…Error: …``), first seen first."""
    seen: dict[str, None] = {}
    try:
        with path.open(encoding="utf-8", errors="replace") as f:
            for line in f:
                if "Error: " in line and not line.lstrip().startswith("File "):
                    seen.setdefault(line.split("] ", 1)[-1].strip(), None)
    except FileNotFoundError:
        return []
    return list(seen)[:limit]
