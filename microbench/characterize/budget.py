"""The batch-budget search (seed 001 §III-C.2): the largest setting whose worst-case batches all pass.

One dimension is searched, the other held: ``budget`` (vLLM ``max-num-batched-tokens``, SGLang
``chunked-prefill-size``) at a given ``max-num-seqs``, or ``seqs`` (``max-num-seqs``) at a given budget.
``measure.search.search_max`` doubles from the initial value, halves on a failure, then bisects to the
resolution; every candidate is started for real (``EngineStarter``: a refused start — out of memory in the
profile run, a KV cache shorter than the context — fails the candidate with the engine's own words) and
probed with its corner-case batches (``probes``), stopping at the first batch that fails. Every probe is
kept with why it passed or failed (``ProbeRecord``), and probes already stored are not run again
(``known``), so an interrupted search resumes.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Literal, Protocol

import aiohttp
from pydantic import Field

from benchcore.schema import StrictModel
from engine_harness.launch import EngineStartError
from engine_harness.metric_names import MetricNames
from microbench.characterize.probes import (
    BatchOutcome,
    CornerBatch,
    ProbeLimits,
    RequestOutcome,
    corner_batches,
    judge,
)
from microbench.client.requests import completion_body
from microbench.client.session import engine_session
from microbench.client.streams import StreamRecord, stream_request
from microbench.measure.engine_client import EngineClient
from microbench.measure.search import SearchStep, search_max
from microbench.workloads.prompts import PromptFactory

__all__ = [
    "BudgetSearch",
    "BudgetSearchPlan",
    "Candidate",
    "EngineStarter",
    "ProbeRecord",
    "ProbeTarget",
    "run_batches",
    "search_budget",
]

Dimension = Literal["budget", "seqs"]
LATE_SEND_RETRIES = 2  # a batch whose requests reached the engine too late to judge is run again


class Candidate(StrictModel):
    """One engine setting the search tries."""

    budget: int = Field(..., ge=1, description="max-num-batched-tokens")
    max_seqs: int = Field(..., ge=1, description="max-num-seqs")

    @property
    def label(self) -> str:
        return f"B{self.budget}-S{self.max_seqs}"


class ProbeTarget(Protocol):
    """What a started candidate offers the probes (``engine_harness.launch.EngineProcess`` does)."""

    @property
    def base_url(self) -> str: ...

    @property
    def auth_headers(self) -> dict[str, str]: ...

    metrics: MetricNames


EngineStarter = Callable[[Candidate], contextlib.AbstractAsyncContextManager[ProbeTarget]]


class ProbeRecord(StrictModel):
    """One candidate as probed: whether it started, each batch's verdict, the candidate's verdict."""

    candidate: Candidate
    started: bool
    start_s: float | None = None
    start_error: str | None = Field(default=None, description="the engine's own words when it refused")
    batches: list[BatchOutcome] = Field(default_factory=list)
    passed: bool
    why: str


class BudgetSearchPlan(StrictModel):
    """What to search and how finely."""

    dimension: Dimension = "budget"
    fixed: int = Field(..., ge=1, description="the other setting: max-num-seqs (budget search) or the budget")
    minimum: int = Field(..., ge=1)
    maximum: int = Field(..., ge=1)
    initial: int = Field(..., ge=1)
    resolution: int = Field(default=1, ge=1, description="stop once a pass and a failure are this close")
    max_probes: int = Field(default=32, ge=1)
    limits: ProbeLimits
    batch_timeout_s: float = Field(default=600.0, gt=0, description="one batch's limit; longer fails it")

    def candidate(self, value: int) -> Candidate:
        if self.dimension == "budget":
            return Candidate(budget=value, max_seqs=self.fixed)
        return Candidate(budget=self.fixed, max_seqs=value)


class BudgetSearch(StrictModel):
    """The search as run: its plan, every probe in order, the search steps and the setting found."""

    plan: BudgetSearchPlan
    probes: list[ProbeRecord]
    steps: list[SearchStep]
    found: int | None = Field(..., description="largest passing value (None: even the minimum failed)")
    wall_s: float

    @property
    def found_candidate(self) -> Candidate | None:
        return None if self.found is None else self.plan.candidate(self.found)


def _outcome(record: StreamRecord, t0_ns: int) -> RequestOutcome:
    stamps = record.chunk_t_ns
    ok = record.error is None and record.completion_tokens > 0
    return RequestOutcome(
        ok=ok,
        error=record.error or (None if ok else "no token arrived"),
        accepted_s=(record.t_headers_ns - t0_ns) / 1e9 if record.t_headers_ns else None,
        first_token_s=(stamps[0] - t0_ns) / 1e9 if stamps else None,
        done_s=(record.t_done_ns - t0_ns) / 1e9 if record.t_done_ns else None,
        gaps_s=[(b - a) / 1e9 for a, b in itertools.pairwise(stamps)],
    )


async def _run_batch(
    client: EngineClient, batch: CornerBatch, prompts: PromptFactory, limits: ProbeLimits, timeout_s: float
) -> BatchOutcome:
    bodies = [
        completion_body(client.model, prompts.cold(p), o, temperature=0)
        for p, o in zip(batch.prompt_tokens, batch.output_tokens, strict=True)
    ]
    records = [StreamRecord() for _ in bodies]
    # one open connection per sequence before the batch, so that its requests reach the engine together
    await asyncio.gather(*(client.alive() for _ in bodies))
    before = await client.scrape()
    t0 = time.perf_counter_ns()
    tasks = [
        asyncio.ensure_future(stream_request(client.session, client.completions_url, b, r, client.headers))
        for b, r in zip(bodies, records, strict=True)
    ]
    _done, pending = await asyncio.wait(tasks, timeout=timeout_s)
    for task in pending:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    for record, task in zip(records, tasks, strict=True):
        if task in pending:
            record.error = f"no answer within the batch limit of {timeout_s:g} s"
        elif task.exception() is not None and record.error is None:
            record.error = f"{type(task.exception()).__name__}: {task.exception()}"
    wall = (time.perf_counter_ns() - t0) / 1e9
    alive = await client.alive()
    preemptions = None
    if alive:
        with contextlib.suppress(Exception):  # a /metrics that stopped answering leaves the count unknown
            preemptions = (await client.scrape()).delta(before, client.metrics.preemptions)
    outcomes = [_outcome(r, t0) for r in records]
    return judge(batch, outcomes, preemptions=preemptions, alive=alive, wall_s=wall, limits=limits)


async def run_batches(
    target: ProbeTarget, model: str, candidate: Candidate, limits: ProbeLimits, timeout_s: float
) -> list[BatchOutcome]:
    """The candidate's corner-case batches against ``target``, in order, up to the first that fails."""
    out: list[BatchOutcome] = []
    prompts = PromptFactory()
    async with engine_session(limit=0, timeout=aiohttp.ClientTimeout(total=None)) as session:
        client = EngineClient(session, target.base_url, model, target.metrics, None, target.auth_headers)
        for batch in corner_batches(candidate.budget, candidate.max_seqs, limits):
            for attempt in range(1, LATE_SEND_RETRIES + 2):
                outcome = await _run_batch(client, batch, prompts, limits, timeout_s)
                outcome.attempts = attempt
                if not outcome.late_sends:
                    break
            out.append(outcome)
            if not outcome.passed:
                break
    return out


def _start_error(exc: EngineStartError) -> str:
    """The engine's reason: the first error line of its log that is not a warning (vLLM warns about the
    file-descriptor limit with an ``OSError`` in the line), else the message's first line."""
    text = str(exc)
    errors = text.partition("errors in the log:\n")[2]
    lines = [ln.strip() for ln in errors.split("\n") if ln.startswith("  ")]
    reasons = [ln for ln in lines if "WARNING" not in ln]
    return (reasons[0] if reasons else text.split("\n", 1)[0])[:400]


async def search_budget(
    plan: BudgetSearchPlan,
    start: EngineStarter,
    model: str,
    *,
    known: Mapping[str, ProbeRecord] | None = None,
    on_probe: Callable[[ProbeRecord], Awaitable[None] | None] | None = None,
) -> BudgetSearch:
    """Search ``plan``'s dimension; ``known`` probes (by candidate label) are reused, not run again;
    ``on_probe`` sees each probe as it finishes (to store and show it)."""
    t0 = time.perf_counter()
    probes: list[ProbeRecord] = []
    stored = dict(known or {})

    async def probe(candidate: Candidate) -> ProbeRecord:
        if candidate.label in stored:
            return stored[candidate.label]
        t_start = time.perf_counter()
        try:
            async with start(candidate) as target:
                start_s = time.perf_counter() - t_start
                batches = await run_batches(target, model, candidate, plan.limits, plan.batch_timeout_s)
        except EngineStartError as exc:
            why = f"the engine refused to start: {_start_error(exc)}"
            return ProbeRecord(
                candidate=candidate, started=False, start_error=str(exc)[-2000:], passed=False, why=why
            )
        failed = next((b for b in batches if not b.passed), None)
        why = f"{failed.name}: {failed.why}" if failed else "all four corner-case batches passed"
        return ProbeRecord(
            candidate=candidate,
            started=True,
            start_s=start_s,
            batches=batches,
            passed=failed is None,
            why=why,
        )

    async def passes(value: float) -> bool:
        record = await probe(plan.candidate(int(value)))
        probes.append(record)
        if on_probe is not None:
            pending = on_probe(record)
            if pending is not None:
                await pending
        return record.passed

    found, steps = await search_max(
        passes,
        initial=plan.initial,
        maximum=plan.maximum,
        minimum=plan.minimum,
        resolution=plan.resolution,
        integer=True,
        max_probes=plan.max_probes,
    )
    return BudgetSearch(
        plan=plan,
        probes=probes,
        steps=steps,
        found=None if found is None else int(found),
        wall_s=time.perf_counter() - t0,
    )
