"""The transfer benchmark's analysis: per-P breakdown and contention (``breakdown``), the link fit and
its profile (``fit``), the figure (``figure``). Reads ``microbench.results.transfer`` records only."""

__all__: list[str] = []
