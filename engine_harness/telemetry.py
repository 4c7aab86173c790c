"""Background telemetry: NVML (``nvidia-ml-py``) where a GPU exists, CPU and engine RSS (psutil) otherwise.

A ``TelemetrySampler`` runs a source in a daemon thread at a fixed interval and keeps tidy rows
``(t_ns, source, device, metric, value)``; ``t_ns`` is ``time.perf_counter_ns()``, the clock the client
stamps tokens with, so telemetry lines up with token gaps. ``to_frame()`` / ``write_parquet()`` give the
table; every row names its source (``nvml`` or ``psutil``), so a reader knows which was used.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import pandas as pd
import psutil

__all__ = ["NvmlSource", "PsutilSource", "Reading", "TelemetrySampler", "TelemetrySource", "default_source"]


@dataclass(frozen=True)
class Reading:
    device: str
    metric: str
    value: float


class TelemetrySource(Protocol):
    name: str

    def read(self) -> Iterable[Reading]: ...

    def close(self) -> None: ...


class NvmlSource:
    """Per-GPU clocks, utilisation, memory, power and the total energy counter through NVML."""

    name = "nvml"

    def __init__(self) -> None:
        import pynvml  # nvidia-ml-py

        self._nvml = pynvml
        pynvml.nvmlInit()
        self._handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]

    def read(self) -> list[Reading]:
        n = self._nvml
        out: list[Reading] = []
        for i, h in enumerate(self._handles):
            dev = f"gpu{i}"
            util = n.nvmlDeviceGetUtilizationRates(h)
            mem = n.nvmlDeviceGetMemoryInfo(h)
            out += [
                Reading(dev, "sm_clock_mhz", n.nvmlDeviceGetClockInfo(h, n.NVML_CLOCK_SM)),
                Reading(dev, "mem_clock_mhz", n.nvmlDeviceGetClockInfo(h, n.NVML_CLOCK_MEM)),
                Reading(dev, "gpu_util_pct", util.gpu),
                Reading(dev, "mem_util_pct", util.memory),
                Reading(dev, "mem_used_bytes", mem.used),
                Reading(dev, "power_w", n.nvmlDeviceGetPowerUsage(h) / 1000.0),
                Reading(dev, "energy_j", n.nvmlDeviceGetTotalEnergyConsumption(h) / 1000.0),
            ]
        return out

    def close(self) -> None:
        self._nvml.nvmlShutdown()

    @staticmethod
    def gpu_names() -> list[str]:
        """Names of the GPUs NVML sees ([] without NVML or a GPU)."""
        try:
            import pynvml

            pynvml.nvmlInit()
        except Exception:  # no library, no driver or no GPU: all mean "no NVML here"
            return []
        try:
            return [
                pynvml.nvmlDeviceGetName(pynvml.nvmlDeviceGetHandleByIndex(i))
                for i in range(pynvml.nvmlDeviceGetCount())
            ]
        finally:
            pynvml.nvmlShutdown()


class PsutilSource:
    """CPU utilisation per core and the resident memory of the engine's processes (with children)."""

    name = "psutil"

    def __init__(self, pids: Callable[[], Sequence[int]] = tuple) -> None:
        self._pids = pids
        psutil.cpu_percent(percpu=True)  # prime: the first call has no interval to measure over

    def read(self) -> list[Reading]:
        out = [Reading(f"cpu{i}", "cpu_util_pct", v) for i, v in enumerate(psutil.cpu_percent(percpu=True))]
        rss = 0
        for pid in self._pids():
            try:
                root = psutil.Process(pid)
                for p in [root, *root.children(recursive=True)]:
                    rss += p.memory_info().rss
            except psutil.Error:
                continue
        out.append(Reading("engine", "rss_bytes", rss))
        out.append(Reading("host", "mem_used_bytes", psutil.virtual_memory().used))
        return out

    def close(self) -> None:
        pass


def default_source(pids: Callable[[], Sequence[int]] = tuple) -> TelemetrySource:
    """NVML when it initialises and sees a GPU; psutil otherwise."""
    try:
        src = NvmlSource()
    except Exception:  # ImportError, NVMLError (no driver / no GPU): fall back to the CPU sampler
        return PsutilSource(pids)
    if not src._handles:
        src.close()
        return PsutilSource(pids)
    return src


class TelemetrySampler:
    """Samples a source every ``interval_s`` in a daemon thread until ``stop()``; a context manager."""

    COLUMNS = ("t_ns", "source", "device", "metric", "value")

    def __init__(self, source: TelemetrySource, interval_s: float = 0.5) -> None:
        if interval_s <= 0:
            raise ValueError(f"telemetry interval must be > 0 s, got {interval_s}")
        self.source = source
        self.interval_s = interval_s
        self.rows: list[tuple[int, str, str, str, float]] = []
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="telemetry", daemon=True)

    def __enter__(self) -> TelemetrySampler:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> None:
        self._thread.start()

    def _run(self) -> None:
        next_t = time.perf_counter()
        while not self._stop.is_set():
            t_ns = time.perf_counter_ns()
            try:
                readings = list(self.source.read())
            except Exception as exc:  # a failed read is recorded, never turned into a zero
                self.errors.append(f"{t_ns}: {exc!r}")
            else:
                self.rows.extend(
                    (t_ns, self.source.name, r.device, r.metric, float(r.value)) for r in readings
                )
            next_t += self.interval_s
            self._stop.wait(max(0.0, next_t - time.perf_counter()))

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=10)
        self.source.close()

    def to_frame(self) -> pd.DataFrame:
        return pd.DataFrame(self.rows, columns=list(self.COLUMNS))

    def write_parquet(self, path: Path) -> Path:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(path.suffix + ".tmp")
        self.to_frame().to_parquet(tmp, index=False)
        tmp.replace(path)
        return path
