"""The simulated engine as an engine kind: its command line and which scheduling its mode runs."""

from __future__ import annotations

import sys

from engine_harness.spec import SpecFields, option
from engine_harness.step_model import Scheduling

__all__ = ["SIM_API_KEY_VAR", "sim_argv", "sim_scheduling"]

SIM_API_KEY_VAR = "SIM_API_KEY"  # the sim reads its key as vLLM reads VLLM_API_KEY


def sim_argv(spec: SpecFields, port: int) -> list[str]:
    argv = [
        sys.executable,
        "-m",
        "engine_harness.sim",
        "--model",
        spec.model_name,
        "--host",
        spec.host,
        "--port",
        str(port),
    ]
    argv += option("--max-num-batched-tokens", spec.chunk_size) + option("--max-num-seqs", spec.max_num_seqs)
    argv += option("--block-size", spec.block_size) + option("--max-model-len", spec.max_model_len)
    if not spec.prefix_caching:
        argv.append("--no-prefix-caching")
    if spec.mixed_chunk:
        argv += ["--mode", "sglang-mixed"]
    return argv + list(spec.extra_args)


def sim_scheduling(spec: SpecFields) -> Scheduling:
    args = list(spec.extra_args)
    mode = args[args.index("--mode") + 1] if "--mode" in args[:-1] else None
    return "exclusive" if mode == "sglang" else "mixed"
