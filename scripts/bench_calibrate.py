"""Benchmark of the calibration's replay: how many times faster than real time a trace is predicted.

Builds a trace of ``--minutes`` of Poisson arrivals at ``--rate`` requests per second (prompt lengths
lognormal around 500 tokens, outputs 16–96 tokens, a quarter of the requests in one of four prefix
groups), fits the simulator from a sweep run folder (default: the committed ``results/reference-cpu``,
``--chunk 2048``), predicts the trace and prints the trace's duration, the replay's wall and CPU time, and
their ratio (the speed figure: seconds of trace per second of prediction). The CPU-time ratio does not
drop when other work shares the machine; the wall-clock one does.

Usage: ``.venv/bin/python scripts/bench_calibrate.py [--minutes 10] [--rate 3] [--model RUN] [--chunk N]``.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from analysis.calibrate.config import fit_to_sim
from analysis.calibrate.predict import predict_trace
from microbench.results.trace import INT_COLUMNS, TRACE_COLUMNS, TraceHeader, write_trace_files

__all__ = ["main", "synthetic_trace"]

REPO = Path(__file__).resolve().parents[1]


def synthetic_trace(minutes: float, rate: float, seed: int = 0) -> pd.DataFrame:
    """A trace frame of completed requests whose timings the replay ignores (only sends and lengths)."""
    rng = np.random.default_rng(seed)
    sends = np.cumsum(rng.exponential(1 / rate, size=int(minutes * 60 * rate * 1.2)))
    sends = sends[sends < minutes * 60]
    n = sends.size
    prompt = np.clip(rng.lognormal(6.2, 0.6, n), 32, 3000).astype(int)
    output = rng.integers(16, 97, n)
    grouped = rng.random(n) < 0.25
    rows: list[dict[str, Any]] = []
    for i in range(n):
        send = int(sends[i] * 1e9)
        rows.append(
            {c: None for c in TRACE_COLUMNS}
            | dict(
                request_id=str(i), stage="bench", warmup=False, client_id="c", tenant_id="", slo_class="",
                session_id="", round_index=0, prefix_group=f"g/{i % 4}" if grouped[i] else "",
                prefix_tokens=256 if grouped[i] else 0, streaming=True, prompt_tokens=int(prompt[i]),
                max_tokens=int(output[i]), input_tokens=int(prompt[i]), output_tokens=int(output[i]),
                intended_ns=send, send_ns=send, schedule_delay_ns=0, first_chunk_ns=send, last_chunk_ns=send,
                num_chunks=0, chunk_ns=[], chunk_tokens=[], tokens_from_usage=True, status="ok",
                http_status=200,
            )
        )  # fmt: skip
    frame = pd.DataFrame(rows, columns=list(TRACE_COLUMNS))
    for c in INT_COLUMNS:
        frame[c] = frame[c].astype("Int64")
    return frame


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--minutes", type=float, default=10.0)
    p.add_argument("--rate", type=float, default=3.0, help="requests per second")
    p.add_argument("--model", type=Path, default=REPO / "results" / "reference-cpu")
    p.add_argument("--chunk", type=int, default=2048)
    args = p.parse_args(argv)
    settings = fit_to_sim(args.model, args.chunk)
    frame = synthetic_trace(args.minutes, args.rate)
    header = TraceHeader(created_at="bench", session_start_unix_ns=0, stages=[], saturated=False)
    with tempfile.TemporaryDirectory() as tmp:
        write_trace_files(Path(tmp) / "trace", header, frame)
        cpu0, t0 = time.process_time(), time.perf_counter()
        pred = predict_trace(Path(tmp) / "trace", settings, Path(tmp) / "pred")
        wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    print(f"machine: {os.cpu_count()} CPUs, load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print(f"trace: {pred.requests} requests, {pred.trace_s:.0f} s; {pred.steps} engine steps predicted")
    print(f"replay alone: {pred.wall_s:.2f} s wall → {pred.speed_ratio:.0f}× real time")
    by_wall, by_cpu = pred.trace_s / wall, pred.trace_s / cpu
    print(f"predict (read, replay, write): {wall:.2f} s wall, {cpu:.2f} s CPU → {by_wall:.0f}× real time "
          f"by the wall clock, {by_cpu:.0f}× per CPU second")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
