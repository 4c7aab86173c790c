"""How an engine runs its steps, read from what it states at start-up, and so how its steps are timed.

The suite's step sources (``engine_harness.steps``) read one line per engine step. Whether the duration a
line carries is a whole step depends on the engine's mode (read in CUDA vLLM 0.33's and SGLang 0.5.23's
source):

- **vLLM, async scheduling** (on by default on CUDA, forced off on CPU): the engine core keeps two batches
  in flight and its ``iteration elapsed time`` is the wait on the *older* batch after the newer one was
  launched, not a step.
- **vLLM, ``uni`` executor** (one GPU, world size 1; the CPU build forces ``mp``): the forward runs inline
  in the call that launches it, and the iteration timer starts only after that call, so the field leaves
  out input preparation and kernel launch (by different amounts for decode-only and long mixed steps).
- **vLLM, CUDA graphs**: steps up to ``max_cudagraph_capture_size`` tokens (512 by default) run as graphs,
  longer ones eagerly: a break in the step cost at that ceiling.
- **SGLang's overlap scheduler** (on by default on GPU): a batch's line is written after the next batch
  was launched, like vLLM's async scheduling.

So a step's duration is taken from the engine's own field only where that field times the whole step
(vLLM's ``mp`` executor without async scheduling: the CPU build, or an instrumented launch with
``--distributed-executor-backend mp --no-async-scheduling``). Everywhere else it is the interval between
the stamps of consecutive step lines: each line is written when that step's outputs were handed to the
requests (vLLM: by the API server's output handler, right after the tokens went to the streams; SGLang:
by the scheduler after processing the batch's results), so the interval is the step as the decode
streams saw it, whatever overlapped inside it. The stamps come from a logging configuration the suite
passes (``VLLM_LOGGING_CONFIG_PATH`` → ``vllm_logging.json``, ``SGLANG_LOGGING_CONFIG_PATH`` →
``sglang_logging.json``: ``@<epoch seconds with µs>`` on every line). A run whose mode cannot be determined
and whose lines carry no stamps gets no step durations at all — never the raw field.
"""

from __future__ import annotations

import re
from typing import Literal

from pydantic import Field

from benchcore.schema import StrictModel

__all__ = [
    "StepMode",
    "StepTiming",
    "describe_step_mode",
    "sglang_step_mode",
    "vllm_step_mode",
    "with_timing",
]

# Where a step's duration came from: the engine's own elapsed field (where it covers the whole step), or
# the interval between the stamps of consecutive step lines.
StepTiming = Literal["engine_field", "log_interval"]


class StepMode(StrictModel):
    """The engine's effective step execution mode, as read from its start-up lines, and the timing used."""

    engine: str = Field(description="engine kind: vllm, sglang, sim")
    async_scheduling: bool | None = Field(
        None, description="two batches in flight (vLLM's async scheduling, SGLang's overlap scheduler)"
    )
    executor: str | None = Field(None, description="vLLM's executor backend: uni, mp, ray, …; None: unknown")
    cuda_graph_max_tokens: int | None = Field(
        None, description="the largest step run as a CUDA graph; 0: none (CPU, eager); None: unknown"
    )
    timing: StepTiming | None = Field(
        None, description="where step durations come from; None: nowhere (the mode could not be determined)"
    )
    evidence: list[str] = Field(default_factory=list, description="what each setting was read from")
    note: str | None = Field(None, description="why steps have no durations, when they have none")

    @property
    def field_is_whole_step(self) -> bool:
        """The engine's own elapsed field times a whole step: vLLM's mp executor, async scheduling off."""
        return self.async_scheduling is False and self.executor == "mp"


# -- vLLM ---------------------------------------------------------------------------------------------
_VLLM_CONFIG = re.compile(r"Initializing a V1 LLM engine \(v(?P<version>[^)]*)\) with config: (?P<config>.*)")
_VLLM_NON_DEFAULT = re.compile(r"non-default args: (?P<args>\{.*\})")
_ASYNC_STATED = re.compile(r"Asynchronous scheduling is (?P<state>enabled|disabled)")
# vLLM's warnings when it turns its default async scheduling off (vllm/config/vllm.py)
_ASYNC_DISABLED = re.compile(
    r"Async scheduling (?:will be disabled|not supported with|is not compatible with .* will be disabled"
    r"|is disabled for)"
)
_WORLD = re.compile(r"\((?P<proc>[A-Za-z_]+)[^ )]* pid=\d+\).*world_size=(?P<n>\d+) rank=0 ")


def _config_value(config: str, key: str) -> str | None:
    m = re.search(rf"(?:^|[ ,{{]){re.escape(key)}=(?P<v>[^,]+)", config)
    return m["v"].strip() if m else None


def _dict_value(text: str, key: str) -> str | None:
    m = re.search(rf"'{re.escape(key)}': (?P<v>\[[^\]]*\]|<[^>]*>|[^,}}]+)", text)
    return m["v"].strip() if m else None


def _vllm_graph_ceiling(config: str) -> tuple[int | None, str | None]:
    if _config_value(config, "device_config") == "cpu":
        return 0, "device_config=cpu: no CUDA graphs"
    if _config_value(config, "enforce_eager") == "True":
        return 0, "enforce_eager=True"
    mode = _dict_value(config, "cudagraph_mode")
    if mode is not None and "NONE" in mode:
        return 0, f"cudagraph_mode {mode}"
    ceiling = _dict_value(config, "max_cudagraph_capture_size")
    if ceiling is not None and ceiling.isdigit():
        return int(ceiling), f"max_cudagraph_capture_size {ceiling}"
    sizes = _dict_value(config, "cudagraph_capture_sizes")
    if sizes is not None and (nums := [int(n) for n in re.findall(r"\d+", sizes)]):
        return max(nums), f"cudagraph_capture_sizes up to {max(nums)}"
    return None, None


def _last(pattern: re.Pattern[str], text: str) -> re.Match[str] | None:
    match = None
    for match in pattern.finditer(text):  # noqa: B007 - the last one is wanted
        pass
    return match


def vllm_step_mode(log_text: str) -> StepMode:
    """vLLM's async scheduling, executor and CUDA-graph ceiling from its start-up lines (the last start in
    ``log_text``). What vLLM states is used first (an ``Asynchronous scheduling is …`` line where the
    version writes one, the non-default args, the warnings that turn its default off, the engine's config
    line); the rest follows vLLM's own rules for its defaults: async scheduling on except on CPU, the
    ``mp`` executor on CPU and ``uni`` for a world size of 1 elsewhere (confirmed by the process that
    states ``world_size``: the engine core itself under ``uni``, a worker under ``mp``)."""
    config_m = _last(_VLLM_CONFIG, log_text)
    if config_m is None:
        return StepMode(engine="vllm", note="no 'Initializing a V1 LLM engine' line in the engine's log")
    config = config_m["config"]
    args_m = _last(_VLLM_NON_DEFAULT, log_text)
    args = args_m["args"] if args_m else ""
    device = _config_value(config, "device_config") or "cuda"
    evidence = [f"vLLM {config_m['version']}, device_config={device}"]
    stated, explicit = _last(_ASYNC_STATED, log_text), _dict_value(args, "async_scheduling")
    disabled = _last(_ASYNC_DISABLED, log_text)
    if stated:
        async_on = stated["state"] == "enabled"
        evidence.append(f"'Asynchronous scheduling is {stated['state']}'")
    elif explicit in ("True", "False"):
        async_on = explicit == "True"
        evidence.append(f"non-default args: async_scheduling {explicit}")
    elif disabled:
        async_on = False
        evidence.append(f"'{disabled.group(0)} …'")
    else:
        async_on = device != "cpu"
        evidence.append("default: async scheduling " + ("off on CPU" if device == "cpu" else "on (not CPU)"))
    backend, world = _dict_value(args, "distributed_executor_backend"), _last(_WORLD, log_text)
    if backend is not None:
        executor = backend.strip("'\"")
        evidence.append(f"non-default args: distributed_executor_backend {executor}")
    elif device == "cpu":
        executor = "mp"
        evidence.append("default: the CPU build forces the mp executor")
    elif world is not None:
        executor = "mp" if world["proc"].startswith(("Worker", "VllmWorker")) else "uni"
        evidence.append(f"world_size={world['n']} stated by the {world['proc']} process")
    else:
        sizes = [_config_value(config, f"{k}_parallel_size") for k in ("tensor", "pipeline")]
        one = all(s in (None, "1") for s in sizes)
        executor = "uni" if one else "mp"
        evidence.append(f"default: world size {'1: uni' if one else '> 1: mp'}")
    ceiling, why = _vllm_graph_ceiling(config)
    if why:
        evidence.append(why)
    return StepMode(
        engine="vllm", async_scheduling=async_on, executor=executor, cuda_graph_max_tokens=ceiling,
        evidence=evidence,
    )  # fmt: skip


# -- SGLang -------------------------------------------------------------------------------------------
def sglang_step_mode(settings: dict[str, str]) -> StepMode:
    """SGLang's overlap scheduler and CUDA-graph ceiling from the settings of its ``server_args=…``
    start-up line (``engine_harness.steps.sglang_settings``: SGLang states its resolved settings there)."""
    overlap = {"False": True, "True": False}.get(settings.get("disable_overlap_schedule", ""))
    ceiling: int | None = None
    if settings.get("device") == "cpu" or settings.get("disable_cuda_graph") == "True":
        ceiling = 0
    elif (bs := settings.get("cuda_graph_max_bs", "")).isdigit():
        ceiling = int(bs)  # decode batches of up to this many requests (a token each) run as graphs
    evidence = [f"server_args: {k}={v}" for k, v in sorted(settings.items())]
    return StepMode(
        engine="sglang", async_scheduling=overlap, cuda_graph_max_tokens=ceiling, evidence=evidence
    )


def with_timing(mode: StepMode, stamped: bool) -> StepMode:
    """``mode`` with the timing its step lines allow: the engine's own field where it times whole steps,
    else the stamped lines' intervals, else none (and why)."""
    if mode.field_is_whole_step:
        return mode.model_copy(update={"timing": "engine_field"})
    if stamped:
        return mode.model_copy(update={"timing": "log_interval"})
    if mode.note:
        why = f"its mode could not be determined ({mode.note})"
    else:
        running = "async scheduling" if mode.async_scheduling else f"the {mode.executor} executor"
        why = f"its elapsed field does not time a whole step under {running}"
    note = f"no step durations: {why}, and its step lines carry no stamps (the suite's logging config)"
    return mode.model_copy(update={"timing": None, "note": note})


def describe_step_mode(mode: StepMode) -> str:
    """One line for a console: the mode and where step durations come from."""
    parts = []
    if mode.async_scheduling is not None:
        name = "overlap scheduler" if mode.engine == "sglang" else "async scheduling"
        parts.append(f"{name} {'on' if mode.async_scheduling else 'off'}")
    if mode.executor:
        parts.append(f"{mode.executor} executor")
    if mode.cuda_graph_max_tokens is not None:
        graphs = mode.cuda_graph_max_tokens
        parts.append(f"CUDA graphs up to {graphs} tokens" if graphs else "no CUDA graphs")
    timing = {
        "engine_field": "steps timed by the engine's own field",
        "log_interval": "steps timed by the stamped step lines' intervals",
        None: mode.note or "no step durations",
    }[mode.timing]
    return f"{mode.engine}: {', '.join(parts) or 'mode not stated'}; {timing}"
