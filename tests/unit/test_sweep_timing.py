"""The sweep's account of its wall time: every phase named, the remainder shown as "other"."""

from __future__ import annotations

import time

from microbench.measure.timing import Timing


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


def test_off_a_terminal_the_progress_bar_prints_plain_lines_as_points_finish() -> None:
    import io

    from rich.console import Console

    from microbench.sweep.progress import progress_bar

    out = io.StringIO()
    console = Console(file=out, force_terminal=False, width=200)
    with progress_bar(console, every_s=0.0) as progress:
        task = progress.add_task("chunk 8192 D4 P2048 r1", total=245, completed=84)
        progress.advance(task)
        progress.advance(task)
    lines = [line for line in out.getvalue().splitlines() if " points, " in line]
    assert [line.split(",")[0] for line in lines] == ["85/245 points", "86/245 points"]
    assert all(" in, ETA " in line and line.endswith("· chunk 8192 D4 P2048 r1") for line in lines)
    # on a terminal the live bar is the display: no extra lines
    term = io.StringIO()
    with progress_bar(Console(file=term, force_terminal=True, width=200), every_s=0.0) as progress:
        progress.advance(progress.add_task("x", total=2))
    assert " points, " not in term.getvalue()
