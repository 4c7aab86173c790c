"""The one top-level error boundary of every command line of the suite.

Exit codes (README, "Exit codes"): 0 ok; 1 measured, with failures (invalid points, failed tests, an
engine that died); 2 bad input (flags, definition files, a missing model); 130 stopped by Ctrl-C
(SIGINT); 143 stopped by SIGTERM; 141 stopped because the reader of its output went away (``| head``:
quietly, as a pipe's writer stops on SIGPIPE; Python's docs, ``signal``, "Note on SIGPIPE"). A known
error prints one paragraph naming the problem and what to do; an unknown one prints its message and
where the full traceback was written (inside the command's own output folder when it has one, never
elsewhere; else on standard error).
"""

from __future__ import annotations

import asyncio
import os
import select
import signal
import sys
import traceback
from collections.abc import Callable
from pathlib import Path
from types import FrameType

from benchcore.redact import scrub

__all__ = [
    "EXIT_BAD_INPUT",
    "EXIT_BROKEN_PIPE",
    "EXIT_FAILURES",
    "BadInput",
    "Failed",
    "Stopped",
    "run_cli",
]

EXIT_FAILURES = 1
EXIT_BAD_INPUT = 2
EXIT_BROKEN_PIPE = 128 + signal.SIGPIPE


class BadInput(Exception):
    """The user's input cannot be used; the message names the problem and the fix (exit 2)."""


class Failed(Exception):
    """The command could not finish; what it measured is kept (exit 1)."""


class Stopped(KeyboardInterrupt):
    """SIGTERM (or SIGINT) asked the command to stop; raised where it was, unwound like Ctrl-C.

    A ``KeyboardInterrupt`` so that asyncio lets it out of whichever task it landed in: a task stores any
    other ``BaseException`` as its result, and a signal that arrived while a side task (a decode stream)
    ran would be swallowed and the command would go on (seen: a sweep that exited 0 after SIGTERM).
    """

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.exit_code = 128 + signum


def _raise_stopped(signum: int, frame: FrameType | None) -> None:
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        raise Stopped(signum) from None
    # In an event loop the interrupted frame may be a transport callback, which would swallow the
    # exception (uvloop reports it as a transport error and the command goes on): raise it from a loop
    # callback instead, from where a KeyboardInterrupt leaves the loop and unwinds the main task.
    loop.call_soon_threadsafe(_raise, signum)


def _raise(signum: int) -> None:
    raise Stopped(signum)


# Both stop signals take the one path above. Left to asyncio's runner, SIGINT cancels the main task, and
# a cancellation can be lost: Python 3.11's asyncio.wait_for returns its result instead when what it waits
# on is done in the same loop pass (the sweep waits so on every decode token and on its injection); the
# command runs on and exits 0. Seen once in the sweep's stop-signal test (SIGINT, exit 0, 2026-11-29; not
# repeated in 42 reruns: the window is one loop pass); tests/unit/test_cli_stop_signals.py opens it surely
_STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


def run_cli(body: Callable[[], int], crash_dir: Callable[[], Path | None] = lambda: None) -> int:
    """Run ``body`` inside the boundary; ``crash_dir()`` says where a traceback may be written."""
    previous = {sig: signal.signal(sig, _raise_stopped) for sig in _STOP_SIGNALS}
    try:
        code = body()
        sys.stdout.flush()  # a reader that went away shows here, not in Python's flush at exit
        return code
    except BrokenPipeError:
        if not _reader_gone():
            return _crashed(crash_dir)
        # nothing more can be shown; what Python would still flush at exit goes nowhere instead
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_BROKEN_PIPE
    except (KeyboardInterrupt, Stopped) as exc:
        code = exc.exit_code if isinstance(exc, Stopped) else 130
        print(f"stopped ({'SIGTERM' if code == 143 else 'Ctrl-C'})", file=sys.stderr)
        return code
    except BadInput as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except Failed as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_FAILURES
    except Exception:  # the boundary: a traceback is never the user's answer
        return _crashed(crash_dir)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _crashed(crash_dir: Callable[[], Path | None]) -> int:
    """Report the exception being handled as a bug: its message, and where its traceback went."""
    exc = sys.exception()
    where = _write_traceback(crash_dir())
    print(scrub(f"error: unexpected {type(exc).__name__}: {exc}\n{where}", os.environ), file=sys.stderr)
    return EXIT_FAILURES


def _reader_gone() -> bool:
    """Whether standard output is a pipe whose reader has gone (poll says POLLERR on its end)."""
    try:
        fd = sys.stdout.fileno()
    except (OSError, ValueError):  # replaced by an object without a file (a test's capture)
        return False
    poll = select.poll()
    poll.register(fd, select.POLLOUT)
    return any(events & select.POLLERR for _, events in poll.poll(0))


def _write_traceback(folder: Path | None) -> str:
    text = scrub(traceback.format_exc(), os.environ)  # a key in a local's repr never reaches the file
    if folder is not None:
        try:
            folder.mkdir(parents=True, exist_ok=True)
            path = folder / "crash-traceback.txt"
            path.write_text(text)
            return f"This is a bug of the suite; the full traceback is in {path} (please report it)."
        except OSError:
            pass
    return "This is a bug of the suite; its full traceback follows (please report it):\n" + text
