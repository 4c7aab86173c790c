"""The telemetry sampler on a fake source, NVML through a stand-in of pynvml, and psutil on this machine."""

import importlib.util
import inspect
import os
import sys
import time
from pathlib import Path

import pandas as pd
import pytest

from engine_harness.telemetry import (
    Failure,
    NvmlSource,
    PsutilSource,
    Reading,
    TelemetrySampler,
    engine_visible_devices,
    errors_path,
)

_spec = importlib.util.spec_from_file_location(
    "fake_pynvml", Path(__file__).parent.parent / "fixtures" / "fake_pynvml.py"
)
fake_pynvml = importlib.util.module_from_spec(_spec)
sys.modules["fake_pynvml"] = fake_pynvml  # dataclasses look their module up by name
_spec.loader.exec_module(fake_pynvml)
FakeGpu, FakeNvml = fake_pynvml.FakeGpu, fake_pynvml.FakeNvml
METRICS = {
    "sm_clock_mhz",
    "mem_clock_mhz",
    "gpu_util_pct",
    "mem_util_pct",
    "mem_used_bytes",
    "power_w",
    "energy_j",
}


class CountingSource:
    name = "fake"

    def __init__(self, fail_on: int | None = None) -> None:
        self.calls = 0
        self.closed = False
        self.fail_on = fail_on

    def read(self) -> list[Reading]:
        self.calls += 1
        if self.calls == self.fail_on:
            raise OSError("sensor unavailable")
        return [Reading("dev0", "calls", self.calls), Reading("dev0", "const", 7.0)]

    def close(self) -> None:
        self.closed = True


def test_sampler_rows_are_tidy_monotonic_and_on_the_client_clock() -> None:
    src = CountingSource()
    t0 = time.perf_counter_ns()
    with TelemetrySampler(src, interval_s=0.01) as sampler:
        time.sleep(0.2)
    t1 = time.perf_counter_ns()
    df = sampler.to_frame()
    assert list(df.columns) == ["t_ns", "source", "device", "metric", "value"]
    calls = df[df.metric == "calls"]
    assert len(calls) >= 5  # 20 intervals fit; a loaded CI box still fits a quarter of them
    assert calls.t_ns.is_monotonic_increasing and calls.t_ns.between(t0, t1).all()
    assert calls.value.tolist() == list(range(1, len(calls) + 1))
    assert set(df.source) == {"fake"} and src.closed


def test_failed_reads_are_recorded_not_turned_into_zeros(tmp_path) -> None:
    src = CountingSource(fail_on=2)
    with TelemetrySampler(src, interval_s=0.01) as sampler:
        time.sleep(0.1)
    assert [e[1:] for e in sampler.errors] == [("fake", "*", "*", "OSError: sensor unavailable")]
    df = sampler.to_frame()
    assert 2 not in df[df.metric == "calls"].value.tolist()
    path = sampler.write_parquet(tmp_path / "telemetry" / "t.parquet")
    assert pd.read_parquet(path).equals(df)
    errors = pd.read_csv(errors_path(path))
    assert errors_path(path).name == "t.errors.csv"
    assert errors.error.tolist() == ["OSError: sensor unavailable"] and errors.t_ns.tolist() == [
        sampler.errors[0][0]
    ]


def test_no_errors_still_writes_the_errors_file_with_its_header(tmp_path) -> None:
    with TelemetrySampler(CountingSource(), interval_s=0.01) as sampler:
        time.sleep(0.03)
    path = sampler.write_parquet(tmp_path / "512.parquet")
    assert errors_path(path).read_text().strip() == "t_ns,source,device,metric,error"


def test_psutil_source_reads_cpus_and_process_rss() -> None:
    src = PsutilSource(lambda: [os.getpid()])
    readings = src.read()
    cpus = [r for r in readings if r.metric == "cpu_util_pct"]
    assert len(cpus) == os.cpu_count()
    assert all(0 <= r.value <= 100 for r in cpus)
    rss = next(r.value for r in readings if r.metric == "rss_bytes")
    assert rss > 10 * 2**20  # this Python process with pandas loaded


def test_interval_must_be_positive() -> None:
    with pytest.raises(ValueError, match="interval must be > 0"):
        TelemetrySampler(CountingSource(), interval_s=0)


# --- NVML through the stand-in --------------------------------------------------------------------------


def _two_gpus(**faults) -> FakeNvml:
    # NVML index 0 sits on the higher bus: CUDA ordinal 0 (PCI bus order) is NVML index 1.
    return FakeNvml([FakeGpu("GPU-aaaa-0001", bus=0x81, **faults), FakeGpu("GPU-bbbb-0002", bus=0x1B)])


def _split(items):
    readings = [r for r in items if isinstance(r, Reading)]
    return readings, [f for f in items if isinstance(f, Failure)]


def test_every_gpu_and_metric_when_nothing_is_refused() -> None:
    src = NvmlSource(None, nvml=_two_gpus())
    readings, failures = _split(src.read())
    assert not failures and src.devices == ["gpu1", "gpu0"]  # PCI bus order
    assert {(r.device, r.metric) for r in readings} == {(d, m) for d in ("gpu0", "gpu1") for m in METRICS}
    power = {r.value for r in readings if r.metric == "power_w"}
    assert all(350 < p < 351 for p in power)  # mW → W
    src.close()
    assert src._nvml.initialised == 0


@pytest.mark.parametrize(
    ("visible", "devices", "problem"),
    [
        ("0", ["gpu1"], None),  # ordinal 0 = lowest PCI bus
        ("1,0", ["gpu0", "gpu1"], None),
        ("GPU-aaaa", ["gpu0"], None),  # a unique UUID prefix
        ("", [], None),  # no GPU for the engine
        ("GPU-", [], "'GPU-' names no device"),  # ambiguous prefix
        ("0,7,1", ["gpu1"], "'7' names no device NVML sees (2 GPUs): CUDA ignores it and the entries after"),
        ("1, 1", ["gpu0"], "'1' repeats an earlier one"),
        ("MIG-nope", [], "'MIG-nope' names no device"),
    ],
)
def test_only_the_engines_gpus_are_sampled(visible: str, devices: list[str], problem: str | None) -> None:
    src = NvmlSource(visible, nvml=_two_gpus())
    assert src.devices == devices
    readings, failures = _split(src.read())
    assert {r.device for r in readings} == set(devices)
    assert [f.metric for f in failures] == (["CUDA_VISIBLE_DEVICES"] if problem else [])
    if problem:
        assert problem in failures[0].error
    assert not _split(src.read())[1]  # a problem of the variable is reported once


def test_a_mig_instance_without_utilisation_keeps_its_other_readings() -> None:
    mig = FakeGpu(
        "MIG-1234",
        bus=0x1B,
        mig_of="GPU-bbbb-0002",
        refuse={"nvmlDeviceGetUtilizationRates": fake_pynvml.NVML_ERROR_NOT_SUPPORTED},
    )
    nvml = _two_gpus()
    nvml.gpus.append(mig)
    src = NvmlSource("MIG-1234", nvml=nvml)
    readings, failures = _split(src.read())
    assert src.devices == ["MIG-1234"]
    assert {r.metric for r in readings} == METRICS - {"gpu_util_pct", "mem_util_pct"}
    assert [(f.metric, f.error) for f in failures] == [
        (m, "NVMLError_NotSupported: Not Supported; metric no longer asked")
        for m in ("gpu_util_pct", "mem_util_pct")
    ]
    readings, failures = _split(src.read())  # refused for good: not asked, not reported again
    assert not failures and len(readings) == 5


def test_no_permission_drops_the_one_metric() -> None:
    code = fake_pynvml.NVML_ERROR_NO_PERMISSION
    src = NvmlSource("0,1", nvml=_two_gpus(refuse={"nvmlDeviceGetTotalEnergyConsumption": code}))
    readings, failures = _split(src.read())
    assert [(f.device, f.metric) for f in failures] == [("gpu0", "energy_j")]
    assert "NVMLError_NoPermission" in failures[0].error
    assert {(r.device, r.metric) for r in readings} == {(d, m) for d in ("gpu0", "gpu1") for m in METRICS} - {
        ("gpu0", "energy_j")
    }


def test_a_gpu_lost_mid_run_is_reported_once_and_the_others_go_on() -> None:
    # gpu0 answers its start-up call (PCI) and 10 more: one full sample of 7, then 3 of the next.
    src = NvmlSource(None, nvml=_two_gpus(lost_after=11))
    first, lost, after = (_split(src.read()) for _ in range(3))
    assert not first[1] and {r.device for r in first[0]} == {"gpu0", "gpu1"}
    assert [(f.device, f.metric) for f in lost[1]] == [("gpu0", "mem_util_pct")]
    assert lost[1][0].error == "NVMLError_GpuIsLost: GPU is lost; device no longer sampled"
    assert [r.metric for r in lost[0] if r.device == "gpu0"] == [
        "sm_clock_mhz",
        "mem_clock_mhz",
        "gpu_util_pct",
    ]
    assert len([r for r in lost[0] if r.device == "gpu1"]) == 7
    assert not after[1] and {r.device for r in after[0]} == {"gpu1"} and src.devices == ["gpu1"]


def test_a_passing_nvml_error_is_reported_each_time_and_the_metric_kept() -> None:
    gpu = FakeGpu("GPU-aaaa-0001", bus=1, refuse={"nvmlDeviceGetPowerUsage": fake_pynvml.NVML_ERROR_UNKNOWN})
    src = NvmlSource(None, nvml=FakeNvml([gpu]))
    for _ in range(2):
        readings, failures = _split(src.read())
        assert [f.error for f in failures] == ["NVMLError_Unknown: Unknown Error"] and len(readings) == 6
    gpu.refuse.clear()
    assert any(r.metric == "power_w" for r in src.read())


def test_the_sampler_keeps_nvml_failures_beside_the_readings(tmp_path) -> None:
    code = fake_pynvml.NVML_ERROR_NOT_SUPPORTED
    nvml = FakeNvml(
        [FakeGpu("GPU-aaaa-0001", bus=1, refuse={"nvmlDeviceGetPowerUsage": code}, lost_after=10)]
    )
    with TelemetrySampler(NvmlSource(None, nvml=nvml), interval_s=0.005) as sampler:
        time.sleep(0.15)
    path = sampler.write_parquet(tmp_path / "telemetry" / "8192.parquet")
    errors = pd.read_csv(errors_path(path))
    # once each: the refused metric, then the lost GPU (on whichever call it was lost)
    assert errors.metric.iloc[0] == "power_w" and "NVMLError_NotSupported" in errors.error.iloc[0]
    assert len(errors) == 2 and errors.error.iloc[1].startswith("NVMLError_GpuIsLost")
    assert set(pd.read_parquet(path).metric) == METRICS - {"power_w"}
    assert nvml.initialised == 0


def test_the_engines_visible_devices_are_its_own_else_inherited(monkeypatch) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,3")
    assert engine_visible_devices({"CUDA_VISIBLE_DEVICES": "1"}) == "1"
    assert engine_visible_devices({}) == "2,3"
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    assert engine_visible_devices({}) is None


def test_the_stand_in_matches_pynvml() -> None:
    pynvml = pytest.importorskip("pynvml", reason="nvidia-ml-py is not installed here (the gpu extra)")
    for name, fn in inspect.getmembers(FakeNvml, inspect.isfunction):
        if name.startswith("nvml"):
            assert list(inspect.signature(fn).parameters)[1:] == list(
                inspect.signature(getattr(pynvml, name)).parameters
            ), name
    for name in dir(fake_pynvml):
        if name.startswith("NVML_"):
            assert getattr(pynvml, name) == getattr(fake_pynvml, name), name
    for code, cls in fake_pynvml.NVMLError._valClassMapping.items():
        real = pynvml.NVMLError(code)
        assert type(real).__name__ == cls.__name__ and str(real) == str(fake_pynvml.NVMLError(code))
        assert isinstance(real, pynvml.NVMLError) and real.value == code


def test_a_gpu_lost_before_the_start_leaves_nvml_shut_down() -> None:
    nvml = _two_gpus(lost_after=0)
    with pytest.raises(fake_pynvml.NVMLError_GpuIsLost):
        NvmlSource(None, nvml=nvml)
    assert nvml.initialised == 0
