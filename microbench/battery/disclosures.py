"""What a battery report discloses about the system and the workload, and the draft's requirements on it.

A disclosure is measured (the engine the battery launched is the SUT boundary "Model Engine" with no
filtering in front; the GPUs are NVML's; the tokenizer is read from its file) or stated by the user
(``--sut-boundary``, ``--guardrails``, ``--gpus``); what is neither is "not stated", and the requirement
that asks for it is not met. ``disclosure_requirements`` turns them into the report-level requirements
every test's verdict counts (beside the warm-up's), so a report never claims what it did not check.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any, Literal

from pydantic import Field

from benchcore.schema import StrictModel
from engine_harness.engines import engine_kind
from engine_harness.telemetry import NvmlSource
from microbench.battery.compliance import Requirement, must, should
from microbench.battery.context import BatteryContext

__all__ = [
    "SUT_BOUNDARIES",
    "Disclosures",
    "disclosure_requirements",
    "measure_disclosures",
    "stand_in",
    "tokenizer_card",
    "workload_stand_ins",
]

SUT_BOUNDARIES = ("Model Engine", "Gateway", "Compound")
Source = Literal["measured", "stated", "not stated"]
TOKEN_COUNTING = (
    "Option A, native tokenizer: input and output counts are the engine's own (usage of each response)"
)
SPECIAL_TOKENS = (
    "EOS ignored (ignore_eos, min_tokens = max_tokens) and not counted in the asked length; BOS and the "
    "chat template's tokens are in the engine's input count; no system prompt; no tool-call formatting"
)


class Disclosures(StrictModel):
    """The report's system and workload declarations, each with where it came from."""

    sut_boundary: str
    sut_boundary_source: Source
    guardrails: str
    guardrails_source: Source
    accelerators: list[str] = Field(default_factory=list, description="GPU names (NVML or stated)")
    accelerators_source: Source = "measured"
    tokenizer: dict[str, Any] = Field(default_factory=dict, description="name, vocabulary size, sha256")
    token_counting: str = TOKEN_COUNTING
    special_tokens: str = SPECIAL_TOKENS
    prompts: dict[str, Any] = Field(default_factory=dict, description="form, token space, salt")
    workload_seed: int | None = None
    arrival_seed: int = 0


def tokenizer_card(path: str | None) -> dict[str, Any]:
    """4.4.1: name, vocabulary size and source of the tokenizer at ``path`` ({} when there is none)."""
    if path is None:
        return {}
    file = Path(path) / "tokenizer.json" if Path(path).is_dir() else Path(path)
    if not file.is_file():
        return {}
    raw = file.read_bytes()
    data = json.loads(raw)
    vocab = len(data.get("model", {}).get("vocab") or {}) + len(data.get("added_tokens", []))
    return {
        "name": Path(path).name,
        "source": str(path),
        "vocab_size": vocab,
        "sha256": hashlib.sha256(raw).hexdigest()[:16],
    }


def measure_disclosures(ctx: BatteryContext) -> Disclosures:
    """What this run can say: measured for an engine it launched, stated (flags) or not for another."""
    launched = engine_kind(ctx.engine.kind).launched
    gpus = NvmlSource.gpu_names() if launched else []
    if ctx.sut_boundary is not None:
        boundary, boundary_source = ctx.sut_boundary, "stated"
    else:
        boundary = "Model Engine" if launched else "not stated (--engine external: pass --sut-boundary)"
        boundary_source = "measured" if launched else "not stated"
    if ctx.guardrails is not None:
        guardrails, guardrails_source = ctx.guardrails, "stated"
    elif launched:
        guardrails = "none: the battery launched the engine and sends to it directly, no filtering between"
        guardrails_source = "measured"
    else:
        guardrails, guardrails_source = "not stated (pass --guardrails)", "not stated"
    if not gpus and ctx.accelerators:
        gpus, gpu_source = [f"GPU ({ctx.accelerators} stated by --gpus)"], "stated"
    else:
        gpu_source = "measured" if launched else "not stated"
    try:
        seed: int | None = ctx.workload_spec().seed
    except (OSError, ValueError):
        seed = None
    return Disclosures(
        sut_boundary=boundary,
        sut_boundary_source=boundary_source,
        guardrails=guardrails,
        guardrails_source=guardrails_source,
        accelerators=gpus,
        accelerators_source=gpu_source,
        tokenizer=tokenizer_card(ctx.prompt_disclosure.get("tokenizer")),
        prompts=ctx.prompt_disclosure,
        workload_seed=seed,
        arrival_seed=ctx.seed,
    )


def disclosure_requirements(d: Disclosures) -> list[Requirement]:
    """The report-level requirements: each met only when its disclosure was measured or stated."""
    card = d.tokenizer
    return [
        must(
            "4.1",
            "the SUT boundary is declared",
            d.sut_boundary_source != "not stated",
            f"{d.sut_boundary} ({d.sut_boundary_source})",
        ),
        must(
            "4.8.1",
            "input and output content filtering (guardrails) disclosed",
            d.guardrails_source != "not stated",
            f"{d.guardrails} ({d.guardrails_source})",
        ),
        must(
            "C.1",
            "the hardware and its accelerators are identified",
            d.accelerators_source != "not stated",
            (", ".join(d.accelerators) or "no GPU") + f" ({d.accelerators_source})",
        ),
        must(
            "4.3.3",
            "deterministic workload seeds, reported",
            d.workload_seed is not None,
            f"workload seed {d.workload_seed}, arrival seed {d.arrival_seed}, prompt salt "
            f"{d.prompts.get('salt', '–')}",
        ),
        must(
            "4.4.1",
            "tokenizer name, vocabulary size and source",
            bool(card),
            f"{card['name']}, {card['vocab_size']} tokens, {card['source']}"
            if card
            else "no tokenizer file known for the model: pass --tokenizer",
        ),
        must("4.4.2", "the token counting method is declared", True, d.token_counting),
        must("4.4.3", "special-token handling is declared", True, d.special_tokens),
    ]


def stand_in(ref: str, workload: str, used: str) -> Requirement:
    """A test that ran a stand-in for the draft's workload: conditional, naming both."""
    return should(ref, f"runs the draft's {workload} workload", False, f"stand-in: {used}")


def workload_stand_ins(ctx: BatteryContext) -> list[Requirement]:
    """The battery workload's stand-in notes (a reference workload without its data) as requirements."""
    try:
        spec = ctx.workload_spec()
    except (OSError, ValueError):
        return []
    return [stand_in("4.3.2", spec.name, note) for note in spec.notes if "STAND-IN" in note]
