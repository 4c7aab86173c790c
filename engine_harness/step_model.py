"""The one step-time model: what an engine step costs, and which steps one prompt's prefill takes.

The simulated engine runs it (its ground truth), ``analysis`` fits it (the design-matrix columns come
from here) and ``analysis.synthetic`` generates runs from it. A step computing ``D`` decode tokens and
prefill chunks of ``c`` tokens, each after ``ctx`` tokens of its prompt already in the KV cache, costs::

    α + κ·[Σc > 0] + β_d·D + β_c·Σc + γ·Σ c·(ctx + c/2) + δ·Σ ctx_dec + λ·(Σ ctx + [Σc > 0]·Σ ctx_dec)

- ``α`` (``alpha_ms``): the fixed cost of any step;
- ``κ`` (``prefill_fixed_ms``): the further fixed cost of a step that carries prompt tokens. On the CPU engine
  a decode-only step takes ≈ 1.6 ms but a prefill step extrapolates to ≈ 8 ms at zero prompt tokens (110
  tokens: 11.8 ms, 214: 13.4, 448: 21.4, 895: 37.9 in the Poisson trace of the first CPU vLLM calibration run,
  2026-11-25 14:45 UTC, since replaced in results/calibrate-vllm-cpu): with one fixed term, a fit holding both
  kinds of step sets α between the two, over-pricing every decode step (a sweep with P = 256 over-predicted
  the traces' E2E by 15%). SGLang on CPU pays one too: in the first SGLang calibration run's workloads (14:50
  UTC) prefill steps of under 256 tokens took ≈ 20 ms where a decode step takes 6–10 ms;
- ``β_d`` (``beta_d_ms``): per decode token; ``β_c`` (``beta_c_ms``): per prefill (chunk) token;
- ``γ`` (``gamma_ns``): attention of a chunk token to the ``ctx`` tokens before it (cached prefix included)
  and, causally, to half of its own chunk: the ``c/2`` is the intra-chunk attention real engines pay (a
  bare first chunk grows faster than linearly);
- ``δ`` (``delta_ns``): a decode token's attention to its own request's context (``ctx_dec``), which grows
  while a batch is reused;
- ``λ`` (``lambda_ns``): per request a prefill-carrying step extends, a cost per token of the context that
  request already holds, whatever the tokens it adds. SGLang on CPU (``torch_native`` attention) pays it:
  per request of an extend batch it gathers the request's whole KV from the pool and runs its attention
  alone; in that run's workloads a chunk of 87–147 tokens after 2048 of its prompt took
  30–34 ms where the same chunk at context 0 takes ≈ 20 ms. A decode riding in a prefill-carrying step
  (mixed scheduling: SGLang ``--enable-mixed-chunk`` runs it as a one-token extend request of that batch)
  pays it too, on its own context (``Σ ctx_dec``): in the mixed-chunk calibration sweep of 2026-11-28
  21:46 UTC a riding decode cost ≈ 8 ms against 1–3 ms in a decode-only step; λ over every extend request's
  context lifted that fit's R² from 0.72 to 0.86 (leave-one-P-out 21.7% → 14.7%), where a coefficient of
  its own for the riders came out alike (15.4 µs against λ 13.6) and held out worse (15.5%). In a
  decode-only step, and in a prefill step the decodes do not ride in (exclusive), there is none. 0 unless a
  fit finds it.

On a GPU whose engine runs CUDA graphs (vLLM: steps up to ``max_cudagraph_capture_size`` tokens, 512 by
default), a step above that ceiling runs eagerly: it pays ``eager_ms`` more (kernel launches a graph
replays at once). ``cuda_graph_max_tokens`` is that ceiling (0: no graphs, as on CPU: no break); it is the
engine's setting, not fitted, and ``eager_ms`` is the break the fit estimates.

Scheduling (``Scheduling``) decides which steps a prompt of ``P`` tokens takes next to ``D`` running
decodes at a token budget (chunk size) ``B``:

- ``mixed`` (vLLM, SGLang ``--enable-mixed-chunk``): every step takes the ``D`` decode tokens first, then
  ``min(remaining, B − D)`` prompt tokens: ``ceil(P / (B − D))`` steps, each carrying the decodes;
- ``exclusive`` (SGLang's default): a step that can run a prefill chunk runs it *instead of* the decode
  batch: ``ceil(P / B)`` steps of ``min(remaining, B)`` prompt tokens and no decode token.

A decode token's extra wait on a prefill step (``extra_wait_ms``) follows: mixed, the step less the
decode-only step it would have taken anyway; exclusive, the whole step.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, Protocol

from pydantic import Field

from benchcore.schema import StrictModel

__all__ = [
    "COLUMNS",
    "MODEL_COLUMNS",
    "PARAMS",
    "Chunk",
    "Scheduling",
    "StepCost",
    "StepModel",
    "StepShape",
    "chunk_schedule",
    "decode_delay_ms",
    "design_row",
    "extra_wait_ms",
    "is_eager",
    "num_prefill_steps",
    "prefill_budget",
]

# How a prefill-carrying step treats the running decodes (see the module's docstring).
Scheduling = Literal["mixed", "exclusive"]


@dataclass(frozen=True, slots=True)
class Chunk:
    """``tokens`` prompt tokens of one request computed in a step, after ``context`` tokens of it."""

    tokens: int
    context: int = 0


@dataclass(frozen=True, slots=True)
class StepShape:
    """What one step computes, as far as its cost is concerned."""

    decode_tokens: int = 0
    chunks: tuple[Chunk, ...] = ()
    decode_context: float = 0.0  # Σ over the decode tokens of each one's context

    @property
    def prefill_tokens(self) -> int:
        return sum(c.tokens for c in self.chunks)

    @property
    def chunk_attention(self) -> float:
        """Σ c·(ctx + c/2) over the chunks: the γ term's multiplier."""
        return sum(c.tokens * (c.context + c.tokens / 2) for c in self.chunks)

    @property
    def prefill_context(self) -> float:
        """Σ ctx over the chunks (context each chunk's request already holds: the λ term without riders)."""
        return float(sum(c.context for c in self.chunks))

    @property
    def extend_context(self) -> float:
        """The λ term's multiplier: Σ ctx over every request a prefill-carrying step extends, its chunks
        and the decodes riding with them; 0 in a decode-only step."""
        return self.prefill_context + self.decode_context if self.chunks else 0.0

    @property
    def chunk_context(self) -> float:
        """Σ c·ctx over the chunks (attention to the cached context only: the analysis' alternative)."""
        return float(sum(c.tokens * c.context for c in self.chunks))

    @property
    def num_tokens(self) -> int:
        return self.decode_tokens + self.prefill_tokens


class StepCost(Protocol):
    """Anything that prices a step: the model itself, or a fit of it (whose estimates may be negative)."""

    def step_ms(self, shape: StepShape) -> float: ...


class StepModel(StrictModel):
    """The step-time model's coefficients (see the module's docstring for the formula)."""

    alpha_ms: float = Field(default=1.0, ge=0, le=10_000, description="fixed cost of any step (ms)")
    beta_d_ms: float = Field(default=0.02, ge=0, le=1_000, description="cost per decode token (ms)")
    beta_c_ms: float = Field(default=0.05, ge=0, le=1_000, description="cost per prefill (chunk) token (ms)")
    gamma_ns: float = Field(
        default=15.0, ge=0, le=1e6, description="per chunk token × (its context + chunk/2) token (ns)"
    )
    delta_ns: float = Field(default=0.0, ge=0, le=1e6, description="per decode token × its context (ns)")
    prefill_fixed_ms: float = Field(
        default=0.0, ge=0, le=10_000, description="extra fixed cost of a step carrying prompt tokens (ms)"
    )
    lambda_ns: float = Field(
        default=0.0,
        ge=0,
        le=1e6,
        description="per request a prefill-carrying step extends (chunk or riding decode) × its context (ns)",
    )
    eager_ms: float = Field(
        default=0.0,
        ge=0,
        le=10_000,
        description="extra fixed cost of a step above the CUDA-graph ceiling (ms)",
    )
    cuda_graph_max_tokens: int = Field(
        default=0, ge=0, le=1 << 20, description="largest step run as a CUDA graph (0: none, no break)"
    )

    def step_ms(self, shape: StepShape) -> float:
        """The model's duration of one step in ms."""
        return (
            self.alpha_ms
            + self.prefill_fixed_ms * (shape.prefill_tokens > 0)
            + self.beta_d_ms * shape.decode_tokens
            + self.beta_c_ms * shape.prefill_tokens
            + self.gamma_ns * 1e-6 * shape.chunk_attention
            + self.delta_ns * 1e-6 * shape.decode_context
            + self.lambda_ns * 1e-6 * shape.extend_context
            + self.eager_ms * is_eager(shape, self.cuda_graph_max_tokens)
        )

    def coefficients(self) -> dict[str, float]:
        """The coefficients by name (``PARAMS``' values)."""
        return {name: float(getattr(self, name)) for name in dict.fromkeys(PARAMS.values())}

    def scaled(self, factor: float) -> StepModel:
        """Every coefficient (each a time) times ``factor``: the same engine ``factor``× slower."""
        return self.model_copy(update={k: v * factor for k, v in self.coefficients().items()})


def is_eager(shape: StepShape, cuda_graph_max_tokens: int | None) -> bool:
    """The step runs eagerly although the engine captures CUDA graphs (it is above their ceiling)."""
    return bool(cuda_graph_max_tokens) and shape.num_tokens > (cuda_graph_max_tokens or 0)


# The design matrix of the linear fit: one column per term, in ms-consistent units, so that a column's
# coefficient is the parameter ``PARAMS[column]`` (attention and context columns are in millions of
# tokens, so their coefficient in ms is the parameter in ns). ``c_ctx_m`` is the cached-context-only
# alternative to ``c_attn_m`` (both estimate γ), ``p_ctx_m`` (the chunks' context, not the riding decodes')
# the alternative to ``e_ctx_m`` (both estimate λ; equal where no decode rides in a prefill step: exclusive
# scheduling); ``prefill_steps`` (1 for a step carrying prompt tokens)
# is fitted where the data hold decode-only steps beside prefill ones, ``eager_steps`` (1 for a step above
# the CUDA-graph ceiling) where they hold steps on both sides of one; ``MODEL_COLUMNS`` are the model's own.
COLUMNS = [
    "n_steps", "prefill_steps", "decode_tokens", "prefill_tokens", "c_ctx_m", "c_attn_m", "d_ctx_m",
    "p_ctx_m", "e_ctx_m", "eager_steps",
]  # fmt: skip
MODEL_COLUMNS = [
    "n_steps", "prefill_steps", "decode_tokens", "prefill_tokens", "c_attn_m", "d_ctx_m", "e_ctx_m",
    "eager_steps",
]  # fmt: skip
PARAMS = {
    "n_steps": "alpha_ms",
    "prefill_steps": "prefill_fixed_ms",
    "decode_tokens": "beta_d_ms",
    "prefill_tokens": "beta_c_ms",
    "c_ctx_m": "gamma_ns",
    "c_attn_m": "gamma_ns",
    "d_ctx_m": "delta_ns",
    "p_ctx_m": "lambda_ns",
    "e_ctx_m": "lambda_ns",
    "eager_steps": "eager_ms",
}


def design_row(shape: StepShape, cuda_graph_max_tokens: int | None = 0) -> dict[str, float]:
    """One step's row of every column of ``COLUMNS`` on an engine with that CUDA-graph ceiling:
    ``StepModel.step_ms(shape)`` equals the sum over ``MODEL_COLUMNS`` of the row's value times the
    column's parameter."""
    return {
        "n_steps": 1.0,
        "prefill_steps": float(shape.prefill_tokens > 0),
        "decode_tokens": float(shape.decode_tokens),
        "prefill_tokens": float(shape.prefill_tokens),
        "c_ctx_m": shape.chunk_context / 1e6,
        "c_attn_m": shape.chunk_attention / 1e6,
        "d_ctx_m": shape.decode_context / 1e6,
        "p_ctx_m": shape.prefill_context / 1e6,
        "e_ctx_m": shape.extend_context / 1e6,
        "eager_steps": float(is_eager(shape, cuda_graph_max_tokens)),
    }


def prefill_budget(chunk_size: int, decode_batch: int, scheduling: Scheduling | None = "mixed") -> int:
    """Prompt tokens one step can carry: ``B − D`` mixed (the decodes come first), ``B`` exclusive."""
    return chunk_size - (0 if scheduling == "exclusive" else decode_batch)


def num_prefill_steps(
    prefill_tokens: int, chunk_size: int, decode_batch: int, scheduling: Scheduling | None = "mixed"
) -> int:
    """How many steps carry the prompt: ``ceil(P / (B − D))`` mixed, ``ceil(P / B)`` exclusive (a budget
    the decodes use up entirely counts as one token per step; ``chunk_schedule`` refuses it)."""
    return math.ceil(prefill_tokens / max(prefill_budget(chunk_size, decode_batch, scheduling), 1))


def chunk_schedule(
    prefill_tokens: int,
    chunk_size: int,
    decode_batch: int,
    scheduling: Scheduling | None = "mixed",
    decode_context: float = 0.0,
) -> list[StepShape]:
    """The prefill steps of one cold prompt of ``prefill_tokens`` next to ``decode_batch`` running decodes
    (each at ``decode_context`` tokens of context) at token budget ``chunk_size``. ``None`` scheduling
    (records written before it was stored) is read as mixed."""
    budget = prefill_budget(chunk_size, decode_batch, scheduling)
    riders = chunk_size - budget
    if budget <= 0:
        raise ValueError(f"chunk {chunk_size} leaves no prefill budget next to {decode_batch} decodes")
    steps, done = [], 0
    while done < prefill_tokens:
        c = min(prefill_tokens - done, budget)
        steps.append(StepShape(riders, (Chunk(c, done),), riders * decode_context))
        done += c
    return steps


def extra_wait_ms(step_ms: float, decode_step_ms: float, scheduling: Scheduling | None) -> float:
    """A decode token's extra wait on a prefill step of ``step_ms``: the whole step when it ran instead of
    the decode step (exclusive), else the step less the decode-only step it replaced (mixed)."""
    return step_ms if scheduling == "exclusive" else step_ms - decode_step_ms


def decode_delay_ms(
    model: StepCost, steps: Sequence[StepShape], decode_batch: int, scheduling: Scheduling | None = "mixed"
) -> float:
    """The model's aggregate decode delay of one prefill's ``steps``: ``D × Σ`` each step's extra wait
    (mixed, each is compared with a decode-only step at the same decode contexts)."""
    return decode_batch * sum(
        extra_wait_ms(
            model.step_ms(s), model.step_ms(StepShape(decode_batch, (), s.decode_context)), scheduling
        )
        for s in steps
    )
