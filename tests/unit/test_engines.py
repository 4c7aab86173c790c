"""EngineSpec → argv/env for every kind and preset, and clear errors for bad settings."""

import json
import sys

import pytest
from pydantic import ValidationError

from engine_harness.engines import DEFAULT_MODEL, EngineSpec, engine_kind, resolve_spec
from engine_harness.environments import EngineEnvError
from engine_harness.settings import EngineSettings
from engine_harness.sglang_kind import LOGGING_CONFIG, sglang_python


def _flag(argv: list[str], name: str) -> str:
    return argv[argv.index(name) + 1]


def test_cpu_preset_vllm_argv_carries_every_setting() -> None:
    spec = resolve_spec("cpu", chunk_size=2048, log_iteration_details=True, extra_args=["--seed", "7"])
    argv = engine_kind("vllm").argv(spec, 8123)
    assert argv[:3] == [sys.executable, "-m", "vllm.entrypoints.openai.api_server"]
    assert _flag(argv, "--model") == DEFAULT_MODEL
    assert _flag(argv, "--served-model-name") == "qwen3-moe-tiny"
    assert _flag(argv, "--host") == "127.0.0.1"
    assert _flag(argv, "--port") == "8123"
    assert _flag(argv, "--max-num-batched-tokens") == "2048"
    assert _flag(argv, "--load-format") == "dummy"
    assert "--enable-chunked-prefill" in argv and "--enable-prefix-caching" in argv
    assert "--enable-logging-iteration-details" in argv
    assert "--block-size" not in argv  # CPU attention wants multiples of 32: the engine picks
    assert "--compilation-config" not in argv  # torch.compile: the engine's default
    assert argv[-2:] == ["--seed", "7"]
    env = engine_kind("vllm").env(spec)
    assert env["VLLM_CPU_KVCACHE_SPACE"] == "4"


def test_torch_compile_off_runs_vllm_eager_and_is_a_vllm_setting_only() -> None:
    argv = engine_kind("vllm").argv(resolve_spec("cpu", torch_compile=False), 8123)
    assert json.loads(_flag(argv, "--compilation-config")) == {"mode": 0}
    with pytest.raises(ValidationError, match=r"kind 'sglang' does not read 'torch_compile'"):
        EngineSettings({"preset": "sglang-cpu", "torch_compile": False})


@pytest.mark.parametrize("preset", ["h100", "h20"])
def test_gpu_presets_follow_seed_table(preset: str) -> None:
    spec = resolve_spec(preset)
    argv = engine_kind("vllm").argv(spec, 9000)
    assert _flag(argv, "--gpu-memory-utilization") == "0.9"
    assert _flag(argv, "--block-size") == "16"
    assert _flag(argv, "--max-num-batched-tokens") == "8192"
    assert "--enable-prefix-caching" in argv and "--enable-chunked-prefill" in argv
    assert "--load-format" not in argv  # real weights on a GPU


def test_sglang_argv_maps_the_same_settings_to_its_flags() -> None:
    spec = EngineSpec(
        kind="sglang",
        model="Qwen/Qwen3-Coder-30B-A3B-Instruct",
        chunk_size=4096,
        prefix_caching=False,
        enforce_eager=True,
        gpu_memory_utilization=0.85,
        mixed_chunk=True,
    )
    argv = engine_kind("sglang").argv(spec, 30000)
    assert argv[:3] == [sglang_python(spec), "-m", "sglang.launch_server"]
    assert _flag(argv, "--chunked-prefill-size") == "4096"
    assert _flag(argv, "--mem-fraction-static") == "0.85"
    assert {
        "--disable-radix-cache",
        "--disable-cuda-graph",
        "--enable-metrics",
        "--enable-mixed-chunk",
    } <= set(argv)


def test_sim_argv_and_prefix_caching_off() -> None:
    argv = engine_kind("sim").argv(EngineSpec(kind="sim", chunk_size=512, prefix_caching=False), 7000)
    assert argv[:3] == [sys.executable, "-m", "engine_harness.sim"]
    assert _flag(argv, "--max-num-batched-tokens") == "512"
    assert "--no-prefix-caching" in argv


def test_vllm_prefix_caching_off_and_eager() -> None:
    argv = engine_kind("vllm").argv(EngineSpec(prefix_caching=False, enforce_eager=True), 1)
    assert "--no-enable-prefix-caching" in argv and "--enforce-eager" in argv


def test_external_needs_url_and_is_never_launched() -> None:
    with pytest.raises(ValidationError, match="needs url"):
        EngineSpec(kind="external")
    spec = EngineSpec(kind="external", url="http://127.0.0.1:9/", api_key_env="MY_KEY")
    with pytest.raises(RuntimeError, match="not launched"):
        engine_kind("external").argv(spec, 1)
    with pytest.raises(ValidationError, match="only for kind 'external'"):
        EngineSpec(kind="vllm", url="http://127.0.0.1:9")


def test_unknown_kind_preset_and_misspelled_setting_are_clear_errors() -> None:
    with pytest.raises(
        ValueError, match="unknown engine kind 'tgi'; known kinds: external, sglang, sim, vllm"
    ):
        engine_kind("tgi")
    with pytest.raises(ValueError, match="unknown preset 'a100'"):
        resolve_spec("a100")
    with pytest.raises(ValidationError, match="chunk_sise"):
        EngineSpec(chunk_sise=2048)  # type: ignore[call-arg]
    with pytest.raises(ValidationError, match="greater than 0"):
        EngineSpec(chunk_size=0)


def test_missing_engine_package_names_the_setup_command(monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.util

    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    with pytest.raises(RuntimeError, match=r"needs the Python package 'vllm'.*bash scripts/setup.sh"):
        engine_kind("vllm").check_installed()


def test_sglang_missing_from_its_interpreter_names_the_sglang_setup_command() -> None:
    # Asked in the engine's own interpreter (a subprocess), here the suite's, which has no SGLang.
    spec = EngineSpec(kind="sglang", python=sys.executable)
    with pytest.raises(
        EngineEnvError, match=r"not installed for .*SETUP_ENGINE=sglang-cpu bash scripts/setup.sh"
    ):
        engine_kind("sglang").check_installed(spec)


def test_a_missing_engine_interpreter_is_named() -> None:
    spec = EngineSpec(kind="sglang", python="/nonexistent/.venv-sglang/bin/python")
    with pytest.raises(
        EngineEnvError, match=r"interpreter /nonexistent/.venv-sglang/bin/python does not exist"
    ):
        engine_kind("sglang").check_installed(spec)


@pytest.mark.parametrize(("preset", "mixed"), [("sglang-cpu", False), ("sglang-cpu-mixed", True)])
def test_sglang_cpu_presets_carry_the_cpu_recipe(preset: str, mixed: bool) -> None:
    spec = resolve_spec(preset, chunk_size=2048, log_iteration_details=True, python="/x/bin/python")
    kind = engine_kind("sglang")
    argv = kind.argv(spec, 8124)
    assert argv[0] == "/x/bin/python"
    assert _flag(argv, "--device") == "cpu"
    assert _flag(argv, "--attention-backend") == "torch_native"
    assert _flag(argv, "--chunked-prefill-size") == "2048"
    assert _flag(argv, "--max-total-tokens") == "65536"
    assert _flag(argv, "--decode-log-interval") == "1"
    assert {"--disable-overlap-schedule", "--enable-cache-report", "--enable-metrics"} <= set(argv)
    assert ("--enable-mixed-chunk" in argv) is mixed
    assert kind.scheduling(spec) == ("mixed" if mixed else "exclusive")
    env = kind.env(spec)
    assert env["SGLANG_USE_CPU_ENGINE"] == "1"
    assert env["SGLANG_LOGGING_CONFIG_PATH"] == str(LOGGING_CONFIG) and LOGGING_CONFIG.is_file()


def test_scheduling_of_each_kind() -> None:
    assert engine_kind("vllm").scheduling(EngineSpec()) == "mixed"
    sim = engine_kind("sim")
    assert sim.scheduling(EngineSpec(kind="sim", extra_args=["--mode", "sglang"])) == "exclusive"
    assert sim.scheduling(EngineSpec(kind="sim", mixed_chunk=True)) == "mixed"


def test_an_api_key_goes_to_a_launched_engine_by_its_environment_never_its_argv(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from engine_harness.environments import EngineEnvError, engine_env

    monkeypatch.setenv("MY_KEY", "sk-unit-5e1f")
    spec = resolve_spec("cpu", api_key_env="MY_KEY")
    argv = engine_kind("vllm").argv(spec, 8123)
    assert not any("sk-unit-5e1f" in a or a.startswith("--api-key") for a in argv)
    env = engine_env(engine_kind("vllm"), spec, sys.executable)
    assert env["VLLM_API_KEY"] == "sk-unit-5e1f" and "MY_KEY" not in env
    sim = EngineSpec(kind="sim", model="sim", api_key_env="MY_KEY")
    assert engine_env(engine_kind("sim"), sim, sys.executable)["SIM_API_KEY"] == "sk-unit-5e1f"
    monkeypatch.delenv("MY_KEY")
    with pytest.raises(EngineEnvError, match="MY_KEY: that variable is not set"):
        engine_env(engine_kind("vllm"), spec, sys.executable)
    # a key on the command line would be echoed into the engine's log: refused, with the way out
    for extra in (["--api-key", "sk-x"], ["--api-key=sk-x"]):
        with pytest.raises(ValidationError, match="--api-key-env VAR"):
            resolve_spec("cpu", extra_args=extra)
    # SGLang takes its key only on its command line: refused for a launched SGLang
    with pytest.raises(ValidationError, match="only on its command line"):
        EngineSpec(kind="sglang", api_key_env="MY_KEY")
