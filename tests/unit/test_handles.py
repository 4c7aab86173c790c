"""``engine_harness.handles.parse_arm`` on its own, as a job other than the battery (ablate) calls it."""

from __future__ import annotations

import argparse
import asyncio
from types import SimpleNamespace

import pytest

from engine_harness.engines import EngineSpec, engine_kind
from engine_harness.handles import (
    EngineOverrides,
    LaunchedEngine,
    NotRestartable,
    parse_arm,
    parse_engine_arm,
)


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
        ("x=engine:url=http://h:8000", "x: unknown engine setting 'url'"),
        ("x=engine:kind=sglang", "x: unknown engine setting 'kind' for a restart of this engine"),
        ("x=engine:max_num_seqs=-1", "x: max_num_seqs=-1:"),
    ],
)
def test_a_bad_arm_names_what_is_wrong(value: str, message: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError) as err:
        parse_arm(value)
    assert str(err.value).startswith(message)


def test_an_arm_may_name_another_kind_which_a_restart_refuses() -> None:
    name, sg = parse_engine_arm("sg=engine:kind=sglang,mixed_chunk=true")
    assert name == "sg" and sg == EngineOverrides({"kind": "sglang", "mixed_chunk": True})
    launched = EngineSpec(kind="sim")
    assert sg.identity_changes(launched) == {"kind": "sglang"}
    assert EngineOverrides({"max_num_seqs": 4}).identity_changes(launched) == {}
    process = SimpleNamespace(spec=launched, kind=engine_kind("sim"), version=None)
    engine = LaunchedEngine(process)  # type: ignore[arg-type]
    assert engine.restart_problem(EngineOverrides({"kind": "sim"})) is None  # the launched kind: fine
    problem = engine.restart_problem(sg)
    assert problem is not None and "changes kind to 'sglang'" in problem and "microbench.ablate" in problem
    with pytest.raises(NotRestartable, match="changes kind to 'sglang'"):
        asyncio.run(engine.reconfigure(sg))
