"""Generate the bundled tiny models in ``engine_harness/models/`` (config + tokenizer, no weights).

The embedded default engine serves these with ``--load-format dummy``: vLLM builds the network from
``config.json`` and fills it with random weights, so no download is ever needed. Run this script to
regenerate the folders; the output is deterministic, so a re-run leaves ``git status`` clean.

Architecture choices (target: Qwen3-Coder-30B-A3B-Instruct — 48 layers, hidden 2048, 32 query heads,
4 KV heads, head_dim 128, 128 experts top-8, moe_intermediate 768):

* ``qwen3-moe-tiny`` keeps the family's structure — Qwen3-MoE blocks (sparse experts with top-k
  routing, q/k norms), grouped-query attention, RoPE — and shrinks every size: 4 layers, hidden 256,
  2 query heads and 1 KV head of head_dim 32, 16 experts top-4, moe_intermediate 128.
  Attention is scaled down with the rest on purpose: with the target's attention width (32×128) a
  32K-token prefill alone takes minutes on 2 CPU cores (attention is quadratic in the prompt), and the
  seed grid goes to P = 32768: this width keeps a 32K prefill near 12 s and the whole seed grid
  (49 cells × 5 repetitions) near the 15-minute budget. KV bytes per token of the target come from
  its own config in ``analysis.breakeven``, not from this model.
* ``qwen3-dense-tiny`` is the dense sibling (``Qwen3ForCausalLM``) with the same attention shape.

Tokenizer: 256 byte tokens with the GPT-2 byte-to-unicode mapping and no merges, plus Qwen's special
tokens. Every id below 256 decodes to printable text (the decoder maps the printable stand-ins back to
spaces and newlines only), so random token ids never produce incomplete UTF-8 in a response.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers

MODELS_DIR = Path(__file__).resolve().parent.parent / "engine_harness" / "models"
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
VOCAB_SIZE = 259  # 256 byte tokens + 3 specials: every id the model can emit decodes to text

CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

COMMON_CONFIG = {
    "attention_bias": False,
    "attention_dropout": 0.0,
    "bos_token_id": 256,
    "eos_token_id": 258,
    "head_dim": 32,
    "hidden_act": "silu",
    "hidden_size": 256,
    "initializer_range": 0.02,
    "max_position_embeddings": 65536,
    "max_window_layers": 4,
    "num_attention_heads": 2,
    "num_hidden_layers": 4,
    "num_key_value_heads": 1,
    "rms_norm_eps": 1e-06,
    "rope_scaling": None,
    "rope_theta": 1000000.0,
    "sliding_window": None,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "transformers_version": "4.51.0",
    "use_cache": True,
    "use_sliding_window": False,
    "vocab_size": VOCAB_SIZE,
}

MODEL_CONFIGS: dict[str, dict[str, object]] = {
    "qwen3-moe-tiny": {
        **COMMON_CONFIG,
        "architectures": ["Qwen3MoeForCausalLM"],
        "model_type": "qwen3_moe",
        "decoder_sparse_step": 1,
        "intermediate_size": 512,
        "mlp_only_layers": [],
        "moe_intermediate_size": 128,
        "norm_topk_prob": True,
        "num_experts": 16,
        "num_experts_per_tok": 4,
        "output_router_logits": False,
        "router_aux_loss_coef": 0.001,
    },
    "qwen3-dense-tiny": {
        **COMMON_CONFIG,
        "architectures": ["Qwen3ForCausalLM"],
        "model_type": "qwen3",
        "intermediate_size": 768,
    },
}


def byte_to_unicode() -> dict[int, str]:
    """GPT-2's reversible map from bytes to printable unicode characters."""
    printable = (
        list(range(ord("!"), ord("~") + 1))
        + list(range(ord("¡"), ord("¬") + 1))
        + list(range(ord("®"), ord("ÿ") + 1))
    )
    chars = printable[:]
    n = 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + n)
            n += 1
    return dict(zip(printable, (chr(c) for c in chars), strict=True))


def build_tokenizer() -> Tokenizer:
    mapping = byte_to_unicode()
    vocab = {mapping[b]: b for b in range(256)}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[], fuse_unk=False))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    # Decode to the printable stand-ins (always valid UTF-8), except space and newline read as such.
    tok.decoder = decoders.Sequence(
        [decoders.Replace(mapping[ord(" ")], " "), decoders.Replace(mapping[ord("\n")], "\n")]
    )
    tok.add_special_tokens(SPECIAL_TOKENS)
    return tok


def write_model(name: str, config: dict[str, object], out_dir: Path) -> Path:
    folder = out_dir / name
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    (folder / "generation_config.json").write_text(
        json.dumps({"bos_token_id": 256, "eos_token_id": 258, "do_sample": False}, indent=2) + "\n"
    )
    build_tokenizer().save(str(folder / "tokenizer.json"), pretty=True)
    tokenizer_config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": None,
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
        "unk_token": None,
        "model_max_length": config["max_position_embeddings"],
        "clean_up_tokenization_spaces": False,
        "chat_template": CHAT_TEMPLATE,
        "added_tokens_decoder": {
            str(256 + i): {
                "content": t,
                "special": True,
                "lstrip": False,
                "rstrip": False,
                "normalized": False,
                "single_word": False,
            }
            for i, t in enumerate(SPECIAL_TOKENS)
        },
    }
    (folder / "tokenizer_config.json").write_text(json.dumps(tokenizer_config, indent=2) + "\n")
    return folder


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=MODELS_DIR, help="folder to write models into")
    args = parser.parse_args()
    for name, config in MODEL_CONFIGS.items():
        print(write_model(name, config, args.out))


if __name__ == "__main__":
    main()
