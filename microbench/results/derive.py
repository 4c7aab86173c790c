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
from typing import Literal

import pandas as pd

from engine_harness.engines import MetricNames
from engine_harness.metrics import MetricsError, Snapshot, step_counts
from engine_harness.steps import EngineStep
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
from microbench.results.windows import Gap, expected_chunks, gaps_of, is_steady, percentile_ms, split_window

__all__ = ["DeriveInputs", "derive", "stream_gaps"]


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


def cut_windows(streams: Sequence[list[Gap]], t0: int, t1: int, rules: ProtocolRules) -> WindowCut:
    """Local baseline, window and recovery gaps of every stream, and the per-stream checks."""
    cut = WindowCut()
    all_before = [split_window(g, t0, t1).before[-rules.local_gaps :] for g in streams]
    # tokens of the step that produced the prefill's first token arrive within a fraction of a decode
    # step of it: a quarter of the local baseline gap
    slack = int(0.25 * 1e6 * (percentile_ms([g for b in all_before for g in b], 50) or 0.0))
    for i, gaps in enumerate(streams):
        split = split_window(gaps, t0, t1, slack)
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
    """The injection hit no prefix cache, nothing was preempted, the engine saw exactly P tokens."""
    reasons = []
    cached = obs.cached_prompt_tokens
    if counts.hits:
        reasons.append(f"the injection hit the prefix cache ({counts.hits:.0f} tokens in /metrics)")
    if cached:
        reasons.append(f"the injection hit the prefix cache (usage.cached_tokens = {cached})")
    if scraped_after and counts.hits is None and cached is None:
        reasons.append("prefix-cache hits could not be verified (no counter, no usage details)")
    if counts.preemptions:
        reasons.append(f"{counts.preemptions:.0f} preemption(s) during the window")
    p = obs.config.new_prefill_tokens
    if obs.prompt_tokens is not None and obs.prompt_tokens != p:
        reasons.append(f"the engine counted {obs.prompt_tokens} prompt tokens, not {p}")
    return reasons


def window_steps(steps: Sequence[EngineStep]) -> list[EngineStep]:
    """Steps from the first to the last prefill-carrying one (the injection is the only prefill)."""
    idx = [i for i, st in enumerate(steps) if st.prefill_tokens > 0]
    return list(steps[idx[0] : idx[-1] + 1]) if idx else []


def _median(values: Sequence[float]) -> float | None:
    return float(pd.Series(values).median()) if len(values) else None


@dataclass(frozen=True)
class ChunkCount:
    actual: int | None
    source: Literal["engine_log", "histogram", "none"]
    steps: list[EngineStep]


def count_chunks(obs: Observation, counts: EngineCounts) -> ChunkCount:
    """Prefill-carrying steps: the engine's step log, else its tokens-per-step histogram."""
    steps = window_steps(obs.engine_steps or [])
    if steps:
        return ChunkCount(sum(1 for st in steps if st.prefill_tokens > 0), "engine_log", steps)
    if counts.mixed_steps is not None:
        return ChunkCount(counts.mixed_steps, "histogram", [])
    return ChunkCount(None, "none", [])


def _derived(
    cut: WindowCut | None, baseline: Baseline | None, n_chunks: int, d: int
) -> tuple[Derived, float | None]:
    """Seed 002's derived fields and the penalty per prefill step; also the local baseline p50."""
    local_p50 = percentile_ms(cut.local, 50) if cut else None
    aggregate = None
    if cut is not None and local_p50 is not None:
        aggregate = sum(
            (g.end_ns - g.start_ns) / 1e6 - local_p50 * g.tokens
            for gaps in cut.per_stream_during
            for g in gaps
        )
    during_p50 = percentile_ms(cut.during, 50) if cut else None
    base_p50 = baseline.tpot_p50_ms if baseline else None
    penalty = aggregate / (d * n_chunks) if aggregate is not None and d else None
    during_ms = base_p50 + penalty if base_p50 is not None and penalty is not None else None
    derived = Derived(
        tpot_penalty_ms=penalty,
        tpot_during_prefill_ms=during_ms,
        penalty_ratio=during_ms / base_p50 if during_ms is not None and base_p50 else None,
        tpot_penalty_p50_ms=during_p50 - base_p50
        if during_p50 is not None and base_p50 is not None
        else None,
        tpot_penalty_ratio=during_p50 / base_p50 if during_p50 is not None and base_p50 else None,
        local_penalty_p50_ms=during_p50 - local_p50
        if during_p50 is not None and local_p50 is not None
        else None,
        total_interference_ms=n_chunks * penalty if penalty is not None else None,
        decode_tokens_delayed=d * n_chunks,
        aggregate_decode_delay_ms=aggregate,
    )
    return derived, local_p50


def derive(inp: DeriveInputs) -> RunRecord:
    """Cut the windows, compute seed 002's fields and ours, and decide validity."""
    obs, rules = inp.observation, inp.rules
    cfg = obs.config
    d, p, chunk = cfg.decode_batch_size, cfg.new_prefill_tokens, cfg.chunk_size
    t0 = obs.t_inject_ns
    t1 = obs.t_first_token_ns if obs.t_first_token_ns is not None else t0
    reasons = list(obs.notes)
    cut: WindowCut | None = None
    if obs.baseline_file is not None:
        streams = [stream_gaps(inp.stamps, i, rules.discard_tokens) for i in range(d)]
        cut = cut_windows(streams, t0, t1, rules)
        reasons += cut.reasons
        if obs.decode_failure is not None and not all(cut.per_stream_during):
            reasons.append(obs.decode_failure)
    counts = engine_counts(inp.before, inp.after, inp.metrics, d)
    reasons += cold_and_clean(obs, counts, inp.after is not None)
    chunks = count_chunks(obs, counts)
    expected = expected_chunks(p, chunk, d)
    derived, local_p50 = _derived(
        cut, inp.baseline, chunks.actual if chunks.actual is not None else expected, d
    )
    baseline = inp.baseline
    decode_ms = [
        s.elapsed_ms for s in obs.engine_steps or [] if s.prefill_tokens == 0 and s.decode_tokens > 0
    ]
    if baseline is not None and baseline.step_time_ms is None and decode_ms:
        baseline = baseline.model_copy(update={"step_time_ms": _median(decode_ms)})
    ttft_ms = (t1 - t0) / 1e6 if obs.t_first_token_ns is not None else None
    during = cut.during if cut else []
    return RunRecord(
        run_id=obs.run_id,
        config=cfg,
        baseline=baseline,
        local_baseline=LocalBaseline(
            tpot_p50_ms=local_p50, tpot_p90_ms=percentile_ms(cut.local, 90), n_gaps=len(cut.local)
        )
        if cut is not None
        else None,
        interference=Interference(
            tpot_during_prefill_p50_ms=percentile_ms(during, 50),
            tpot_during_prefill_p90_ms=percentile_ms(during, 90),
            tpot_during_prefill_max_ms=percentile_ms(during, 100),
            tpot_after_prefill_p50_ms=percentile_ms(cut.after, 50) if cut else None,
            num_chunks_actual=chunks.actual,
            num_chunks_source=chunks.source,
            num_chunks_expected=expected,
            engine_steps=counts.steps,
            step_time_mixed_ms=_median([s.elapsed_ms for s in chunks.steps if s.prefill_tokens > 0]),
            prefill_duration_ms=ttft_ms,
            prefill_ttft_ms=ttft_ms,
            n_gaps_during=len(during),
            max_tokens_per_read=cut.max_per_read if cut else 0,
            recovery_gaps_ms=[round(g.ms, 4) for g in cut.after] if cut else [],
            prefix_cache_hits=counts.hits,
            prefix_cache_queries=counts.queries,
            cached_prompt_tokens=obs.cached_prompt_tokens,
            preemptions=counts.preemptions,
            engine_steps_log=chunks.steps,
        ),
        derived=derived,
        validity=Validity(valid=not reasons, reasons=reasons, attempt=obs.attempt),
        t_inject_ns=t0,
        t_first_token_ns=t1,
        raw_file=obs.raw_file or "",
    )
