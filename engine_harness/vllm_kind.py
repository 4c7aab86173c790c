"""vLLM as an engine kind: its command line and environment (CPU build and CUDA build alike)."""

from __future__ import annotations

import sys

from engine_harness.process_group import core_text, isolation_plan
from engine_harness.spec import SpecFields, option
from engine_harness.steps import VLLM_LOGGING_CONFIG

__all__ = ["vllm_argv", "vllm_env"]


def vllm_argv(spec: SpecFields, port: int) -> list[str]:
    # --enable-prompt-tokens-details: usage.prompt_tokens_details.cached_tokens per request, so a
    # prefix-cache hit of one request is seen on that request, not only in the /metrics totals.
    argv = [
        spec.python or sys.executable,
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        spec.model,
        "--served-model-name",
        spec.model_name,
        "--host",
        spec.host,
        "--port",
        str(port),
        "--enable-prompt-tokens-details",
    ]
    argv += option("--max-num-batched-tokens", spec.chunk_size)
    if spec.chunk_size is not None:
        argv.append("--enable-chunked-prefill")
    argv.append("--enable-prefix-caching" if spec.prefix_caching else "--no-enable-prefix-caching")
    if spec.enforce_eager:
        argv.append("--enforce-eager")
    if not spec.torch_compile:
        argv += ["--compilation-config", '{"mode": 0}']
    argv += option("--max-model-len", spec.max_model_len) + option("--max-num-seqs", spec.max_num_seqs)
    argv += option("--gpu-memory-utilization", spec.gpu_memory_utilization)
    argv += option("--block-size", spec.block_size) + option("--load-format", spec.load_format)
    argv += option("--dtype", spec.dtype)
    if spec.log_iteration_details:
        argv.append("--enable-logging-iteration-details")
    return argv + list(spec.extra_args)


def vllm_env(spec: SpecFields) -> dict[str, str]:
    env = {"VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1", "HF_HUB_OFFLINE": "1"}
    if spec.cpu_kvcache_gib is not None:
        env["VLLM_CPU_KVCACHE_SPACE"] = f"{spec.cpu_kvcache_gib:g}"
    if spec.isolate_worker:
        env["VLLM_CPU_OMP_THREADS_BIND"] = core_text(isolation_plan(spec.cpu_threads_bind).worker)
    elif spec.cpu_threads_bind is not None:
        env["VLLM_CPU_OMP_THREADS_BIND"] = spec.cpu_threads_bind
    if spec.log_iteration_details:  # stamped step lines time whole steps in every mode (step_modes)
        env["VLLM_LOGGING_CONFIG_PATH"] = str(VLLM_LOGGING_CONFIG)
    return env | spec.env
