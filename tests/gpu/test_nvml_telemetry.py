"""NVML telemetry on a real GPU (skipped where nvidia-smi lists none).

Needs nvidia-ml-py, pandas, psutil and pyarrow; torch only for the CUDA-ordinal check (skipped without).
"""

import time

import pandas as pd
import pytest

from engine_harness.telemetry import Failure, NvmlSource, TelemetrySampler, default_source, errors_path

pytestmark = pytest.mark.gpu


def test_nvml_is_the_default_source_and_reads_sane_values(tmp_path) -> None:
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
    path = sampler.write_parquet(tmp_path / "telemetry" / "8192.parquet")
    errors = pd.read_csv(errors_path(path))
    # A whole GPU answers every call; what a card refuses is named in the file, not silently missing.
    assert set(df.metric) | set(errors.metric) >= {"sm_clock_mhz", "power_w", "energy_j", "gpu_util_pct"}
    print(f"\n{len(df)} readings of {sorted(src.devices)}; failures: {errors.to_dict('records')}")


def _devices_and_failures(visible: str) -> tuple[list[str], list[Failure]]:
    src = NvmlSource(visible)
    try:
        return src.devices, [r for r in src.read() if isinstance(r, Failure)]
    finally:
        src.close()


def test_the_engines_gpus_by_ordinal_uuid_or_none() -> None:
    import pynvml

    (name,), failures = _devices_and_failures("0")
    assert not failures
    pynvml.nvmlInit()
    try:
        uuid = pynvml.nvmlDeviceGetUUID(pynvml.nvmlDeviceGetHandleByIndex(int(name.removeprefix("gpu"))))
        count = pynvml.nvmlDeviceGetCount()
    finally:
        pynvml.nvmlShutdown()
    assert _devices_and_failures(uuid)[0] == [name]
    assert _devices_and_failures("") == ([], [])
    devices, failures = _devices_and_failures(f"0,{count}")  # past the last GPU: CUDA ignores the rest
    assert devices == [name] and "names no device" in failures[0].error


def test_cuda_ordinals_map_to_the_gpus_cuda_uses() -> None:
    torch = pytest.importorskip("torch")
    import pynvml

    if not torch.cuda.is_available():
        pytest.skip("torch sees no CUDA device")
    pynvml.nvmlInit()
    try:
        for ordinal in range(torch.cuda.device_count()):
            (name,), _ = _devices_and_failures(str(ordinal))
            handle = pynvml.nvmlDeviceGetHandleByIndex(int(name.removeprefix("gpu")))
            cuda_uuid = str(torch.cuda.get_device_properties(ordinal).uuid)
            assert pynvml.nvmlDeviceGetUUID(handle).removeprefix("GPU-") == cuda_uuid
    finally:
        pynvml.nvmlShutdown()
