"""A point's derived figures from what the run folder stores: one pure function, ``derive``.

Inputs (all stored by the live protocol, see ``microbench.results.layout``): the ``Observation`` of one
attempt (times of the injection, its usage, the engine's own steps, what failed live), the stamps of every
decode stream and of the injection (``raw/``), the decode batch's Phase 1 ``Baseline`` (``baselines/``),
the ``/metrics`` snapshots before and after (``metrics/``), the protocol's rules and the engine's metric
names. Output: the ``RunRecord`` with seed 002's fields, ours, and the validity decision. Nothing here
reads a clock, a socket or a file, so every record of a run can be re-derived and every rule is testable
on hand-built stamps.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import pandas as pd

from engine_harness.metric_names import MetricNames
from engine_harness.metrics import MetricsError, Snapshot, step_counts
from engine_harness.step_model import num_prefill_steps
from microbench.client.prompts import BLOCK_TOKENS
from microbench.results.records import (
    Baseline,
    Derived,
    Interference,
    LocalBaseline,
    Observation,
    ProtocolRules,
    RunRecord,
    Validity,
)
from microbench.results.steps import (
    ChunkCount,
    PrefillSteps,
    attempt_decode_steps,
    count_chunks,
    prefill_steps,
    window_steps,
)
from microbench.results.validity import implausible_steps, stalled_between_steps
from microbench.results.windows import Gap, gaps_of, is_steady, percentile_ms, split_window

__all__ = ["METRICS_READ", "DeriveInputs", "derive", "stream_gaps"]

# The engine quantities (``MetricNames`` fields) ``derive`` reads from the scrapes: what a run stores.
METRICS_READ = (
    "iteration_tokens",
    "prefix_cache_queries",
    "prefix_cache_hits",
    "preemptions",
    "queue_time",
    "prefill_time",
    "requests_running",
    "requests_waiting",
)


@dataclass(frozen=True)
class DeriveInputs:
    """Everything ``derive`` reads, as loaded from the run folder."""

    observation: Observation
    stamps: pd.DataFrame | None  # columns stream, role, t_ns, tokens, seen
    baseline: Baseline | None
    before: Snapshot | None
    after: Snapshot | None
    rules: ProtocolRules
    metrics: MetricNames


def stream_gaps(stamps: pd.DataFrame | None, stream: int, discard_tokens: int) -> list[Gap]:
    """The gaps of decode stream ``stream`` past its first ``discard_tokens`` tokens.

    The stamps hold a slice of the stream; ``seen`` (tokens received so far, this chunk included) says
    how many tokens came before the slice, so the discard rule counts from the stream's real start.
    """
    if stamps is None or stamps.empty:
        return []
    rows = stamps[(stamps["stream"] == stream) & (stamps["role"] == "decode")].sort_values(
        "t_ns", kind="stable"
    )
    if rows.empty:
        return []
    before = int(rows["seen"].iloc[0]) - int(rows["tokens"].iloc[0])
    return gaps_of(rows["t_ns"].tolist(), rows["tokens"].tolist(), max(discard_tokens - before, 0))


@dataclass
class WindowCut:
    """Decode gaps of every stream cut around the prefill window [send, first token]."""

    local: list[Gap] = field(default_factory=list)
    during: list[Gap] = field(default_factory=list)
    after: list[Gap] = field(default_factory=list)
    per_stream_during: list[list[Gap]] = field(default_factory=list)
    max_per_read: int = 0
    reasons: list[str] = field(default_factory=list)


def cut_windows(
    streams: Sequence[list[Gap]], t0: int, t1: int, rules: ProtocolRules, exclusive: bool = False
) -> WindowCut:
    """Local baseline, window and recovery gaps of every stream, and the per-stream checks.
    ``exclusive``: the prefill steps ran instead of the decode steps (see ``split_window``)."""
    cut = WindowCut()
    all_before = [split_window(g, t0, t1).before[-rules.local_gaps :] for g in streams]
    # tokens of the step that produced the prefill's first token arrive within a fraction of a decode
    # step of it: a quarter of the local baseline gap
    slack = int(0.25 * 1e6 * (percentile_ms([g for b in all_before for g in b], 50) or 0.0))
    for i, gaps in enumerate(streams):
        split = split_window(gaps, t0, t1, slack, exclusive)
        local_i = split.before[-rules.local_gaps :]
        recovery = split.after[: rules.recovery_gaps]
        cut.local.extend(local_i)
        cut.during.extend(split.during)
        cut.after.extend(recovery)
        cut.per_stream_during.append(split.during)
        if not split.during or not split.after:
            cut.reasons.append(f"decode stream {i} did not span the prefill window")
        if not is_steady(local_i, rules.local_gaps, rules.steady_ratio):
            cut.reasons.append(f"decode stream {i} was not steady right before the injection")
        window = local_i + split.during + recovery
        cut.max_per_read = max(cut.max_per_read, max((g.tokens for g in window), default=0))
    return cut


@dataclass(frozen=True)
class EngineCounts:
    """What the engine's /metrics say happened between the scrapes."""

    hits: float | None = None
    queries: float | None = None
    preemptions: float | None = None
    steps: int | None = None
    mixed_steps: int | None = None


def engine_counts(
    before: Snapshot | None, after: Snapshot | None, names: MetricNames, d: int
) -> EngineCounts:
    if before is None or after is None:
        return EngineCounts()
    steps = mixed = None
    try:
        counts = step_counts(before, after, names, d)
        steps, mixed = counts.steps, counts.mixed_steps
    except MetricsError:
        pass
    return EngineCounts(
        hits=after.delta(before, names.prefix_cache_hits),
        queries=after.delta(before, names.prefix_cache_queries),
        preemptions=after.delta(before, names.preemptions),
        steps=steps,
        mixed_steps=mixed,
    )


def cold_and_clean(obs: Observation, counts: EngineCounts, scraped_after: bool) -> list[str]:
    """The injection hit no prefix cache, nothing was preempted, the engine saw exactly P tokens. A hit
    shorter than a cold prompt's first block (``BLOCK_TOKENS``) is a token-granular cache matching its
    first ids by chance (SGLang's radix cache, page size 1), not a warm prompt: it does not count."""
    reasons = []
    cached = obs.cached_prompt_tokens
    if counts.hits and counts.hits >= BLOCK_TOKENS:
        reasons.append(f"the injection hit the prefix cache ({counts.hits:.0f} tokens in /metrics)")
    if cached and cached >= BLOCK_TOKENS:
        reasons.append(f"the injection hit the prefix cache (usage.cached_tokens = {cached})")
    if scraped_after and counts.hits is None and cached is None:
        reasons.append("prefix-cache hits could not be verified (no counter, no usage details)")
    if counts.preemptions:
        reasons.append(f"{counts.preemptions:.0f} preemption(s) during the window")
    p = obs.config.new_prefill_tokens
    if obs.prompt_tokens is not None and obs.prompt_tokens != p:
        reasons.append(f"the engine counted {obs.prompt_tokens} prompt tokens, not {p}")
    return reasons


def local_context(stamps: pd.DataFrame | None, d: int, t0: int, prefix: int) -> float | None:
    """Mean context of the decode streams at the send: the shared prefix plus the tokens each had got."""
    if stamps is None or stamps.empty or d == 0:
        return None
    decode = stamps[(stamps["role"] == "decode") & (stamps["t_ns"] <= t0)]
    if decode.empty:
        return None
    return prefix + float(decode.groupby("stream")["seen"].max().mean())


def engine_times(
    inp: DeriveInputs, duration_ms: float | None
) -> tuple[float | None, float | None, float | None]:
    """The injection's queue and prefill time from the engine's histograms, and the front end's share of
    the client's send → first token. Only when exactly one request (the injection) was observed."""
    before, after, names = inp.before, inp.after, inp.metrics
    if before is None or after is None or not names.queue_time or not names.prefill_time:
        return None, None, None
    count = after.delta(before, [n + "_count" for n in names.prefill_time])
    if count != 1:
        return None, None, None
    queue = after.delta(before, [n + "_sum" for n in names.queue_time])
    prefill = after.delta(before, [n + "_sum" for n in names.prefill_time])
    queue_ms = queue * 1e3 if queue is not None else None
    prefill_ms = prefill * 1e3 if prefill is not None else None
    frontend = None
    if duration_ms is not None and queue_ms is not None and prefill_ms is not None:
        frontend = duration_ms - queue_ms - prefill_ms
    return queue_ms, prefill_ms, frontend


def _ratio(num: float | None, den: float | None) -> float | None:
    return num / den if num is not None and den else None


def _diff(a: float | None, b: float | None) -> float | None:
    return a - b if a is not None and b is not None else None


def derived_figures(
    cut: WindowCut | None, steps: PrefillSteps, chunks: ChunkCount, d: int, has_log: bool, first_token: bool
) -> Derived:
    """Every derived figure against the local baseline; per-step penalties from the engine's record."""
    local_p50 = percentile_ms(cut.local, 50) if cut else None
    aggregate = None
    if cut is not None and local_p50 is not None:
        aggregate = sum(
            (g.end_ns - g.start_ns) / 1e6 - local_p50 * g.tokens for s in cut.per_stream_during for g in s
        )
    # no first token, no prefill window: nothing to divide (the point is invalid anyway, and says why)
    identity = aggregate / (d * chunks.used) if aggregate is not None and d and first_token else None
    # a step log without durations (a mode whose elapsed field is no step, and no stamps) counts the
    # chunks but prices none of them: the client's identity does
    timed = has_log and steps.full_ms is not None
    penalty, source = (steps.penalty_full_ms(), "engine_steps") if timed else (identity, "identity")
    if penalty is None:
        source = "none"
    total = steps.total_penalty_ms() if timed else None
    during_p50 = percentile_ms(cut.during, 50) if cut else None
    during = local_p50 + penalty if local_p50 is not None and penalty is not None else None
    return Derived(
        tpot_penalty_ms=penalty,
        penalty_source=source,
        penalty_last_step_ms=steps.penalty_last_ms() if timed else None,
        tpot_during_prefill_ms=during,
        penalty_ratio=_ratio(during, local_p50),
        tpot_penalty_p50_ms=_diff(during_p50, local_p50),
        tpot_penalty_ratio=_ratio(during_p50, local_p50),
        penalty_identity_ms=identity,
        identity_check=_ratio(aggregate, d * total if total is not None else None),
        num_chunks_used=chunks.used,
        chunks_note=chunks.note,
        total_interference_ms=total if timed else (chunks.used * identity if identity is not None else None),
        decode_tokens_delayed=d * chunks.used,
        aggregate_decode_delay_ms=aggregate,
    )


def _interference(inp: DeriveInputs, cut: WindowCut | None, steps: PrefillSteps, chunks: ChunkCount,
                  counts: EngineCounts) -> Interference:  # fmt: skip
    obs = inp.observation
    t0 = obs.t_inject_ns
    duration = (obs.t_first_token_ns - t0) / 1e6 if obs.t_first_token_ns is not None else None
    queue, prefill_time, frontend = engine_times(inp, duration)
    during = cut.during if cut else []
    has_log = bool(steps.prefill)
    attempt_decode = attempt_decode_steps(obs.engine_steps or [], obs.config.decode_batch_size)
    return Interference(
        tpot_during_prefill_p50_ms=percentile_ms(during, 50),
        tpot_during_prefill_p90_ms=percentile_ms(during, 90),
        tpot_during_prefill_max_ms=percentile_ms(during, 100),
        tpot_after_prefill_p50_ms=percentile_ms(cut.after, 50) if cut else None,
        num_chunks_actual=chunks.actual,
        num_chunks_source=chunks.source,
        num_chunks_expected=num_prefill_steps(
            obs.config.new_prefill_tokens,
            obs.config.chunk_size,
            obs.config.decode_batch_size,
            obs.config.scheduling,
        ),
        engine_steps=counts.steps,
        full_chunk_steps=len(steps.full) if has_log else None,
        step_time_full_chunk_ms=steps.full_ms if has_log else None,
        step_time_last_chunk_ms=steps.last_partial.elapsed_ms if steps.last_partial else None,
        decode_step_ms=steps.decode_step_ms,
        attempt_decode_step_ms=attempt_decode[0],
        attempt_decode_steps=attempt_decode[1] or None,
        engine_prefill_ms=steps.prefill_ms if has_log else None,
        engine_queue_ms=queue,
        engine_prefill_time_ms=prefill_time,
        frontend_ms=frontend,
        client_lag_max_ms=obs.client_lag_max_ms,
        prefill_duration_ms=duration,
        prefill_ttft_ms=duration,
        n_gaps_during=len(during),
        max_tokens_per_read=cut.max_per_read if cut else 0,
        recovery_gaps_ms=[round(g.ms, 4) for g in cut.after] if cut else [],
        prefix_cache_hits=counts.hits,
        prefix_cache_queries=counts.queries,
        cached_prompt_tokens=obs.cached_prompt_tokens,
        preemptions=counts.preemptions,
        engine_steps_log=window_steps(obs.engine_steps or []),
        step_mode=obs.step_mode,
    )


def derive(inp: DeriveInputs) -> RunRecord:
    """Cut the windows, compute seed 002's fields and ours, and decide validity."""
    obs, rules = inp.observation, inp.rules
    cfg = obs.config
    d = cfg.decode_batch_size
    t0 = obs.t_inject_ns
    t1 = obs.t_first_token_ns if obs.t_first_token_ns is not None else t0
    reasons = list(obs.notes)
    cut: WindowCut | None = None
    if obs.baseline_file is not None:
        streams = [stream_gaps(inp.stamps, i, rules.discard_tokens) for i in range(d)]
        cut = cut_windows(streams, t0, t1, rules, exclusive=cfg.scheduling == "exclusive")  # see windows
        reasons += cut.reasons
        if obs.decode_failure is not None and not all(cut.per_stream_during):
            reasons.append(obs.decode_failure)
    counts = engine_counts(inp.before, inp.after, inp.metrics, d)
    reasons += cold_and_clean(obs, counts, inp.after is not None)
    reasons += implausible_steps(obs.engine_steps or [])  # a frozen engine's step is not interference
    reasons += stalled_between_steps(obs.engine_steps or [])  # nor a freeze between two steps
    steps = prefill_steps(obs.engine_steps or [], cfg.chunk_size, d, cfg.scheduling)
    chunks = count_chunks(
        len(steps.prefill) or None,
        counts.mixed_steps,
        num_prefill_steps(cfg.new_prefill_tokens, cfg.chunk_size, d, cfg.scheduling),
    )
    local = None
    if cut is not None:
        local = LocalBaseline(
            tpot_p50_ms=percentile_ms(cut.local, 50),
            tpot_p90_ms=percentile_ms(cut.local, 90),
            n_gaps=len(cut.local),
            context_tokens=local_context(inp.stamps, d, t0, cfg.decode_context),
        )
    return RunRecord(
        run_id=obs.run_id,
        config=cfg,
        baseline=inp.baseline,
        local_baseline=local,
        interference=_interference(inp, cut, steps, chunks, counts),
        derived=derived_figures(cut, steps, chunks, d, bool(steps.prefill), obs.t_first_token_ns is not None),
        validity=Validity(valid=not reasons, reasons=reasons, attempt=obs.attempt),
        t_inject_ns=t0,
        t_first_token_ns=t1,
        raw_file=obs.raw_file or "",
    )
