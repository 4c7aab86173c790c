"""The five reference workloads of the IETF draft: lengths, prefix sharing, notes and clipping."""

from __future__ import annotations

import itertools
import json
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from microbench.client.requests import RequestSpec
from microbench.workloads.generator import Workload
from microbench.workloads.prompts import PromptFactory
from microbench.workloads.reference import REFERENCE_SEED, WORKLOADS, reference_workload

N = 6000


def _requests(name: str, n: int = N, **options: object) -> list[RequestSpec]:
    workload = Workload(reference_workload(name, **options), PromptFactory(salt=1))
    return list(itertools.islice(workload.requests(), n))


def test_all_five_are_registered_with_the_reference_seed() -> None:
    assert WORKLOADS.names() == [
        "code-completion", "conversation", "long-context", "synthetic-skewed", "synthetic-uniform",
    ]  # fmt: skip
    assert {reference_workload(name).seed for name in WORKLOADS} == {REFERENCE_SEED}


def test_synthetic_uniform() -> None:
    reqs = _requests("synthetic-uniform")
    inputs = np.array([r.prompt_tokens for r in reqs])
    outputs = np.array([r.max_tokens for r in reqs])
    assert (inputs.min(), inputs.max(), outputs.min(), outputs.max()) == (128, 512, 64, 256)
    assert inputs.mean() == pytest.approx(320, rel=0.02) and outputs.mean() == pytest.approx(160, rel=0.02)
    assert not any(r.prefix_tokens for r in reqs)
    assert all(r.sampling == {"temperature": 0.0} for r in reqs)


def test_synthetic_skewed() -> None:
    reqs = _requests("synthetic-skewed")
    inputs = np.array([r.prompt_tokens for r in reqs])
    outputs = np.array([r.max_tokens for r in reqs])
    assert np.median(inputs) == pytest.approx(245, rel=0.05)  # the draft's ~245
    assert np.median(outputs) == pytest.approx(np.exp(4.5), rel=0.06)
    assert inputs.min() >= 32 and inputs.max() <= 4096 and outputs.min() >= 16 and outputs.max() <= 2048


def test_conversation_stand_in_matches_the_draft_s_percentiles_and_says_so() -> None:
    spec = reference_workload("conversation")
    assert any("STAND-IN" in note for note in spec.notes)
    rng = np.random.default_rng(0)
    client = spec.clients[0]
    assert np.percentile(client.input_length.sample(rng, 400_000), [50, 95, 99]) == pytest.approx(
        [156, 892, 2134], rel=0.02
    )
    assert np.percentile(client.output_length.sample(rng, 400_000), [50, 95, 99]) == pytest.approx(
        [234, 789, 1567], rel=0.02
    )
    reqs = _requests("conversation", 10_000)
    assert np.median([r.prompt_tokens - r.prefix_tokens for r in reqs]) == pytest.approx(156, rel=0.05)
    assert np.median([r.max_tokens for r in reqs]) == pytest.approx(234, rel=0.05)
    assert np.mean([r.prefix_tokens == 200 for r in reqs]) == pytest.approx(0.5, abs=0.02)
    assert len({tuple(r.prompt[:200]) for r in reqs if r.prefix_tokens}) == 1


def test_conversation_from_a_sharegpt_file(tmp_path: Path) -> None:
    data = [
        {"conversations": [{"from": "human", "value": "a" * 10}, {"from": "gpt", "value": "b" * 30}]},
        {"conversations": [{"from": "human", "value": "c" * 50}, {"from": "gpt", "value": "d" * 70}]},
        {"conversations": [{"from": "human", "value": "no answer"}]},
    ]
    path = tmp_path / "sharegpt.json"
    path.write_text(json.dumps(data))
    spec = reference_workload("conversation", sharegpt_path=str(path))
    assert "2 conversations" in spec.notes[0]
    reqs = _requests("conversation", 2000, sharegpt_path=str(path))
    assert {r.prompt_tokens - r.prefix_tokens for r in reqs} == {10, 50}  # byte-level tokenizer
    assert {r.max_tokens for r in reqs} == {30, 70}


def test_code_completion_contexts() -> None:
    reqs = _requests("code-completion", 10_000)
    with_context = [r for r in reqs if r.prefix_tokens]
    assert len(with_context) / len(reqs) == pytest.approx(0.8, abs=0.015)
    groups = Counter(r.prefix_group for r in with_context)
    assert len(groups) == 10
    lengths = {r.prefix_group: r.prefix_tokens for r in with_context}
    assert all(512 <= n <= 1024 for n in lengths.values())
    weights = np.arange(1, 11, dtype=float) ** -1.5
    expected_top = weights[0] / weights.sum()
    assert groups["repository-context/0"] / len(with_context) == pytest.approx(expected_top, abs=0.02)
    by_group = {r.prefix_group: tuple(r.prompt[: r.prefix_tokens]) for r in with_context}
    assert all(tuple(r.prompt[: r.prefix_tokens]) == by_group[r.prefix_group] for r in with_context)
    assert np.median([r.max_tokens for r in reqs]) == pytest.approx(np.exp(4.0), rel=0.08)


def test_long_context_targets_and_clipping_note() -> None:
    reqs = _requests("long-context", 100)
    assert Counter(r.prompt_tokens for r in reqs).keys() == {8192, 16384, 32768, 65536, 131072}
    assert {r.max_tokens for r in reqs} == {256}
    spec = reference_workload("long-context", max_model_len=20000)
    assert any("CLIPPED" in n and "32768, 65536, 131072" in n and "19744" in n for n in spec.notes)
    clipped = _requests("long-context", 100, max_model_len=20000)
    assert {r.prompt_tokens for r in clipped} == {8192, 16384, 19744}
