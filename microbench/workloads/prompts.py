"""Prompts of exact token length: unique cold parts, deliberately shared prefixes, text when needed.

``PromptFactory`` draws token ids from a ``microbench.client.prompts.TokenSpace`` (the bundled tiny models:
0..255, their specials 256–258 left out; ``token_space_for(model)`` reads it from a model folder).
Uniqueness follows the sweep's rule, by construction: every request drawn gets the factory's next number
(``item()``), and a cold part is a function of the factory's ``salt`` (uuid4 ⊕ ``time_ns`` ⊕
``perf_counter_ns`` unless given), that number and the part's place in the request (``part``: a
conversation's later rounds). Its first ids are the digits of a one-to-one mix of (number, part), the rest
a SHAKE-128 stream keyed by the three, so two cold parts of one factory never share a first 16-token block
and no two prompts share a prefix-cache block by accident. Counted, not drawn in turn: a cold part is made
only when asked for, in any order and in any process, so a load-generation worker builds only the
requests it sends (``RequestSpec.built``) and skips the others' for nothing. Forked workers number the
requests they draw as their parent would; ``item_counts``/``raise_item_counts`` carry the counts back
to the parent, so a later run in the parent never draws a number a worker used. ``document_question``
builds the Long Context workload's prompt: a cold document, then a fixed question (a suffix, so it never
makes a prefix-cache hit). Shared prefixes (prefix groups, repository contexts, system prompts) are drawn
once per ``(group, index)`` and repeated on purpose; they are new in every run (the salt), so a run
starts cold. Giving the same salt back reproduces every prompt, whatever the number of workers; the salt
is reported in the trace header.

Engines that accept token ids get them as is (exact lengths). Otherwise (the chat API) ``TextRenderer``
decodes the ids with the model's tokenizer and re-encodes the text, trimming or extending the ids until the
text holds exactly as many tokens as asked; ``text_space`` picks the tokenizer's longest run of ids whose
tokens are printable ASCII (the bundled tiny models: '!'..'~'), so the text round-trips.
"""

from __future__ import annotations

import hashlib
import json
import math
import time
import uuid
import weakref
from pathlib import Path
from typing import Any, Literal, Protocol

import numpy as np

from engine_harness.engines import DEFAULT_MODEL
from microbench.client.prompts import BLOCK_TOKENS, TokenSpace, local_model_folder, token_space_for

__all__ = [
    "BLOCK_TOKENS",
    "BYTE_SPACE",
    "QUESTION_TOKENS",
    "PromptFactory",
    "TextRenderer",
    "Tokenizer",
    "as_prompt",
    "item_counts",
    "load_tokenizer",
    "prompt_source",
    "raise_item_counts",
    "text_space",
]

QUESTION_TOKENS = 100  # the Long Context workload's fixed question (IETF A.5.1: "~100 tokens")
BYTE_SPACE = TokenSpace(0, 256)  # the bundled tiny models' byte tokens (specials 256–258 left out)


_PART_BITS = 20  # a request's cold parts: 0 its first round's, 1 + 2·r and 2 + 2·r its (r+1)-th later round's
_MASK64 = (1 << 64) - 1
_FACTORIES: weakref.WeakValueDictionary[int, PromptFactory] = weakref.WeakValueDictionary()


def _fresh_salt() -> int:
    return uuid.uuid4().int ^ time.time_ns() ^ (time.perf_counter_ns() << 64)


def _mix64(x: int) -> int:
    """A one-to-one map of 64-bit integers (splitmix64's finalizer: xor-shifts and odd multipliers)."""
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    return x ^ (x >> 31)


class PromptFactory:
    """Ids of ``space``: ``cold(n)`` never repeats a first block; ``shared(...)`` always repeats."""

    def __init__(self, space: TokenSpace = BYTE_SPACE, salt: int | None = None) -> None:
        size = space.hi - space.lo
        if size**BLOCK_TOKENS < 2**64:
            raise ValueError(f"token space [{space.lo}, {space.hi}) is too small for unique first blocks")
        self.space = space
        self.salt = _fresh_salt() if salt is None else salt
        self._items = 0  # requests numbered so far (``item``)
        self._shared: dict[tuple[str, int], list[int]] = {}
        salt_bytes = self.salt.to_bytes(max(1, (self.salt.bit_length() + 7) // 8), "little")
        self._cold_key = hashlib.shake_128(b"cold\0" + salt_bytes)
        self._mix_key = int.from_bytes(hashlib.blake2b(salt_bytes, digest_size=8).digest(), "little")
        self._head = math.ceil(64 / math.log2(size))  # ids that spell a 64-bit number in base ``size``
        _FACTORIES[id(self)] = self

    def _rng(self, *key: int) -> np.random.Generator:
        words = [(self.salt >> (32 * i)) & 0xFFFFFFFF for i in range(6)]
        return np.random.default_rng([*words, *key])

    def item(self) -> int:
        """The next request's number: one per request drawn, whoever builds it later."""
        self._items += 1
        return self._items - 1

    def cold(self, n: int, item: int | None = None, part: int = 0) -> list[int]:
        """``n`` ids of request ``item``'s cold part ``part`` (None: a new request's): the same ids every
        time they are asked for, and no other (item, part) of this factory has their first block."""
        if item is None:
            item = self.item()
        if not 0 <= part < 1 << _PART_BITS or not 0 <= item < 1 << (64 - _PART_BITS):
            raise ValueError(f"cold part {part} of request {item} is out of range")
        key = item << _PART_BITS | part
        size, lo = self.space.hi - self.space.lo, self.space.lo
        head, value = [], _mix64(key ^ self._mix_key)
        for _ in range(min(self._head, n)):
            value, digit = divmod(value, size)
            head.append(lo + digit)
        if n <= self._head:
            return head
        stream = self._cold_key.copy()
        stream.update(key.to_bytes(8, "little"))
        # 32 random bits per id, reduced modulo the space: a bias under size / 2**32 (1e-5 at 40k ids)
        tail = np.frombuffer(stream.digest(4 * (n - self._head)), dtype=np.uint32) % size + lo
        return head + tail.tolist()

    def document_question(
        self, n: int, question: int = QUESTION_TOKENS, item: int | None = None
    ) -> list[int]:
        """A Long Context prompt (IETF A.5): a cold document of ``n - question`` ids (request ``item``'s,
        None: a new request's), then one fixed question of ``question`` ids (at most half the prompt) that
        every such prompt of this factory ends with."""
        q = min(question, n // 2)
        return self.cold(n - q, item) + self.shared("long-context-question", 0, q)

    def shared(self, group: str, index: int, n: int) -> list[int]:
        """The ``index``-th prefix of ``group``: the same ``n`` ids every time it is asked for."""
        key = (group, index)
        cached = self._shared.get(key)
        if cached is None or len(cached) < n:
            # A digest of the whole name (63 bits, the same in every process). The key before 2026-11-30,
            # a name's first 32 bytes read big-endian modulo 2**63, kept only bytes 25-32: 0 for every name
            # of up to 24 bytes, so the i-th prefixes of two groups ("system", "corpus") were one and the
            # same, and SGLang served one group's requests from the other's cached prefix.
            digest = hashlib.blake2b(group.encode("utf-8"), digest_size=8).digest()
            group_key = int.from_bytes(digest, "big") >> 1
            cached = self._rng(2, group_key, index).integers(self.space.lo, self.space.hi, size=n).tolist()
            self._shared[key] = cached
        return cached[:n]


def item_counts() -> dict[int, int]:
    """This process's factories' request counts, by ``id`` (a forked worker sends them to its parent)."""
    return {key: factory._items for key, factory in _FACTORIES.items()}


def raise_item_counts(counts: dict[int, int]) -> None:
    """Raise each of this process's factories to the count a forked worker reached with its copy (the
    same ``id``: the worker's copy of it), so this process never numbers a request again that a worker
    drew; a count only ever rises, so an ``id`` that is another factory's only skips numbers."""
    for key, count in counts.items():
        if (factory := _FACTORIES.get(key)) is not None:
            factory._items = max(factory._items, count)


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


def _tokenizer_file(path: str | Path) -> Path:
    path = Path(path)
    if path.is_dir():
        path = path / "tokenizer.json"
    if not path.is_file():
        raise FileNotFoundError(f"no tokenizer.json at {path}")
    return path


def load_tokenizer(path: str | Path) -> Tokenizer:
    """A tokenizer from a ``tokenizer.json`` file or a model folder holding one."""
    return _HFTokenizer(_tokenizer_file(path))


def _printable(token: str) -> bool:
    return bool(token) and all(" " < ch < "\x7f" for ch in token)


def text_space(path: str | Path) -> TokenSpace:
    """The longest run of ids whose vocabulary entries are printable ASCII (no space or byte markers)."""
    data = json.loads(_tokenizer_file(path).read_text(encoding="utf-8"))
    vocab: dict[str, int] = data.get("model", {}).get("vocab") or {}
    special = {int(t["id"]) for t in data.get("added_tokens", []) if t.get("special")}
    ids = sorted(i for tok, i in vocab.items() if _printable(tok) and i not in special)
    best, start = (0, 0), 0
    for k in range(1, len(ids) + 1):
        if k == len(ids) or ids[k] != ids[k - 1] + 1:
            if k - start > best[1] - best[0]:
                best = (ids[start], ids[k - 1] + 1)
            start = k
    if best[1] - best[0] < 2:
        raise ValueError(f"{path}: no run of printable-ASCII tokens to draw text prompts from")
    return TokenSpace(*best)


class TextRenderer:
    """Ids → text through ``tokenizer``, with the token count of the text the engine will see.

    When re-encoding merges or splits tokens, the tail of the ids is trimmed (or extended with the first
    ids again) and the text rendered anew, up to ``tries`` times; the count returned is always the text's.
    """

    def __init__(self, tokenizer: Tokenizer, tries: int = 8) -> None:
        self.tokenizer = tokenizer
        self.tries = tries

    def render(self, ids: list[int]) -> tuple[str, int]:
        target, work = len(ids), list(ids)
        for _ in range(self.tries):
            text = self.tokenizer.decode(work)
            count = len(self.tokenizer.encode(text))
            if count == target or not work:
                break
            work = work[: len(work) - (count - target)] if count > target else work + ids[: target - count]
        return text, count


def as_prompt(ids: list[int], text: TextRenderer | None) -> tuple[list[int] | str, int]:
    """``ids`` as the prompt sent and its token count: as they are, or exact-count text through ``text``."""
    return (ids, len(ids)) if text is None else text.render(ids)


def _tokenizer_path(model: str, tokenizer: str | None) -> str | None:
    """The given tokenizer, else the served model's folder (a path, or a bundled model's name as vLLM serves
    it), else the bundled one for the sim ('sim')."""
    if tokenizer is not None:
        return tokenizer
    if (folder := local_model_folder(model)) is not None:
        return str(folder)
    return DEFAULT_MODEL if model == "sim" else None  # the sim tokenizes as the bundled tiny models do


def prompt_source(
    api: Literal["completions", "chat"],
    model: str,
    *,
    tokenizer: str | None = None,
    space: TokenSpace | None = None,
    salt: int | None = None,
) -> tuple[PromptFactory, TextRenderer | None, dict[str, Any]]:
    """Prompts for ``api`` on ``model``: token ids for completions, exact-count text for chat.

    Token ids come from the model's own vocabulary (``token_space_for``: the bundled models' bytes, else
    ids every large vocabulary holds); text from the tokenizer's printable run (``text_space``). Returns
    the factory, the text renderer (None: token ids) and what a trace header records to repeat the run
    (form, token space, salt, tokenizer). Raises ``ValueError`` when chat has no tokenizer.
    """
    path = _tokenizer_path(model, tokenizer)
    if api == "chat" and path is None:
        raise ValueError(
            f"the chat API takes text prompts, made exact through the model's tokenizer: no tokenizer.json "
            f"for {model!r}; pass --tokenizer PATH (a tokenizer.json or a model folder)"
        )
    try:
        text = TextRenderer(load_tokenizer(path)) if api == "chat" and path else None
        if space is None:
            space = text_space(path) if text is not None and path else token_space_for(path or model)
    except FileNotFoundError as exc:
        raise ValueError(f"--tokenizer: {exc}") from None
    factory = PromptFactory(space, salt=salt)
    disclosure = {
        "form": "text" if text is not None else "token ids",
        "token_space": [space.lo, space.hi],
        "salt": str(factory.salt),
        "tokenizer": path,
    }
    return factory, text, disclosure
