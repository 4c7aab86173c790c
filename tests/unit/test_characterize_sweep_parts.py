"""The users sweep's pure parts: levels, the level length rule, joint length tables."""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from microbench.characterize.requests import JointLengths, request_source
from microbench.characterize.users import UserSweepPlan, level_duration, user_levels
from microbench.workloads.prompts import PromptFactory


def test_user_levels_double_to_the_maximum() -> None:
    assert user_levels(128) == [1, 2, 4, 8, 16, 32, 64, 128]
    assert user_levels(48) == [1, 2, 4, 8, 16, 32, 48]
    assert user_levels(32, minimum=4) == [4, 8, 16, 32]
    with pytest.raises(ValueError):
        user_levels(0)


def test_level_duration_aims_at_the_minimum_request_count() -> None:
    plan = UserSweepPlan(min_duration_s=30, max_duration_s=120, min_requests=100)
    assert level_duration(plan, 1, None) == 30
    assert level_duration(plan, 4, 0.5) == 30  # 1.2 × 100 × 0.5 / 4 = 15 s < 30
    assert level_duration(plan, 2, 1.0) == pytest.approx(60.0)  # 1.2 × 100 × 1 / 2
    assert level_duration(plan, 1, 10.0) == 120  # capped


def test_joint_lengths_draw_only_observed_pairs_and_keep_their_correlation(tmp_path: Path) -> None:
    rng = np.random.default_rng(1)
    inp = rng.integers(16, 2000, 400)
    out = np.clip(inp // 4 + rng.integers(-20, 20, 400), 1, None)  # strongly correlated
    path = tmp_path / "pairs.csv"
    pd.DataFrame({"input_tokens": inp, "output_tokens": out}).to_csv(path, index=False)
    table = JointLengths.read(path)
    observed = set(zip(inp.tolist(), out.tolist(), strict=True))
    requests = list(itertools.islice(table.requests(7, PromptFactory(salt=3)), 500))
    drawn = [(r.prompt_tokens, r.max_tokens) for r in requests]
    assert set(drawn) <= observed
    d = np.log(np.array(drawn, dtype=float))
    assert np.corrcoef(d[:, 0], d[:, 1])[0, 1] > 0.8 and table.correlation() > 0.8
    # the same seed draws the same lengths; prompts are cold (distinct)
    again = [
        (r.prompt_tokens, r.max_tokens) for r in itertools.islice(table.requests(7, PromptFactory()), 500)
    ]
    assert again == drawn and len({tuple(r.prompt[:16]) for r in requests}) == len(requests)  # type: ignore[index]
    clipped = next(table.requests(7, PromptFactory(), max_model_len=64))
    assert clipped.prompt_tokens + clipped.max_tokens <= 64


def test_joint_lengths_and_workloads_refuse_bad_input(tmp_path: Path) -> None:
    bad = tmp_path / "bad.csv"
    bad.write_text("input,output\n1,2\n")
    with pytest.raises(ValueError, match="columns"):
        JointLengths.read(bad)
    zero = tmp_path / "zero.csv"
    zero.write_text("input_tokens,output_tokens\n0,2\n")
    with pytest.raises(ValueError, match="at least 1"):
        JointLengths.read(zero)
    requests, about = request_source("synthetic-uniform", None, 0, 4096)
    first = next(requests)
    assert about["name"] == "synthetic-uniform" and 128 <= first.prompt_tokens <= 512
