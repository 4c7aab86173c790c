"""The standard test battery of the IETF draft "LLM Benchmarking Methodology" (§5.1–5.10) and its reports.

Tests register by name (``registry.register_test``) in ``battery/sections/``; each takes a
``BatteryContext`` (engine, profile, workloads, load-generator runs) and returns typed data plus the
MUST/SHOULD requirements it checked (``compliance``). The measurement rules they compose (capacity search,
levels, saturation, sustainable rate, statistics) are the shared floor's, ``microbench.measure``; the
engine handle (restart with overrides) is ``engine_harness.handles``. ``runner.run_battery`` warms up
(§4.5), runs them and builds one ``BatteryReport``; ``runner.write_report`` renders it as JSON, Markdown
(C.1 and C.2) and self-contained HTML with figures. ``python -m microbench.battery run ...`` is the
command line.
"""

from microbench.battery.compliance import Requirement, verdict
from microbench.battery.context import BatteryContext
from microbench.battery.profiles import PROFILES, Profile, profile
from microbench.battery.registry import TESTS, SkipTest, register_test
from microbench.battery.report import BatteryReport, TestResult

# runner (run_battery, write_report) is imported from its module, not here: it loads the tests and
# matplotlib (≈ 1 s), and every python -m microbench.battery, --help included, imports this package

__all__ = [
    "PROFILES",
    "TESTS",
    "BatteryContext",
    "BatteryReport",
    "Profile",
    "Requirement",
    "SkipTest",
    "TestResult",
    "profile",
    "register_test",
    "verdict",
]
