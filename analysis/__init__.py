"""Reads result folders (never an engine): tables, interference models, break-even, offload policy, figures.

Modules: ``table`` (run folder → ``interference_table.csv``), ``steps`` (per-step/per-window fit data),
``models`` (seed and step models), ``breakeven`` (KV transfer cost, link profiles in ``links/``),
``policy`` (offload lookup table + CLI), ``plots`` (Figures), ``criteria`` (seed 002's success criteria,
each verdict naming what it judged), ``sweep_report`` (the sweep's one typed report: ``SweepReport``),
``report`` (its Markdown/HTML renderers + CLI; page template in ``templates/``),
``synthetic`` (a run folder from a known step model, for tests and demos), ``calibrate`` (a simulator
fitted from a sweep predicts a recorded trace; the calibration report says how far it is).
"""

from benchcore.matplotlib_dir import private_matplotlib_dir

__all__: list[str] = []

private_matplotlib_dir()  # before any module of the package imports matplotlib: nothing written in ~
