"""Prompts of exact token length as token-id lists: warm shared prefixes and unique cold prompts.

``/v1/completions`` accepts ``prompt`` as a list of token ids, so a P-token prompt is exactly P tokens
with no client-side tokenizer. Ids are drawn from a ``TokenSpace`` — the ids that decode to ordinary
tokens of the served model (specials excluded), read from a local model folder when there is one (a path,
or a bundled model's name as the engines serve it).

Cold prompts are unique per call: their RNG is seeded from ``uuid4`` and ``time.time_ns()`` (the fix
for seed 002's prefix-cache bug, where deterministic prompts hit the cache after repetition 0). Their
first 16-token block (``BLOCK_TOKENS``) alone makes a hit on a cached block practically impossible
(≥ 256¹⁶ choices); the protocol still verifies on the engine's counters that no block was hit. Shared
prefixes are deterministic in their seed, so every decode stream of a batch gets the same warm prefix.
"""

from __future__ import annotations

import json
import random
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from engine_harness.spec import MODELS_DIR

__all__ = [
    "BLOCK_TOKENS",
    "FALLBACK_SPACE",
    "TokenSpace",
    "cold_prompt",
    "local_model_folder",
    "shared_prefix",
    "token_space_for",
]

# The first block of a cold prompt, what makes it cold: two cold prompts never share one (256 ids give
# 256¹⁶ first blocks; ``microbench.workloads.prompts.PromptFactory`` makes a repeat impossible: its first
# ids spell the request's number). A cache that matches token by token (SGLang's radix cache, page size 1)
# still matches a cold prompt's first ids by chance: no prompt can start with an id never seen before once
# as many prompts as ids went by (256 on the bundled byte models; SGLang adds no BOS to token-id prompts, so
# the hit is the prompt's own first id), and 1-token hits were seen on 5 of 32 sweep attempts. So a hit
# shorter than this block is a chance match of a cold prompt's first ids (it saves under 16 of P tokens:
# 0.2% of a 512-token prompt for the usual 1), and one of this block or more is a warm prompt
# (``microbench.results.derive.cold_and_clean``).
BLOCK_TOKENS = 16


@dataclass(frozen=True)
class TokenSpace:
    """Token ids ``lo <= id < hi`` that are ordinary (non-special) tokens of the model."""

    lo: int
    hi: int

    def __post_init__(self) -> None:
        if not 0 <= self.lo < self.hi:
            raise ValueError(f"token space must satisfy 0 <= lo < hi, got [{self.lo}, {self.hi})")
        if self.hi - self.lo < 2:
            raise ValueError(
                f"token space [{self.lo}, {self.hi}) has fewer than 2 ids: prompts can't be random"
            )

    @classmethod
    def parse(cls, text: str) -> TokenSpace:
        """``"LO:HI"`` → ``TokenSpace(LO, HI)`` with a clear error for anything else."""
        try:
            lo, hi = (int(x) for x in text.split(":"))
        except ValueError:
            raise ValueError(f"token range must look like LO:HI (e.g. 0:256), got {text!r}") from None
        return cls(lo, hi)


# For a hub model with no local files: ids every current large vocabulary (Qwen, Llama, Mistral) holds
# as ordinary tokens. Pass --token-range to use another.
FALLBACK_SPACE = TokenSpace(1000, 30000)


def local_model_folder(model: str) -> Path | None:
    """The folder holding ``model``'s ``tokenizer.json``: ``model`` itself (a path), or the bundled model
    of that name (as the engines serve it); None for a hub name with no local files."""
    return next((f for f in (Path(model), MODELS_DIR / model) if (f / "tokenizer.json").is_file()), None)


def token_space_for(model: str) -> TokenSpace:
    """The ordinary-token id range of a local model folder (``tokenizer.json``), the folder given or the
    bundled model of that name (an external engine serving ``qwen3-moe-tiny``: its 256 byte ids, where the
    fallback's ids crashed SGLang 0.5.23 with an embedding IndexError), else the fallback."""
    folder = local_model_folder(model)
    if folder is None:
        return FALLBACK_SPACE
    data = json.loads((folder / "tokenizer.json").read_text())
    vocab = data.get("model", {}).get("vocab") or {}
    special = {int(t["id"]) for t in data.get("added_tokens", []) if t.get("special")}
    ids = sorted(int(i) for i in vocab.values() if int(i) not in special)
    if not ids:
        return FALLBACK_SPACE
    # The contiguous run from the smallest ordinary id: byte-level and BPE vocabularies start there.
    hi = ids[0]
    for i in ids:
        if i != hi:
            break
        hi += 1
    return TokenSpace(ids[0], hi)


def cold_prompt(n_tokens: int, space: TokenSpace) -> list[int]:
    """``n_tokens`` random ids, unique per call (uuid4 + time_ns seed): never a prefix-cache hit."""
    if n_tokens <= 0:
        raise ValueError(f"a prompt needs at least one token, got {n_tokens}")
    rng = random.Random(uuid.uuid4().int ^ time.time_ns())
    return [rng.randrange(space.lo, space.hi) for _ in range(n_tokens)]


def shared_prefix(n_tokens: int, space: TokenSpace, seed: int) -> list[int]:
    """``n_tokens`` ids fixed by ``seed``: the warm prefix decode streams share."""
    if n_tokens <= 0:
        raise ValueError(f"a prefix needs at least one token, got {n_tokens}")
    rng = random.Random(f"shared-prefix:{seed}")
    return [rng.randrange(space.lo, space.hi) for _ in range(n_tokens)]
