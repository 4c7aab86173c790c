"""Observe → predict → calibrate (seed 003 §11): a simulator fitted from a sweep, checked against traces.

``config`` (fit → sim settings), ``replay`` (virtual-time replay through the one scheduler,
``engine_harness.scheduler_model``), ``predict`` (a predicted trace folder), ``metrics`` (per-request
latencies of a trace), ``stats`` (the statistics, pure), ``report`` (one typed ``CalibrationReport``),
``pages`` (its renderers and figures); ``python -m analysis.calibrate predict|report`` is the command line.
"""

__all__: list[str] = []
