"""Engine steps as SGLang reports them: its scheduler's per-batch log lines.

Why this source. SGLang 0.5.23 has no tokens-per-step histogram and logs no step duration. What it has:
- its scheduler logs every prefill batch after it ran ("Prefill batch, #new-seq: 1, #new-token: 2048,
  #cached-token: 0, …, #running-req: 4, …") and every ``--decode-log-interval``-th decode batch
  ("Decode batch, #running-req: 4, …"), from ``process_batch_result`` once the step's outputs are sent;
  with ``--decode-log-interval 1`` that is one line per engine step, the same coverage as vLLM's
  ``--enable-logging-iteration-details``;
- the forward-pass metrics publisher (``--enable-forward-pass-metrics``: per-step wall time over ZMQ)
  times steps with device events and needs a GPU; ``sglang:per_stage_req_latency_seconds{stage=
  "chunked_prefill"}`` gives only a count and a sum per request; neither serves a CPU box.
So the step source is the log: tokens and requests per step as SGLang states them, and the step's
duration as the interval between its line and the previous step's line (one scheduler loop: schedule,
forward, outputs). Timestamps come from the record's epoch time in microseconds, which the logging
configuration ``engine_harness/sglang_logging.json`` adds (``@1795132741.123456``); SGLang's own format
(``SGLANG_LOG_MS=1``: milliseconds) is read too.

What SGLang does not report, the step says so rather than inventing it:
- the first step after the mark has ``elapsed_ms = None``: its start is not logged, and the engine may
  have been idle before it (a bare prefill, D = 0);
- a prefill line counts the running batch (``#running-req``) before mixing, not whether the decodes
  rode in that step. With ``--enable-mixed-chunk`` SGLang mixes them in (its ``mix_with_running``)
  unless their KV does not fit; without it they wait. ``decode_tokens`` of a prefill step is therefore
  the running batch when the engine runs mixed, else 0 — the scheduling mode decides, as in SGLang's code.
"""

from __future__ import annotations

import re
from datetime import datetime
from pathlib import Path

from microbench.records import EngineStep

__all__ = ["SglangLogStepSource", "parse_sglang_step_lines"]

_STEP = re.compile(
    r"^\[(?P<date>\d{4}-\d\d-\d\d \d\d:\d\d:\d\d(?:\.\d+)?)(?: @(?P<epoch>\d+\.\d+))?[^\]]*\] "
    r"(?P<kind>Prefill|Decode) batch(?: \[\d+\])?, (?P<body>.*)$",
    re.MULTILINE,
)
_FIELD = re.compile(r"#(?P<name>[a-z-]+): (?P<value>\d+)")


def _timestamp(m: re.Match[str]) -> float:
    if m["epoch"]:
        return float(m["epoch"])
    fmt = "%Y-%m-%d %H:%M:%S.%f" if "." in m["date"] else "%Y-%m-%d %H:%M:%S"
    return datetime.strptime(m["date"], fmt).timestamp()


def _step(kind: str, fields: dict[str, int], mixed: bool, elapsed_ms: float | None) -> EngineStep:
    running = fields.get("running-req", 0)
    if kind == "Decode":
        return EngineStep(
            prefill_tokens=0,
            decode_tokens=running,
            prefill_requests=0,
            decode_requests=running,
            elapsed_ms=elapsed_ms,
        )
    riders = running if mixed else 0
    return EngineStep(
        prefill_tokens=fields.get("new-token", 0),
        decode_tokens=riders,
        prefill_requests=fields.get("new-seq", 0),
        decode_requests=riders,
        elapsed_ms=elapsed_ms,
    )


def parse_sglang_step_lines(text: str, mixed: bool, previous_t: float | None = None) -> list[EngineStep]:
    """Every SGLang step line in ``text``, in order. ``mixed``: the engine runs ``--enable-mixed-chunk``.
    ``previous_t``: epoch seconds of the step line right before ``text``, if known (else the first
    step's duration is None)."""
    steps = []
    last = previous_t
    for m in _STEP.finditer(text):
        t = _timestamp(m)
        elapsed = round((t - last) * 1e3, 3) if last is not None and t >= last else None
        fields = {f["name"]: int(f["value"]) for f in _FIELD.finditer(m["body"])}
        steps.append(_step(m["kind"], fields, mixed, elapsed))
        last = t
    return steps


class SglangLogStepSource:
    """Reads SGLang's step lines appended to its log file after a byte offset."""

    def __init__(self, log_path: Path, mixed: bool) -> None:
        self.log_path = log_path
        self.mixed = mixed

    async def mark(self) -> int:
        return self.log_path.stat().st_size if self.log_path.exists() else 0

    async def since(self, mark: int) -> list[EngineStep]:
        with self.log_path.open("rb") as f:
            f.seek(mark)
            text = f.read().decode("utf-8", "replace")
        # only whole lines: the engine may be writing the last one right now
        return parse_sglang_step_lines(text[: text.rfind("\n") + 1], self.mixed)
