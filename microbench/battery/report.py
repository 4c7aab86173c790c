"""The battery's one typed result: ``BatteryReport``; JSON, Markdown and HTML are renderers of it.

A test's numbers live in its own ``TestData`` subclass, registered by test name (``TEST_DATA``) so a report
read back from JSON gets the same typed objects. Each ``TestData`` lays itself out as ``Table`` objects
(the draft's report tables) and names its headline numbers; renderers never know a test's fields.
"""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, Literal

from pydantic import BeforeValidator, Field, SerializeAsAny

from benchcore.registry import Registry
from benchcore.schema import StrictModel
from microbench.battery.compliance import Requirement, Verdict
from microbench.battery.disclosures import Disclosures
from microbench.measure.levels import verdict_text
from microbench.measure.sustainable import Capacity

__all__ = [
    "TEST_DATA",
    "BatteryReport",
    "SystemInfo",
    "Table",
    "TestData",
    "TestDataField",
    "TestResult",
    "WarmupResult",
    "capacity_rows",
    "level_rate_rows",
    "ms",
    "num",
    "parse_test_data",
    "pct",
]


class Table(StrictModel):
    """A report table: a title, column names and rows of already formatted cells."""

    title: str
    columns: list[str]
    rows: list[list[str]]
    note: str = ""


class TestData(StrictModel):
    """Base of every test's measurements; ``test`` names the registered test."""

    __test__ = False  # not a pytest class
    shows_capacity: ClassVar[bool] = False  # tables that print the battery's maximum
    test: str
    battery_capacity: Capacity | None = Field(
        default=None, description="the battery's one capacity, set by the runner once every test ran"
    )

    def tables(self) -> list[Table]:
        raise NotImplementedError

    def headline(self) -> dict[str, str]:
        """A few formatted key results for the summary (metric → value)."""
        return {}


TEST_DATA: Registry[type[TestData]] = Registry("battery test data")


def parse_test_data(value: Any) -> Any:
    """A mapping with a ``test`` key (or a ``TestData``) → the registered model; None stays None."""
    if value is None or isinstance(value, TestData):
        return value
    if not isinstance(value, dict) or "test" not in value:
        raise ValueError("test data is a mapping with a 'test' key")
    return TEST_DATA.get(str(value["test"])).model_validate(value)


TestDataField = Annotated[SerializeAsAny[TestData] | None, BeforeValidator(parse_test_data)]


class TestResult(StrictModel):
    """One test of the battery: whether it ran, its compliance, its data and its figures."""

    __test__ = False
    name: str
    section: str
    title: str
    status: Literal["ran", "skipped", "failed"]
    reason: str = Field(default="", description="why it was skipped or failed")
    duration_s: float = 0.0
    requirements: list[Requirement] = Field(default_factory=list)
    verdict: Verdict = "not run"
    notes: list[str] = Field(default_factory=list, description="deviations and declarations")
    data: TestDataField = None
    figures: list[str] = Field(default_factory=list, description="PNG files under figures/")


class WarmupResult(StrictModel):
    """§4.5: what the warm-up did and whether it was verified (or that a cold start was measured)."""

    cold_start: bool
    requests: int = 0
    output_tokens: int = 0
    queue_drained: bool | None = None
    probe_before_s: float | None = None
    probes_after_s: list[float] = Field(default_factory=list)
    variation: float | None = Field(
        default=None, description="(max − min) / median of the last round of probes after"
    )
    requirements: list[Requirement] = Field(default_factory=list)


class SystemInfo(StrictModel):
    """System identification (C.1/C.2)."""

    model: str
    engine_kind: str
    engine_version: str | None = None
    base_url: str
    hardware: str
    accelerators: int = Field(..., ge=0, description="GPU count (0: CPU only)")
    cpu_count: int
    sut_boundary: str = "Model Engine"
    engine_settings: dict[str, Any] = Field(default_factory=dict)
    max_model_len: int | None = None
    prefix_caching: bool | None = Field(default=None, description="None: not known (external engine)")
    guardrails: str = "none: no input or output content filtering in front of the engine"


class BatteryReport(StrictModel):
    """Everything a battery run produced (raw traces live beside it under traces/)."""

    version: Literal[1] = 1  # update on a breaking change of the report's fields
    created_at: str
    command: str
    profile: str
    seed: int
    workload: str
    workload_spec: dict[str, Any] = Field(
        default_factory=dict, description="the battery workload's full spec (4.3.3: repeatable exactly)"
    )
    system: SystemInfo
    warmup: WarmupResult
    tests: list[TestResult]
    git_commit: str | None = None
    notes: list[str] = Field(default_factory=list)
    capacity: Capacity | None = Field(default=None, description="every maximum in the report comes from here")
    disclosures: Disclosures | None = Field(
        default=None, description="what the report declares, each measured, stated or not stated"
    )

    def result(self, name: str) -> TestResult | None:
        return next((t for t in self.tests if t.name == name), None)


def ms(seconds: float | None) -> str:
    """Seconds → '123.4 ms' ('–' when missing)."""
    return "–" if seconds is None else f"{seconds * 1e3:.1f} ms"


def num(value: float | None, fmt: str = ".1f", unit: str = "") -> str:
    return "–" if value is None else f"{value:{fmt}}{unit}"


def pct(value: float | None) -> str:
    return "–" if value is None else f"{value * 100:.1f}%"


def _pm(value: float | None, ci: float | None, unit: str) -> str:
    if value is None:
        return "–"
    return f"{value:.1f} ± {ci:.1f}{unit}" if ci is not None else f"{value:.1f}{unit}"


def capacity_rows(cap: Capacity | None) -> list[list[str]]:
    """The battery's maximum, as every test that names one shows it (Metric, Value)."""
    if cap is None:
        return [["Max Output Throughput", "not measured (the capacity measurement did not run)"]]
    return [
        [
            "Max Output Throughput (sustainable)",
            _pm(cap.max_output_tps, cap.max_output_tps_ci, " tok/s")
            + (f" ({cap.max_source})" if cap.max_source else ""),
        ],
        ["Max Request Throughput (at that level)", num(cap.max_rps, ".2f", " req/s")],
        [
            "Max sustainable open-loop rate",
            num(cap.sustainable_rate_rps, ".2f", " req/s")
            + (f" ({cap.sustainable_rate_source})" if cap.sustainable_rate_source else ""),
        ],
        [
            "Peak throughput, any level (saturated included)",
            num(cap.peak_output_tps, ".1f", " tok/s") + (f" ({cap.peak_source})" if cap.peak_source else ""),
        ],
    ]


def level_rate_rows(title: str, rows: list[Any]) -> Table:
    """Load levels with offered, sent and achieved rates and the saturation verdict (LevelRow objects)."""
    body = []
    for r in rows:
        closed = r.loop == "closed"
        body.append(
            [
                f"c = {r.offered:.0f}" if closed else f"{r.offered:.2f} req/s",
                "–" if closed else num(r.sent_rps, ".2f"),
                f"{r.request_rps:.2f}",
                _pm(r.output_tps, r.output_tps_ci, ""),
                ms(r.e2e.p50),
                ms(r.e2e.p99),
                f"{r.steady.ramp_s:.2f}",
                f"{r.steady.queue_growth:+.1f} (limit {r.steady.growth_limit:.1f})",
                "yes" if r.sustainable else "no",
                verdict_text(r) or "–",
            ]
        )
    return Table(
        title=title,
        columns=[
            "Offered",
            "Sent (req/s)",
            "Achieved (req/s)",
            "Output (tok/s)",
            "E2E P50",
            "E2E P99",
            "Ramp skipped (s)",
            "In-flight growth (req)",
            "Sustainable",
            "Saturation signs",
        ],
        rows=body,
        note="rates over the nominal issuing window less the ramp; ± is the 95% half-width from the Poisson "
        "count of completions (conservative for a closed loop, which has no arrival noise)",
    )
