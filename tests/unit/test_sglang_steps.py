"""SGLang's scheduler log lines → engine steps, on lines transcribed from a real SGLang 0.5.23 on CPU."""

import asyncio
from pathlib import Path

import pytest

from engine_harness.step_model import num_prefill_steps
from engine_harness.steps import EngineStep, SglangLogStepSource, parse_sglang_step_lines, sglang_step_source
from microbench.results.steps import prefill_steps

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"


def test_exclusive_prefill_steps_carry_no_decodes_and_take_the_whole_chunk() -> None:
    steps = parse_sglang_step_lines((FIXTURES / "sglang_cpu_steps_exclusive.log").read_text(), mixed=False)
    assert [s.prefill_tokens for s in steps] == [0] * 6 + [2048, 2048] + [0]
    assert [s.decode_tokens for s in steps] == [4] * 6 + [0, 0] + [4]
    assert [s.prefill_requests for s in steps] == [0] * 6 + [1, 1] + [0]
    # a step's duration: from the previous step line to its own (epoch µs in the lines)
    assert steps[0].elapsed_ms is None  # nothing before it: its start is not logged
    assert steps[6].elapsed_ms == pytest.approx(1795391675.079053e3 - 1795391674.672351e3, abs=1e-3)
    assert steps[7].elapsed_ms == pytest.approx(596.476, abs=1e-3)
    assert steps[8].elapsed_ms == pytest.approx(73.501, abs=1e-3)  # the INFO line in between is no step


def test_mixed_prefill_steps_carry_the_running_decodes_and_budget_minus_d() -> None:
    steps = parse_sglang_step_lines((FIXTURES / "sglang_cpu_steps_mixed.log").read_text(), mixed=True)
    prefill = [s for s in steps if s.prefill_tokens]
    assert [s.prefill_tokens for s in prefill] == [2044, 2044, 8]  # ceil(4096 / (2048 − 4)) = 3 steps
    assert all(s.decode_tokens == 4 and s.decode_requests == 4 for s in prefill)
    assert sum(s.prefill_tokens for s in prefill) == 4096
    assert all(s.elapsed_ms is not None and s.elapsed_ms > 0 for s in steps[1:])


def test_sglangs_own_millisecond_format_and_forward_iteration_numbers_are_read() -> None:
    text = (
        "[2026-11-22 23:54:34.600 TP0] Decode batch [17], #running-req: 2, #token: 90, token usage: 0.00, "
        "cpu graph: False, gen throughput (token/s): 80.00, #queue-req: 0\n"
        "[2026-11-22 23:54:34.612 TP0] Prefill batch [18], #new-seq: 1, #new-token: 512, #cached-token: 0, "
        "token usage: 0.01, #running-req: 2, #queue-req: 0, #pending-token: 0, cpu graph: False, "
        "input throughput (token/s): 900.00\n"
    )
    steps = parse_sglang_step_lines(text, mixed=False, previous_t=None)
    assert [(s.prefill_tokens, s.decode_tokens) for s in steps] == [(0, 2), (512, 0)]
    assert steps[1].elapsed_ms == pytest.approx(12.0, abs=1e-6)


def test_a_step_line_older_than_the_previous_one_gets_no_duration() -> None:
    line = "[2026-11-22 23:54:34.{ms:03d} @17953916{t}] Decode batch, #running-req: 1, #token: 9\n"
    text = line.format(ms=600, t="74.600000") + line.format(ms=500, t="74.500000")
    assert [s.elapsed_ms for s in parse_sglang_step_lines(text, mixed=False)] == [None, None]


def test_log_source_returns_only_whole_lines_after_the_mark(tmp_path: Path) -> None:
    log = tmp_path / "engine.log"
    lines = (FIXTURES / "sglang_cpu_steps_exclusive.log").read_text().splitlines(keepends=True)[2:]
    log.write_text("".join(lines[:4]))
    source = SglangLogStepSource(log, mixed=False)
    mark = asyncio.run(source.mark())
    with log.open("a") as f:
        f.write("".join(lines[4:]))
        f.write(lines[4][:40])  # a line being written right now
    steps = asyncio.run(source.since(mark))
    assert [s.prefill_tokens for s in steps] == [0, 0, 2048, 2048, 0]
    assert steps[0].elapsed_ms is None and all(s.elapsed_ms for s in steps[1:])


def test_the_source_reads_the_mode_from_sglangs_own_server_args_line(tmp_path: Path) -> None:
    log = tmp_path / "engine.log"
    args = (
        "[2026-11-22 23:52:56.129 @1795391576.129214] server_args={{'chunked_prefill_size': 2048, "
        "'disable_overlap_schedule': {off}, 'enable_mixed_chunk': {mixed}, "
        "'decode_log_interval': {every}}}\n"
    )
    log.write_text(args.format(off=False, mixed=False, every=1) + args.format(off=True, mixed=True, every=1))
    source = sglang_step_source(None, "http://x", log)  # type: ignore[arg-type]
    assert isinstance(source, SglangLogStepSource) and source.mixed  # the last start counts
    assert source.mode is not None and source.mode.async_scheduling is False  # --disable-overlap-schedule
    assert source.mode.timing == "log_interval"
    # SGLang's GPU default, the overlap scheduler: lines still one per step, in order, each written when
    # its step's outputs went out; the record's mode says the overlap was on (it used to give no source)
    log.write_text(args.format(off=False, mixed=False, every=1))
    overlap = sglang_step_source(None, "http://x", log)  # type: ignore[arg-type]
    assert isinstance(overlap, SglangLogStepSource) and overlap.mode is not None
    assert overlap.mode.async_scheduling is True and overlap.mode.timing == "log_interval"
    log.write_text(args.format(off=True, mixed=False, every=40))
    assert sglang_step_source(None, "http://x", log) is None  # type: ignore[arg-type]  # one line per 40
    assert sglang_step_source(None, "http://x", tmp_path / "none.log") is None  # type: ignore[arg-type]


def _step(prefill: int, decode: int, ms: float | None) -> EngineStep:
    return EngineStep(
        prefill_tokens=prefill,
        decode_tokens=decode,
        prefill_requests=int(prefill > 0),
        decode_requests=decode,
        elapsed_ms=ms,
    )


def test_an_exclusive_prefill_step_delays_a_decode_token_by_the_whole_step() -> None:
    # 4 decodes at 10 ms a step, then two exclusive 2048-token prefill steps of 400 and 600 ms
    log = [
        _step(0, 4, None),
        _step(0, 4, 10.0),
        _step(0, 4, 10.0),
        _step(2048, 0, 400.0),
        _step(2048, 0, 600.0),
    ]
    exclusive = prefill_steps(log, chunk=2048, d=4, scheduling="exclusive")
    assert exclusive.decode_step_ms == 10.0  # the step without a duration is left out
    assert exclusive.penalty_full_ms() == 500.0  # no decode token in the step: the decodes wait it all
    assert exclusive.total_penalty_ms() == 1000.0
    mixed = prefill_steps(log, chunk=2048, d=4)
    assert mixed.penalty_full_ms() == 490.0 and mixed.total_penalty_ms() == 980.0


def test_a_prefill_step_without_a_duration_gives_no_sum_never_a_short_one() -> None:
    # a bare prefill (D = 0) after idle: SGLang does not log when its first step started
    steps = prefill_steps(
        [_step(2048, 0, None), _step(2048, 0, 600.0)], chunk=2048, d=0, scheduling="exclusive"
    )
    assert steps.prefill_ms is None and steps.full_ms == 600.0
    assert steps.penalty_full_ms() is None and steps.total_penalty_ms() is None  # no decodes to delay
    assert (
        num_prefill_steps(4096, 2048, 4, "exclusive") == 2 and num_prefill_steps(4096, 2048, 4, "mixed") == 3
    )
