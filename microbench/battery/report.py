"""The battery's one typed result: ``BatteryReport``; JSON, Markdown and HTML are renderers of it.

A test's numbers live in its own ``TestData`` subclass, registered by test name (``TEST_DATA``) so a report
read back from JSON gets the same typed objects. Each ``TestData`` lays itself out as ``Table`` objects
(the draft's report tables) and names its headline numbers; renderers never know a test's fields.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BeforeValidator, Field, SerializeAsAny

from benchcore.registry import Registry
from benchcore.schema import StrictModel
from microbench.battery.compliance import Requirement, Verdict

__all__ = [
    "REPORT_VERSION",
    "TEST_DATA",
    "BatteryReport",
    "SystemInfo",
    "Table",
    "TestData",
    "TestDataField",
    "TestResult",
    "WarmupResult",
    "ms",
    "num",
    "parse_test_data",
    "pct",
]

REPORT_VERSION = 1  # update on a breaking change of the report's fields


class Table(StrictModel):
    """A report table: a title, column names and rows of already formatted cells."""

    title: str
    columns: list[str]
    rows: list[list[str]]
    note: str = ""


class TestData(StrictModel):
    """Base of every test's measurements; ``test`` names the registered test."""

    __test__ = False  # not a pytest class
    test: str

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
    variation: float | None = Field(default=None, description="(max − min) / median of the probes after")
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

    version: Literal[1] = 1
    created_at: str
    command: str
    profile: str
    seed: int
    workload: str
    system: SystemInfo
    warmup: WarmupResult
    tests: list[TestResult]
    git_commit: str | None = None
    notes: list[str] = Field(default_factory=list)

    def result(self, name: str) -> TestResult | None:
        return next((t for t in self.tests if t.name == name), None)


def ms(seconds: float | None) -> str:
    """Seconds → '123.4 ms' ('–' when missing)."""
    return "–" if seconds is None else f"{seconds * 1e3:.1f} ms"


def num(value: float | None, fmt: str = ".1f", unit: str = "") -> str:
    return "–" if value is None else f"{value:{fmt}}{unit}"


def pct(value: float | None) -> str:
    return "–" if value is None else f"{value * 100:.1f}%"
