"""Battery tests registered by name: ``@register_test("ttft", "5.1", "Time to First Token", estimate=...)``.

A test is an async function of a ``BatteryContext`` returning an ``Outcome`` (its typed data, the
requirements it checked, and notes). Raising ``SkipTest`` says why the engine or the run cannot give
what the test needs; the runner reports it as skipped with that reason. A test registers with itself
what the plan needs (``plan``): its estimate, and whether it scales its load by the capacity measurement.
A new test is a new module in ``sections/``: importing that package imports every module in it.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from benchcore.registry import Registry
from microbench.battery.compliance import Requirement, must, should
from microbench.battery.context import BatteryContext
from microbench.battery.plan import PlanEstimate
from microbench.battery.report import TestData

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = [
    "TESTS",
    "BatteryTest",
    "FigureSpec",
    "Outcome",
    "SkipTest",
    "TestFunction",
    "duration_requirement",
    "register_test",
    "sample_requirements",
]


class SkipTest(Exception):
    """The test cannot run against this engine or with these settings; the message says why."""


@dataclass
class Outcome:
    """What a test returns: its data, the requirements it checked, and declarations/deviations."""

    data: TestData
    requirements: list[Requirement] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


TestFunction = Callable[[BatteryContext], Awaitable[Outcome]]


@dataclass(frozen=True)
class FigureSpec:
    """A test's figure: ``plot(data)`` draws it from the test's data; ``caption`` says what it shows."""

    plot: Callable[[Any], Figure]
    caption: str


@dataclass(frozen=True)
class BatteryTest:
    name: str
    section: str
    title: str
    run: TestFunction
    estimate: PlanEstimate | None = None  # None: no load of its own (5.2 reports the capacity measurement)
    needs_capacity: bool = False  # scales its load by the capacity measurement (planned before it)
    figure: FigureSpec | None = None  # its figure in the report (microbench.battery.plots draws it)


TESTS: Registry[BatteryTest] = Registry("battery test")


def register_test(
    name: str,
    section: str,
    title: str,
    *,
    estimate: PlanEstimate | None = None,
    needs_capacity: bool = False,
    figure: FigureSpec | None = None,
) -> Callable[[TestFunction], TestFunction]:
    def add(fn: TestFunction) -> TestFunction:
        TESTS.register(name)(BatteryTest(name, section, title, fn, estimate, needs_capacity, figure))
        return fn

    return add


def sample_requirements(ref: str, count: int, *, p999: bool = True) -> list[Requirement]:
    """5.1.2.1 / 5.1.4.3: ≥ 1000 samples for P99, ≥ 10000 for P99.9 (only where P99.9 is reported)."""
    reqs = [must(ref, "at least 1000 samples for P99", count >= 1000, f"{count} samples")]
    if p999:
        reqs.append(must(ref, "at least 10000 samples for P99.9", count >= 10_000, f"{count} samples"))
    return reqs


def duration_requirement(ref: str, seconds: float, minimum: float, level: str = "MUST") -> Requirement:
    """A minimum test duration per load level (e.g. 60 s in 5.2.2.1 and 5.3.2)."""
    make = must if level == "MUST" else should
    return make(ref, f"at least {minimum:g} s per load level", seconds >= minimum, f"{seconds:.1f} s")
