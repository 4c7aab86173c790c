"""What a prefill step costs beyond its log (analysis.calibrate.prefill_time), its place in the replay, and
the front-end fit that must not count it twice (analysis.frontend.charged_twice_ms)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from analysis.calibrate.prefill_time import charged_ms, charged_twice_ms, fit_prefill_time, prefill_time_rows
from analysis.calibrate.replay import ReplayRequest, replay
from analysis.calibrate.stream_time import StreamTimeFit
from analysis.frontend import fit_frontend
from tests.unit.test_calibrate_replay import MS, _settings

STREAM = StreamTimeFit(0.7, (0.6, 0.8), 0.1, (0.09, 0.11), 12, (2, 4, 8))
BASE_MS = 4.0  # the local baseline's median decode gap


def _rec(
    d: int,
    steps: list[tuple[int, float | None]],
    extra_ms: list[float],
    scheduling: str = "mixed",
    valid: bool = True,
    aggregate: bool = True,
    frontend_ms: float | None = None,
    engine_prefill_time_ms: float | None = None,
    made_up_ms: float = 0.0,
) -> Any:
    """A sweep record stand-in whose decodes waited, per prefill step (prompt tokens, logged ms), the logged
    time, the stream time the replay charges and ``extra_ms``: its aggregate delay is built from them. Each
    stream's three gaps after the window are the baseline's, the first less ``made_up_ms``."""
    riding = d if scheduling == "mixed" else 0
    streamed = [riding + (j == len(steps) - 1) for j in range(len(steps))]
    cycles = sum(
        (ms or 0.0) + STREAM.fixed_ms + STREAM.per_token_ms * n + e
        for (_, ms), n, e in zip(steps, streamed, extra_ms, strict=True)
    )
    # mixed: each prefill step is one of the decodes' gaps; exclusive: they wait it out, then one decode gap
    per_stream = cycles - len(steps) * BASE_MS if scheduling == "mixed" else cycles
    log = [SimpleNamespace(prefill_tokens=p, elapsed_ms=ms) for p, ms in steps]
    log.append(SimpleNamespace(prefill_tokens=0, elapsed_ms=3.0))  # a decode-only step: not a prefill
    return SimpleNamespace(
        config=SimpleNamespace(
            decode_batch_size=d, scheduling=scheduling, new_prefill_tokens=sum(p for p, _ in steps)
        ),
        validity=SimpleNamespace(valid=valid),
        local_baseline=SimpleNamespace(tpot_p50_ms=BASE_MS),
        derived=SimpleNamespace(aggregate_decode_delay_ms=d * per_stream if aggregate else None),
        interference=SimpleNamespace(
            engine_steps_log=log,
            frontend_ms=frontend_ms,
            engine_prefill_time_ms=engine_prefill_time_ms,
            engine_prefill_ms=sum(ms or 0.0 for _, ms in steps),
            recovery_gaps_ms=[BASE_MS - made_up_ms, BASE_MS, BASE_MS] * d,
            step_mode=None,
        ),
    )


def _truth(p: int) -> float:
    return 2.0 + 500 * p / 1e6  # 2 ms per prefill step + 500 ns per prompt token


def _grid(scheduling: str) -> list[Any]:
    prompts = {256: [(256, 12.0)], 1024: [(1024, 50.0)], 3000: [(2048, 110.0), (952, 52.0)]}
    return [
        _rec(d, steps, [_truth(p) for p, _ in steps], scheduling)
        for d in (2, 4, 8)
        for steps in prompts.values()
    ]


@pytest.mark.parametrize("scheduling", ["mixed", "exclusive"])
def test_the_fit_recovers_a_known_cost_per_step_and_per_prompt_token(scheduling: str) -> None:
    fit = fit_prefill_time(_grid(scheduling), STREAM)
    assert fit.per_step_ms == pytest.approx(2.0) and fit.per_token_ns == pytest.approx(500.0)
    assert fit.per_token_ci_ns is not None and fit.per_token_ci_ns[0] > 0 and fit.n == 9 and fit.note == ""
    # a step carrying 2048 prompt tokens: 2 + 1.024 ms; a decode-only step: nothing
    assert fit.step_ms(2048) == pytest.approx(3.024) and fit.step_ms(0) == 0.0


def test_the_rows_take_the_stream_time_each_step_streams() -> None:
    (row,) = prefill_time_rows([_rec(4, [(2048, 110.0), (952, 52.0)], [1.0, 2.0])], STREAM).to_dict("records")
    # mixed: 4 decodes ride in both steps, the second also streams the prompt's first token
    assert row["k"] == 2 and row["P"] == 3000 and row["logged_ms"] == pytest.approx(162.0)
    assert row["stream_ms"] == pytest.approx((0.7 + 0.4) + (0.7 + 0.5))
    assert row["excess_ms"] == pytest.approx(3.0)
    (alone,) = prefill_time_rows([_rec(4, [(1024, 50.0)], [1.0], "exclusive")], STREAM).to_dict("records")
    assert alone["stream_ms"] == pytest.approx(0.7 + 0.1) and alone["excess_ms"] == pytest.approx(1.0)


def test_no_extra_time_gives_none() -> None:
    # the sim as reality: a step's log is its whole cost; the decodes' delay only adds noise of either sign
    noise = [0.05, -0.04, 0.03, -0.05, 0.02, -0.03, 0.04, -0.02, 0.01]
    prompts = ([(256, 12.0)], [(1024, 50.0)], [(2048, 110.0), (952, 52.0)])
    grid = [(d, steps) for d in (2, 4, 8) for steps in prompts]
    records = [_rec(d, steps, [e] * len(steps)) for (d, steps), e in zip(grid, noise, strict=True)]
    fit = fit_prefill_time(records, STREAM)
    assert fit.per_step_ms == 0.0 and fit.per_token_ns == 0.0
    assert "per prompt token" in fit.note and "per prefill step" in fit.note


def test_a_late_step_made_up_in_the_next_gap_is_no_cost() -> None:
    # an engine holding a step grid (the sim): its prefill step ran late by as much as the next gap was short
    late = [[0.4, 1.5, 0.7], [0.9, 0.6, 3.0], [2.0, 1.1, 0.5]]
    records = [
        _rec(d, steps, [lateness / len(steps)] * len(steps), made_up_ms=lateness)
        for d, row in zip((2, 4, 8), late, strict=True)
        for steps, lateness in zip(
            ([(256, 12.0)], [(1024, 50.0)], [(2048, 110.0), (952, 52.0)]), row, strict=True
        )
    ]
    rows = prefill_time_rows(records, STREAM)
    assert rows["excess_ms"].abs().max() < 1e-9
    fit = fit_prefill_time(records, STREAM)
    assert fit.per_step_ms == pytest.approx(0.0, abs=1e-9) and fit.per_token_ns == pytest.approx(
        0.0, abs=1e-6
    )


def test_records_that_cannot_say_are_left_out() -> None:
    good = _rec(4, [(1024, 50.0)], [1.0])
    records = [
        good,
        _rec(0, [(1024, 50.0)], [1.0]),  # no decodes
        _rec(4, [(1024, None)], [1.0]),  # an untimed prefill step
        _rec(4, [(1024, 50.0)], [1.0], aggregate=False),  # no aggregate delay
        _rec(4, [(1024, 50.0)], [1.0], valid=False),
        _rec(4, [(1024, 50.0)], [1.0], made_up_ms=0.0),
    ]
    records[-1].interference.recovery_gaps_ms = [4.0] * 7  # 7 gaps of 4 streams: whose is whose unknown
    assert len(prefill_time_rows(records, STREAM)) == 1
    with pytest.raises(ValueError, match="three valid records"):
        fit_prefill_time(records, STREAM)


def test_what_the_replay_charges_a_record_and_what_the_front_end_held_of_it() -> None:
    fit = fit_prefill_time(_grid("mixed"), STREAM)
    rec = _rec(4, [(1024, 50.0)], [0.0], engine_prefill_time_ms=51.5, frontend_ms=10.0)
    charged = charged_ms(rec, STREAM, fit)
    assert charged == pytest.approx(0.7 + 0.5 + 2.0 + 0.512)
    # the engine's prefill time held 1.5 ms beyond the logged step: the rest was in the front-end time
    assert charged_twice_ms(rec, charged) == pytest.approx(charged - 1.5)
    assert charged_twice_ms(rec, 1.0) == 0.0  # all of it inside the engine's own prefill time
    assert charged_twice_ms(rec, None) == 0.0
    # an interval-timed log (no histogram): its prefill interval is the logged steps, nothing held
    interval = _rec(4, [(1024, 50.0)], [0.0])
    assert charged_twice_ms(interval, 3.0) == pytest.approx(3.0)
    assert charged_ms(_rec(4, [(1024, None)], [0.0]), STREAM, fit) is None


def test_the_front_end_fit_takes_out_what_the_replay_charges_once() -> None:
    fit = fit_prefill_time(_grid("mixed"), STREAM)
    records = []
    for p, ms in ((256, 12.0), (1024, 50.0), (2048, 110.0)):
        charged = charged_ms(_rec(4, [(p, ms)], [0.0]), STREAM, fit) or 0.0
        # the front-end time is 6 ms flat plus what the engine's prefill time (logged + 1 ms) left out
        records.append(
            _rec(4, [(p, ms)], [0.0], frontend_ms=6.0 + charged - 1.0, engine_prefill_time_ms=ms + 1.0)
        )
    plain = fit_frontend(records)
    assert plain.per_token_ns > 400  # the prompt-token part of the charge read as API-server time
    front = fit_frontend(records, lambda r: charged_twice_ms(r, charged_ms(r, STREAM, fit)))
    assert front.fixed_ms == pytest.approx(6.0) and front.per_token_ns == pytest.approx(0.0, abs=1e-6)


def test_the_replay_adds_the_prefill_extra_to_steps_carrying_prompt_tokens() -> None:
    req = ReplayRequest("a", 5 * MS, list(range(1000)), 3)
    settings = _settings(stream_fixed_ms=0.5, stream_ms_per_token=0.25)
    plain = replay([req], settings).token_ns["a"]
    extra = replay(
        [req], settings.model_copy(update={"prefill_extra_ms": 2.0, "prefill_extra_ns_per_token": 1000.0})
    ).token_ns["a"]
    # the 1000-token prefill step costs 2 + 1 ms more; the decode steps after it nothing more
    assert extra == [t + 3 * MS for t in plain]
    assert settings.beyond_log_ms(3, 0) == pytest.approx(0.5 + 0.75)
