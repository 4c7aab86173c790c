"""The suite's one flag vocabulary, shared by every command line (README, "Flags").

- ``--out DIR``: the folder this command writes into (a run folder for a job, a report folder for a
  report); never a parent, never a path without suffix.
- ``--config FILE``: the definition file (sweep, transfer, battery YAML); flags override its values.
- ``--arm NAME=…``: a named configuration arm (battery 5.10 today, A/B ablations later); repeatable.
- lists are space-separated values after one flag (``--chunk 2048 8192``, ``--tests ttft itl``).
- durations carry their unit (``30s``, ``500ms``, ``2m``, ``1h``); flags name no unit.
The engine's flags (``--engine``, ``--preset``, ``--model``, ``--url``, ``--api-key-env``,
``--engine-args``) live with the engine table in ``engine_harness.flags``.
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path

__all__ = ["add_config", "add_out", "arm", "duration", "duration_ms", "hms"]

_UNITS = {"ms": 1e-3, "s": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0}
_DURATION = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*(ms|s|min|m|h)\s*$")


def duration(text: str) -> float:
    """``'30s'``, ``'500ms'``, ``'2m'``, ``'1h'`` → seconds (an argparse type: bad input names the fix)."""
    m = _DURATION.match(text)
    if m is None:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a duration: give a number with a unit, e.g. 500ms, 30s, 2m or 1h"
        )
    value = float(m[1]) * _UNITS[m[2]]
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{text!r}: a duration must be > 0")
    return value


def hms(seconds: float) -> str:
    """A duration as people read it in progress lines: ``4m05s``, ``1h02m03s``."""
    s = round(seconds)
    return f"{s // 3600}h{s % 3600 // 60:02d}m{s % 60:02d}s" if s >= 3600 else f"{s // 60}m{s % 60:02d}s"


def duration_ms(text: str) -> float:
    """Like ``duration``, in milliseconds."""
    return duration(text) * 1e3


def arm(text: str) -> tuple[str, str]:
    """``NAME=VALUE`` → (name, value); the value's meaning belongs to the command."""
    name, sep, value = text.partition("=")
    if not sep or not name.strip() or not re.fullmatch(r"[A-Za-z0-9_.-]+", name.strip()):
        raise argparse.ArgumentTypeError(
            f"{text!r}: an arm is NAME=VALUE with NAME made of letters, digits, '.', '_' or '-'"
        )
    return name.strip(), value


def add_out(parser: argparse.ArgumentParser | argparse._ArgumentGroup, default_text: str) -> None:
    parser.add_argument(
        "--out",
        type=Path,
        metavar="DIR",
        help=f"the folder this command writes into (default {default_text})",
    )


def add_config(parser: argparse.ArgumentParser | argparse._ArgumentGroup, example: str) -> None:
    parser.add_argument(
        "--config", type=Path, metavar="FILE", help=f"a definition file, e.g. {example}; flags override it"
    )
