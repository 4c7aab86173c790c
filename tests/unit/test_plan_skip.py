"""A worker passes the plan items other workers send without making them (``skip()``, ``share_of``), and
what it does make is exactly what a plain walk of the plan gives at the same places."""

from __future__ import annotations

import itertools
import random
from pathlib import Path
from typing import Any

import pytest

from microbench.client.requests import RequestSpec
from microbench.loadgen.stages import Stage, share_of
from microbench.workloads.generator import Workload
from microbench.workloads.prompts import PromptFactory
from microbench.workloads.schedulers import parse_scheduler
from microbench.workloads.spec import load_workload_spec

# two clients (one with a shared prefix, one multi-turn) at different rates, lengths clipped by the context
SPEC = """
name: skips
seed: 11
aggregate_rate: 200
clients:
  - id: a
    rate_fraction: 0.7
    input_length: {type: uniform, min: 8, max: 300}
    output_length: {type: uniform, min: 1, max: 40}
    prefix: {group: sys, length: {type: fixed, value: 24}, fraction: 0.5, count: 3}
  - id: b
    rate_fraction: 0.3
    input_length: {type: fixed, value: 50}
    output_length: {type: fixed, value: 8}
    multi_turn: {max_rounds: 3, think_time_s: 0.5}
"""


def _workload(tmp_path: Path, salt: int = 3) -> Workload:
    (tmp_path / "w.yaml").write_text(SPEC)
    return Workload(load_workload_spec(tmp_path / "w.yaml"), PromptFactory(salt=salt), max_model_len=256)


def _seen(spec: RequestSpec) -> tuple[Any, ...]:
    """What a request is (its prompt built): everything but the closures, which compare by identity."""
    r = spec.built()
    return (r.prompt, r.prompt_tokens, r.max_tokens, r.client_id, r.prefix_group, r.prefix_tokens,
            r.session_id, r.think_time_s, r.clipped, r.next_turn is None)  # fmt: skip


def test_skipping_any_items_leaves_the_others_as_a_plain_walk_makes_them(tmp_path: Path) -> None:
    walk = [(offset, _seen(spec)) for offset, spec in itertools.islice(_workload(tmp_path).plan(60.0), 900)]
    assert {c[3] for _, c in walk} == {"a", "b"} and any(c[8] for _, c in walk)  # both clients, some clipped
    rng = random.Random(5)
    plan = _workload(tmp_path).plan(60.0)
    for offset, seen in walk:
        if rng.random() < 0.6:
            assert plan.skip() == offset
        else:
            got_offset, spec = next(plan)
            assert (got_offset, _seen(spec)) == (offset, seen)
    requests = [_seen(s) for s in itertools.islice(_workload(tmp_path, salt=4).requests(), 600)]
    mixed = _workload(tmp_path, salt=4).requests()
    for seen in requests:
        if rng.random() < 0.5:
            mixed.skip()
        else:
            assert _seen(next(mixed)) == seen


@pytest.mark.parametrize("n", [1, 2, 3, 8])
def test_the_workers_shares_are_the_plan_once_each_and_nobody_drafts_another_ones(
    tmp_path: Path, n: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    walk = [(offset, _seen(spec)) for offset, spec in itertools.islice(_workload(tmp_path).plan(60.0), 500)]
    drafted = 0
    first_round = Workload._first_round

    def counted(self: Workload, *args: Any) -> RequestSpec:
        nonlocal drafted
        drafted += 1
        return first_round(self, *args)

    monkeypatch.setattr(Workload, "_first_round", counted)
    merged: dict[int, tuple[int, tuple[Any, ...]]] = {}
    first = 7  # items pulled in earlier stages: worker k's items are those whose count is k mod n
    for k in range(n):
        drafted = 0
        workload = _workload(tmp_path)
        items = list(share_of(workload.plan(60.0), k, n, first, limit=500))
        assert [o for o, _ in items] == [o for o, _ in walk]  # every worker sees every item's time
        own = {i: (o, _seen(s)) for i, (o, s) in enumerate(items) if s is not None}
        assert set(own) == {i for i in range(500) if (first + i) % n == k}
        assert drafted == len(own)  # the others' drafts were never made
        assert workload.prompts.item() == 500  # every item's number was taken, none past the limit
        merged |= own
    assert [merged[i] for i in range(500)] == walk


def test_a_plan_that_cannot_skip_is_walked_and_a_scheduled_stage_skips_when_its_requests_can(
    tmp_path: Path,
) -> None:
    plain = iter(list(itertools.islice(_workload(tmp_path).plan(60.0), 40)))
    items = list(share_of(plain, 1, 4, limit=None))
    assert len(items) == 40 and [i for i, (_, s) in enumerate(items) if s is not None] == list(
        range(1, 40, 4)
    )
    scheduler = parse_scheduler({"kind": "poisson", "rate": 50.0, "seed": 2})
    walked = Stage.scheduled("s", scheduler, _workload(tmp_path).requests(), max_requests=60)
    walk = [_seen(s) for _, s in itertools.islice(walked.plan, 60)]
    stage = Stage.scheduled("s", scheduler, _workload(tmp_path).requests(), max_requests=60)
    assert hasattr(stage.plan, "skip")
    own = [(i, _seen(s)) for i, (_, s) in enumerate(share_of(stage.plan, 0, 3, limit=60)) if s is not None]
    assert own == [(i, walk[i]) for i in range(0, 60, 3)]
