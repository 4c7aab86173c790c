"""SGLang as an engine kind: its command line, environment, interpreter and a dry run of its own parser.

SGLang runs in its own environment where one was set up (``.venv-sglang``: ``SETUP_ENGINE=sglang-cpu
bash scripts/setup.sh`` on a CPU box, see docs/design.md §2), else in the suite's interpreter
(``SETUP_ENGINE=sglang`` on a GPU box). Before a start, SGLang's own ``prepare_server_args`` parses the
argv in that interpreter, so a flag it does not accept fails at once with SGLang's message instead of
after a minute of imports.

Step logging (``EngineSpec.log_iteration_details``): ``--decode-log-interval 1`` makes the scheduler log
every decode step ("Decode batch, …") as it logs every prefill step ("Prefill batch, …"), and
``SGLANG_LOGGING_CONFIG_PATH`` points at ``sglang_logging.json``, whose format adds the record's epoch
time in microseconds (``@1700000000.123456``); ``engine_harness.steps`` reads those lines.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from engine_harness.environments import EngineEnvError, ask_python, find_venv_python
from engine_harness.process_group import isolation_plan
from engine_harness.spec import SpecFields, option
from engine_harness.step_model import Scheduling

__all__ = [
    "LOGGING_CONFIG",
    "SETUP_HINT",
    "SGLANG_PRESETS",
    "SGLANG_VENV",
    "Scheduling",
    "check_sglang_args",
    "sglang_argv",
    "sglang_env",
    "sglang_python",
    "sglang_scheduling",
]

SGLANG_VENV = ".venv-sglang"
SETUP_HINT = (
    "`SETUP_ENGINE=sglang-cpu bash scripts/setup.sh` on a box without a GPU (SGLang in .venv-sglang), "
    "`SETUP_ENGINE=sglang bash scripts/setup.sh` on a GPU box"
)
LOGGING_CONFIG = Path(__file__).resolve().parent / "sglang_logging.json"
_DRY_PARSE = (
    "import sys; from sglang.srt.server_args import prepare_server_args; prepare_server_args(sys.argv[1:])"
)


def sglang_python(spec: SpecFields) -> str:
    """The spec's ``python``, else ``.venv-sglang/bin/python`` where it exists, else this interpreter."""
    return spec.python or find_venv_python(SGLANG_VENV) or sys.executable


def sglang_scheduling(spec: SpecFields) -> Scheduling:
    return "mixed" if spec.mixed_chunk else "exclusive"


def sglang_argv(spec: SpecFields, port: int) -> list[str]:
    argv = [sglang_python(spec), "-m", "sglang.launch_server", "--model-path", spec.model]
    argv += ["--served-model-name", spec.model_name, "--host", spec.host, "--port", str(port)]
    # --enable-cache-report: usage.prompt_tokens_details.cached_tokens per request (the cold check)
    argv += ["--enable-metrics", "--enable-cache-report"]
    argv += option("--chunked-prefill-size", spec.chunk_size)
    if not spec.prefix_caching:
        argv.append("--disable-radix-cache")
    if spec.enforce_eager:
        argv.append("--disable-cuda-graph")
    if spec.mixed_chunk:
        argv.append("--enable-mixed-chunk")
    if not spec.overlap_schedule:
        argv.append("--disable-overlap-schedule")
    argv += option("--context-length", spec.max_model_len) + option(
        "--max-running-requests", spec.max_num_seqs
    )
    argv += option("--mem-fraction-static", spec.gpu_memory_utilization) + option(
        "--page-size", spec.block_size
    )
    argv += option("--load-format", spec.load_format) + option("--dtype", spec.dtype)
    argv += option("--device", spec.device) + option("--attention-backend", spec.attention_backend)
    argv += option("--max-total-tokens", spec.max_total_tokens)
    if spec.log_iteration_details:
        argv += ["--decode-log-interval", "1"]
    return argv + list(spec.extra_args)


def sglang_env(spec: SpecFields) -> dict[str, str]:
    env = {"HF_HUB_OFFLINE": "1", "SGLANG_LOG_MS": "1"}
    if spec.device == "cpu":
        # Without it SGLang takes vLLM's rotary kernels on a CPU device and fails (DESIGN §2).
        env["SGLANG_USE_CPU_ENGINE"] = "1"
    if spec.log_iteration_details:
        env["SGLANG_LOGGING_CONFIG_PATH"] = str(LOGGING_CONFIG)
    if spec.isolate_worker:  # torch's pool in the scheduler: one thread per core it is pinned to (launch)
        env["OMP_NUM_THREADS"] = str(len(isolation_plan(spec.cpu_threads_bind).worker))
    return env | spec.env


def check_sglang_args(python: str, argv: list[str]) -> None:
    """SGLang's own parser and settings checks on ``argv`` (everything after ``-m sglang.launch_server``)
    in SGLang's interpreter; raises ``EngineEnvError`` with SGLang's message when it refuses them."""
    result = ask_python(python, _DRY_PARSE, argv)
    if result.returncode != 0:
        lines = [ln for ln in result.stderr.strip().splitlines() if ln.strip()]
        # argparse's verdict ("sglang serve: error: unrecognized arguments: --x") or the exception line
        verdict = [ln for ln in lines if "error:" in ln or "Error:" in ln]
        message = "\n".join(verdict[-3:] or lines[-6:]) or f"exit code {result.returncode}, no message"
        raise EngineEnvError(f"SGLang refused the engine settings before start:\n{message}")


# Presets for SGLang on a CPU box, the same model and budget as the vLLM `cpu` preset. `sglang-cpu` is
# SGLang's default scheduling (a prefill step runs instead of the decode step), `sglang-cpu-mixed` adds
# --enable-mixed-chunk (the decodes ride in every prefill step, as in vLLM).
_SGLANG_CPU: dict[str, Any] = {
    "kind": "sglang",
    "device": "cpu",
    "attention_backend": "torch_native",
    "load_format": "dummy",
    "dtype": "float32",
    "chunk_size": 8192,
    "max_model_len": 40960,
    "max_num_seqs": 64,
    # KV pool in tokens; without it SGLang's CPU pool takes ≈ 85 % of free RAM.
    "max_total_tokens": 65536,
    "prefix_caching": True,
    "mixed_chunk": False,
    # On a CPU device the overlap scheduler gains nothing to overlap and logs each step a step late;
    # one P = 4096 injection next to 4 decodes (chunk 2048, shared 2-core box): TTFT 2.26 s with it,
    # 1.02 s without.
    "overlap_schedule": False,
}
# Presets for SGLang on the seed's cards: seed 002's model, budget (8192) and prefix caching, the context
# length of the vLLM preset of the same card (engines.PRESETS, kv_budget), and otherwise SGLang's GPU
# defaults, as a user runs it: the overlap scheduler on, CUDA graphs on, its own page size (the seed's
# block 16 is vLLM's default) and its own --mem-fraction-static (that knob sizes weights + KV pool only,
# not vLLM's whole-process budget, so the seed's 0.9 would leave too little for activations and graphs).
_SGLANG_GPU: dict[str, Any] = {
    "kind": "sglang",
    "model": "Qwen/Qwen3-Coder-30B-A3B-Instruct",
    "chunk_size": 8192,
    "prefix_caching": True,
    "mixed_chunk": False,
    "overlap_schedule": True,
}
SGLANG_PRESETS: dict[str, dict[str, Any]] = {
    "sglang-cpu": _SGLANG_CPU,
    "sglang-cpu-mixed": _SGLANG_CPU | {"mixed_chunk": True},
    "sglang-h100": _SGLANG_GPU | {"max_model_len": 65536},
    "sglang-h100-mixed": _SGLANG_GPU | {"max_model_len": 65536, "mixed_chunk": True},
    "sglang-h20": _SGLANG_GPU | {"max_model_len": 200000},
    "sglang-h20-mixed": _SGLANG_GPU | {"max_model_len": 200000, "mixed_chunk": True},
}
