"""Byte-level tokenizer of the simulated engine, matching the bundled tiny models (no dependencies).

Text → UTF-8 bytes → ids 0..255; ids 256..258 are the specials ``<|endoftext|>``, ``<|im_start|>`` and
``<|im_end|>`` (EOS). Chat messages go through the bundled models' ChatML template. The sim generates
printable ASCII ids only, so every generated token decodes to exactly one visible character.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from typing import Any

__all__ = [
    "IM_END",
    "IM_START",
    "VOCAB_SIZE",
    "decode",
    "decode_token",
    "encode",
    "encode_chat",
    "sample_token",
]

ENDOFTEXT, IM_START, IM_END = 256, 257, 258
VOCAB_SIZE = 259
_PRINTABLE_LO, _PRINTABLE_HI = 0x21, 0x7E  # '!' .. '~'
_TOKEN_TEXT = [chr(i) if 0x20 <= i < 0x7F else "" for i in range(VOCAB_SIZE)]


def encode(text: str) -> list[int]:
    """UTF-8 bytes of ``text`` as token ids."""
    return list(text.encode("utf-8"))


def decode(token_ids: Sequence[int]) -> str:
    """Byte ids back to text (invalid UTF-8 replaced); special ids are skipped, as vLLM does by default."""
    return bytes(t for t in token_ids if 0 <= t < 256).decode("utf-8", "replace")


def decode_token(token_id: int) -> str:
    """Text of one generated id: its character for printable ASCII, '' otherwise (EOS included)."""
    return _TOKEN_TEXT[token_id] if 0 <= token_id < VOCAB_SIZE else ""


def sample_token(rng: random.Random) -> int:
    """A random printable ASCII id."""
    return rng.randint(_PRINTABLE_LO, _PRINTABLE_HI)


def _content_text(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # OpenAI content parts: keep the text ones
        return "".join(str(p.get("text", "")) for p in content if isinstance(p, Mapping))
    raise ValueError(f"unsupported message content of type {type(content).__name__}")


def encode_chat(messages: Sequence[Mapping[str, Any]], add_generation_prompt: bool = True) -> list[int]:
    """ChatML: ``<|im_start|>role\\ncontent<|im_end|>\\n`` per message, then ``<|im_start|>assistant\\n``."""
    ids: list[int] = []
    for m in messages:
        if not isinstance(m, Mapping) or "role" not in m:
            raise ValueError("every message needs a 'role'")
        ids.append(IM_START)
        ids += encode(f"{m['role']}\n{_content_text(m.get('content'))}")
        ids.append(IM_END)
        ids += encode("\n")
    if add_generation_prompt:
        ids.append(IM_START)
        ids += encode("assistant\n")
    return ids
