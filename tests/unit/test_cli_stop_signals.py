"""The command-line boundary's stop signals: Ctrl-C and SIGTERM end a command whatever it awaits."""

from __future__ import annotations

import asyncio
import os
import signal

import pytest

from benchcore.cli import run_cli
from microbench.client import aio


@pytest.mark.parametrize(("signum", "code"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_a_stop_signal_in_the_loop_pass_that_ends_a_wait_for_still_stops_the_command(
    signum: int, code: int
) -> None:
    # Python 3.11's asyncio.wait_for, cancelled in the loop pass in which what it waits on is done, returns
    # the result and drops the cancellation: a stop signal that asyncio's runner turned into a cancellation
    # of the main task was lost there, and the command ran on to exit 0
    ran_on: list[bool] = []

    async def command() -> int:
        loop = asyncio.get_running_loop()
        done: asyncio.Future[None] = loop.create_future()

        def finish() -> None:
            done.set_result(None)
            os.kill(os.getpid(), signum)  # its handler runs here, before wait_for's waiter is released

        loop.call_soon(finish)
        await asyncio.wait_for(done, 5)
        await asyncio.sleep(0.2)  # the rest of the command
        ran_on.append(True)
        return 0

    before = signal.getsignal(signal.SIGINT)  # SIG_IGN in a job a shell put in the background (test.sh's)
    assert run_cli(lambda: aio.run(command())) == code
    assert not ran_on
    assert signal.getsignal(signal.SIGINT) is before  # the boundary put it back
