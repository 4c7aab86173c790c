"""The one continuous-batching scheduler: requests, step planning, KV, preemption (pure, clock-free).

No I/O and no clock: ``schedule()`` plans one step, the caller decides how long it takes, then
``commit(plan, sample)`` applies it (``sample`` picks the token a request generates). Two callers drive
it: the simulated engine (``engine_harness.sim``) in real time, sleeping each step's modelled duration,
and the calibration's replay (``analysis.calibrate``) in virtual time, adding it to a clock of its own;
so a prediction schedules exactly as the sim engine does. Three modes (``SchedulerMode``):

``vllm`` (vLLM V1)
    Each step first gives one token to every running request in decode (in running order), then prefill
    chunks of partially prefilled and waiting requests up to the remaining budget. With ``D`` decodes
    running, a prompt of ``P`` uncached tokens takes ``ceil(P / (budget - D))`` steps, each carrying the
    ``D`` decodes (mixed steps). When KV blocks run out, the last running request is preempted: its
    blocks are freed and it goes back to the front of the waiting queue to be recomputed.
``sglang`` (SGLang default)
    A step that can run a prefill chunk runs it *instead of* the decode batch; chunk size = budget. The
    prompt takes ``ceil(P / budget)`` steps, during which the ``D`` decodes get no token; decodes do not
    count against the budget in decode steps.
``sglang-mixed`` (SGLang ``--enable-mixed-chunk``)
    The decode batch rides along with the prefill chunk and takes ``D`` tokens of its budget:
    ``ceil(P / (budget - D))`` steps, as in vLLM.

A request's first token is sampled at the end of its last prefill step (so ``max_tokens=1`` finishes
there). Prefix caching: full blocks whose chained hash is cached are not computed; at most
``num_tokens - 1`` tokens hit, as in vLLM, so at least one token is always computed. Prefix-cache
queries and hits are counted in tokens when a request is admitted.
"""

from __future__ import annotations

import enum
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

from engine_harness.kv_blocks import BlockPool, block_hashes
from engine_harness.step_model import Chunk, StepShape

__all__ = [
    "EOS_TOKEN_ID",
    "ScheduledChunk",
    "Scheduler",
    "SchedulerMode",
    "SimRequest",
    "Status",
    "StepPlan",
    "StepResult",
    "TokenOutput",
]

# vLLM V1; SGLang's default (a prefill step replaces the decodes); SGLang with --enable-mixed-chunk
SchedulerMode = Literal["vllm", "sglang", "sglang-mixed"]

EOS_TOKEN_ID = 258  # <|im_end|> of the bundled byte-level tokenizer


class Status(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass(eq=False)
class SimRequest:
    """One request as the scheduler sees it; ``token_ids`` is the prompt followed by the outputs so far."""

    request_id: str
    prompt_token_ids: list[int]
    max_tokens: int
    min_tokens: int = 0
    ignore_eos: bool = False
    token_ids: list[int] = field(default_factory=list)
    num_computed_tokens: int = 0
    num_cached_tokens: int | None = None  # prefix-cache hit at first admission
    block_ids: list[int] = field(default_factory=list)
    hashes: list[int] = field(default_factory=list)
    num_cached_blocks: int = 0  # leading blocks already registered in the prefix cache
    status: Status = Status.WAITING
    finish_reason: str | None = None
    num_preemptions: int = 0
    num_external_tokens: int = 0  # prompt tokens whose KV a connector loaded (not computed here)

    def __post_init__(self) -> None:
        if not self.token_ids:
            self.token_ids = list(self.prompt_token_ids)

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - len(self.prompt_token_ids)

    @property
    def in_decode(self) -> bool:
        """Has its prompt (and any recomputation) done; the next step computes the last sampled token."""
        return self.num_output_tokens > 0 and self.num_computed_tokens == self.num_tokens - 1


@dataclass(frozen=True, slots=True)
class ScheduledChunk:
    """``num_tokens`` of one request computed in a step, starting after ``context`` computed tokens."""

    request: SimRequest
    num_tokens: int
    context: int
    is_decode: bool


@dataclass
class StepPlan:
    """What one step computes."""

    chunks: list[ScheduledChunk] = field(default_factory=list)
    preempted: list[SimRequest] = field(default_factory=list)
    admitted: list[SimRequest] = field(default_factory=list)

    @property
    def shape(self) -> StepShape:
        """What the step computes, as the step-time model prices it."""
        decodes = [c for c in self.chunks if c.is_decode]
        chunks = tuple(Chunk(c.num_tokens, c.context) for c in self.chunks if not c.is_decode)
        return StepShape(sum(c.num_tokens for c in decodes), chunks, float(sum(c.context for c in decodes)))

    @property
    def num_tokens(self) -> int:
        return sum(c.num_tokens for c in self.chunks)


@dataclass(frozen=True, slots=True)
class TokenOutput:
    """A token a request generated at the end of a step (``finish_reason`` set when it was the last)."""

    request: SimRequest
    token_id: int
    finish_reason: str | None


@dataclass
class StepResult:
    outputs: list[TokenOutput] = field(default_factory=list)
    finished: list[SimRequest] = field(default_factory=list)


class Scheduler:
    """Waiting queue, running list and KV pool; plans and commits steps in one of three modes."""

    def __init__(
        self,
        mode: SchedulerMode = "vllm",
        max_num_batched_tokens: int = 8192,
        max_num_seqs: int = 256,
        block_size: int = 16,
        num_kv_blocks: int = 65536,
        enable_prefix_caching: bool = True,
    ) -> None:
        self.mode = mode
        self.budget = max_num_batched_tokens
        self.max_num_seqs = max_num_seqs
        self.block_size = block_size
        self.pool = BlockPool(num_kv_blocks, block_size, enable_prefix_caching)
        self.waiting: deque[SimRequest] = deque()
        self.running: list[SimRequest] = []
        self.prefix_cache_queries = 0
        self.prefix_cache_hits = 0
        self.num_preemptions = 0

    # -- requests ---------------------------------------------------------------------------------

    def add(self, request: SimRequest) -> None:
        """Queue a new request (FCFS)."""
        request.hashes = block_hashes(request.token_ids, self.block_size)
        request.status = Status.WAITING
        self.waiting.append(request)

    def abort(self, request: SimRequest) -> bool:
        """Remove a request wherever it is and free its blocks; False if it had already finished."""
        if request.status is Status.FINISHED:
            return False
        if request.status is Status.RUNNING:
            self.running.remove(request)
        else:
            self.waiting.remove(request)
        self._free(request)
        request.status = Status.FINISHED
        request.finish_reason = "abort"
        return True

    def has_work(self) -> bool:
        return bool(self.running or self.waiting)

    # -- planning ---------------------------------------------------------------------------------

    def schedule(self) -> StepPlan:
        """Plan the next step (may preempt and admit requests); an empty plan means nothing can run."""
        if self.mode == "vllm":
            return self._schedule_vllm()
        return self._schedule_sglang(mixed=self.mode == "sglang-mixed")

    def _schedule_vllm(self) -> StepPlan:
        plan = StepPlan()
        budget = self.budget
        i = 0
        while i < len(self.running) and budget > 0:
            req = self.running[i]
            n = min(req.num_tokens - req.num_computed_tokens, budget)
            if not self._grow_or_preempt(req, n, plan):
                break
            plan.chunks.append(ScheduledChunk(req, n, req.num_computed_tokens, req.in_decode))
            budget -= n
            i += 1
        if not plan.preempted:
            self._admit(plan, budget)
        return plan

    def _schedule_sglang(self, mixed: bool) -> StepPlan:
        plan = StepPlan()
        decodes = [r for r in self.running if r.in_decode]
        budget = self.budget - (len(decodes) if mixed else 0)
        # Continue chunked prefills (running, not yet decoding) first, then admit waiting requests.
        for req in [r for r in self.running if not r.in_decode]:
            if budget <= 0:
                break
            if req.status is not Status.RUNNING:
                continue  # preempted a moment ago
            n = min(req.num_tokens - req.num_computed_tokens, budget)
            if not self._grow_or_preempt(req, n, plan):
                break
            plan.chunks.append(ScheduledChunk(req, n, req.num_computed_tokens, False))
            budget -= n
        if not plan.preempted:
            self._admit(plan, budget)
        if plan.chunks and not mixed:
            return plan
        for req in decodes:
            if req.status is not Status.RUNNING:
                continue  # preempted by an earlier decode of this step
            if not self._grow_or_preempt(req, 1, plan):
                break
            plan.chunks.append(ScheduledChunk(req, 1, req.num_computed_tokens, True))
        return plan

    def _admit(self, plan: StepPlan, budget: int) -> None:
        """Move waiting requests into the running list while budget, seats and KV blocks allow."""
        while self.waiting and budget > 0 and len(self.running) < self.max_num_seqs:
            req = self.waiting[0]
            hits: list[int] = []
            if req.num_computed_tokens == 0:
                max_hit_blocks = (req.num_tokens - 1) // self.block_size
                hits = self.pool.lookup(req.hashes[:max_hit_blocks])
            num_hit = max(len(hits) * self.block_size, req.num_external_tokens)
            n = min(req.num_tokens - num_hit, budget)
            need = -(-(num_hit + n) // self.block_size) - len(hits)
            if need + self.pool.num_evictable(hits) > self.pool.num_free:
                break
            self.pool.touch(hits)
            new_blocks = self.pool.allocate(need)
            assert new_blocks is not None
            req.block_ids = hits + new_blocks
            req.num_cached_blocks = len(hits)
            req.num_computed_tokens = num_hit
            if self.pool.enable_caching:
                self.prefix_cache_queries += req.num_tokens
                self.prefix_cache_hits += len(hits) * self.block_size
            if req.num_cached_tokens is None:
                req.num_cached_tokens = num_hit
            self.waiting.popleft()
            req.status = Status.RUNNING
            self.running.append(req)
            plan.admitted.append(req)
            plan.chunks.append(ScheduledChunk(req, n, num_hit, False))
            budget -= n

    def _grow(self, req: SimRequest, n: int) -> bool:
        """Give ``req`` enough blocks for ``n`` more tokens; False (nothing taken) if the pool is short."""
        need = -(-(req.num_computed_tokens + n) // self.block_size) - len(req.block_ids)
        if need <= 0:
            return True
        blocks = self.pool.allocate(need)
        if blocks is None:
            return False
        req.block_ids.extend(blocks)
        return True

    def _grow_or_preempt(self, req: SimRequest, n: int, plan: StepPlan) -> bool:
        """``_grow``, preempting the last running request until it fits; False if ``req`` itself went."""
        while not self._grow(req, n):
            victim = self.running.pop()
            self._preempt(victim)
            plan.preempted.append(victim)
            if any(c.request is victim for c in plan.chunks):  # SGLang order: planned earlier this step
                plan.chunks = [c for c in plan.chunks if c.request is not victim]
            if victim is req:
                return False
        return True

    def _preempt(self, req: SimRequest) -> None:
        """Preemption by recompute: free the blocks, forget progress, go to the front of the queue."""
        self._free(req)
        req.num_computed_tokens = 0
        req.num_cached_blocks = 0
        req.num_preemptions += 1
        req.status = Status.WAITING
        self.num_preemptions += 1
        self.waiting.appendleft(req)

    def _free(self, req: SimRequest) -> None:
        self.pool.release(req.block_ids)
        req.block_ids = []

    # -- committing -------------------------------------------------------------------------------

    def commit(self, plan: StepPlan, sample: Callable[[SimRequest], int]) -> StepResult:
        """Apply a planned step: advance computed tokens, cache full blocks, sample, finish requests.

        Requests aborted while the step ran are skipped. ``sample(request)`` returns the generated id.
        """
        result = StepResult()
        bs = self.block_size
        for chunk in plan.chunks:
            req = chunk.request
            if req.status is not Status.RUNNING:
                continue
            req.num_computed_tokens += chunk.num_tokens
            full = min(req.num_computed_tokens // bs, len(req.block_ids))
            if full > req.num_cached_blocks and self.pool.enable_caching:
                if len(req.hashes) < full:
                    parent = req.hashes[-1] if req.hashes else None
                    req.hashes.extend(block_hashes(req.token_ids, bs, len(req.hashes), parent))
                for b in range(req.num_cached_blocks, full):
                    self.pool.cache(req.block_ids[b], req.hashes[b])
                req.num_cached_blocks = full
            if req.num_computed_tokens < req.num_tokens:
                continue  # a prefill chunk that is not the last one
            token = sample(req)
            req.token_ids.append(token)
            n_out = req.num_output_tokens
            reason: str | None = None
            if n_out >= req.max_tokens:
                reason = "length"
            elif token == EOS_TOKEN_ID and not req.ignore_eos and n_out >= req.min_tokens:
                reason = "stop"
            result.outputs.append(TokenOutput(req, token, reason))
            if reason is not None:
                self.running.remove(req)
                self._free(req)
                req.status = Status.FINISHED
                req.finish_reason = reason
                result.finished.append(req)
        return result

    @property
    def kv_usage(self) -> float:
        return self.pool.usage
