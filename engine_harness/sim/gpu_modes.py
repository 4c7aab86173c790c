"""The sim's GPU-like modes: how CUDA vLLM runs and times its steps, reproduced with known truth.

CUDA vLLM 0.33 differs from the CPU build the suite measures by default (``engine_harness.step_modes``):
async scheduling keeps two batches in flight, one GPU runs the ``uni`` executor, CUDA graphs cover steps
up to a ceiling. The sim models a step as host work ``H`` (input preparation and kernel launch:
``host_ms + host_ns_per_token × tokens``) followed by device work ``T`` (the step-time model, with its
eager cost above the graph ceiling), and times and logs it as vLLM would:

============================  ==========================  ===========================================
mode                          whole step (what decodes     vLLM's ``iteration elapsed time``
                              wait, the sim's truth)
============================  ==========================  ===========================================
``mp``, async off (CPU-like)  ``H + T``                   ``H + T`` (the worker times the whole forward)
``uni``, async off            ``H + T``                   ``T`` (the timer starts after the launch)
async scheduling              ``max(T, H_next)``          ``max(T − H_next, 0)``: the wait on the older
                                                          batch after the next one was launched
============================  ==========================  ===========================================

With ``vllm_log`` the sim writes what vLLM writes to its log: the start-up statement (non-default args,
the engine's config line with ``device_config`` and ``max_cudagraph_capture_size``, the process that
states ``world_size``) and one stamped iteration line per step, so the sweep reads the sim with the very
parser and mode rules it reads vLLM with, and the tests can hold the derivation to the sim's truth.
"""

from __future__ import annotations

import os
import time
from typing import TYPE_CHECKING

from engine_harness.step_model import StepShape

if TYPE_CHECKING:
    from engine_harness.sim.params import SimConfig
    from engine_harness.sim.step_record import StepRecord

__all__ = ["host_s", "iteration_line", "startup_lines", "step_times"]

SIM_VLLM_VERSION = "0.33.0+sim"


def host_s(config: SimConfig, shape: StepShape) -> float:
    """Host work of one step in model seconds (input preparation and kernel launch)."""
    return (config.host_ms * 1e-3) + config.host_ns_per_token * 1e-9 * shape.num_tokens


def step_times(config: SimConfig, device_s: float, host: float, host_next: float) -> tuple[float, float]:
    """The whole step and the engine's elapsed field (model seconds) of a step whose device work takes
    ``device_s`` and host work ``host``, the next step's host work being ``host_next`` (see the table)."""
    if config.async_scheduling:
        return max(device_s, host_next), max(device_s - host_next, 0.0)
    whole = host + device_s
    return whole, whole if config.executor == "mp" else device_s


def _prefix(process: str, now: float | None = None) -> str:
    now = time.time() if now is None else now
    date = time.strftime("%m-%d %H:%M:%S", time.localtime(now))
    return f"({process} pid={os.getpid()}) INFO {date} @{now:.6f}"


def startup_lines(config: SimConfig) -> list[str]:
    """What vLLM states at start-up about its step mode (engine_harness.step_modes reads these)."""
    args: dict[str, object] = {"model": config.model, "max_num_batched_tokens": config.max_num_batched_tokens}
    if not config.async_scheduling:
        args["async_scheduling"] = False  # CUDA's default is on: vLLM states it only when set
    if config.executor != "uni":
        args["distributed_executor_backend"] = config.executor  # one GPU's default is uni
    ceiling = config.step.cuda_graph_max_tokens
    compilation = "{'cudagraph_mode': <CUDAGraphMode.NONE: 0>}"
    if ceiling:
        compilation = (
            "{'cudagraph_mode': <CUDAGraphMode.FULL_AND_PIECEWISE: (2, 1)>, "
            f"'cudagraph_capture_sizes': [1, 2, 4, 8, {ceiling}], 'max_cudagraph_capture_size': {ceiling}}}"
        )
    worker = "EngineCore" if config.executor == "uni" else "VllmWorker-0"
    return [
        f"{_prefix('MainProcess')} [utils.py:1] non-default args: {args}",
        f"{_prefix('EngineCore')} [core.py:1] Initializing a V1 LLM engine (v{SIM_VLLM_VERSION}) with "
        f"config: model='{config.model}', tensor_parallel_size=1, pipeline_parallel_size=1, "
        f"device_config=cuda, enforce_eager={not ceiling}, "
        f"enable_prefix_caching={config.enable_prefix_caching}, compilation_config={compilation}",
        f"{_prefix(worker)} [parallel_state.py:1] world_size=1 rank=0 local_rank=0 "
        "distributed_init_method=tcp://127.0.0.1:0 backend=nccl",
    ]


def iteration_line(record: StepRecord, kv_usage: float) -> str:
    """One step as vLLM's ``--enable-logging-iteration-details`` writes it, stamped as the suite's
    logging config stamps it (``engine_harness/vllm_logging.json``), at the step's end: the sim's books of
    the step (its commit: 236 µs for a 1024-token chunk, 55 for a decode step, 2026-11-29) run between
    that end and the print and are no part of the modelled step (the next one starts on the model's grid);
    stamped at the print, a big step's interval held its books less the step before's (eager fit +12%)."""
    end_ns = record.t_start_ns + record.duration_ns
    stamp = time.time() - (time.perf_counter_ns() - end_ns) / 1e9
    return (
        f"{_prefix('MainProcess', stamp)} [loggers.py:200] Engine 000: Iteration({record.index}): "
        f"{record.num_prefill_reqs} context requests, {record.prefill_tokens} context tokens, "
        f"{record.num_decode_reqs} generation requests, {record.decode_tokens} generation tokens, "
        f"iteration elapsed time: {record.reported_ms:.2f} ms, GPU KV cache usage: {kv_usage * 100:.1f}%"
    )
