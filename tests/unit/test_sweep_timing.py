"""The sweep's account of its wall time: every phase named, the remainder shown as "other"."""

from __future__ import annotations

import time

from microbench.sweep.lifecycle import Timing


def test_timing_names_every_phase_and_the_remainder() -> None:
    timing = Timing(t0=time.perf_counter() - 100.0)
    timing.spent = {"engine start": 40.0, "measurement windows": 30.0}
    timing.spent |= {"idle waits": 6.0, "store + derive": 9.0}
    line = timing.report()
    assert line.startswith("wall 100.0 s = engine start 40.0 s + measurement windows 30.0 s")
    assert "idle waits 6.0 s + store + derive 9.0 s + other 15.0 s" in line
    assert line.endswith("after engine start: measurement windows 50%")  # 30 of the 60 s after the start


def test_a_phase_adds_up_its_time_even_when_it_raises() -> None:
    timing = Timing()
    for _ in range(2):
        try:
            with timing.phase("idle waits"):
                time.sleep(0.01)
                raise RuntimeError
        except RuntimeError:
            pass
    assert 0.02 <= timing.spent["idle waits"] < 0.5
