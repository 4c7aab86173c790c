"""Predict a recorded trace: replay it through the fitted simulator and write the predicted trace.

The output folder holds the predicted trace in the trace format (``header.json``, ``trace.parquet``,
``trace.csv``: the same reader reads it), the replay's step log (``steps.parquet``: per step its start,
duration as the engine's step log would say it, the API server's time after it (``stream_ns``), decode
and prefill tokens), the configuration it ran (``sim-settings.json``, and ``sim.yaml``:
the same as ``python -m engine_harness.sim --params`` reads it, to run a live sim engine alike).
"""

from __future__ import annotations

import datetime as dt
import platform
from dataclasses import dataclass
from pathlib import Path

import yaml

from analysis.calibrate.config import SimSettings
from analysis.calibrate.replay import predicted_frame, replay, replay_requests
from benchcore.atomic import atomic_write_bytes, write_model
from microbench.results.trace import TraceHeader, read_trace, write_trace_files

__all__ = ["Prediction", "predict_trace", "with_round_trip"]


@dataclass(frozen=True)
class Prediction:
    """What a prediction wrote, and how fast it ran."""

    out_dir: Path
    requests: int
    steps: int
    trace_s: float  # the real trace's first send to its last chunk
    wall_s: float  # the replay's own time

    @property
    def speed_ratio(self) -> float:
        """Trace seconds predicted per second of replay."""
        return self.trace_s / self.wall_s if self.wall_s > 0 else float("inf")


def _header(real: TraceHeader, trace_dir: Path, settings: SimSettings, wall_s: float) -> TraceHeader:
    return real.model_copy(
        update={
            "created_at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
            "engine": {
                "kind": "prediction",
                "predicted_from": str(trace_dir),
                "real_engine": real.engine,
                "sim": settings.model_dump(mode="json"),
            },
            "loadgen": {
                "predicted_by": "python -m analysis.calibrate predict (virtual-time replay)",
                "python": platform.python_version(),
                "host": platform.node(),
                "replay_wall_s": wall_s,
            },
        }
    )


def predict_trace(trace_dir: str | Path, settings: SimSettings, out_dir: str | Path) -> Prediction:
    """Replay the trace at ``trace_dir`` through ``settings`` and write the prediction into ``out_dir``
    (which the caller has locked). ``ValueError`` for a trace the engine cannot serve."""
    trace_dir, out = Path(trace_dir), Path(out_dir)
    real_header, frame = read_trace(trace_dir)
    # the fastest of the client's round-trip probes: the network's own time (a slower probe on a busy host
    # measured the host's load at that moment, not a delay every request pays)
    probes = real_header.network.get("rtt_ms") or {}
    rtt = probes.get("min", probes.get("median"))
    settings = with_round_trip(settings, rtt)
    requests = replay_requests(frame, settings)
    if not requests:
        raise ValueError(f"{trace_dir} holds no completed request to replay")
    result = replay(requests, settings)
    pred = predicted_frame(frame, result)
    write_trace_files(out, _header(real_header, trace_dir, settings, result.wall_s), pred)
    steps = result.steps_frame()
    atomic_write_bytes(out / "steps.parquet", steps.to_parquet(index=False))
    write_model(out / "sim-settings.json", settings)
    atomic_write_bytes(out / "sim.yaml", yaml.safe_dump(settings.sim_params(), sort_keys=False).encode())
    sends = frame["send_ns"].dropna().astype(float)
    lasts = frame["last_chunk_ns"].dropna().astype(float)
    trace_s = float((lasts.max() - sends.min()) / 1e9) if len(sends) and len(lasts) else 0.0
    return Prediction(out, len(requests), len(steps), trace_s, result.wall_s)


def with_round_trip(settings: SimSettings, rtt_ms: float | None) -> SimSettings:
    """``settings`` for a trace whose client measured round-trip time ``rtt_ms`` (its header's fastest
    ``GET /v1/models``): no token reaches a client sooner than one round trip after its request left, so
    the fixed per-request time is at least that (seed 003 §10: client TTFT = server TTFT + RTT)."""
    if rtt_ms is None or rtt_ms <= settings.frontend_fixed_ms:
        return settings
    fitted = settings.frontend_fixed_ms
    note = f"frontend_fixed_ms={rtt_ms:.3g} (the trace's round-trip time, above the fitted {fitted:.3g})"
    return settings.model_copy(update={"frontend_fixed_ms": rtt_ms, "matched": [*settings.matched, note]})
