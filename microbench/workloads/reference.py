"""The five reference workloads of the IETF draft (§4.3.2, Appendix A), registered by name, fixed seeds.

``reference_workload(name, ...)`` returns a ``WorkloadSpec``:

- ``synthetic-uniform``: input Uniform(128, 512), output Uniform(64, 256), no prefix sharing.
- ``synthetic-skewed``: input LogNormal(5.5, 1.0) in [32, 4096], output LogNormal(4.5, 1.2) in [16, 2048].
- ``conversation``: empirical lengths from a local ShareGPT file when given (first human turn / first
  answer of conversations with an answer, counted with the given tokenizer, drawn as pairs); otherwise a
  stand-in through the draft's stated percentiles (input P50/P95/P99 = 156/892/2134, output
  234/789/1567), labelled as such. Half of the requests carry one 200-token system prompt.
- ``code-completion``: 10 repository contexts of 512–1024 tokens; 80% of requests carry one, picked by
  Zipf(s=1.5); output LogNormal(4.0, 1.5). The draft names no input lengths for the code after the context,
  so a stated stand-in is used.
- ``long-context``: targets 8k, 16k, 32k, 64k, 128k tokens (Appendix A), equally likely, output 256;
  with ``max_model_len`` the targets that do not fit are clipped to what does, and the note says which.

Every caveat goes into ``WorkloadSpec.notes``, which the trace header reports.
"""

from __future__ import annotations

import itertools
import json
from collections import Counter
from collections.abc import Callable, Mapping
from pathlib import Path

from pydantic import Field

from benchcore.registry import Registry
from benchcore.schema import StrictModel
from engine_harness.engines import DEFAULT_MODEL
from microbench.workloads.prompts import load_tokenizer
from microbench.workloads.spec import WorkloadSpec, load_workload_spec

__all__ = [
    "REFERENCE_SEED",
    "WORKLOADS",
    "ReferenceOptions",
    "load_workload",
    "reference_workload",
    "sharegpt_lengths",
]

REFERENCE_SEED = 42  # the seed of the draft's generation pseudocode (A.1.4)
LONG_CONTEXT_TARGETS = (8192, 16384, 32768, 65536, 131072)


class ReferenceOptions(StrictModel):
    """What a reference workload may need to know about the run."""

    max_model_len: int | None = Field(default=None, ge=2, description="engine's longest prompt + output")
    sharegpt_path: str | None = Field(
        default=None, description="local ShareGPT JSON for the conversation workload"
    )
    tokenizer_path: str = Field(default=DEFAULT_MODEL, description="tokenizer that counts ShareGPT tokens")
    seed: int = Field(
        default=REFERENCE_SEED, ge=0, description="workload seed (the reference one unless changed)"
    )


WORKLOADS: Registry[Callable[[ReferenceOptions], WorkloadSpec]] = Registry("reference workload")


def reference_workload(name: str, **options: object) -> WorkloadSpec:
    """The reference workload ``name`` with ``options`` (see ``ReferenceOptions``)."""
    return WORKLOADS.get(name)(ReferenceOptions.model_validate(options))


def load_workload(
    name: str, *, max_model_len: int | None = None, sharegpt_path: str | None = None
) -> WorkloadSpec:
    """A reference workload by name, or a spec YAML by path; a ShareGPT file only for 'conversation'
    (any other would ignore it: ``ValueError`` naming it)."""
    if sharegpt_path is not None and name != "conversation":
        raise ValueError(f"--sharegpt {sharegpt_path}: only the conversation workload reads it, not {name!r}")
    if name in WORKLOADS:
        options = {"sharegpt_path": sharegpt_path} if sharegpt_path is not None else {}
        return reference_workload(name, max_model_len=max_model_len, **options)
    return load_workload_spec(name)


def _spec(name: str, opts: ReferenceOptions, client: Mapping[str, object], notes: list[str]) -> WorkloadSpec:
    return WorkloadSpec.model_validate(
        {"name": name, "seed": opts.seed, "clients": [{"id": name, **client}], "notes": notes}
    )


@WORKLOADS.register("synthetic-uniform")
def synthetic_uniform(opts: ReferenceOptions) -> WorkloadSpec:
    client = {
        "input_length": {"type": "uniform", "min": 128, "max": 512},
        "output_length": {"type": "uniform", "min": 64, "max": 256},
    }
    return _spec("synthetic-uniform", opts, client, ["IETF draft A.1: random token ids, no prefix sharing"])


@WORKLOADS.register("synthetic-skewed")
def synthetic_skewed(opts: ReferenceOptions) -> WorkloadSpec:
    client = {
        "input_length": {"type": "lognormal", "mu": 5.5, "sigma": 1.0, "floor": 32, "cap": 4096},
        "output_length": {"type": "lognormal", "mu": 4.5, "sigma": 1.2, "floor": 16, "cap": 2048},
    }
    return _spec("synthetic-skewed", opts, client, ["IETF draft A.2: log-normal lengths, floors and caps"])


def sharegpt_lengths(path: Path, tokenizer_path: str) -> tuple[list[int], list[int]]:
    """(input, output) token counts of the first human turn and its answer, per conversation with one."""
    tokenizer = load_tokenizer(tokenizer_path)
    inputs, outputs = [], []
    for item in json.loads(path.read_text(encoding="utf-8")):
        turns = item.get("conversations") or []
        for first, second in itertools.pairwise(turns):
            if first.get("from") == "human" and second.get("from") == "gpt":
                inputs.append(len(tokenizer.encode(first.get("value", ""))))
                outputs.append(len(tokenizer.encode(second.get("value", ""))))
                break
    if not inputs:
        raise ValueError(f"{path}: no conversation with a human turn followed by an answer")
    return inputs, outputs


def _pairs(inputs: list[int], outputs: list[int], note: str) -> dict[str, object]:
    """The client fields of paired empirical lengths: each distinct (input, output) pair once, weighted by
    how often it occurs (``ClientSpec.paired_lengths``)."""
    counts = sorted(
        Counter(zip((max(1, n) for n in inputs), (max(1, n) for n in outputs), strict=True)).items()
    )
    weights = [float(c) for _, c in counts]
    return {
        "input_length": {
            "type": "empirical",
            "values": [p[0] for p, _ in counts],
            "weights": weights,
            "note": note,
        },
        "output_length": {
            "type": "empirical",
            "values": [p[1] for p, _ in counts],
            "weights": weights,
            "note": note,
        },
        "paired_lengths": True,
    }


@WORKLOADS.register("conversation")
def conversation(opts: ReferenceOptions) -> WorkloadSpec:
    system_prompt = {"group": "system-prompt", "length": {"type": "fixed", "value": 200}, "fraction": 0.5}
    if opts.sharegpt_path is not None:
        inputs, outputs = sharegpt_lengths(Path(opts.sharegpt_path), opts.tokenizer_path)
        source = (
            f"ShareGPT file {opts.sharegpt_path} ({len(inputs)} conversations, "
            f"tokenizer {opts.tokenizer_path})"
        )
        client = {**_pairs(inputs, outputs, source), "prefix": system_prompt}
        notes = [
            f"IETF draft A.3: empirical lengths from {source}; each request's input and output are one "
            "conversation's question and answer (drawn as pairs)"
        ]
    else:
        stand_in = "stand-in: log-linear through the IETF draft A.3.2 percentiles; tails (P0, P100) assumed"
        client = {
            "input_length": {
                "type": "quantiles",
                "points": {0.0: 4, 0.5: 156, 0.95: 892, 0.99: 2134, 1.0: 4096},
                "note": stand_in,
            },
            "output_length": {
                "type": "quantiles",
                "points": {0.0: 4, 0.5: 234, 0.95: 789, 0.99: 1567, 1.0: 3072},
                "note": stand_in,
            },
            "prefix": system_prompt,
        }
        notes = [
            "IETF draft A.3 without a ShareGPT file: EMPIRICAL STAND-IN matching the draft's stated "
            "percentiles (input 156/892/2134, output 234/789/1567 at P50/P95/P99), not ShareGPT itself"
        ]
    notes.append("50% of requests carry one shared 200-token system prompt before their input")
    return _spec("conversation", opts, client, notes)


@WORKLOADS.register("code-completion")
def code_completion(opts: ReferenceOptions) -> WorkloadSpec:
    client = {
        "input_length": {"type": "lognormal", "mu": 5.0, "sigma": 0.8, "floor": 16, "cap": 2048},
        "output_length": {"type": "lognormal", "mu": 4.0, "sigma": 1.5, "floor": 1, "cap": 2048},
        "prefix": {
            "group": "repository-context",
            "count": 10,
            "length": {"type": "uniform", "min": 512, "max": 1024},
            "fraction": 0.8,
            "zipf_s": 1.5,
        },
    }
    notes = [
        "IETF draft A.4: 10 repository contexts of 512-1024 tokens, 80% of requests share one (Zipf s=1.5)",
        "stand-in: code after the context ~ LogNormal(5.0, 0.8) in [16, 2048] (the draft gives no lengths)",
        "output LogNormal(4.0, 1.5) capped at 2048 (the draft gives no cap)",
    ]
    return _spec("code-completion", opts, client, notes)


@WORKLOADS.register("long-context")
def long_context(opts: ReferenceOptions) -> WorkloadSpec:
    output = 256
    targets = list(LONG_CONTEXT_TARGETS)
    notes = [
        "IETF draft A.5 targets (the main text, 4.3.2.5, says Uniform(8192, 32768)); document + question "
        "are random ids of the target length; output fixed at 256"
    ]
    if opts.max_model_len is not None:
        limit = opts.max_model_len - output
        if limit < 1:
            raise ValueError(
                f"max_model_len {opts.max_model_len} leaves no room for a prompt and 256 outputs"
            )
        clipped = [t for t in targets if t > limit]
        targets = [min(t, limit) for t in targets]
        if clipped:
            notes.append(
                f"CLIPPED: targets {', '.join(map(str, clipped))} exceed max_model_len {opts.max_model_len} "
                f"- {output} output tokens and were clipped to {limit} tokens"
            )
    else:
        notes.append("not clipped: no max_model_len given; targets up to 131072 tokens will be sent")
    client = {
        "input_length": {"type": "empirical", "values": targets, "note": "A.5 target lengths"},
        "output_length": {"type": "fixed", "value": output},
    }
    return _spec("long-context", opts, client, notes)
