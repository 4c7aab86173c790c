"""The interference shard's plan and entry: what it measures, in which order, and when it starts nothing."""

from __future__ import annotations

from typing import Any

import aiohttp
from rich.console import Console

from engine_harness.engines import EngineSpec
from microbench.measure.plan import ShardPlan
from microbench.measure.shard import ShardContext, measure_shard


def _plan(**over: Any) -> ShardPlan:
    base: dict[str, Any] = dict(
        spec=EngineSpec(kind="sim", chunk_size=512),
        chunk=512,
        decode_batch_sizes=[0, 4],
        prefill_tokens=[256, 2048],
        repetitions=2,
        decode_context=256,
        seed=0,
        decode_budgets={4: 300},
        hardware="CPU: test",
    )
    return ShardPlan(**(base | over))


def test_points_go_per_d_then_per_repetition_then_p() -> None:
    assert _plan().points()[:5] == [(0, 256, 0), (0, 2048, 0), (0, 256, 1), (0, 2048, 1), (4, 256, 0)]


def test_a_point_config_carries_the_plan_resolved_once() -> None:
    plan = _plan(spec=EngineSpec(kind="sim", chunk_size=512, extra_args=["--mode", "sglang"]))
    cfg = plan.config(4, 2048, 1, 300)
    assert (cfg.chunk_size, cfg.decode_batch_size, cfg.new_prefill_tokens, cfg.repetition) == (
        512,
        4,
        2048,
        1,
    )
    assert cfg.scheduling == "exclusive" and cfg.gpu == "CPU: test" and cfg.decode_max_tokens == 300
    assert plan.config(0, 256, 0, 300).decode_max_tokens == 0  # a bare prefill has no decode batch
    space, prefix = plan.tokens()
    assert len(prefix) == 256 and prefix == plan.tokens()[1]  # the seed fixes the shared prefix
    assert all(space.lo <= t < space.hi for t in prefix)


class _AllDone:
    def is_done(self, chunk: int, d: int, p: int, rep: int) -> bool:
        return True

    def judge_cell(self, chunk: int, d: int, p: int, max_attempts: int) -> list[Any]:
        return []  # every cell judged sound

    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"a shard with nothing left called sink.{name}")


async def test_a_shard_with_every_point_stored_starts_no_engine() -> None:
    async with aiohttp.ClientSession() as session:
        await measure_shard(_plan(), _AllDone(), ShardContext(session, Console(quiet=True)))  # type: ignore[arg-type]
