"""A model's KV-cache shape, and the KV bytes one token takes: ``2 × layers × kv_heads × head_dim × dtype
bytes``, from a Hugging Face ``config.json``. One definition for every user: the transfer benchmark's
link fit (its bytes axis when the connector counts none), the break-even, the offload policy and the
GPU presets' start-up KV check (``kv_budget``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["DTYPE_BYTES", "ModelKV", "kv_bytes_per_token", "read_model_kv"]

DTYPE_BYTES = {
    "bfloat16": 2, "float16": 2, "half": 2, "fp16": 2, "bf16": 2, "float32": 4, "float": 4, "fp32": 4,
    "float8_e4m3fn": 1, "float8_e5m2": 1, "fp8": 1, "fp8_e4m3": 1, "fp8_e5m2": 1, "int8": 1,
}  # fmt: skip


def kv_bytes_per_token(layers: int, kv_heads: int, head_dim: int, dtype_bytes: int) -> int:
    """K and V of one token in every attention layer: the formula, written once."""
    return 2 * layers * kv_heads * head_dim * dtype_bytes


@dataclass(frozen=True)
class ModelKV:
    """The KV-cache shape of one model."""

    name: str
    layers: int
    kv_heads: int
    head_dim: int
    dtype_bytes: int

    @property
    def kv_bytes_per_token(self) -> int:
        return kv_bytes_per_token(self.layers, self.kv_heads, self.head_dim, self.dtype_bytes)

    @classmethod
    def from_config(cls, name: str, cfg: dict[str, Any], dtype: str | None = None) -> ModelKV:
        """From a Hugging Face config mapping; ``dtype`` overrides ``torch_dtype`` (e.g. an fp8 KV cache,
        or the ``--dtype`` the engine ran); None or ``"auto"``: the config's own."""
        try:
            layers = int(cfg["num_hidden_layers"])
            heads = int(cfg["num_attention_heads"]) if "num_attention_heads" in cfg else None
            kv_heads = int(cfg.get("num_key_value_heads") or heads or 0)
            head_dim = int(cfg.get("head_dim") or (int(cfg["hidden_size"]) // heads if heads else 0))
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"model config {name!r} lacks the attention shape: {exc}") from exc
        given = dtype if dtype not in (None, "auto") else None
        dtype_name = str(given or cfg.get("torch_dtype") or cfg.get("dtype") or "bfloat16")
        if dtype_name not in DTYPE_BYTES:
            raise ValueError(f"unknown KV dtype {dtype_name!r} for {name}; known: {sorted(DTYPE_BYTES)}")
        if min(layers, kv_heads, head_dim) <= 0:
            raise ValueError(f"model config {name!r} has a non-positive attention dimension")
        return cls(name, layers, kv_heads, head_dim, DTYPE_BYTES[dtype_name])


def read_model_kv(model: str | Path, dtype: str | None = None) -> ModelKV | None:
    """The KV shape of a local model: its folder or its ``config.json``; None when there is no such file
    (a hub name the engine downloads itself)."""
    path = Path(model)
    if path.is_dir():
        path = path / "config.json"
    if not path.is_file():
        return None
    return ModelKV.from_config(path.parent.name, json.loads(path.read_text()), dtype)
