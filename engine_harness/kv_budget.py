"""Does a preset's longest request fit its card? vLLM's start-up KV check, as arithmetic.

vLLM 0.33 refuses to start when one request of ``max_model_len`` tokens needs more KV cache than the
memory left for it (``vllm/v1/core/kv_cache_planning.py``: "To serve at least one request with the
model's max seq len …"). The memory left is ``ceil(total × gpu_memory_utilization)`` minus the weights,
the profiled activation peak, non-torch memory and the CUDA-graph estimate (``vllm/v1/worker/
gpu_worker.py``); a request needs ``ceil(tokens / block_size)`` blocks in every attention layer, and
the block pool holds one more (its null block) back.

The activation peak and the graphs are only known after a start, so ``kv_headroom_bytes`` leaves them
out: it is the most those may take before the check fails. Negative headroom fails on any card state.
The model's shape is transcribed from its ``config.json`` (the suite never downloads weights).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from engine_harness import model_kv

__all__ = [
    "CARD_BYTES",
    "GIB",
    "QWEN3_CODER_30B_A3B",
    "ModelShape",
    "kv_bytes_for_request",
    "kv_bytes_per_token",
    "kv_headroom_bytes",
    "longest_request_that_fits",
    "weight_bytes",
]

GIB = 2**30
MIB = 2**20

# The total vLLM budgets from (torch.accelerator.get_memory_info, i.e. cudaMemGetInfo): on an H100 80GB
# HBM3 (driver 580.159.04) 85,017,493,504 B, 480 MiB under NVML's and nvidia-smi's 81559 MiB (measured);
# an H20 96 GB shows 97871 MiB in nvidia-smi, taken less the same 480 MiB (an estimate, not measured).
CARD_BYTES: dict[str, int] = {"h100": 85_017_493_504, "h20": (97871 - 480) * MIB}


@dataclass(frozen=True)
class ModelShape:
    """The config.json fields that size a decoder-only MoE's weights and its KV cache (all layers MoE)."""

    layers: int
    hidden: int
    q_heads: int
    kv_heads: int
    head_dim: int
    experts: int
    expert_intermediate: int
    vocab: int
    tied_embeddings: bool = False
    dtype_bytes: int = 2  # bf16 weights


# Qwen/Qwen3-Coder-30B-A3B-Instruct config.json: num_hidden_layers 48, hidden_size 2048,
# num_attention_heads 32, num_key_value_heads 4, head_dim 128, num_experts 128, moe_intermediate_size
# 768, vocab_size 151936, tie_word_embeddings false, torch_dtype bfloat16.
QWEN3_CODER_30B_A3B = ModelShape(
    layers=48,
    hidden=2048,
    q_heads=32,
    kv_heads=4,
    head_dim=128,
    experts=128,
    expert_intermediate=768,
    vocab=151936,
)


def weight_bytes(shape: ModelShape) -> int:
    """Parameters × bytes: attention (q, k, v, o), router and experts (gate, up, down) per layer, the
    embedding and the LM head (norms are < 0.01 % and left out)."""
    attn = shape.hidden * shape.head_dim * (2 * shape.q_heads + 2 * shape.kv_heads)
    moe = shape.experts * (3 * shape.hidden * shape.expert_intermediate + shape.hidden)
    embeddings = shape.vocab * shape.hidden * (1 if shape.tied_embeddings else 2)
    return (shape.layers * (attn + moe) + embeddings) * shape.dtype_bytes


def kv_bytes_per_token(shape: ModelShape, kv_dtype_bytes: int = 2) -> int:
    """K and V of one token in every layer (2 bytes: bf16 KV, 1: fp8 KV)."""
    return model_kv.kv_bytes_per_token(shape.layers, shape.kv_heads, shape.head_dim, kv_dtype_bytes)


def kv_bytes_for_request(shape: ModelShape, tokens: int, block_size: int, kv_dtype_bytes: int = 2) -> int:
    """KV one request of ``tokens`` holds, in whole blocks, as vLLM's check counts it."""
    return math.ceil(tokens / block_size) * block_size * kv_bytes_per_token(shape, kv_dtype_bytes)


def kv_headroom_bytes(
    card_bytes: int,
    gpu_memory_utilization: float,
    shape: ModelShape,
    max_model_len: int,
    block_size: int,
    kv_dtype_bytes: int = 2,
) -> int:
    """What the activation peak, non-torch memory and CUDA graphs may take before vLLM's start-up check
    fails for ``max_model_len``; below 0 it fails whatever they take."""
    budget = math.ceil(card_bytes * gpu_memory_utilization)
    needed = kv_bytes_for_request(shape, max_model_len + block_size, block_size, kv_dtype_bytes)  # + null
    return budget - weight_bytes(shape) - needed


def longest_request_that_fits(
    card_bytes: int,
    gpu_memory_utilization: float,
    shape: ModelShape,
    reserve_bytes: int,
    block_size: int,
    kv_dtype_bytes: int = 2,
) -> int:
    """The largest whole-block ``max_model_len`` that passes the check with ``reserve_bytes`` set aside for
    activations, non-torch memory and graphs (0 when not even one block fits)."""
    left = math.ceil(card_bytes * gpu_memory_utilization) - weight_bytes(shape) - reserve_bytes
    per_block = block_size * kv_bytes_per_token(shape, kv_dtype_bytes)
    return max(0, left // per_block - 1) * block_size  # one block is the pool's null block
