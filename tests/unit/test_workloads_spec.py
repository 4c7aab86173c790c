"""Workload specs: strict YAML, and the generator's requests and plans following the spec."""

from __future__ import annotations

import itertools
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from microbench.client.prompts import TokenSpace
from microbench.client.requests import RequestSpec
from microbench.client.streams import StreamRecord
from microbench.workloads.generator import Workload
from microbench.workloads.prompts import BLOCK_TOKENS, PromptFactory
from microbench.workloads.spec import WorkloadSpec, WorkloadSpecError, load_workload_spec

MIX = """
name: mix
seed: 11
aggregate_rate: 200
clients:
  - id: chat
    rate_fraction: 3
    arrival: {process: gamma, cv: 2.0}
    input_length: {type: lognormal, mu: 4.0, sigma: 0.5, floor: 8, cap: 512}
    output_length: {type: exponential, mean: 20, cap: 64}
    prefix: {group: sys, length: {type: fixed, value: 32}, fraction: 0.5}
  - id: batch
    rate_fraction: 1
    streaming: false
    arrival: {process: poisson}
    input_length: {type: uniform, min: 16, max: 32}
    output_length: {type: fixed, value: 4}
    windows: [{start_s: 0, end_s: 5}, {start_s: 10, end_s: 15}]
"""


def _spec(text: str, tmp_path: Path) -> WorkloadSpec:
    path = tmp_path / "w.yaml"
    path.write_text(text)
    return load_workload_spec(path)


def _take(workload: Workload, n: int) -> list[RequestSpec]:
    return [draft.built() for draft in itertools.islice(workload.requests(), n)]


def test_clients_mix_by_rate_fraction_and_follow_their_lengths(tmp_path: Path) -> None:
    requests = _take(Workload(_spec(MIX, tmp_path), PromptFactory(salt=1)), 8000)
    by_client = Counter(r.client_id for r in requests)
    assert by_client["chat"] / len(requests) == pytest.approx(0.75, abs=0.02)
    chat = [r for r in requests if r.client_id == "chat"]
    batch = [r for r in requests if r.client_id == "batch"]
    own = np.array([r.prompt_tokens - r.prefix_tokens for r in chat])
    assert np.median(own) == pytest.approx(np.exp(4.0), rel=0.05)
    assert np.mean([r.prefix_tokens == 32 for r in chat]) == pytest.approx(0.5, abs=0.03)
    assert {r.prefix_group for r in chat} == {"", "sys/0"}
    assert all(16 <= r.prompt_tokens <= 32 and r.max_tokens == 4 and not r.streaming for r in batch)
    assert all(len(r.prompt) == r.prompt_tokens for r in requests)
    assert all(r.sampling == {"temperature": 0.0} for r in requests)


def test_prefix_group_repeats_its_prefix_and_cold_parts_never_share_a_block(tmp_path: Path) -> None:
    requests = _take(Workload(_spec(MIX, tmp_path), PromptFactory(salt=2)), 2000)
    prefixed = [r for r in requests if r.prefix_tokens]
    assert len({tuple(r.prompt[:32]) for r in prefixed}) == 1
    cold_blocks = [tuple(r.prompt[r.prefix_tokens : r.prefix_tokens + BLOCK_TOKENS]) for r in requests]
    assert len(set(cold_blocks)) == len(cold_blocks)
    assert all(0 <= t < 256 for r in requests for t in r.prompt)


def test_each_group_and_index_has_its_own_prefix_whatever_the_names_length() -> None:
    """Two groups' i-th prefixes share no first block: short names (the key once read only bytes 25-32 of
    the name, 0 for all of these) and long ones that differ only past byte 32."""
    factory = PromptFactory(salt=7)
    names = ["system", "corpus", "g", "long-context-question", "x" * 40 + "a", "x" * 40 + "b"]
    firsts = {(n, i): tuple(factory.shared(n, i, 64)[:BLOCK_TOKENS]) for n in names for i in range(3)}
    assert len(set(firsts.values())) == len(firsts)
    assert factory.shared("system", 1, 64) == PromptFactory(salt=7).shared("system", 1, 200)[:64]


def test_token_space_is_respected() -> None:
    factory = PromptFactory(TokenSpace(1000, 1100), salt=3)
    ids = factory.cold(5000) + factory.shared("g", 0, 500)
    assert min(ids) >= 1000 and max(ids) < 1100
    with pytest.raises(ValueError, match="too small"):
        PromptFactory(TokenSpace(0, 8))


def test_same_seed_and_salt_reproduce_requests_a_new_salt_changes_only_ids(tmp_path: Path) -> None:
    spec = _spec(MIX, tmp_path)
    a = _take(Workload(spec, PromptFactory(salt=5)), 300)
    b = _take(Workload(spec, PromptFactory(salt=5)), 300)
    c = _take(Workload(spec, PromptFactory()), 300)
    assert [(r.prompt, r.max_tokens, r.client_id) for r in a] == [
        (r.prompt, r.max_tokens, r.client_id) for r in b
    ]
    assert [(r.prompt_tokens, r.max_tokens, r.client_id) for r in a] == [
        (r.prompt_tokens, r.max_tokens, r.client_id) for r in c
    ]
    assert all(x.prompt != y.prompt for x, y in zip(a, c, strict=True))


def test_plan_follows_rates_and_windows(tmp_path: Path) -> None:
    workload = Workload(_spec(MIX, tmp_path), PromptFactory(salt=1))
    plan = list(workload.plan(duration_s=20.0))
    times = np.array([t for t, _ in plan]) / 1e9
    assert np.all(np.diff(times) >= 0) and times.max() < 20
    chat = times[[r.client_id == "chat" for _, r in plan]]
    batch = times[[r.client_id == "batch" for _, r in plan]]
    assert len(chat) / 20 == pytest.approx(150, rel=0.1)  # 3/4 of 200 req/s (gamma cv 2: wider spread)
    assert len(batch) / 10 == pytest.approx(50, rel=0.1)  # 1/4 of 200 req/s, active 10 of 20 s
    assert not np.any((batch >= 5) & (batch < 10)) and not np.any(batch >= 15)


def test_max_model_len_clips_and_counts(tmp_path: Path) -> None:
    workload = Workload(_spec(MIX, tmp_path), PromptFactory(salt=1), max_model_len=64)
    requests = _take(workload, 500)
    assert all(r.prompt_tokens + r.max_tokens <= 64 for r in requests)
    assert any(r.clipped for r in requests) and not all(r.clipped for r in requests)
    assert all(r.prompt_tokens + r.max_tokens == 64 for r in requests if r.clipped)


MULTI = """
name: chat-sessions
seed: 1
clients:
  - id: user
    input_length: {type: fixed, value: 20}
    output_length: {type: fixed, value: 5}
    prefix: {group: sys, length: {type: fixed, value: 16}}
    multi_turn: {max_rounds: 3, think_time_s: 0.25, context_growth: accumulate}
"""


def test_multi_turn_accumulates_context_from_the_server_s_answer(tmp_path: Path) -> None:
    first = next(Workload(_spec(MULTI, tmp_path), PromptFactory(salt=1)).requests()).built()
    assert first.session_id == "user-0" and first.round_index == 0 and first.think_time_s == 0.25
    assert first.next_turn is not None
    answer = StreamRecord(chunk_t_ns=[1, 2], chunk_tokens=[3, 4])  # the server reported 7 tokens
    second = first.next_turn(first, answer)
    assert second is not None and second.round_index == 1
    assert second.prompt[: first.prompt_tokens] == first.prompt
    assert second.prompt_tokens == 36 + 7 + 20
    third = second.next_turn(second, answer) if second.next_turn else None
    assert third is not None and third.round_index == 2
    assert third.next_turn is not None and third.next_turn(third, answer) is None  # 3 rounds in all


def test_fixed_context_growth_keeps_only_the_prefix(tmp_path: Path) -> None:
    spec = _spec(MULTI.replace("accumulate", "fixed"), tmp_path)
    first = next(Workload(spec, PromptFactory(salt=1)).requests()).built()
    assert first.next_turn is not None
    second = first.next_turn(first, StreamRecord(chunk_t_ns=[1], chunk_tokens=[5]))
    assert second is not None and second.prompt_tokens == 36
    assert second.prompt[:16] == first.prompt[:16] and second.prompt[16:] != first.prompt[16:]


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (
            ("mu: 4.0", "mu: .nan"),
            "clients.0.input_length: length distribution 'lognormal': mu: Input should be a finite",
        ),
        (
            ("mean: 20", "mean: -20"),
            "clients.0.output_length: length distribution 'exponential': mean: Input should be",
        ),
        (
            ("rate_fraction: 3", "rate_fraction: 3\n    colour: red"),
            "clients.0.colour: Extra inputs are not permitted",
        ),
        (
            ("rate_fraction: 1", "rate_fraction: -1"),
            "clients.1.rate_fraction: Input should be greater than 0",
        ),
        (("process: poisson", "process: concurrency"), "process 'concurrency' is not one of"),
        (("end_s: 5}", "end_s: 12}"), "windows must be in order and must not overlap"),
        (("seed: 11", "seed: 11\nseed: 12"), "duplicate key 'seed'"),
        (("id: batch", "id: chat"), "client ids must be unique: chat"),
        (("aggregate_rate: 200", "aggregate_rate: .inf"), "aggregate_rate: Input should be a finite number"),
    ],
)
def test_invalid_yaml_names_file_and_field(tmp_path: Path, edit: tuple[str, str], message: str) -> None:
    assert edit[0] in MIX
    with pytest.raises(WorkloadSpecError) as info:
        _spec(MIX.replace(edit[0], edit[1], 1), tmp_path)
    assert str(info.value).startswith(str(tmp_path / "w.yaml"))
    assert message in str(info.value)


PAIRED = """
name: pairs
seed: 5
clients:
  - id: sharegpt
    paired_lengths: true
    input_length: {type: empirical, values: [10, 200, 40], weights: [1, 1, 2]}
    output_length: {type: empirical, values: [300, 5, 40], weights: [1, 1, 2]}
"""


def test_paired_lengths_keep_each_observed_pair_together(tmp_path: Path) -> None:
    requests = _take(Workload(_spec(PAIRED, tmp_path), PromptFactory(salt=1)), 2000)
    pairs = Counter((r.prompt_tokens, r.max_tokens) for r in requests)
    assert set(pairs) == {(10, 300), (200, 5), (40, 40)}  # drawn independently, 9 pairs would appear
    assert pairs[(40, 40)] / len(requests) == pytest.approx(0.5, abs=0.04)  # the pairs' weights


@pytest.mark.parametrize(
    ("client", "message"),
    [
        ("input_length: {type: fixed, value: 8}\n    output_length: {type: empirical, values: [1]}",
         "of type empirical with values"),
        ("input_length: {type: empirical, values: [1, 2]}\n    output_length: {type: empirical, values: [3]}",
         "values of one length"),
    ],
)  # fmt: skip
def test_paired_lengths_need_two_empirical_lists_of_one_length(
    tmp_path: Path, client: str, message: str
) -> None:
    text = f"name: bad\nseed: 1\nclients:\n  - id: c\n    paired_lengths: true\n    {client}\n"
    with pytest.raises(WorkloadSpecError, match=message):
        _spec(text, tmp_path)
