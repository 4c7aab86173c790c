"""The one rich console of a command: on a terminal, its width; elsewhere (a log file, CI, ``nohup``) 200
columns, because rich's default of 80 cuts the sweep's interference table to "81…" in every cell."""

from __future__ import annotations

import sys

from rich.console import Console

__all__ = ["LOG_WIDTH", "console"]

LOG_WIDTH = 200


def console() -> Console:
    return Console() if sys.stdout.isatty() else Console(width=LOG_WIDTH)
