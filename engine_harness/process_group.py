"""An engine's process group: every launched engine is a group leader, stopped with its children.

``_kill_group`` sends SIGTERM to the whole group and SIGKILL after a grace period; an ``atexit`` hook does
the same for any engine still alive when the interpreter leaves (Ctrl-C included), and the child asks the
kernel for SIGTERM when the suite's process dies (Linux), so no engine outlives the suite.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import os
import signal
import subprocess

__all__ = ["_LIVE", "_die_with_parent", "_kill_group"]

_LIVE: set[subprocess.Popen[bytes]] = set()  # engines launched and not yet stopped
_PR_SET_PDEATHSIG = 1


def _kill_group(proc: subprocess.Popen[bytes], grace_s: float) -> None:
    """SIGTERM the process group, wait up to ``grace_s``, then SIGKILL what is left."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=grace_s)
    # The leader may be gone while its children (engine cores, workers) linger in the group.
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=5)
    _LIVE.discard(proc)


@atexit.register
def _reap_all() -> None:
    for proc in list(_LIVE):
        _kill_group(proc, grace_s=5)


def _die_with_parent() -> None:
    """In the child before exec: SIGTERM it when the suite's process dies, even by SIGKILL (Linux)."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
