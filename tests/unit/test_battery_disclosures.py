"""Disclosures: measured for a launched engine, stated or "not stated" for another; verdicts count them."""

from pathlib import Path
from typing import Any

import pytest
import yaml

from engine_harness.engines import DEFAULT_MODEL
from engine_harness.handles import ExternalEngine
from engine_harness.telemetry import NvmlSource
from microbench.battery.cli import main
from microbench.battery.compliance import must, verdict
from microbench.battery.context import BatteryContext
from microbench.battery.disclosures import (
    disclosure_requirements,
    measure_disclosures,
    tokenizer_card,
    workload_stand_ins,
)
from microbench.battery.profiles import profile


class _Launched(ExternalEngine):
    kind = "sim"


def _ctx(engine: Any, **kw: Any) -> BatteryContext:
    return BatteryContext(engine=engine, model="sim", profile=profile("quick"), **kw)


def _unmet(ctx: BatteryContext) -> list[str]:
    return [r.ref for r in disclosure_requirements(measure_disclosures(ctx)) if not r.met]


def test_a_launched_engine_s_boundary_guardrails_and_gpus_are_measured(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(NvmlSource, "gpu_names", staticmethod(lambda: ["NVIDIA H100 80GB HBM3"]))
    ctx = _ctx(_Launched("http://127.0.0.1:9"), prompt_disclosure={"tokenizer": DEFAULT_MODEL, "salt": "7"})
    d = measure_disclosures(ctx)
    assert (d.sut_boundary, d.sut_boundary_source, d.guardrails_source) == (
        "Model Engine",
        "measured",
        "measured",
    )
    assert d.accelerators == ["NVIDIA H100 80GB HBM3"] and d.workload_seed == 42
    assert d.tokenizer["vocab_size"] == 259 and d.tokenizer["name"] == "qwen3-moe-tiny"
    assert _unmet(ctx) == []
    refs = {r.ref: r.detail for r in disclosure_requirements(d)}
    assert list(refs) == ["4.1", "4.8.1", "C.1", "4.3.3", "4.4.1", "4.4.2", "4.4.3"]
    assert refs["4.3.3"] == "workload seed 42, arrival seed 0, prompt salt 7"
    assert refs["4.4.2"].startswith("Option A, native tokenizer") and "EOS ignored" in refs["4.4.3"]
    reqs = [*disclosure_requirements(d), must("5.1", "a test's own", True)]
    assert verdict(reqs) == "unconditionally compliant"


def test_an_external_engine_not_described_is_not_compliant_until_stated() -> None:
    ctx = _ctx(ExternalEngine("http://127.0.0.1:9"))
    assert _unmet(ctx) == ["4.1", "4.8.1", "C.1", "4.4.1"]
    assert verdict(disclosure_requirements(measure_disclosures(ctx))) == "not compliant"
    stated = _ctx(
        ExternalEngine("http://127.0.0.1:9"),
        sut_boundary="Gateway",
        guardrails="input filter: Llama Guard 3",
        accelerators=2,
        prompt_disclosure={"tokenizer": DEFAULT_MODEL},
    )
    d = measure_disclosures(stated)
    assert (d.sut_boundary, d.sut_boundary_source, d.accelerators_source) == ("Gateway", "stated", "stated")
    assert _unmet(stated) == []


def test_a_stand_in_workload_makes_a_test_conditional_and_names_it() -> None:
    reqs = workload_stand_ins(_ctx(ExternalEngine("http://x"), workload_name="conversation"))
    assert [(r.ref, r.level) for r in reqs] == [("4.3.2", "SHOULD")] and "conversation" in reqs[0].text
    assert "STAND-IN" in reqs[0].detail and verdict(reqs) == "conditionally compliant"
    assert workload_stand_ins(_ctx(ExternalEngine("http://x"))) == []  # synthetic-uniform is the draft's own


def test_a_sharegpt_file_replaces_the_conversation_stand_in(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "sharegpt.json"
    path.write_text('[{"conversations": [{"from": "human", "value": "hi"}, {"from": "gpt", "value": "yo"}]}]')
    ctx = _ctx(ExternalEngine("http://x"), workload_name="conversation", sharegpt_path=str(path))
    assert workload_stand_ins(ctx) == [] and "ShareGPT file" in ctx.workload_spec().notes[0]
    assert ctx.workload_spec("code-completion").name == "code-completion"  # other workloads never read it
    assert main(["run", "--sharegpt", str(path), "--out", str(tmp_path / "out")]) == 2
    assert "only the conversation workload reads it, not 'synthetic-uniform'" in capsys.readouterr().err


def test_no_tokenizer_file_gives_no_card(tmp_path: Path) -> None:
    assert tokenizer_card(None) == {} and tokenizer_card(str(tmp_path)) == {}


def test_the_battery_refuses_spec_fields_it_would_ignore(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    spec = {
        "name": "timed",
        "seed": 1,
        "clients": [
            {"id": "a", "arrival": {"process": "gamma", "cv": 2.0}, "windows": [{"start_s": 0, "end_s": 5}],
             "input_length": {"type": "fixed", "value": 8}, "output_length": {"type": "fixed", "value": 2}},
        ],
    }  # fmt: skip
    (tmp_path / "spec.yaml").write_text(yaml.safe_dump(spec))
    argv = ["run", "--workload", str(tmp_path / "spec.yaml"), "--out", str(tmp_path / "out")]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "clients[a].arrival, clients[a].windows would be ignored" in err and "microbench.loadgen" in err
    assert main(["run", "--sut-boundary", "Router", "--out", str(tmp_path / "out2")]) == 2
    assert "--sut-boundary must be one of Model Engine, Gateway, Compound" in capsys.readouterr().err
