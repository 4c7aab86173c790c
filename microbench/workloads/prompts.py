"""Prompts of exact token length: unique cold parts, deliberately shared prefixes, text when needed.

``PromptFactory`` draws token ids from a ``microbench.client.prompts.TokenSpace`` (the bundled tiny models:
0..255, their specials 256–258 left out; ``token_space_for(model)`` reads it from a model folder).
Uniqueness follows the sweep's rule: cold parts come from one RNG seeded by the factory's ``salt``
(uuid4 ⊕ ``time_ns`` ⊕ ``perf_counter_ns`` unless given), and the factory never hands out
two cold parts with the same first 16-token block, so no two prompts share a prefix-cache block by
accident. Shared prefixes (prefix groups, repository contexts, system prompts) are drawn once per
``(group, index)`` and repeated on purpose; they are new in every run (the salt), so a run starts cold.
Giving the same salt back reproduces every prompt; the salt is reported in the trace header.

Engines that accept token ids get them as is (exact lengths). Otherwise ``TextRenderer`` decodes the ids
with a tokenizer and counts the text's tokens again; pick a printable id range so that text round-trips.
"""

from __future__ import annotations

import time
import uuid
from pathlib import Path
from typing import Protocol

import numpy as np

from microbench.client.prompts import TokenSpace

__all__ = ["BLOCK_TOKENS", "BYTE_SPACE", "PromptFactory", "TextRenderer", "Tokenizer", "load_tokenizer"]

BLOCK_TOKENS = 16  # prefix-cache block the uniqueness rule is about
BYTE_SPACE = TokenSpace(0, 256)  # the bundled tiny models' byte tokens (specials 256–258 left out)


def _fresh_salt() -> int:
    return uuid.uuid4().int ^ time.time_ns() ^ (time.perf_counter_ns() << 64)


class PromptFactory:
    """Ids of ``space``: ``cold(n)`` never repeats a first block; ``shared(...)`` always repeats."""

    def __init__(self, space: TokenSpace = BYTE_SPACE, salt: int | None = None) -> None:
        if (space.hi - space.lo) ** BLOCK_TOKENS < 2**64:
            raise ValueError(f"token space [{space.lo}, {space.hi}) is too small for unique first blocks")
        self.space = space
        self.salt = _fresh_salt() if salt is None else salt
        self._cold_rng = self._rng(1)
        self._first_blocks: set[bytes] = set()
        self._shared: dict[tuple[str, int], list[int]] = {}

    def _rng(self, *key: int) -> np.random.Generator:
        words = [(self.salt >> (32 * i)) & 0xFFFFFFFF for i in range(6)]
        return np.random.default_rng([*words, *key])

    def cold(self, n: int) -> list[int]:
        """``n`` fresh ids whose first block no earlier cold part of this factory has."""
        while True:
            ids = self._cold_rng.integers(self.space.lo, self.space.hi, size=n)
            block = ids[:BLOCK_TOKENS].tobytes()
            if n < BLOCK_TOKENS or block not in self._first_blocks:
                if n >= BLOCK_TOKENS:
                    self._first_blocks.add(block)
                return ids.tolist()

    def shared(self, group: str, index: int, n: int) -> list[int]:
        """The ``index``-th prefix of ``group``: the same ``n`` ids every time it is asked for."""
        key = (group, index)
        cached = self._shared.get(key)
        if cached is None or len(cached) < n:
            group_key = int.from_bytes(group.encode("utf-8")[:32].ljust(32, b"\0"), "big") % 2**63
            cached = self._rng(2, group_key, index).integers(self.space.lo, self.space.hi, size=n).tolist()
            self._shared[key] = cached
        return cached[:n]


class Tokenizer(Protocol):
    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: list[int]) -> str: ...


class _HFTokenizer:
    """Adapter of a ``tokenizers.Tokenizer`` (a ``tokenizer.json``) to ``encode``/``decode`` on id lists."""

    def __init__(self, path: Path) -> None:
        from tokenizers import Tokenizer as RustTokenizer

        self._tok = RustTokenizer.from_file(str(path))

    def encode(self, text: str) -> list[int]:
        return list(self._tok.encode(text, add_special_tokens=False).ids)

    def decode(self, ids: list[int]) -> str:
        return str(self._tok.decode(ids, skip_special_tokens=False))


def load_tokenizer(path: str | Path) -> Tokenizer:
    """A tokenizer from a ``tokenizer.json`` file or a model folder holding one."""
    path = Path(path)
    if path.is_dir():
        path = path / "tokenizer.json"
    if not path.is_file():
        raise FileNotFoundError(f"no tokenizer.json at {path}")
    return _HFTokenizer(path)


class TextRenderer:
    """Ids → text through ``tokenizer``, with the token count of the text the engine will see."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        self.tokenizer = tokenizer

    def render(self, ids: list[int]) -> tuple[str, int]:
        text = self.tokenizer.decode(ids)
        return text, len(self.tokenizer.encode(text))
