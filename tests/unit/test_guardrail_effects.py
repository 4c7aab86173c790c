"""Battery 5.10 compares each configuration with the baseline (analysis.effects, per-request values)."""

from __future__ import annotations

import numpy as np
import pytest

from microbench.battery.sections.guardrail import GuardrailData, config_effects


def test_each_configuration_is_compared_with_the_baseline_at_each_level() -> None:
    rng = np.random.default_rng(4)
    samples: dict[tuple[str, float, str], list[float]] = {}
    for f in (0.25, 0.5):
        for fig in ("ttft", "e2e"):
            base = 0.1 * np.exp(rng.normal(0, 0.05, 60))
            samples[("bare", f, fig)] = list(base)
            samples[("filter", f, fig)] = list(1.2 * base * np.exp(rng.normal(0, 0.01, 60)))
            samples[("same", f, fig)] = list(0.1 * np.exp(rng.normal(0, 0.05, 60)))
    effects = config_effects(samples, "bare")
    assert len(effects) == 2 * 2 * 2  # two configurations × two levels × two figures
    for e in effects:
        if e.config == "filter":
            assert e.ratio == pytest.approx(1.2, rel=0.03) and e.verdict == "B worse" and e.n_a == e.n_b == 60
        else:
            assert e.ratio == pytest.approx(1.0, abs=0.05) and e.verdict in (
                "no detectable difference",
                "undecided",
            )
    data = GuardrailData(
        configs={"bare": "u", "filter": "v", "same": "w"}, max_throughput={}, levels=[], effects=effects
    )
    table = data.tables()[-1]
    assert len(table.rows) == 8 and any("filter worse" in row[-1] for row in table.rows)


def test_a_level_one_configuration_never_reached_is_listed() -> None:
    samples = {("bare", 0.5, "ttft"): [0.1, 0.11, 0.12], ("filter", 0.5, "e2e"): [0.2, 0.21, 0.2]}
    verdicts = {(e.config, e.figure): e.verdict for e in config_effects(samples, "bare")}
    assert verdicts == {("filter", "ttft"): "only in A", ("filter", "e2e"): "only in B"}
