"""Prompt lengths, uniqueness and token spaces."""

import pytest

from engine_harness.engines import DEFAULT_MODEL
from microbench.client.prompts import FALLBACK_SPACE, TokenSpace, cold_prompt, shared_prefix, token_space_for


def test_cold_prompts_have_exact_length_and_never_share_a_first_block() -> None:
    space = TokenSpace(0, 256)
    prompts = [cold_prompt(1024, space) for _ in range(200)]
    assert all(len(p) == 1024 and all(0 <= t < 256 for t in p) for p in prompts)
    assert len({tuple(p[:16]) for p in prompts}) == 200


def test_shared_prefix_is_fixed_by_its_seed() -> None:
    space = TokenSpace(0, 256)
    assert shared_prefix(64, space, 1) == shared_prefix(64, space, 1)
    assert shared_prefix(64, space, 1) != shared_prefix(64, space, 2)


def test_token_space_of_the_bundled_model_excludes_specials() -> None:
    assert token_space_for(DEFAULT_MODEL) == TokenSpace(0, 256)
    # by the name an engine serves it under (an external engine): its bytes, not the fallback's large ids
    assert token_space_for("qwen3-moe-tiny") == token_space_for("qwen3-dense-tiny") == TokenSpace(0, 256)
    assert token_space_for("Qwen/Qwen3-Coder-30B-A3B-Instruct") == FALLBACK_SPACE


def test_bad_token_ranges_and_lengths_are_clear_errors() -> None:
    assert TokenSpace.parse("10:20") == TokenSpace(10, 20)
    with pytest.raises(ValueError, match="LO:HI"):
        TokenSpace.parse("10-20")
    with pytest.raises(ValueError, match="lo < hi"):
        TokenSpace(5, 5)
    with pytest.raises(ValueError, match="at least one token"):
        cold_prompt(0, TokenSpace(0, 256))
