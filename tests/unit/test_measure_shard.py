"""The interference shard's plan and entry: what it measures, in which order, and when it starts nothing
(and that a point judged stalled against its cell is measured again, on ``--resume`` too)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import aiohttp
import pytest
from rich.console import Console

from engine_harness.engines import EngineSpec
from microbench.measure.plan import ShardPlan
from microbench.measure.shard import Shard, ShardContext, measure_shard


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
    space, prompts = plan.tokens()
    assert len(prompts) == 1 and len(prompts[0]) == 256  # shared: one prefix every decode stream starts on
    assert prompts == plan.tokens()[1]  # the seed fixes it
    assert all(space.lo <= t < space.hi for t in prompts[0])


def test_distinct_decode_prompts_give_each_stream_of_the_largest_batch_its_own() -> None:
    plan = _plan(decode_batch_sizes=[0, 2, 4], decode_prompts="distinct")
    _, prompts = plan.tokens()
    assert len(prompts) == 4 and all(len(p) == 256 for p in prompts)
    assert len({tuple(p) for p in prompts}) == 4 and prompts == plan.tokens()[1]  # distinct, seeded
    assert prompts[0] == _plan().tokens()[1][0]  # the first is the shared prefix of the same seed


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


class _OneTakenBack(_AllDone):
    """Every point stored; the first cell judged finds one of them stalled (as on ``--resume``)."""

    def __init__(self) -> None:
        self.taken: set[tuple[int, int, int, int]] = set()

    def is_done(self, chunk: int, d: int, p: int, rep: int) -> bool:
        return (chunk, d, p, rep) not in self.taken

    def judge_cell(self, chunk: int, d: int, p: int, max_attempts: int) -> list[Any]:
        if (d, p) != (0, 256):
            return []
        self.taken.add((chunk, d, p, 1))
        record = SimpleNamespace(validity=SimpleNamespace(valid=False, reasons=["stalled"], attempt=0),
                                 config=SimpleNamespace(chunk_size=chunk, decode_batch_size=d,
                                                        new_prefill_tokens=p, repetition=1))  # fmt: skip
        return [SimpleNamespace(record=record, blamed=[], taken_back=True, final=False, done=False)]


async def test_a_stored_point_judged_stalled_against_its_cell_is_measured_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    ran: list[bool] = []

    async def run(self: Shard) -> None:
        ran.append(True)

    monkeypatch.setattr(Shard, "run", run)
    sink = _OneTakenBack()
    async with aiohttp.ClientSession() as session:
        await measure_shard(_plan(), sink, ShardContext(session, Console(quiet=True)))  # type: ignore[arg-type]
    assert ran == [True] and sink.taken == {(512, 0, 256, 1)}  # judged before "nothing left" was decided


def test_a_decode_batch_sends_each_stream_its_own_prompt(monkeypatch: pytest.MonkeyPatch) -> None:
    import asyncio

    from engine_harness.metric_names import VLLM_METRICS
    from microbench.measure import decode_batch
    from microbench.measure.engine_client import EngineClient
    from microbench.results.records import ProtocolRules

    sent: list[list[int]] = []

    async def fake_stream(session: Any, url: str, payload: dict[str, Any], rec: Any, *rest: Any) -> Any:
        sent.append(payload["prompt"])
        return rec

    monkeypatch.setattr(decode_batch, "stream_request", fake_stream)
    client = EngineClient(session=None, base_url="http://x", model="m", metrics=VLLM_METRICS)  # type: ignore[arg-type]
    prompts = [[1, 2], [3, 4], [5, 6]]

    async def run() -> int:
        batch = decode_batch.DecodeBatch(client, prompts, 32, ProtocolRules())
        await batch.start()
        await asyncio.gather(*batch.tasks)
        return batch.size

    assert asyncio.run(run()) == 3 and sent == prompts
