"""Replay a recorded trace through the fitted simulator in virtual time: the predicted per-request trace.

The one scheduler (``engine_harness.scheduler_model``, which the simulated engine drives in real time)
plans every step; the fitted step model (``SimSettings.step``) says how long it takes; a virtual clock
adds it up, so nothing sleeps and a 10-minute trace predicts in seconds. The loop is the sim engine's:
a request reaches the engine at its recorded send plus the API server's time for it
(``frontend_fixed_ms + frontend_ns_per_token × P``: the fit cannot tell the request's way in from the
first token's way back, and the way in is where it decides which step a request joins), joins the
waiting queue, and is considered when the next step is planned; an idle engine starts a step the moment
a request arrives; a step lasts its step-model time plus the time the engine's step log leaves out (the
API server's, per step and per token the step streams: ``analysis.calibrate.stream_time``; and, for a step
carrying prompt tokens, per step and per prompt token: ``analysis.calibrate.prefill_time``), and the first
step after an idle spell its wake cost for that spell (``SimSettings.wake``: ``engine_harness.wake_model``,
measured by the sweep's wake probe); every token of a step reaches the client at the step's end.

What is replayed, per request of the real trace that completed (``status == "ok"``): its send time, its
prompt length (the server's ``usage.prompt_tokens``, else the requested one), its output length (the
server's ``usage.completion_tokens``, else ``max_tokens``), and its prefix group: requests of one group
share the group's first ``prefix_tokens`` token ids (seeded by the group's name), so the prefix cache sees
what the real engine saw; every other token id is unique to its request (seeded by its id). Requests that
did not complete in the real run are kept in the predicted trace with their real status, not replayed.
"""

from __future__ import annotations

import time
import zlib
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from analysis.calibrate.config import SimSettings
from engine_harness.scheduler_model import Scheduler, SimRequest
from engine_harness.step_model import StepCost

__all__ = ["ReplayRequest", "ReplayResult", "predicted_frame", "replay", "replay_requests"]

_TOKEN = 1  # the token every replayed step generates (output ids do not matter: lengths are the trace's)
_ID_SPACE = 1 << 30  # token ids drawn from here: two unrelated prompts never share a block by chance


@dataclass(frozen=True)
class ReplayRequest:
    """One request as the replay sends it to the engine."""

    request_id: str
    arrival_ns: int  # when the engine sees it (trace clock)
    prompt_token_ids: list[int]
    output_tokens: int


@dataclass
class ReplayResult:
    """Token times per request (trace clock, engine side), each request's prefix-cache hit, the step log."""

    token_ns: dict[str, list[int]] = field(default_factory=dict)
    cached_tokens: dict[str, int] = field(default_factory=dict)
    steps: list[dict[str, Any]] = field(default_factory=list)
    wall_s: float = 0.0

    def steps_frame(self) -> pd.DataFrame:
        return pd.DataFrame(self.steps)


def _ids(key: str, n: int) -> list[int]:
    rng = np.random.default_rng(zlib.crc32(key.encode()))
    return rng.integers(0, _ID_SPACE, size=n).tolist() if n > 0 else []


def _int(value: Any) -> int | None:
    return None if value is None or pd.isna(value) else int(value)


def replay_requests(frame: pd.DataFrame, settings: SimSettings) -> list[ReplayRequest]:
    """The completed requests of a trace frame as the replay sends them (sorted by arrival)."""
    out = []
    for row in frame.itertuples(index=False):
        send = _int(row.send_ns)
        if row.status != "ok" or send is None:
            continue
        prompt = _int(row.input_tokens) or int(row.prompt_tokens)
        output = _int(row.output_tokens) or int(row.max_tokens)
        shared = min(_int(row.prefix_tokens) or 0, prompt - 1) if row.prefix_group else 0
        ids = _ids(f"prefix:{row.prefix_group}", shared) + _ids(f"request:{row.request_id}", prompt - shared)
        arrival = send + int(settings.frontend_fixed_ms * 1e6 + settings.frontend_ns_per_token * prompt)
        out.append(ReplayRequest(str(row.request_id), arrival, ids, max(1, output)))
    return sorted(out, key=lambda r: r.arrival_ns)


def replay(
    requests: list[ReplayRequest], settings: SimSettings, step: StepCost | None = None
) -> ReplayResult:
    """Run ``requests`` through the scheduler in virtual time, each step priced by ``step`` (default:
    ``settings.step``). A request that can never fit the engine (prompt + output beyond its context or
    KV pool) raises ``ValueError`` naming it."""
    cost = step or settings.step
    limit = min(settings.max_model_len, settings.num_kv_blocks * settings.block_size)
    for r in requests:
        if len(r.prompt_token_ids) + r.output_tokens > limit:
            raise ValueError(
                f"request {r.request_id}: {len(r.prompt_token_ids)} prompt + {r.output_tokens} output tokens "
                f"exceed the simulated engine's context ({limit} tokens)"
            )
    sched = Scheduler(
        mode=settings.mode,
        max_num_batched_tokens=settings.max_num_batched_tokens,
        max_num_seqs=settings.max_num_seqs,
        block_size=settings.block_size,
        num_kv_blocks=settings.num_kv_blocks,
        enable_prefix_caching=settings.enable_prefix_caching,
    )
    result = ReplayResult()
    started = time.perf_counter()
    now, i, n = 0, 0, len(requests)
    idle_from: int | None = 0  # where the engine's idle spell began (None: it is busy); idle from the start
    while i < n or sched.has_work():
        while i < n and requests[i].arrival_ns <= now:
            r = requests[i]
            sched.add(SimRequest(r.request_id, r.prompt_token_ids, r.output_tokens, ignore_eos=True))
            result.token_ns[r.request_id] = []
            i += 1
        if not sched.has_work():
            idle_from = now if idle_from is None else idle_from
            now = requests[i].arrival_ns  # idle: the next step starts when the next request arrives
            continue
        plan = sched.schedule()
        if not plan.chunks:
            if plan.preempted:
                continue
            if i == n:  # nothing can run and nothing will arrive: the engine is stuck
                stuck = ", ".join(r.request_id for r in list(sched.waiting)[:3])
                raise ValueError(f"the simulated engine cannot schedule {stuck}: KV pool too small")
            now = requests[i].arrival_ns
            continue
        shape = plan.shape
        streamed = sum(1 for c in plan.chunks if c.context + c.num_tokens >= c.request.num_tokens)
        wake = settings.wake.extra_ms((now - idle_from) / 1e9) if idle_from is not None else 0.0
        idle_from = None
        duration = round((cost.step_ms(shape) + wake) * 1e6)  # what the engine's step log would say
        stream = round(settings.beyond_log_ms(streamed, shape.prefill_tokens) * 1e6)
        result.steps.append(
            {
                "t_start_ns": now,
                "duration_ns": duration,
                "stream_ns": stream,
                "decode_tokens": shape.decode_tokens,
                "prefill_tokens": shape.prefill_tokens,
                "num_prefill_reqs": len(shape.chunks),
                "preemptions": len(plan.preempted),
            }
        )
        now += duration + stream
        for out in sched.commit(plan, lambda _req: _TOKEN).outputs:
            result.token_ns[out.request.request_id].append(now)
        for req in plan.admitted:
            if req.num_cached_tokens is not None:
                result.cached_tokens.setdefault(req.request_id, req.num_cached_tokens)
    result.wall_s = time.perf_counter() - started
    return result


def predicted_frame(frame: pd.DataFrame, result: ReplayResult) -> pd.DataFrame:
    """The real trace's rows with the replay's times: every replayed request gets its predicted chunk
    stamps (one token each, at its step's end), first and last chunk, and its token counts; requests not
    replayed keep their real status, with their times cleared."""
    pred = frame.copy()
    times = pred["request_id"].astype(str).map(result.token_ns)
    chunk_ns, chunk_tokens = [], []
    for t in times:
        stamps = list(t) if isinstance(t, list) else []
        chunk_ns.append(stamps)
        chunk_tokens.append([1] * len(stamps))
    pred["chunk_ns"] = chunk_ns
    pred["chunk_tokens"] = chunk_tokens
    pred["num_chunks"] = [len(s) for s in chunk_ns]
    done = pred["num_chunks"] > 0
    first = [s[0] if s else None for s in chunk_ns]
    last = [s[-1] if s else None for s in chunk_ns]
    pred["first_chunk_ns"] = pd.array(first, dtype="Int64")
    pred["last_chunk_ns"] = pd.array(last, dtype="Int64")
    pred["done_ns"] = pred["last_chunk_ns"]
    pred["headers_ns"] = pd.array([None] * len(pred), dtype="Int64")
    pred["output_tokens"] = pd.array([len(s) if s else None for s in chunk_ns], dtype="Int64")
    cached = pred["request_id"].astype(str).map(result.cached_tokens)
    pred["cached_tokens"] = pd.array([None if pd.isna(c) else int(c) for c in cached], dtype="Int64")
    pred.loc[done, "finish_reason"] = "length"
    pred.loc[done, "error"] = None
    pred.loc[~done, "error"] = "not replayed: the request did not complete in the real run"
    pred.loc[done, "tokens_from_usage"] = True
    return pred
