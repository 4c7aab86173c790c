"""Background telemetry: NVML (``nvidia-ml-py``) where a GPU exists, CPU and engine RSS (psutil) otherwise.

A ``TelemetrySampler`` runs a source in a daemon thread at a fixed interval and keeps tidy rows
``(t_ns, source, device, metric, value)``; ``t_ns`` is ``time.perf_counter_ns()``, the clock the client
stamps tokens with, so telemetry lines up with token gaps. ``to_frame()`` / ``write_parquet()`` give the
table; every row names its source (``nvml`` or ``psutil``), so a reader knows which was used. What the
source could not read (a ``Failure``: one NVML call refused, a lost GPU, a read that raised) is kept as
rows ``(t_ns, source, device, metric, error)`` and written beside the table (``<name>.errors.csv``), so
a gap in the telemetry says why it is there.
"""

from __future__ import annotations

import importlib
import io
import os
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import pandas as pd
import psutil

from benchcore.atomic import atomic_write_bytes

__all__ = [
    "Failure",
    "NvmlSource",
    "PsutilSource",
    "Reading",
    "TelemetrySampler",
    "TelemetrySource",
    "default_source",
    "engine_gpus",
    "engine_visible_devices",
    "errors_path",
]


@dataclass(frozen=True)
class Reading:
    device: str
    metric: str
    value: float


@dataclass(frozen=True)
class Failure:
    """A reading the source could not take, and why (the sample's other readings still count)."""

    device: str
    metric: str
    error: str


class TelemetrySource(Protocol):
    name: str

    def read(self) -> Iterable[Reading | Failure]: ...

    def close(self) -> None: ...


class NvmlSource:
    """Per-GPU clocks, utilisation, memory, power and the total energy counter through NVML, for the
    engine's GPUs only (``visible_devices``: its ``CUDA_VISIBLE_DEVICES``; ``None``, unset: every GPU).

    Each NVML call is guarded on its own: a failure drops that one reading and is reported as a
    ``Failure``, never the whole sample. A metric the device refuses for good (not supported, e.g.
    utilisation on a MIG instance; no permission; a driver without the function) is reported once and
    no longer asked; a lost GPU is reported once and no longer sampled; any other NVML error is reported
    each time it happens. ``nvml`` is the ``pynvml`` module (``nvidia-ml-py``), or a stand-in in tests.
    """

    name = "nvml"

    def __init__(self, visible_devices: str | None = None, nvml: Any = None) -> None:
        if nvml is None:
            nvml = importlib.import_module("pynvml")  # nvidia-ml-py, where a GPU extra is installed
        self._nvml = nvml
        nvml.nvmlInit()
        try:
            self._devices, problems = engine_gpus(nvml, visible_devices)
        except Exception:  # e.g. a GPU lost before the start: no source, and NVML not left initialised
            nvml.nvmlShutdown()
            raise
        self._pending: list[Reading | Failure] = [Failure("*", "CUDA_VISIBLE_DEVICES", p) for p in problems]
        self._skip: set[tuple[str, str]] = set()
        n = nvml
        self._refused = (n.NVMLError_NotSupported, n.NVMLError_NoPermission, n.NVMLError_FunctionNotFound)

    @property
    def devices(self) -> list[str]:
        """The names the readings carry (``gpu<NVML index>``, a MIG instance by its UUID)."""
        return [name for name, _ in self._devices]

    def read(self) -> list[Reading | Failure]:
        n = self._nvml
        out: list[Reading | Failure] = self._pending
        self._pending = []
        lost: set[str] = set()
        for dev, handle in self._devices:
            for metric, call in _NVML_METRICS:
                if (dev, metric) in self._skip:
                    continue
                try:
                    out.append(Reading(dev, metric, call(n, handle)))
                except n.NVMLError_GpuIsLost as exc:
                    out.append(Failure(dev, metric, f"{_nvml_error(exc)}; device no longer sampled"))
                    lost.add(dev)
                    break
                except self._refused as exc:
                    out.append(Failure(dev, metric, f"{_nvml_error(exc)}; metric no longer asked"))
                    self._skip.add((dev, metric))
                except n.NVMLError as exc:
                    out.append(Failure(dev, metric, _nvml_error(exc)))
        self._devices = [(d, h) for d, h in self._devices if d not in lost]
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


# One NVML call per metric, each guarded on its own in NvmlSource.read.
_NVML_METRICS: tuple[tuple[str, Callable[[Any, Any], float]], ...] = (
    ("sm_clock_mhz", lambda n, h: n.nvmlDeviceGetClockInfo(h, n.NVML_CLOCK_SM)),
    ("mem_clock_mhz", lambda n, h: n.nvmlDeviceGetClockInfo(h, n.NVML_CLOCK_MEM)),
    ("gpu_util_pct", lambda n, h: n.nvmlDeviceGetUtilizationRates(h).gpu),
    ("mem_util_pct", lambda n, h: n.nvmlDeviceGetUtilizationRates(h).memory),
    ("mem_used_bytes", lambda n, h: n.nvmlDeviceGetMemoryInfo(h).used),
    ("power_w", lambda n, h: n.nvmlDeviceGetPowerUsage(h) / 1000.0),  # mW
    ("energy_j", lambda n, h: n.nvmlDeviceGetTotalEnergyConsumption(h) / 1000.0),  # mJ
)


def _nvml_error(exc: Exception) -> str:
    return f"{type(exc).__name__}: {exc}"


def engine_gpus(nvml: Any, visible_devices: str | None) -> tuple[list[tuple[str, Any]], list[str]]:
    """The NVML handles of the GPUs an engine with ``CUDA_VISIBLE_DEVICES=visible_devices`` uses, named
    ``gpu<NVML index>`` (a MIG instance: its UUID), and the problems found in the variable.

    CUDA's rules: unset (``None``) is every GPU, empty is none; an entry is a CUDA ordinal, a (prefix of
    a) ``GPU-`` UUID or a ``MIG-`` UUID; at the first entry that names no device CUDA ignores the rest.
    An ordinal counts GPUs in PCI bus order, NVML's order: CUDA's own order with
    ``CUDA_DEVICE_ORDER=PCI_BUS_ID``, and on a box of one GPU model also its default (vLLM assumes it).
    """
    count = nvml.nvmlDeviceGetCount()
    gpus = sorted(range(count), key=lambda i: _bus(nvml, nvml.nvmlDeviceGetHandleByIndex(i)))
    if visible_devices is None:
        return [(f"gpu{i}", nvml.nvmlDeviceGetHandleByIndex(i)) for i in gpus], []
    uuids = {i: nvml.nvmlDeviceGetUUID(nvml.nvmlDeviceGetHandleByIndex(i)) for i in gpus}
    chosen: list[tuple[str, Any]] = []
    for entry in (e.strip() for e in visible_devices.split(",") if visible_devices.strip()):
        found = _visible_entry(nvml, entry, gpus, uuids)
        if found is None or found[0] in (name for name, _ in chosen):
            why = "repeats an earlier one" if found else f"names no device NVML sees ({count} GPUs)"
            return chosen, [f"entry {entry!r} {why}: CUDA ignores it and the entries after it"]
        chosen.append(found)
    return chosen, []


def _bus(nvml: Any, handle: Any) -> tuple[int, int, int]:
    pci = nvml.nvmlDeviceGetPciInfo(handle)
    return (pci.domain, pci.bus, pci.device)


def _visible_entry(nvml: Any, entry: str, gpus: list[int], uuids: dict[int, str]) -> tuple[str, Any] | None:
    if entry.isdigit():
        ordinal = int(entry)
        if ordinal >= len(gpus):
            return None
        return f"gpu{gpus[ordinal]}", nvml.nvmlDeviceGetHandleByIndex(gpus[ordinal])
    if entry.startswith("MIG-"):
        try:
            return entry, nvml.nvmlDeviceGetHandleByUUID(entry)
        except nvml.NVMLError:
            return None
    matches = [i for i in gpus if entry.startswith("GPU-") and uuids[i].startswith(entry)]
    if len(matches) != 1:  # none, or an ambiguous prefix
        return None
    return f"gpu{matches[0]}", nvml.nvmlDeviceGetHandleByIndex(matches[0])


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


def engine_visible_devices(engine_env: Mapping[str, str]) -> str | None:
    """The engine's ``CUDA_VISIBLE_DEVICES``: its own setting, else the one it inherits (None: unset)."""
    return engine_env.get("CUDA_VISIBLE_DEVICES", os.environ.get("CUDA_VISIBLE_DEVICES"))


def default_source(
    pids: Callable[[], Sequence[int]] = tuple, visible_devices: str | None = None
) -> TelemetrySource:
    """NVML on the engine's GPUs when it initialises and sees one of them; psutil otherwise."""
    try:
        src = NvmlSource(visible_devices)
    except Exception:  # ImportError, NVMLError (no driver / no GPU): fall back to the CPU sampler
        return PsutilSource(pids)
    if not src.devices:
        src.close()
        return PsutilSource(pids)
    return src


def errors_path(path: Path) -> Path:
    """Where the failures of the telemetry table at ``path`` are written: ``<stem>.errors.csv`` beside it."""
    return path.with_name(f"{path.stem}.errors.csv")


class TelemetrySampler:
    """Samples a source every ``interval_s`` in a daemon thread until ``stop()``; a context manager."""

    COLUMNS = ("t_ns", "source", "device", "metric", "value")
    ERROR_COLUMNS = ("t_ns", "source", "device", "metric", "error")

    def __init__(self, source: TelemetrySource, interval_s: float = 0.5) -> None:
        if interval_s <= 0:
            raise ValueError(f"telemetry interval must be > 0 s, got {interval_s}")
        self.source = source
        self.interval_s = interval_s
        self.rows: list[tuple[int, str, str, str, float]] = []
        self.errors: list[tuple[int, str, str, str, str]] = []
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
            name = self.source.name
            try:
                readings = list(self.source.read())
            except Exception as exc:  # a failed read is recorded, never turned into a zero
                readings = [Failure("*", "*", f"{type(exc).__name__}: {exc}")]
            for r in readings:
                if isinstance(r, Failure):
                    self.errors.append((t_ns, name, r.device, r.metric, r.error))
                else:
                    self.rows.append((t_ns, name, r.device, r.metric, float(r.value)))
            next_t += self.interval_s
            self._stop.wait(max(0.0, next_t - time.perf_counter()))

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=10)
        self.source.close()

    def to_frame(self) -> pd.DataFrame:
        return pd.DataFrame(self.rows, columns=list(self.COLUMNS))

    def errors_frame(self) -> pd.DataFrame:
        return pd.DataFrame(self.errors, columns=list(self.ERROR_COLUMNS))

    def write_parquet(self, path: Path) -> Path:
        """The table at ``path`` and its failures at ``errors_path(path)`` (a header only when none)."""
        table = io.BytesIO()
        self.to_frame().to_parquet(table, index=False)
        atomic_write_bytes(path, table.getvalue())  # all or nothing, no temporary file left on a full disk
        atomic_write_bytes(errors_path(path), self.errors_frame().to_csv(index=False).encode())
        return path
