"""Cold prompts counted, not drawn in turn: a request's prompt is a function of the factory's salt, the
request's number and the part, so drafts build the same prompts in any order and in any process, and a
worker can skip the requests it does not send for the price of their lengths."""

from __future__ import annotations

import itertools
import random
from pathlib import Path

import pytest

from microbench.client.prompts import TokenSpace
from microbench.client.requests import ApiSettings, RequestSpec, build_payload
from microbench.workloads.generator import Workload
from microbench.workloads.prompts import BLOCK_TOKENS, PromptFactory, item_counts, raise_item_counts
from microbench.workloads.spec import load_workload_spec

SPEC = """
name: drafts
seed: 3
aggregate_rate: 100
clients:
  - id: a
    input_length: {type: uniform, min: 8, max: 300}
    output_length: {type: fixed, value: 4}
    prefix: {group: sys, length: {type: fixed, value: 24}, fraction: 0.5}
"""


def test_a_cold_part_is_the_same_whoever_asks_and_in_whatever_order() -> None:
    a, b = PromptFactory(salt=4), PromptFactory(salt=4)
    in_turn = [a.cold(40) for _ in range(6)]  # requests 0..5, numbered as they are drawn
    assert [b.cold(40, item=i) for i in reversed(range(6))] == in_turn[::-1]
    assert a.item() == 6 and b.item() == 0  # b was asked by number: it numbered nothing
    assert a.cold(40, item=2, part=0) == in_turn[2] and a.cold(40, item=2, part=1) != in_turn[2]
    assert a.cold(10, item=2) == in_turn[2][:10]  # a prefix of the same part
    assert PromptFactory(salt=5).cold(40, item=0) != in_turn[0]
    with pytest.raises(ValueError, match="out of range"):
        a.cold(8, item=0, part=1 << 20)


@pytest.mark.parametrize("space", [TokenSpace(0, 16), TokenSpace(0, 256), TokenSpace(1000, 1094)])
def test_no_two_numbers_or_parts_share_a_first_block(space: TokenSpace) -> None:
    """The first ids spell a one-to-one mix of (number, part) in base |space|: with 16 ids a first block
    is exactly those 64 bits, so a repeat would be a collision of the mix, which has none."""
    factory = PromptFactory(space, salt=8)
    keys = [(item, part) for item in range(4000) for part in (0, 1, 2)]
    blocks = {tuple(factory.cold(BLOCK_TOKENS + 4, item, part)[:BLOCK_TOKENS]) for item, part in keys}
    assert len(blocks) == len(keys)
    ids = factory.cold(5000, item=1)
    assert min(ids) >= space.lo and max(ids) < space.hi and len(ids) == 5000
    assert len(set(ids)) == space.hi - space.lo  # the stream covers the space


def test_drafts_build_the_same_prompts_in_any_order(tmp_path: Path) -> None:
    (tmp_path / "w.yaml").write_text(SPEC)
    spec = load_workload_spec(tmp_path / "w.yaml")
    drafts = list(itertools.islice(Workload(spec, PromptFactory(salt=2)).requests(), 300))
    assert all(d.prompt == [] and d.build_prompt is not None for d in drafts)
    in_turn = [d.built() for d in drafts]
    shuffled = list(enumerate(itertools.islice(Workload(spec, PromptFactory(salt=2)).requests(), 300)))
    random.Random(1).shuffle(shuffled)
    by_index = {i: d.built() for i, d in shuffled}
    assert [by_index[i] for i in range(300)] == in_turn
    assert all(
        len(r.prompt) == r.prompt_tokens == d.prompt_tokens for r, d in zip(in_turn, drafts, strict=True)
    )
    assert all(r.built() is r and r.build_prompt is None for r in in_turn)
    cold = [tuple(r.prompt[r.prefix_tokens : r.prefix_tokens + BLOCK_TOKENS]) for r in in_turn]
    assert len(set(cold)) == 300
    with pytest.raises(ValueError, match="draft"):
        build_payload(drafts[0], ApiSettings(model="m"))
    assert build_payload(in_turn[0], ApiSettings(model="m"))["prompt"] == in_turn[0].prompt


def test_a_parent_takes_over_the_numbers_its_workers_drew() -> None:
    factory = PromptFactory(salt=6)
    factory.cold(8)
    counts = item_counts()
    assert counts[id(factory)] == 1
    raise_item_counts({id(factory): 40})
    assert factory.item() == 40
    raise_item_counts({id(factory): 3})  # a count only rises
    assert factory.item() == 41


def test_a_draft_built_twice_is_built_from_its_number_each_time() -> None:
    factory = PromptFactory(salt=9)
    item = factory.item()
    draft = RequestSpec([], 30, 2, build_prompt=lambda: (factory.cold(30, item), 30))
    assert draft.built().prompt == draft.built().prompt == factory.cold(30, item)
