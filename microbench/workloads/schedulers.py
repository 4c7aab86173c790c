"""Arrival schedulers: seeded, pure generators of absolute target send times, registered by name.

A scheduler yields offsets in nanoseconds from the start of its stage, non-decreasing; it never looks at
a clock or a response, so the same seed gives the same times and the dispatcher only has to sleep until
each one. Open-loop kinds: ``max_throughput`` (all at t=0), ``poisson``, ``gamma`` (``cv`` > 1 is bursty),
``weibull``, ``uniform`` (evenly spaced, optional jitter) and ``trace`` (timestamps from a file). The
closed-loop kind ``concurrency`` yields t=0 for every request and carries the number of requests to keep in
flight; the session releases the next issue when one completes.

Random kinds draw inter-arrival gaps in blocks from ``numpy.random.default_rng(seed)``; the first request
goes at t=0 and request k at the sum of the first k gaps, so the mean gap is ``1/rate``.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal

import numpy as np
from pydantic import BeforeValidator, ConfigDict, Field, SerializeAsAny, model_validator

from benchcore.registry import Registry, validate_by_name
from benchcore.schema import StrictModel

__all__ = [
    "SCHEDULERS",
    "ConcurrencyScheduler",
    "GammaScheduler",
    "MaxThroughputScheduler",
    "PoissonScheduler",
    "RateScheduler",
    "Scheduler",
    "SchedulerField",
    "TraceScheduler",
    "UniformScheduler",
    "WeibullScheduler",
    "parse_scheduler",
    "weibull_shape_for_cv",
]

SCHEDULERS: Registry[type[Scheduler]] = Registry("scheduler")
_BLOCK = 4096
_NS = 1_000_000_000


class Scheduler(StrictModel):
    """Target send times of one stage. ``sweep_axis`` names the field a rate/concurrency sweep varies."""

    model_config = ConfigDict(allow_inf_nan=False, frozen=True)
    sweep_axis: ClassVar[str | None] = None

    kind: str
    seed: int = Field(default=0, ge=0, description="seed of the arrival process; reported with the trace")

    def offsets_ns(self) -> Iterator[int]:
        """Target send times, ns from the stage start, non-decreasing; endless unless read from a file."""
        raise NotImplementedError

    @property
    def requested_rate(self) -> float | None:
        """Mean requests per second asked for (None: as fast as possible or paced by completions)."""
        return None

    @property
    def in_flight_limit(self) -> int | None:
        """Requests a closed loop keeps in flight (None: open loop)."""
        return None

    def with_load(self, value: float) -> Scheduler:
        """A copy with the sweep axis (rate or concurrency) set to ``value``: one point of a sweep."""
        if self.sweep_axis is None:
            raise ValueError(f"scheduler {self.kind!r} has no rate or concurrency to sweep")
        return type(self).model_validate({**self.model_dump(), self.sweep_axis: value})


def parse_scheduler(value: Any) -> Scheduler:
    """A mapping with a ``kind`` key (or a ``Scheduler``) → the registered scheduler model."""
    return validate_by_name(SCHEDULERS, value, "kind")


SchedulerField = Annotated[SerializeAsAny[Scheduler], BeforeValidator(parse_scheduler)]


@SCHEDULERS.register("max_throughput")
class MaxThroughputScheduler(Scheduler):
    """Offline: every request at t=0."""

    kind: Literal["max_throughput"] = "max_throughput"

    def offsets_ns(self) -> Iterator[int]:
        while True:
            yield 0


@SCHEDULERS.register("concurrency")
class ConcurrencyScheduler(Scheduler):
    """Closed loop: ``concurrency`` requests in flight; a completion releases the next issue."""

    kind: Literal["concurrency"] = "concurrency"
    sweep_axis: ClassVar[str | None] = "concurrency"
    concurrency: int = Field(..., ge=1, description="requests kept in flight")

    def offsets_ns(self) -> Iterator[int]:
        while True:
            yield 0

    @property
    def in_flight_limit(self) -> int | None:
        return self.concurrency


class RateScheduler(Scheduler):
    """Open loop at a mean ``rate``: subclasses draw the gaps."""

    sweep_axis: ClassVar[str | None] = "rate"
    rate: float = Field(..., gt=0, description="mean requests per second")

    def gaps_s(self, rng: np.random.Generator, n: int) -> np.ndarray:
        raise NotImplementedError

    def offsets_ns(self) -> Iterator[int]:
        rng = np.random.default_rng(self.seed)
        t_s = 0.0
        while True:
            block = np.concatenate(([t_s], t_s + np.cumsum(self.gaps_s(rng, _BLOCK))))
            yield from (int(v) for v in np.rint(block[:-1] * _NS))
            t_s = float(block[-1])

    @property
    def requested_rate(self) -> float | None:
        return self.rate


@SCHEDULERS.register("poisson")
class PoissonScheduler(RateScheduler):
    """Exponential gaps (CV = 1): the draft's required open-loop process."""

    kind: Literal["poisson"] = "poisson"

    def gaps_s(self, rng: np.random.Generator, n: int) -> np.ndarray:
        return rng.exponential(1.0 / self.rate, size=n)


@SCHEDULERS.register("gamma")
class GammaScheduler(RateScheduler):
    """Gamma gaps with coefficient of variation ``cv``: shape 1/cv², scale cv²/rate; cv > 1 is bursty."""

    kind: Literal["gamma"] = "gamma"
    cv: float = Field(default=1.0, gt=0, description="std/mean of the gaps (1 = Poisson, > 1 = bursty)")

    def gaps_s(self, rng: np.random.Generator, n: int) -> np.ndarray:
        return rng.gamma(1.0 / self.cv**2, self.cv**2 / self.rate, size=n)


def weibull_shape_for_cv(cv: float) -> float:
    """The Weibull shape k whose coefficient of variation is ``cv`` (bisection on log k)."""

    def cv_of(k: float) -> float:
        ratio = math.exp(math.lgamma(1 + 2 / k) - 2 * math.lgamma(1 + 1 / k))
        return math.sqrt(max(ratio - 1.0, 0.0))

    lo, hi = math.log(0.05), math.log(200.0)  # cv(0.05) ≈ 1e6, cv(200) ≈ 0.006; cv falls with k
    if not cv_of(math.exp(hi)) <= cv <= cv_of(math.exp(lo)):
        raise ValueError(f"cv {cv} is outside what a Weibull reaches here (0.006 … 1e6)")
    for _ in range(100):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if cv_of(math.exp(mid)) > cv else (lo, mid)
    return math.exp((lo + hi) / 2)


@SCHEDULERS.register("weibull")
class WeibullScheduler(RateScheduler):
    """Weibull gaps with coefficient of variation ``cv``; the shape follows from cv, the scale from rate."""

    kind: Literal["weibull"] = "weibull"
    cv: float = Field(default=1.0, gt=0.01, lt=100, description="std/mean of the gaps")

    def gaps_s(self, rng: np.random.Generator, n: int) -> np.ndarray:
        k = weibull_shape_for_cv(self.cv)
        scale = (1.0 / self.rate) / math.exp(math.lgamma(1 + 1 / k))
        return scale * rng.weibull(k, size=n)


@SCHEDULERS.register("uniform")
class UniformScheduler(RateScheduler):
    """Evenly spaced (gap 1/rate); with ``jitter`` j the gaps are uniform in [(1-j)/rate, (1+j)/rate]."""

    kind: Literal["uniform"] = "uniform"
    jitter: float = Field(
        default=0.0, ge=0, lt=1, description="relative half-width of the gap's uniform range"
    )

    def gaps_s(self, rng: np.random.Generator, n: int) -> np.ndarray:
        if self.jitter == 0:
            return np.full(n, 1.0 / self.rate)
        return rng.uniform((1 - self.jitter) / self.rate, (1 + self.jitter) / self.rate, size=n)


_UNITS = {"s": 1e9, "ms": 1e6, "us": 1e3, "ns": 1.0}


@SCHEDULERS.register("trace")
class TraceScheduler(Scheduler):
    """Replays timestamps from a file: a CSV or Parquet column, or a text file of one number per line.

    Times are taken relative to the earliest one, sorted, and divided by ``speedup``. A trace written by
    this load generator replays with ``column: intended_ns, unit: ns``.
    """

    kind: Literal["trace"] = "trace"
    path: str = Field(..., description="CSV, Parquet or text file of timestamps")
    column: str = Field(default="timestamp", description="column holding the times (CSV and Parquet)")
    unit: Literal["s", "ms", "us", "ns"] = Field(default="s", description="unit of the times in the file")
    speedup: float = Field(default=1.0, gt=0, description="replay this many times faster than recorded")

    @model_validator(mode="after")
    def _check_file(self) -> TraceScheduler:
        if not Path(self.path).is_file():
            raise ValueError(f"trace file {self.path!r} does not exist")
        return self

    def times(self) -> np.ndarray:
        """The file's timestamps in its own unit, as read (unsorted)."""
        path = Path(self.path)
        if path.suffix in (".csv", ".parquet"):
            import pandas as pd

            frame = pd.read_parquet(path) if path.suffix == ".parquet" else pd.read_csv(path)
            if self.column not in frame.columns:
                columns = ", ".join(map(str, frame.columns))
                raise ValueError(f"{path}: no column {self.column!r} (has {columns})")
            values = frame[self.column].to_numpy(dtype=float)
        else:
            values = np.array([float(tok) for tok in path.read_text().split()], dtype=float)
        if values.size == 0 or not np.all(np.isfinite(values)):
            raise ValueError(f"{path}: timestamps must be present and finite")
        return values

    def offsets_ns(self) -> Iterator[int]:
        values = np.sort(self.times())
        offsets = np.rint((values - values[0]) * _UNITS[self.unit] / self.speedup)
        yield from (int(v) for v in offsets)

    @property
    def requested_rate(self) -> float | None:
        values = self.times()
        span_s = (values.max() - values.min()) * _UNITS[self.unit] / 1e9 / self.speedup
        return (values.size - 1) / span_s if span_s > 0 else None
