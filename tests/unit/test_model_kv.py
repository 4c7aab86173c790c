"""KV bytes per token, one definition: a model config's attention shape times the dtype the engine ran."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from engine_harness.kv_budget import QWEN3_CODER_30B_A3B
from engine_harness.kv_budget import kv_bytes_per_token as budget_kv_bytes
from engine_harness.model_kv import ModelKV, read_model_kv

TINY = Path(__file__).resolve().parents[2] / "engine_harness" / "models" / "qwen3-moe-tiny"


def test_the_bundled_model_follows_the_engine_dtype_and_a_hub_name_has_no_local_shape() -> None:
    assert json.loads((TINY / "config.json").read_text())["torch_dtype"] == "bfloat16"
    float32 = read_model_kv(TINY, "float32")
    assert float32 is not None and float32.kv_bytes_per_token == 2 * 4 * 1 * 32 * 4 == 1024
    for own in (None, "auto"):  # the engine was told no dtype: the config's own (bf16)
        model = read_model_kv(str(TINY), own)
        assert model is not None and model.kv_bytes_per_token == 512
    by_file = read_model_kv(TINY / "config.json", "fp8")
    assert by_file is not None and (by_file.name, by_file.kv_bytes_per_token) == ("qwen3-moe-tiny", 256)
    assert read_model_kv("Qwen/not-local") is None


def test_the_shape_comes_from_hidden_size_when_head_dim_is_absent_and_bad_configs_say_why() -> None:
    cfg = {"num_hidden_layers": 48, "num_attention_heads": 32, "num_key_value_heads": 4, "hidden_size": 4096}
    assert ModelKV.from_config("x", cfg).kv_bytes_per_token == 2 * 48 * 4 * 128 * 2
    assert ModelKV.from_config("x", cfg | {"num_key_value_heads": None}).kv_heads == 32  # MHA
    with pytest.raises(ValueError, match="lacks the attention shape"):
        ModelKV.from_config("x", {"num_attention_heads": 4})
    with pytest.raises(ValueError, match="unknown KV dtype 'int3'"):
        ModelKV.from_config("x", cfg, "int3")


def test_the_gpu_budget_and_the_analysis_read_the_target_model_alike() -> None:
    from analysis.breakeven import load_model_kv  # its shape from analysis/model_configs.yaml

    for dtype, nbytes in (("bfloat16", 2), ("fp8", 1)):
        kv = load_model_kv("Qwen3-Coder-30B-A3B-Instruct", dtype).kv_bytes_per_token
        assert kv == budget_kv_bytes(QWEN3_CODER_30B_A3B, nbytes) == 98304 * nbytes // 2
