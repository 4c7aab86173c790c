"""The event loop every client of the suite runs on: uvloop where it is installed, asyncio's otherwise.

uvloop's loop spends less CPU per socket read and timer than asyncio's pure-Python one, which matters
twice here: a load generator's schedule delay and a sweep's token stamps both depend on the client
getting back to its loop quickly.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
from collections.abc import Coroutine, Iterator
from typing import Any, TypeVar

__all__ = ["loop_name", "no_full_collections", "run"]

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


@contextlib.contextmanager
def no_full_collections() -> Iterator[None]:
    """No full (generation-2) garbage collections inside the block; young ones still run.

    A full pass walks every object the process holds (pandas, pydantic, the stamps so far) with the
    event loop stopped: measured 55–110 ms on the CPU engine's client, long enough to deliver a dozen
    decode tokens in one read or to send a scheduled request late. Inside the block the objects alive
    at its start are frozen out of collection and generation 2 is never triggered automatically;
    callers collect explicitly where nothing is being timed (``gc.collect()`` between sweep points).
    Entering costs nothing (no collection first: garbage frozen with the rest is freed after the block).
    """
    gc.freeze()
    thresholds = gc.get_threshold()
    gc.set_threshold(thresholds[0], thresholds[1], 1_000_000)
    try:
        yield
    finally:
        gc.set_threshold(*thresholds)
        gc.unfreeze()
