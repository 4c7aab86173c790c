"""A definition's ``engine:`` settings, typed: a misspelled key or a bad value is an error naming it."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from engine_harness.settings import EngineSettings
from microbench.sweep.config import SweepConfig


def test_a_misspelled_key_is_named_with_the_setting_it_looks_like() -> None:
    with pytest.raises(
        ValidationError, match=r"'chunk_sise' is not an engine setting \(did you mean 'chunk_size'\?\)"
    ):
        SweepConfig(engine=EngineSettings({"kind": "sim", "chunk_sise": 512}))
    with pytest.raises(ValidationError, match="unknown preset 'h300'"):
        EngineSettings({"preset": "h300"})
    with pytest.raises(ValidationError, match="max_num_seqs: Input should be greater than 0"):
        EngineSettings({"kind": "sim", "max_num_seqs": 0})


def test_settings_resolve_once_to_the_spec_and_are_stored_as_written() -> None:
    sweep = SweepConfig.model_validate({"chunks": [512, 1024], "engine": {"kind": "sim", "max_num_seqs": 8}})
    spec = sweep.engine_spec(1024)
    assert spec.kind == "sim" and spec.max_num_seqs == 8 and spec.chunk_size == 1024
    assert sweep.model_dump(mode="json")["engine"] == {"kind": "sim", "max_num_seqs": 8}
    cpu = SweepConfig().engine.resolve()
    assert cpu.kind == "vllm" and cpu.load_format == "dummy"  # the default: the cpu preset
