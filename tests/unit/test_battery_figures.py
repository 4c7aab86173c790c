"""Each battery test registers its figure with itself (register_test(..., figure=...)); the report's
figures and captions come from that registration, with no list of tests anywhere else."""

from __future__ import annotations

from microbench.battery import sections as _sections  # noqa: F401  (registers the tests)
from microbench.battery.plots import caption_for
from microbench.battery.registry import TESTS


def test_the_tests_that_draw_a_figure_registered_it_with_a_caption() -> None:
    with_figure = {name for name in TESTS.names() if TESTS.get(name).figure is not None}
    assert with_figure == {"ttft", "throughput", "tradeoff", "itl", "capacity", "long_context"}
    for name in with_figure:
        assert caption_for(name).startswith(f"Figure {TESTS.get(name).section}:")
    assert caption_for("fairness") == "Figure: fairness"  # no figure registered: a plain caption
