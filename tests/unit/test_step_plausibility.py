"""Issue #33: a step its own point's other steps say the engine could not take (a frozen engine) makes
the point invalid with its reason (``microbench.results.validity``), on hand-built steps."""

from __future__ import annotations

from engine_harness.steps import EngineStep
from microbench.results.validity import implausible_steps, stalled_between_steps


def _decode(ms: float, d: int = 4) -> EngineStep:
    return EngineStep(prefill_tokens=0, decode_tokens=d, prefill_requests=0, decode_requests=d, elapsed_ms=ms)


def _mixed(ms: float, chunk: int = 508, d: int = 4) -> EngineStep:
    return EngineStep(
        prefill_tokens=chunk, decode_tokens=d, prefill_requests=1, decode_requests=d, elapsed_ms=ms
    )


def _point(prefill_ms: list[float], decode_ms: float = 5.0) -> list[EngineStep]:
    """Decode-only steps, the injection's mixed steps, decode-only steps again (one attempt's log)."""
    return [*(_decode(decode_ms) for _ in range(8)), *(_mixed(ms) for ms in prefill_ms),
            *(_decode(decode_ms) for _ in range(8))]  # fmt: skip


def test_a_clean_point_has_no_implausible_step() -> None:
    assert implausible_steps(_point([20.0, 21.0, 19.5, 20.2])) == []


def test_a_decode_step_frozen_for_30_s_is_named() -> None:
    steps = _point([20.0, 21.0, 19.5])
    steps[3] = _decode(30_005.0)
    (reason,) = implausible_steps(steps)
    assert "engine step 3 took 30005 ms for 4 tokens" in reason and "stalled" in reason


def test_a_prefill_step_frozen_for_30_s_is_named_against_its_peers() -> None:
    (reason,) = implausible_steps(_point([20.0, 30_020.0, 19.5, 20.2]))
    assert "engine step 9 took 30020 ms for 512 tokens" in reason


def test_a_lone_prefill_step_is_judged_against_the_decode_steps() -> None:
    assert implausible_steps(_point([30_020.0]))  # no prefill peers: the decode steps bound it
    # ... generously: a prefill step costs more than a decode step, up to its tokens' share
    assert implausible_steps(_point([600.0])) == []


def test_a_hiccup_of_a_loaded_machine_is_not_a_stall() -> None:
    steps = _point([20.0, 21.0, 19.5])
    steps[2] = _decode(400.0)  # 80x the median, but under a second beyond it
    assert implausible_steps(steps) == []


def test_without_peers_nothing_is_judged() -> None:
    assert implausible_steps([_mixed(30_000.0), _decode(5.0)]) == []
    assert implausible_steps([]) == []


def _stamped(
    steps: list[EngineStep], freeze_before: int | None = None, freeze_s: float = 30.0
) -> list[EngineStep]:
    """``steps`` stamped back to back from t = 1000 s, each ending its own elapsed time after the last (the
    engine's own timing, vLLM's synchronous mode), with ``freeze_s`` of no step before ``freeze_before``."""
    t, out = 1000.0, []
    for i, s in enumerate(steps):
        t += (s.elapsed_ms or 0.0) / 1000 + 0.0005 + (freeze_s if i == freeze_before else 0.0)
        out.append(s.model_copy(update={"t_end_s": t}))
    return out


def test_a_freeze_between_two_steps_is_named() -> None:
    # every step looks normal; the 30 s with no step between step 4 and 5 is the stall
    steps = _stamped(_point([20.0, 21.0, 19.5]), freeze_before=5)
    assert implausible_steps(steps) == []
    (reason,) = stalled_between_steps(steps)
    assert "no engine step ran for 30000 ms before step 5 while requests were running" in reason
    assert "stalled" in reason


def test_host_time_between_steps_and_an_idle_engine_are_no_stall() -> None:
    assert stalled_between_steps(_stamped(_point([20.0, 21.0, 19.5]))) == []  # 0.5 ms between steps
    steps = _stamped(_point([20.0, 21.0, 19.5]), freeze_before=5, freeze_s=0.8)  # a hiccup under 1 s
    assert stalled_between_steps(steps) == []
    idle = [
        EngineStep(prefill_tokens=0, decode_tokens=0, prefill_requests=0, decode_requests=0, elapsed_ms=1.0)
    ]
    steps = _stamped([*_point([20.0])[:8], *idle, *_point([20.0])[8:]], freeze_before=9)
    assert stalled_between_steps(steps) == []  # nothing ran in the step before the gap: no work was waiting
