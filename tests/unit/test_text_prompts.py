"""Text prompts of exact token counts: the tokenizer's printable run, and re-encoding that merges tokens."""

from pathlib import Path

import pytest

from engine_harness.engines import DEFAULT_MODEL
from microbench.client.prompts import TokenSpace
from microbench.workloads.prompts import (
    PromptFactory,
    TextRenderer,
    load_tokenizer,
    prompt_source,
    text_space,
)


class _MergingTokenizer:
    """Ids are characters 'a'..'z' (0..25); encoding merges every 'ab' into one token (26)."""

    def decode(self, ids: list[int]) -> str:
        return "".join("ab" if i == 26 else chr(ord("a") + i) for i in ids)

    def encode(self, text: str) -> list[int]:
        out, k = [], 0
        while k < len(text):
            if text.startswith("ab", k):
                out.append(26)
                k += 2
            else:
                out.append(ord(text[k]) - ord("a"))
                k += 1
        return out


def test_the_bundled_models_text_space_is_printable_ascii_and_round_trips() -> None:
    space = text_space(DEFAULT_MODEL)
    assert space == TokenSpace(ord("!"), ord("~") + 1)
    renderer = TextRenderer(load_tokenizer(DEFAULT_MODEL))
    factory = PromptFactory(space, salt=3)
    for n in (1, 17, 300):
        text, count = renderer.render(factory.cold(n))
        assert count == n and len(text) == n and text.isprintable() and " " not in text


def test_merged_tokens_are_made_up_so_the_text_has_the_asked_count() -> None:
    ids = [0, 1] * 10 + [2] * 5  # "ab" ten times merges into 10 tokens on re-encoding
    text, count = TextRenderer(_MergingTokenizer()).render(ids)
    assert count == len(ids) == len(_MergingTokenizer().encode(text))
    assert TextRenderer(_MergingTokenizer(), tries=1).render(ids)[1] == 15  # the true count, never the asked


def test_a_vocabulary_without_printable_tokens_is_a_clear_error(tmp_path: Path) -> None:
    (tmp_path / "tokenizer.json").write_text('{"model": {"vocab": {"\\u0100": 0, "\\u0101": 1}}}')
    with pytest.raises(ValueError, match="no run of printable-ASCII tokens"):
        text_space(tmp_path)


def test_chat_finds_the_tokenizer_by_path_bundled_name_or_the_sim() -> None:
    for model in (DEFAULT_MODEL, "qwen3-moe-tiny", "sim"):
        _, text, disclosure = prompt_source("chat", model, salt=5)
        assert text is not None and disclosure["form"] == "text" and disclosure["salt"] == "5"
        assert disclosure["tokenizer"].endswith("qwen3-moe-tiny") and disclosure["token_space"] == [33, 127]
    _, text, disclosure = prompt_source("completions", "org/hub-model")
    assert text is None and disclosure["token_space"] == [1000, 30000]  # ids every large vocabulary holds
    with pytest.raises(ValueError, match="pass --tokenizer PATH"):
        prompt_source("chat", "org/hub-model")
