"""The telemetry sampler on a fake source, and the psutil source on this machine."""

import os
import time

import pandas as pd
import pytest

from engine_harness.telemetry import PsutilSource, Reading, TelemetrySampler


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
    assert len(sampler.errors) == 1 and "sensor unavailable" in sampler.errors[0]
    df = sampler.to_frame()
    assert 2 not in df[df.metric == "calls"].value.tolist()
    path = sampler.write_parquet(tmp_path / "telemetry" / "t.parquet")
    assert pd.read_parquet(path).equals(df)


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
