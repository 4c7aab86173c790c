"""NVML telemetry on a real GPU (skipped where nvidia-smi lists none)."""

import time

import pytest

from engine_harness.telemetry import NvmlSource, TelemetrySampler, default_source

pytestmark = pytest.mark.gpu


def test_nvml_is_the_default_source_and_reads_sane_values() -> None:
    src = default_source()
    assert isinstance(src, NvmlSource)
    assert NvmlSource.gpu_names()
    with TelemetrySampler(src, interval_s=0.05) as sampler:
        time.sleep(0.5)
    df = sampler.to_frame()
    assert set(df.source) == {"nvml"}
    by_metric = df.groupby("metric").value
    assert (by_metric.get_group("sm_clock_mhz") > 0).all()
    assert (by_metric.get_group("mem_used_bytes") > 0).all()
    energy = by_metric.get_group("energy_j").to_numpy()
    assert (energy[1:] >= energy[:-1]).all()  # a counter never goes back
