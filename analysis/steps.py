"""Per-step and per-window data of a run, the inputs of the step-time model fits.

A mixed step carrying a prefill chunk of ``c`` tokens at context ``ctx`` (prompt tokens of the injection
already computed: 0 for its first chunk, ``c1`` for the second, ``c1 + c2`` for the third…) next to ``D``
decode tokens costs ``α + β_d·D + β_c·c + γ·c·ctx``; a decode-only step ``α + β_d·D``.

``steps_frame`` reads every engine step of the valid records' ``engine_steps_log``; ``windows_frame``
gives one row per valid record *without* a step log, with the same regressors summed over the prefill
window (``n_steps``, ``Σ D``, ``P``, ``Σ c·ctx``) from vLLM's chunk schedule, so the same linear model
can be fitted to ``prefill_duration_ms``.
"""

from __future__ import annotations

import pandas as pd

from microbench.results.records import RunRecord

__all__ = ["REGRESSORS", "schedule_injection", "steps_frame", "windows_frame"]

# Design-matrix columns, in the order of the parameters α, β_d, β_c, γ. ``c_ctx_m`` is c·ctx / 10⁶, so
# that with times in ms its coefficient is γ in ns per (chunk token × context token).
REGRESSORS = ["n_steps", "decode_tokens", "prefill_tokens", "c_ctx_m"]


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


def steps_frame(records: list[RunRecord]) -> pd.DataFrame:
    """One row per logged engine step of every valid record: ``REGRESSORS``, ``elapsed_ms``, ``kind``
    ('mixed' or 'decode'), ``step_index`` and the record's cell keys. Empty when no record has a log."""
    rows = []
    for rec in records:
        if not rec.validity.valid:
            continue
        ctx = 0
        for i, step in enumerate(rec.interference.engine_steps_log):
            c = step.prefill_tokens
            rows.append(
                {
                    **_keys(rec),
                    "step_index": i,
                    "kind": "mixed" if c > 0 else "decode",
                    "n_steps": 1.0,
                    "decode_tokens": float(step.decode_tokens),
                    "prefill_tokens": float(c),
                    "context": float(ctx),
                    "c_ctx_m": c * ctx / 1e6,
                    "elapsed_ms": step.elapsed_ms,
                }
            )
            ctx += c
    columns = [
        "chunk_size", "decode_batch_size", "new_prefill_tokens", "repetition", "step_index", "kind",
        *REGRESSORS, "context", "elapsed_ms",
    ]  # fmt: skip
    return pd.DataFrame(rows, columns=columns)


def windows_frame(records: list[RunRecord], only_without_log: bool = True) -> pd.DataFrame:
    """One row per valid record: the step model's regressors summed over its prefill window (chunks from
    ``schedule_injection``, or ``num_chunks_actual`` equal chunks when that differs) and
    ``prefill_duration_ms`` as ``elapsed_ms``. By default only records without a step log."""
    rows = []
    for rec in records:
        if not rec.validity.valid or (only_without_log and rec.interference.engine_steps_log):
            continue
        cfg = rec.config
        d, p = cfg.decode_batch_size, cfg.new_prefill_tokens
        sched = schedule_injection(d, p, cfg.chunk_size)
        n_actual = rec.interference.num_chunks_actual
        if n_actual and n_actual != len(sched):
            size = -(-p // n_actual)
            sched = [(d, min(size, p - i * size), i * size) for i in range(n_actual)]
        rows.append(
            {
                **_keys(rec),
                "n_steps": float(len(sched)),
                "decode_tokens": float(sum(s[0] for s in sched)),
                "prefill_tokens": float(p),
                "c_ctx_m": sum(c * ctx for _, c, ctx in sched) / 1e6,
                "elapsed_ms": rec.interference.prefill_duration_ms,
            }
        )
    columns = [
        "chunk_size",
        "decode_batch_size",
        "new_prefill_tokens",
        "repetition",
        *REGRESSORS,
        "elapsed_ms",
    ]
    return pd.DataFrame(rows, columns=columns)
