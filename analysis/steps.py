"""Per-step and per-window data of a run: the design matrices of the step-time model candidates.

A mixed step carrying a prefill chunk of ``c`` tokens at context ``ctx`` (prompt tokens of the injection
already computed: 0 for its first chunk, ``c1`` for the second…) next to ``D`` decode tokens whose own
contexts sum to ``D·ctx_dec``, and a decode-only step, are rows of one linear model. The candidates
differ in their attention terms (``CANDIDATES``):

- ``c·ctx``: attention to the cached context only (DESIGN §5's first model);
- ``c·(ctx + c/2)``: plus the chunk's causal attention to itself (a bare first chunk grows faster than
  linearly: 1024 → 62 ms, 2048 → 137 ms, 4096 → 336 ms on the CPU engine);
- ``c·(ctx + c/2) + D·ctx_dec``: plus the decodes' attention to their own growing context;
- ``c·(ctx + c/2) + λ·ctx per chunk``: plus a cost per token of each chunk's request's cached context
  (SGLang's CPU attention gathers each request's KV: ``step_model``'s λ). A sweep whose prompts all fit
  one step (context 0) cannot tell λ: the candidate is then left out. Offered to exclusive scheduling
  only (``EXCLUSIVE_ONLY``), alone and with ``D·ctx_dec``: SGLang's CPU decode step gathers each
  request's whole KV too (sweeps of 2026-11-28 at decode contexts 407 / 1464 / 3224 tokens: D = 4 steps
  22.6 / 23.7 / 34.8 ms, a lone decode 16.1 / 14.6 / 15.4 ms). Sweeps at one decode context cannot tell δ
  from β_d (every decode row's context is D times nearly the same number: the candidate is not offered
  below ``MIN_DECODE_CONTEXT_SPREAD``): pool sweeps at several
  (``sweeps/calibrate-*-cpu-contexts.yaml``, ``calibrate predict --model A B C``);
- ``c·(ctx + c/2) + λ·ctx per extend request``: λ on the decodes riding in a prefill-carrying step too, each
  on its own context (SGLang ``--enable-mixed-chunk`` runs them as one-token extend requests of that batch:
  ``step_model``'s λ). Offered to mixed scheduling only (``MIXED_ONLY``): exclusive, no decode rides and it
  is the per-chunk candidate. On the mixed-chunk sweep of 2026-11-28 21:46 UTC it fits R² 0.86 and holds
  out 14.7% where the best candidate without it fits 0.72 and holds out 21.7%.
Every candidate also carries a prefill step's own fixed cost (``PREFILL``, ``step_model``'s κ) where the
data hold decode-only steps beside prefill ones (SGLang on CPU: ≈ 16 ms for a 128-token prefill step
where a decode step of 2 takes ≈ 8.5).

``steps_frame`` reads every prefill step of the valid records' ``engine_steps_log`` and one decode-only
row per record (the median of the attempt's decode-only steps: ``decode_row_ms``); ``windows_frame``
gives one row per valid record *without* a step log, the regressors summed over its prefill window from
the step model's chunk schedule in the record's scheduling (mixed: the decodes ride in every chunk step;
exclusive: they wait).
"""

from __future__ import annotations

import pandas as pd

from engine_harness.step_model import COLUMNS, Chunk, StepShape, chunk_schedule, design_row
from microbench.results.records import RunRecord

__all__ = [
    "CANDIDATES",
    "EAGER",
    "EXCLUSIVE_ONLY",
    "MIN_DECODE_CONTEXT_SPREAD",
    "MIXED_ONLY",
    "PREFILL",
    "decode_context_spread",
    "decode_row_ms",
    "graph_ceiling",
    "offered",
    "steps_frame",
    "windows_frame",
]

# A candidate model uses a subset of the step model's design columns (``engine_harness.step_model``).
CANDIDATES: dict[str, list[str]] = {
    "c·ctx": ["n_steps", "decode_tokens", "prefill_tokens", "c_ctx_m"],
    "c·(ctx + c/2)": ["n_steps", "decode_tokens", "prefill_tokens", "c_attn_m"],
    "c·(ctx + c/2) + D·ctx_dec": ["n_steps", "decode_tokens", "prefill_tokens", "c_attn_m", "d_ctx_m"],
    "c·(ctx + c/2) + λ·ctx per chunk": ["n_steps", "decode_tokens", "prefill_tokens", "c_attn_m", "p_ctx_m"],
    "c·(ctx + c/2) + λ·ctx per chunk + D·ctx_dec": [
        "n_steps", "decode_tokens", "prefill_tokens", "c_attn_m", "p_ctx_m", "d_ctx_m",
    ],
    "c·(ctx + c/2) + λ·ctx per extend request": [
        "n_steps", "decode_tokens", "prefill_tokens", "c_attn_m", "e_ctx_m",
    ],
}  # fmt: skip
# Candidates offered only to runs whose prefill steps run instead of the decodes (exclusive scheduling:
# SGLang's default), where the cached-context term was measured (results/calibrate-sglang-cpu). On the CPU
# vLLM fit of 2026-11-25 14:45 UTC (since replaced in results/calibrate-vllm-cpu) κ + λ also wins
# leave-one-P-out (4.6% against 6.0% for κ alone) but moved that calibration's median errors (TTFT 5.1 → 5.3%
# and 10.0 → 9.8%, E2E 4.6 → 5.2% and 7.3 → 7.2%, Poisson and bursty): for vLLM it is a decision of its own,
# not taken here.
EXCLUSIVE_ONLY = frozenset({"c·(ctx + c/2) + λ·ctx per chunk", "c·(ctx + c/2) + λ·ctx per chunk + D·ctx_dec"})
# Candidates offered only to runs whose decodes ride in the prefill steps (mixed scheduling). On the committed
# CPU vLLM runs (results/calibrate-vllm-cpu, results/reference-cpu) it does not win: a negative λ (−18 ns)
# and 12.3% held out against 11.5%, and 8.8% against 9.2% with one term more (within the 10% that keeps
# the simpler candidate).
MIXED_ONLY = frozenset({"c·(ctx + c/2) + λ·ctx per extend request"})
# Added to every candidate where the steps lie on both sides of the engine's CUDA-graph ceiling.
EAGER = "eager_steps"
# Added to every candidate where the data hold decode-only steps beside prefill-carrying ones: a prefill
# step's own fixed cost (κ), which α alone would split between the two kinds.
PREFILL = "prefill_steps"


# A sweep at one decode context still spreads its decode rows' contexts a little (each stream's context grows
# by the tokens decoded before the point's baseline: 586-677 tokens on test_calibrate_sim's grid at
# --decode-context 512), so δ (D·ctx_dec) and β_d are not exactly collinear but only noise tells them apart:
# on a loaded CI box (2026-11-29, CI 18) that grid's fit chose δ > 0 from 0.6% step noise against a truth
# of δ = 0, and the replay, whose contexts grow to 3000+, priced every decode step 4% high (E2E bias +4%).
# Below this spread the candidate is not offered; pooled sweeps at several contexts (405-3224) and a batch
# reused across repetitions (552-1152) are well above it.
MIN_DECODE_CONTEXT_SPREAD = 1.5


def decode_context_spread(frame: pd.DataFrame) -> float:
    """The largest decode context of the rows with decodes over the smallest (1: one context, or none)."""
    with_decodes = frame[frame["decode_tokens"] > 0]
    per_decode = (with_decodes["d_ctx_m"] / with_decodes["decode_tokens"]).to_numpy(float)
    return float(per_decode.max() / per_decode.min()) if len(per_decode) and per_decode.min() > 0 else 1.0


def offered(frame: pd.DataFrame, exclusive: bool) -> list[str]:
    """The candidates a run's steps may be fitted with: those of its scheduling (``EXCLUSIVE_ONLY`` where
    its prefill steps ran instead of the decodes, ``MIXED_ONLY`` where the decodes rode in them), and
    the decodes' context cost (``D·ctx_dec``) only where the decode contexts spread by
    ``MIN_DECODE_CONTEXT_SPREAD`` or more."""
    tell_delta = decode_context_spread(frame) >= MIN_DECODE_CONTEXT_SPREAD
    return [
        name
        for name, cols in CANDIDATES.items()
        if name not in (MIXED_ONLY if exclusive else EXCLUSIVE_ONLY) and (tell_delta or "d_ctx_m" not in cols)
    ]


def graph_ceiling(rec: RunRecord) -> int:
    """The largest step the record's engine ran as a CUDA graph (0: none, or not known)."""
    mode = rec.interference.step_mode
    return (mode.cuda_graph_max_tokens or 0) if mode is not None else 0


def _keys(rec: RunRecord) -> dict[str, int]:
    cfg = rec.config
    return {
        "chunk_size": cfg.chunk_size,
        "decode_batch_size": cfg.decode_batch_size,
        "new_prefill_tokens": cfg.new_prefill_tokens,
        "repetition": cfg.repetition,
    }


def _decode_context(rec: RunRecord) -> float:
    local = rec.local_baseline
    if local is not None and local.context_tokens is not None:
        return local.context_tokens
    return float(rec.config.decode_context)


def steps_frame(records: list[RunRecord]) -> pd.DataFrame:
    """One row per logged prefill step and one decode-only row per valid record: every column of
    ``COLUMNS``, ``elapsed_ms``, ``kind`` ('mixed' or 'decode'), ``context`` and the cell keys. A step
    without a duration (the engine did not report it) has no row but counts in the context."""
    rows = []
    for rec in records:
        if not rec.validity.valid:
            continue
        d, dec_ctx, ceiling = rec.config.decode_batch_size, _decode_context(rec), graph_ceiling(rec)
        ctx = 0
        for i, step in enumerate(s for s in rec.interference.engine_steps_log if s.prefill_tokens > 0):
            c = step.prefill_tokens
            if step.elapsed_ms is None:  # the engine did not report this step's duration
                ctx += c
                continue
            row = {**_keys(rec), "step_index": i, "kind": "mixed", "context": float(ctx)}
            shape = StepShape(step.decode_tokens, (Chunk(c, ctx),), step.decode_tokens * dec_ctx)
            rows.append(row | design_row(shape, ceiling) | {"elapsed_ms": step.elapsed_ms})
            ctx += c
        decode_ms = decode_row_ms(rec)
        if rec.interference.engine_steps_log and decode_ms is not None and d:
            row = {**_keys(rec), "step_index": -1, "kind": "decode", "context": 0.0}
            shape = StepShape(d, (), d * dec_ctx)
            rows.append(row | design_row(shape, ceiling) | {"elapsed_ms": decode_ms})
    columns = [
        "chunk_size",
        "decode_batch_size",
        "new_prefill_tokens",
        "repetition",
        "step_index",
        "kind",
        *COLUMNS,
        "context",
        "elapsed_ms",
    ]
    return pd.DataFrame(rows, columns=columns)


def decode_row_ms(rec: RunRecord) -> float | None:
    """A record's decode-only step for the step-model fit: the median of every decode-only step of the
    attempt at its D (``attempt_decode_step_ms``, 25-40 steps); a record derived before 2026-11-29 gives
    its local baseline (``decode_step_ms``, the ~10 steps before the prefill), as it always had.

    Why: the decode-only step is most of a serving trace's steps, and a replay adds them up. The local
    baseline was more than 0.1 ms off the sim's true step in 8 of 36 attempts of the sim calibration's fit
    sweeps (up to 2.1 ms): α 39.865 for 40.0, which moved the replay's step grid up to 10 ms off the sim's
    over a 450-step busy period, so requests near a step boundary joined the step before or after (TTFT
    MAPE 5.6-11.9%; with the attempt's median 0.7-1.4%, three quiet runs).

    The row weighs 1, as a prefill step's row does, not √n as the mean of n independent steps would: a
    box's slow stretches run whole attempts late, so the steps of one attempt are not independent, and
    √n narrowed β_d's interval until two runs of one sim on a loaded box (``test_frozen_engine_fit``)
    disagreed beyond both intervals ([0.184, 0.208] against [0.209, 0.237])."""
    itf = rec.interference
    if itf.attempt_decode_step_ms is not None and itf.attempt_decode_steps:
        return itf.attempt_decode_step_ms
    return itf.decode_step_ms


def _timed_log(rec: RunRecord) -> bool:
    """The record's step log gives its steps durations (not so where the engine's mode allowed none)."""
    return any(s.elapsed_ms is not None for s in rec.interference.engine_steps_log)


def windows_frame(records: list[RunRecord], only_without_log: bool = True) -> pd.DataFrame:
    """One row per valid record: the regressors summed over its prefill window (chunks from the step
    model's ``chunk_schedule`` in the record's scheduling, or ``num_chunks_actual`` equal chunks when that
    differs) and, as ``elapsed_ms``, the engine's prefill time when /metrics had it, else the client's
    send → first token. By default only records without a step log that times its steps (an engine
    mode that allowed no durations leaves a log that counts the chunks but prices none)."""
    rows = []
    for rec in records:
        itf = rec.interference
        if not rec.validity.valid or (only_without_log and _timed_log(rec)):
            continue
        cfg = rec.config
        d, p = cfg.decode_batch_size, cfg.new_prefill_tokens
        dec_ctx = _decode_context(rec)
        sched = chunk_schedule(p, cfg.chunk_size, d, cfg.scheduling, dec_ctx)
        if itf.num_chunks_actual and itf.num_chunks_actual != len(sched):
            size, riders = -(-p // itf.num_chunks_actual), sched[0].decode_tokens
            sched = [
                StepShape(riders, (Chunk(min(size, p - i * size), i * size),), riders * dec_ctx)
                for i in range(itf.num_chunks_actual)
            ]
        summed = pd.DataFrame([design_row(s, graph_ceiling(rec)) for s in sched]).sum()
        elapsed = (
            itf.engine_prefill_time_ms if itf.engine_prefill_time_ms is not None else itf.prefill_duration_ms
        )
        rows.append({**_keys(rec), **summed.to_dict(), "elapsed_ms": elapsed})
    columns = ["chunk_size", "decode_batch_size", "new_prefill_tokens", "repetition", *COLUMNS, "elapsed_ms"]
    return pd.DataFrame(rows, columns=columns)
