"""Per-step and per-window data of a run: the design matrices of the step-time model candidates.

A mixed step carrying a prefill chunk of ``c`` tokens at context ``ctx`` (prompt tokens of the injection
already computed: 0 for its first chunk, ``c1`` for the second…) next to ``D`` decode tokens whose own
contexts sum to ``D·ctx_dec``, and a decode-only step, are rows of one linear model. The candidates
differ in their attention terms (``CANDIDATES``):

- ``c·ctx``: attention to the cached context only (DESIGN §5's first model);
- ``c·(ctx + c/2)``: plus the chunk's causal attention to itself (a bare first chunk grows faster than
  linearly: 1024 → 62 ms, 2048 → 137 ms, 4096 → 336 ms on the CPU engine);
- ``c·(ctx + c/2) + D·ctx_dec``: plus the decodes' attention to their own growing context.

``steps_frame`` reads every prefill step of the valid records' ``engine_steps_log`` and one decode-only
row per record (its ``decode_step_ms``); ``windows_frame`` gives one row per valid record *without* a
step log, the regressors summed over its prefill window from vLLM's chunk schedule.
"""

from __future__ import annotations

import pandas as pd

from microbench.results.records import RunRecord

__all__ = ["CANDIDATES", "COLUMNS", "PARAMS", "schedule_injection", "steps_frame", "windows_frame"]

# Every regressor; a candidate model uses a subset. Times are in ms, so the coefficient of a column
# divided by 10⁶ is in ns per (token × token).
COLUMNS = ["n_steps", "decode_tokens", "prefill_tokens", "c_ctx_m", "c_attn_m", "d_ctx_m"]
PARAMS = {
    "n_steps": "alpha_ms",
    "decode_tokens": "beta_d_ms",
    "prefill_tokens": "beta_c_ms",
    "c_ctx_m": "gamma_ns",
    "c_attn_m": "gamma_ns",
    "d_ctx_m": "delta_ns",
}
CANDIDATES: dict[str, list[str]] = {
    "c·ctx": ["n_steps", "decode_tokens", "prefill_tokens", "c_ctx_m"],
    "c·(ctx + c/2)": ["n_steps", "decode_tokens", "prefill_tokens", "c_attn_m"],
    "c·(ctx + c/2) + D·ctx_dec": ["n_steps", "decode_tokens", "prefill_tokens", "c_attn_m", "d_ctx_m"],
}


def schedule_injection(decode_batch: int, prefill_tokens: int, chunk_size: int) -> list[tuple[int, int, int]]:
    """vLLM's chunks of one injection as ``(decode tokens, chunk tokens, context)``: every step takes the
    D decode tokens first, then ``min(remaining, chunk − D)`` prompt tokens."""
    budget = chunk_size - decode_batch
    if budget <= 0:
        raise ValueError(f"chunk {chunk_size} leaves no prefill budget next to {decode_batch} decodes")
    steps, done = [], 0
    while done < prefill_tokens:
        c = min(prefill_tokens - done, budget)
        steps.append((decode_batch, c, done))
        done += c
    return steps


def _keys(rec: RunRecord) -> dict[str, int]:
    cfg = rec.config
    return {
        "chunk_size": cfg.chunk_size,
        "decode_batch_size": cfg.decode_batch_size,
        "new_prefill_tokens": cfg.new_prefill_tokens,
        "repetition": cfg.repetition,
    }


def regressors(d: float, c: float, ctx: float, decode_context: float) -> dict[str, float]:
    """One step's row of every column (``decode_context``: mean context of each decode stream)."""
    return {
        "n_steps": 1.0,
        "decode_tokens": float(d),
        "prefill_tokens": float(c),
        "c_ctx_m": c * ctx / 1e6,
        "c_attn_m": c * (ctx + c / 2) / 1e6,
        "d_ctx_m": d * decode_context / 1e6,
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
        d, dec_ctx = rec.config.decode_batch_size, _decode_context(rec)
        ctx = 0
        for i, step in enumerate(s for s in rec.interference.engine_steps_log if s.prefill_tokens > 0):
            c = step.prefill_tokens
            if step.elapsed_ms is None:  # the engine did not report this step's duration
                ctx += c
                continue
            row = {**_keys(rec), "step_index": i, "kind": "mixed", "context": float(ctx)}
            rows.append(
                row | regressors(step.decode_tokens, c, ctx, dec_ctx) | {"elapsed_ms": step.elapsed_ms}
            )
            ctx += c
        if rec.interference.engine_steps_log and rec.interference.decode_step_ms is not None and d:
            row = {**_keys(rec), "step_index": -1, "kind": "decode", "context": 0.0}
            rows.append(row | regressors(d, 0, 0, dec_ctx) | {"elapsed_ms": rec.interference.decode_step_ms})
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


def windows_frame(records: list[RunRecord], only_without_log: bool = True) -> pd.DataFrame:
    """One row per valid record: the regressors summed over its prefill window (chunks from
    ``schedule_injection``, or ``num_chunks_actual`` equal chunks when that differs) and, as
    ``elapsed_ms``, the engine's prefill time when /metrics had it, else the client's send → first token.
    By default only records without a step log."""
    rows = []
    for rec in records:
        itf = rec.interference
        if not rec.validity.valid or (only_without_log and itf.engine_steps_log):
            continue
        cfg = rec.config
        d, p = cfg.decode_batch_size, cfg.new_prefill_tokens
        sched = schedule_injection(d, p, cfg.chunk_size)
        if itf.num_chunks_actual and itf.num_chunks_actual != len(sched):
            size = -(-p // itf.num_chunks_actual)
            sched = [(d, min(size, p - i * size), i * size) for i in range(itf.num_chunks_actual)]
        summed = pd.DataFrame([regressors(dd, c, ctx, _decode_context(rec)) for dd, c, ctx in sched]).sum()
        elapsed = (
            itf.engine_prefill_time_ms if itf.engine_prefill_time_ms is not None else itf.prefill_duration_ms
        )
        rows.append({**_keys(rec), **summed.to_dict(), "elapsed_ms": elapsed})
    columns = ["chunk_size", "decode_batch_size", "new_prefill_tokens", "repetition", *COLUMNS, "elapsed_ms"]
    return pd.DataFrame(rows, columns=columns)
