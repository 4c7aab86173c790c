"""A definition's ``engine:`` settings, typed: a misspelled key or a bad value is an error naming it."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from engine_harness.settings import EngineSettings
from microbench.measure.grid import SweepConfig


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


def test_a_setting_only_some_kinds_read_is_refused_for_another_kind_with_where_it_goes() -> None:
    with pytest.raises(
        ValidationError, match=r"kind 'sim' does not read 'cpu_kvcache_gib' \(a setting of vllm\)"
    ):
        EngineSettings({"kind": "sim", "cpu_kvcache_gib": 2})
    with pytest.raises(ValidationError, match=r"sglang.cpu_kvcache_gib: kind 'sglang' does not read"):
        EngineSettings({"sglang": {"cpu_kvcache_gib": 2}})
    with pytest.raises(ValidationError, match=r"vllm.model: 'model' is read by every kind"):
        EngineSettings({"vllm": {"model": "x"}})


def test_a_kinds_block_applies_only_when_that_kind_runs() -> None:
    settings = {"preset": "cpu", "max_model_len": 16384, "vllm": {"cpu_kvcache_gib": 2}}  # sweeps/smoke.yaml
    vllm = EngineSettings(settings).resolve()
    assert vllm.kind == "vllm" and vllm.cpu_kvcache_gib == 2 and vllm.max_model_len == 16384
    sglang = EngineSettings(settings | {"kind": "sglang"}).resolve()  # --engine sglang: cpu reads sglang-cpu
    assert sglang.kind == "sglang" and sglang.cpu_kvcache_gib is None and sglang.max_model_len == 16384
    mixed = EngineSettings(settings | {"preset": "sglang-cpu-mixed"}).resolve()  # the preset names the kind
    assert mixed.kind == "sglang" and mixed.mixed_chunk and mixed.cpu_kvcache_gib is None
