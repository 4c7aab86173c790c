"""5.10's ``--arm``: endpoints and engine-settings configurations, and the clear errors of both."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchcore.cli import BadInput
from engine_harness.handles import EngineOverrides
from microbench.battery.cli import build_parser, main


def _configs(*values: str) -> list[tuple[str, str | EngineOverrides]]:
    argv = ["run"]
    for value in values:
        argv += ["--arm", value]
    configs: list[tuple[str, str | EngineOverrides]] = build_parser().parse_args(argv).arm
    return configs


def _error(value: str, capsys: pytest.CaptureFixture[str]) -> str:
    with pytest.raises(SystemExit) as exc:
        _configs(value)
    assert exc.value.code == 2
    return capsys.readouterr().err


def test_endpoints_and_engine_settings_mix_in_order() -> None:
    configs = _configs(
        "bare=engine:",
        "filtered=http://127.0.0.1:9000/v1",
        "small=engine:max_num_seqs=4, prefix_caching=false,chunk_size=2048,cpu_threads_bind=0-1",
    )
    assert configs == [
        ("bare", EngineOverrides()),
        ("filtered", "http://127.0.0.1:9000/v1"),
        (
            "small",
            EngineOverrides(
                {"max_num_seqs": 4, "prefix_caching": False, "chunk_size": 2048, "cpu_threads_bind": "0-1"}
            ),
        ),
    ]
    assert str(configs[0][1]) == "engine: as launched"
    assert str(configs[2][1]) == (
        "engine: max_num_seqs=4, prefix_caching=False, chunk_size=2048, cpu_threads_bind=0-1"
    )


def test_bad_configurations_fail_at_parse_time(capsys: pytest.CaptureFixture[str]) -> None:
    assert "--arm wants NAME=URL or NAME=engine:KEY=VALUE,..., got 'bare'" in _error("bare", capsys)
    unknown = _error("small=engine:max_seqs=4", capsys)
    assert (
        "argument --arm: small: unknown engine setting 'max_seqs'; "
        "allowed: api_key_env, attention_backend, block_size" in unknown
    )
    assert "max_num_seqs" in unknown
    # the model and the kind are not settings of this engine: another model is another configuration
    assert "unknown engine setting 'model'" in _error("other=engine:model=x", capsys)
    assert "small: max_num_seqs=0: Input should be greater than 0" in _error(
        "small=engine:max_num_seqs=0", capsys
    )
    assert "prefix_caching='maybe': Input should be a valid boolean" in _error(
        "nocache=engine:prefix_caching=maybe", capsys
    )
    assert "'max_num_seqs' is not KEY=VALUE" in _error("small=engine:max_num_seqs", capsys)


def test_engine_settings_need_a_launched_engine(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["run", "--engine", "external", "--url", "http://127.0.0.1:9", "--out", str(tmp_path)]
    assert main([*argv, "--arm", "bare=engine:", "--arm", "small=engine:max_num_seqs=4"]) == 2
    assert "engine-settings configurations need --engine vllm|sim" in capsys.readouterr().err


def test_help_explains_both_forms(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "400")  # one line per option: the example is not broken at its hyphen
    with pytest.raises(SystemExit):
        build_parser().parse_args(["run", "--help"])
    text = capsys.readouterr().out
    assert "NAME=URL, an endpoint" in text
    assert "--arm bare=engine: --arm small-batch=engine:max_num_seqs=4" in text


def test_a_definition_file_sets_the_run_and_flags_override_it(tmp_path: Path) -> None:
    from microbench.battery.cli import _settings

    config = tmp_path / "battery.yaml"
    config.write_text(
        "tests: [ttft, itl]\nprofile: quick\nttft_slo: 500ms\n"
        "arms: {bare: 'engine:', small: 'engine:max_num_seqs=4'}\n"
    )
    s = _settings(build_parser().parse_args(["run", "--config", str(config), "--profile", "conformant"]))
    assert s["tests"] == ["ttft", "itl"] and s["profile"] == "conformant" and s["ttft_slo_ms"] == 500.0
    assert [name for name, _ in s["arms"]] == ["bare", "small"]
    assert s["arms"][1][1] == EngineOverrides({"max_num_seqs": 4})
    config.write_text("tests: [ttft]\nprofil: quick\n")
    with pytest.raises(BadInput, match="profil"):
        _settings(build_parser().parse_args(["run", "--config", str(config)]))
