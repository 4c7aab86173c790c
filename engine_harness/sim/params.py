"""Settings of the simulated engine (step-time model, fault knobs, server) as strict pydantic models.

Settings flow defaults → YAML (``--params FILE``) → command-line flags → one validated ``SimConfig``.
A YAML file holds the same keys as ``SimConfig``, with the step-time model under ``step:`` and the fault
knobs under ``faults:``::

    max_num_batched_tokens: 2048
    step: {alpha_ms: 1.0, beta_d_ms: 0.02, beta_c_ms: 0.05, gamma_ns: 15.0, jitter: 0.0}
    faults: {error_429_fraction: 0.1}
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import Field, model_validator

from benchcore.schema import StrictModel
from engine_harness.scheduler_model import SchedulerMode
from engine_harness.sim.kv_transfer import KvTransferModel
from engine_harness.step_model import StepModel, StepShape
from engine_harness.wake_model import WakeCost

__all__ = [
    "PRESETS_DIR",
    "FaultConfig",
    "SimConfig",
    "SimMode",
    "SimStepModel",
    "load_config",
    "merge_settings",
]

PRESETS_DIR = Path(__file__).resolve().parent / "presets"

SimMode = SchedulerMode


class SimStepModel(StepModel):
    """The sim's ground truth: the one step-time model (``engine_harness.step_model``) with its
    coefficients, and ``jitter``, the relative standard deviation of a seeded Gaussian factor
    ``max(0, 1 + N(0, jitter))`` on the whole step."""

    jitter: float = Field(default=0.0, ge=0, le=1, description="relative std of a seeded step factor")

    def sample_s(self, shape: StepShape, rng: random.Random) -> float:
        """The step time in seconds with jitter drawn from ``rng`` (no draw at all when ``jitter`` is 0)."""
        cost = self.step_ms(shape) / 1e3
        if self.jitter == 0:
            return cost
        return cost * max(0.0, 1.0 + rng.gauss(0.0, self.jitter))


class FaultConfig(StrictModel):
    """Faults a reliability test can ask for; every random decision comes from the server's seed."""

    error_500_fraction: float = Field(default=0.0, ge=0, le=1, description="share answered HTTP 500")
    error_429_fraction: float = Field(default=0.0, ge=0, le=1, description="share answered HTTP 429")
    retry_after_s: float | None = Field(
        default=None, ge=0, le=3600, description="Retry-After (s) sent with each injected 429 (None: none)"
    )
    cut_after_chunks: int | None = Field(
        default=None,
        ge=0,
        description="close a stream's connection after this many content chunks (no [DONE])",
    )
    cut_fraction: float = Field(default=1.0, ge=0, le=1, description="share of streams cut")
    slow_start_s: float = Field(default=0.0, ge=0, le=3600, description="/health is 503 this long")
    die_after_requests: int | None = Field(
        default=None, ge=1, description="the engine dies once this many requests have finished"
    )
    die_at_s: float | None = Field(default=None, gt=0, description="die this long after start")
    death: Literal["crash", "vllm"] = Field(
        default="crash",
        description="how the engine dies: 'crash' (connections dropped, the port closes at once) or "
        "'vllm' (as vLLM when its engine core dies: an error event inside each open stream, then "
        "[DONE]; /metrics still answers and /health is 500 for a moment before the port closes)",
    )
    stall_step: int | None = Field(default=None, ge=0, description="index of the step that stalls")
    stall_s: float = Field(default=0.0, ge=0, le=3600, description="model seconds added to the stalled step")

    @model_validator(mode="after")
    def _check(self) -> FaultConfig:
        if self.error_500_fraction + self.error_429_fraction > 1:
            raise ValueError("error_500_fraction + error_429_fraction must not exceed 1")
        if self.stall_s > 0 and self.stall_step is None:
            raise ValueError("stall_s needs stall_step (the index of the step to stall)")
        return self


class SimConfig(StrictModel):
    """Everything that decides how one simulated engine behaves."""

    model: str = Field(default="sim", min_length=1, description="the model name clients send")
    host: str = "127.0.0.1"
    port: int = Field(default=0, ge=0, le=65535, description="0: a free port picked by the OS")
    reuse_port: bool = Field(
        default=False,
        description="SO_REUSEPORT: several sim processes listen on one port and the kernel spreads the "
        "connections between them (a client fast enough to need more than one core of sim)",
    )
    mode: SimMode = Field(
        default="vllm",
        description="vllm: decodes ride with chunks; sglang: a prefill step replaces decodes; "
        "sglang-mixed: SGLang with --enable-mixed-chunk",
    )
    max_num_batched_tokens: int = Field(default=8192, ge=1, le=1 << 20, description="token budget per step")
    max_num_seqs: int = Field(default=256, ge=1, le=1 << 16, description="most requests running at once")
    block_size: int = Field(default=16, ge=1, le=1024, description="tokens per KV block")
    num_kv_blocks: int = Field(default=65536, ge=1, le=1 << 24, description="KV blocks in the pool")
    memory_tokens: int | None = Field(
        default=None, ge=1, le=1 << 30, description="device memory left after the weights, in KV tokens: the "
        "start-up profile run reserves activation_tokens per batched token, the KV pool gets the rest "
        "(replacing num_kv_blocks), and a start that leaves it less than max_model_len fails as vLLM's does"
    )  # fmt: skip
    activation_tokens: float = Field(
        default=1.0, ge=0, le=1e4, description="activation memory per batched token, in KV tokens"
    )
    enable_prefix_caching: bool = True
    max_model_len: int = Field(default=65536, ge=2, le=1 << 24, description="longest prompt + completion")
    frontend_ns_per_token: float = Field(
        default=0.0, ge=0, le=1e6, description="API-server time per prompt token before the engine sees a "
        "request (parsing, tokenization, hand-off): in the client's TTFT, not in the engine's queue time"
    )  # fmt: skip
    step: SimStepModel = Field(default_factory=lambda: SimStepModel())
    wake: WakeCost = Field(
        default_factory=lambda: WakeCost(), description="extra time of the first step after an idle spell "
        "(engine_harness.wake_model; none by default)"
    )  # fmt: skip
    # GPU-like modes (engine_harness.sim.gpu_modes): host work before the device runs a step, and how vLLM
    # would run and time it
    host_ms: float = Field(
        default=0.0, ge=0, le=10_000, description="host work per step (ms): input prep, launch"
    )
    host_ns_per_token: float = Field(default=0.0, ge=0, le=1e6, description="host work per step token (ns)")
    executor: Literal["mp", "uni"] = Field(
        default="mp", description="vLLM's executor the sim times its steps as: mp (the elapsed field "
        "times the whole step, as on CPU) or uni (one GPU: the field starts after the launch)"
    )  # fmt: skip
    async_scheduling: bool = Field(
        default=False, description="two batches in flight (CUDA vLLM's default): a step's host work overlaps "
        "the previous step's device work, the field times the wait on the older batch"
    )  # fmt: skip
    vllm_log: bool = Field(
        default=False, description="log like CUDA vLLM on stdout: its start-up statement and a stamped "
        "iteration line per step (the sweep then reads the sim as it reads vLLM)"
    )  # fmt: skip
    time_scale: float = Field(
        default=1.0,
        ge=0,
        le=1000,
        description="wall seconds per model second: 1 real time, <1 faster, 0 no sleeping",
    )
    busy_wait_ms: float = Field(
        default=1.0,
        ge=0,
        le=100,
        description="end each step with naps of ≤50 µs for this long (+1 ms): loop timers are coarse; "
        "0: timer only (steps end up to ~1 ms late)",
    )
    seed: int = Field(default=0, description="seeds jitter, generated tokens and fault decisions")
    eos_probability: float = Field(default=0.0, ge=0, le=1, description="chance a sampled token is EOS")
    enable_prompt_tokens_details: bool = Field(
        default=False,
        description="usage carries prompt_tokens_details.cached_tokens (vLLM's flag of that name)",
    )
    step_log_path: Path | None = Field(default=None, description="JSONL file of every step")
    step_log_max: int | None = Field(default=None, ge=1, description="steps kept in memory")
    faults: FaultConfig = Field(default_factory=lambda: FaultConfig())
    kv_transfer: KvTransferModel | None = Field(
        default=None, description="a simulated KV connector with a known link (see sim.kv_transfer)"
    )

    @property
    def kv_blocks(self) -> int:
        """KV blocks in the pool: ``num_kv_blocks``, or with ``memory_tokens`` what the activations of a
        ``max_num_batched_tokens`` step leave of it (vLLM sizes its KV cache after such a profile run)."""
        if self.memory_tokens is None:
            return self.num_kv_blocks
        free = self.memory_tokens - self.activation_tokens * self.max_num_batched_tokens
        return max(0, int(free // self.block_size))

    @property
    def context_limit(self) -> int:
        """Longest prompt + completion a request may ask for: ``max_model_len``, capped by the KV pool."""
        return min(self.max_model_len, self.kv_blocks * self.block_size)

    def memory_problem(self) -> str | None:
        """Why this engine cannot start under its ``memory_tokens`` (None: it can), worded as vLLM words
        the same failures: the profile run's out-of-memory, no room for the cache, a cache shorter than
        ``max_model_len``."""
        if self.memory_tokens is None:
            return None
        activations = self.activation_tokens * self.max_num_batched_tokens
        if activations > self.memory_tokens:
            return (
                f"torch.OutOfMemoryError: out of memory in the profile run: a step of "
                f"{self.max_num_batched_tokens} batched tokens needs {activations:.0f} token slots of "
                f"activations, the device has {self.memory_tokens} (sim memory_tokens)"
            )
        kv_tokens = self.kv_blocks * self.block_size
        if kv_tokens == 0:
            return (
                "ValueError: No available memory for the cache blocks. Try increasing "
                "`gpu_memory_utilization` when initializing the engine."
            )
        if kv_tokens < self.max_model_len:
            return (
                f"ValueError: To serve at least one request with the models's max seq len "
                f"({self.max_model_len}), {self.max_model_len} tokens of KV cache are needed, which is "
                f"larger than the available KV cache memory ({kv_tokens} tokens). Based on the available "
                f"memory, the estimated maximum model length is {kv_tokens}. Try increasing "
                "`gpu_memory_utilization` or decreasing `max_model_len` when initializing the engine."
            )
        return None


def merge_settings(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    """``base`` updated by ``over``, nested mappings merged key by key (neither is modified)."""
    out = dict(base)
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merge_settings(out[key], value)
        else:
            out[key] = value
    return out


def load_config(params: str | Path | None = None, overrides: dict[str, Any] | None = None) -> SimConfig:
    """Defaults → YAML file (a path, or the name of a file in ``presets/``) → ``overrides`` → ``SimConfig``.

    ``overrides`` may nest (``{"step": {"alpha_ms": 2}}``); keys whose value is ``None`` are ignored, so
    unset command-line flags leave the YAML's values alone.
    """
    settings: dict[str, Any] = {}
    if params is not None:
        path = Path(params)
        if not path.exists() and (PRESETS_DIR / f"{params}.yaml").exists():
            path = PRESETS_DIR / f"{params}.yaml"
        loaded = yaml.safe_load(path.read_text()) or {}
        if not isinstance(loaded, dict):
            raise ValueError(f"{path}: expected a mapping of settings, got {type(loaded).__name__}")
        settings = loaded

    def _drop_none(d: dict[str, Any]) -> dict[str, Any]:
        return {k: _drop_none(v) if isinstance(v, dict) else v for k, v in d.items() if v is not None}

    settings = merge_settings(settings, _drop_none(overrides or {}))
    return SimConfig.model_validate(settings)
