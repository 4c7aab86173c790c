"""``engine_harness.handles.parse_arm`` on its own, as a job other than the battery (ablate) calls it."""

from __future__ import annotations

import argparse

import pytest

from engine_harness.handles import EngineOverrides, parse_arm


def test_an_arm_is_an_endpoint_or_typed_engine_settings() -> None:
    assert parse_arm("remote=http://h:8000") == ("remote", "http://h:8000")
    assert parse_arm("bare=engine:") == ("bare", EngineOverrides())
    name, small = parse_arm("small=engine:max_num_seqs=4, prefix_caching=false")
    assert name == "small" and small == EngineOverrides({"max_num_seqs": 4, "prefix_caching": False})
    assert str(small) == "engine: max_num_seqs=4, prefix_caching=False"


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("bare", "--arm wants NAME=URL or NAME=engine:KEY=VALUE,..., got 'bare'"),
        ("x=", "--arm wants NAME=URL or NAME=engine:KEY=VALUE,..., got 'x='"),
        ("x=engine:model=other", "x: unknown engine setting 'model'"),
        ("x=engine:max_num_seqs=-1", "x: max_num_seqs=-1:"),
    ],
)
def test_a_bad_arm_names_what_is_wrong(value: str, message: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError) as err:
        parse_arm(value)
    assert str(err.value).startswith(message)
