"""The offload table a known step model and link predict: the sim engine's own table (its known answer).

``analysis.policy`` builds the table of a measured sweep; this builds the same ``OffloadPolicy`` from the
step-time model (``engine_harness.step_model``: one cold prompt's chunk schedule next to D decodes, its
aggregate decode delay) and a ``LinkProfile`` — what a sim engine run with those coefficients and that
link will do, so a router driven by it has a known right answer. Cells say ``interference_source:
step_model``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict
from datetime import UTC, datetime

import pandas as pd

from analysis.breakeven import LinkProfile, TransferMode
from analysis.policy import FORMAT, POLICY_COLUMNS, OffloadPolicy
from engine_harness.model_kv import ModelKV
from engine_harness.step_model import StepModel, chunk_schedule, decode_delay_ms

__all__ = ["predicted_policy"]


def predicted_policy(
    step: StepModel,
    link: LinkProfile,
    model: ModelKV,
    chunk: int,
    decode_batches: Sequence[int],
    prefill_tokens: Sequence[int],
    mode: TransferMode = "bulk",
) -> OffloadPolicy:
    """The table of ``step`` × ``link`` on the grid ``decode_batches`` × ``prefill_tokens`` at ``chunk``."""
    rows = []
    for d in sorted(set(decode_batches)):
        for p in sorted(set(prefill_tokens)):
            schedule = chunk_schedule(p, chunk, d)
            interference = decode_delay_ms(step, schedule, d) if d else 0.0
            compute = sum(step.step_ms(s) for s in chunk_schedule(p, chunk, 0))
            transfer = link.transfer_ms(p * model.kv_bytes_per_token, model.layers, mode, compute)
            rows.append({
                "chunk_size": chunk, "decode_batch_size": d, "new_prefill_tokens": p,
                "interference_ms": interference, "transfer_ms": transfer,
                "decision": "offload" if interference > transfer else "local",
                "margin_ms": interference - transfer, "interference_source": "step_model",
                "repetitions": 0, "prefill_compute_ms": compute,
            })  # fmt: skip
    metadata = {
        "format": FORMAT,
        "created_utc": datetime.now(UTC).isoformat(timespec="seconds"),
        "source_run": None,
        "run_id": "predicted",
        "engine_version": None,
        "model": asdict(model) | {"kv_bytes_per_token": model.kv_bytes_per_token},
        "link": link.model_dump(),
        "mode": mode,
        "interference_cost": "the step model's aggregate decode delay of one cold prompt (ms)",
        "fit": {"step_params": step.coefficients()},
        "link_basis": link.describe(),
        "warnings": ["predicted from a step model, not measured"],
    }
    return OffloadPolicy(pd.DataFrame(rows, columns=POLICY_COLUMNS), metadata)
