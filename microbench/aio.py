"""The event loop every client of the suite runs on: uvloop where it is installed, asyncio's otherwise.

uvloop's loop spends less CPU per socket read and timer than asyncio's pure-Python one, which matters
twice here: a load generator's schedule delay and a sweep's token stamps both depend on the client
getting back to its loop quickly.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any, TypeVar

__all__ = ["loop_name", "run"]

T = TypeVar("T")


def loop_name() -> str:
    """Which loop ``run`` uses here: ``uvloop`` or ``asyncio``."""
    try:
        import uvloop  # noqa: F401
    except ImportError:
        return "asyncio"
    return "uvloop"


def run(main: Coroutine[Any, Any, T]) -> T:
    """``asyncio.run(main)`` on a uvloop loop when uvloop is importable."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(main)
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        return runner.run(main)
