"""The batch-budget search's pure parts: corner-case batches, verdicts, the sim's memory limit, the search
against a synthetic engine whose boundary is known."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import ClassVar

import pytest

from engine_harness.launch import EngineStartError
from engine_harness.sim.params import SimConfig
from microbench.characterize import budget
from microbench.characterize.budget import BudgetSearchPlan, Candidate, search_budget
from microbench.characterize.probes import BatchOutcome, ProbeLimits, RequestOutcome, corner_batches, judge

LIMITS = ProbeLimits(context=1024, decode_tokens=16, short_tokens=8)


def test_corner_batches_fill_the_budget_and_the_context() -> None:
    batches = {b.name: b for b in corner_batches(4096, 8, LIMITS)}
    prefill = batches["all-prefill"]
    assert prefill.size == 5 and sum(prefill.prompt_tokens) <= 4096 and max(prefill.prompt_tokens) <= 1023
    assert sum(prefill.prompt_tokens) > 4096 - prefill.size  # the budget's worth, less rounding
    decode = batches["decode-at-max-context"]
    assert decode.size == 8 and {
        p + o for p, o in zip(decode.prompt_tokens, decode.output_tokens, strict=True)
    } == {1024}
    assert batches["max-short-sequences"].prompt_tokens == [8] * 8
    assert batches["one-max-prompt"].prompt_tokens == [1023] and batches["one-max-prompt"].output_tokens == [
        1
    ]
    # a budget smaller than the context: one prompt of the whole budget
    assert corner_batches(300, 8, LIMITS)[0].prompt_tokens == [300]


def _ok(first: float, done: float) -> RequestOutcome:
    return RequestOutcome(ok=True, first_token_s=first, done_s=done, gaps_s=[0.01, 0.02])


def test_judge_names_every_reason() -> None:
    decode = corner_batches(4096, 2, LIMITS)[1]
    good = judge(decode, [_ok(0.1, 0.5), _ok(0.2, 0.6)], preemptions=0, alive=True, wall_s=0.6, limits=LIMITS)
    assert good.passed and "2 × 1008+16" in good.why
    queued = judge(decode, [_ok(0.1, 0.5), _ok(0.7, 0.9)], preemptions=0, alive=True, wall_s=1, limits=LIMITS)
    assert not queued.passed and "did not run as one batch" in queued.why
    storm = judge(decode, [_ok(0.1, 0.5), _ok(0.2, 0.6)], preemptions=3, alive=True, wall_s=1, limits=LIMITS)
    assert not storm.passed and "3 preemptions > limit 0" in storm.why
    lenient = LIMITS.model_copy(update={"preemption_limit": 3})
    assert judge(decode, [_ok(0.1, 0.5)] * 2, preemptions=3, alive=True, wall_s=1, limits=lenient).passed
    dead = judge(
        decode,
        [RequestOutcome(ok=False, error="HTTP 500: boom")] * 2,
        preemptions=None,
        alive=False,
        wall_s=1,
        limits=LIMITS,
    )
    assert (
        not dead.passed
        and "the engine died" in dead.why
        and "2/2 requests failed (first: HTTP 500: boom)" in dead.why
    )
    slo = LIMITS.model_copy(update={"itl_slo_ms": 15.0})
    slow = judge(decode, [_ok(0.1, 0.5)] * 2, preemptions=0, alive=True, wall_s=1, limits=slo)
    assert not slow.passed and "ITL P99 20.0 ms > SLO 15 ms" in slow.why


def test_sim_memory_limit_fails_a_start_as_vllm_does() -> None:
    config = SimConfig(
        memory_tokens=40000, activation_tokens=1, max_num_batched_tokens=8192, max_model_len=1024
    )
    assert config.kv_blocks == (40000 - 8192) // 16 and config.memory_problem() is None
    assert config.context_limit == 1024
    short = config.model_copy(update={"max_num_batched_tokens": 39000})
    assert short.kv_blocks == 62 and "max seq len (1024)" in (short.memory_problem() or "")
    assert "estimated maximum model length is 992" in (short.memory_problem() or "")
    oom = config.model_copy(update={"max_num_batched_tokens": 40001})
    assert "OutOfMemoryError" in (oom.memory_problem() or "")
    assert SimConfig(num_kv_blocks=10).kv_blocks == 10 and SimConfig().memory_problem() is None


class _Target:
    base_url = "http://unused"
    auth_headers: ClassVar[dict[str, str]] = {}
    metrics = None


def test_search_finds_a_known_boundary_and_records_every_probe(monkeypatch: pytest.MonkeyPatch) -> None:
    """A synthetic engine: budgets above 16000 refuse to start, above 12345 fail the decode batch."""

    async def batches(
        target: object, model: str, c: Candidate, limits: ProbeLimits, t: float
    ) -> list[BatchOutcome]:
        ok = c.budget <= 12345
        return [
            BatchOutcome(
                name="decode-at-max-context",
                sequences=4,
                prompt_tokens=1008,
                output_tokens=16,
                failed=0,
                preemptions=0 if ok else 2,
                alive=True,
                concurrent=True,
                wall_s=0.1,
                passed=ok,
                why="ok" if ok else "2 preemptions > limit 0",
            )
        ]

    @contextlib.asynccontextmanager
    async def start(c: Candidate) -> AsyncIterator[_Target]:
        if c.budget > 16000:
            raise EngineStartError("exited; errors in the log:\n  ValueError: No available memory\nmore")
        yield _Target()

    monkeypatch.setattr(budget, "run_batches", batches)
    plan = BudgetSearchPlan(fixed=4, minimum=256, maximum=65536, initial=1024, limits=LIMITS)
    result = asyncio.run(search_budget(plan, start, "m"))  # type: ignore[arg-type]
    assert result.found == 12345
    by_value = {p.candidate.budget: p for p in result.probes}
    assert len(by_value) == len(result.probes) == len(result.steps)  # each value probed once
    refused = [p for p in result.probes if not p.started]
    assert refused and all("refused to start: ValueError: No available memory" in p.why for p in refused)
    assert by_value[12346].started and "preemptions" in by_value[12346].why
    # a resumed search reuses stored probes: no engine is started again
    starts: list[int] = []

    @contextlib.asynccontextmanager
    async def counting(c: Candidate) -> AsyncIterator[_Target]:
        starts.append(c.budget)
        yield _Target()

    known = {p.candidate.label: p for p in result.probes}
    again = asyncio.run(search_budget(plan, counting, "m", known=known))  # type: ignore[arg-type]
    assert again.found == 12345 and starts == []


def test_a_batch_sent_late_is_inconclusive_not_a_failure() -> None:
    decode = corner_batches(4096, 2, LIMITS)[1]
    early = RequestOutcome(ok=True, accepted_s=0.0, first_token_s=0.1, done_s=0.5, gaps_s=[0.01])
    sent_late = RequestOutcome(ok=True, accepted_s=0.6, first_token_s=0.7, done_s=0.9, gaps_s=[0.01])
    queued = RequestOutcome(ok=True, accepted_s=0.01, first_token_s=0.7, done_s=0.9, gaps_s=[0.01])
    late = judge(decode, [early, sent_late], preemptions=0, alive=True, wall_s=1, limits=LIMITS)
    assert late.late_sends and not late.passed and "inconclusive" in late.why
    blocked = judge(decode, [early, queued], preemptions=0, alive=True, wall_s=1, limits=LIMITS)
    assert not blocked.late_sends and not blocked.concurrent and "did not run as one batch" in blocked.why


def test_a_refused_start_is_named_by_its_error_not_a_warning() -> None:
    message = (
        "vllm engine exited with code 1 during start-up; last lines of x.log:\nerrors in the log:\n"
        "  (APIServer pid=1) WARNING [system_utils.py:255] Found ulimit of 20000 … `OSError: [Errno 24] …`\n"
        "  ValueError: invalid literal for int() with base 10: ''\n"
        "  RuntimeError: Engine core initialization failed\n"
        "tail …"
    )
    assert (
        budget._start_error(EngineStartError(message))
        == "ValueError: invalid literal for int() with base 10: ''"
    )
    assert budget._start_error(EngineStartError("nothing answered")) == "nothing answered"
