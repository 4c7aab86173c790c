"""Transfer lifecycle (seed 002, second microbenchmark): PD-disaggregation TTFT breakdown, measured.

``python -m microbench.transfer`` (``cli``) runs a producer and a consumer engine joined by a vLLM KV
connector (presets in ``engine_harness/connectors/``) behind the in-repo proxy (``proxy``), stamps
every phase of each request (``measure``) with a watchdog for hung engines (``watchdog``), samples each
engine's idle CPU (``idle``), then the producer's engine alone as the uncontended baseline (``runner``),
and writes records (``microbench.results.transfer``) in the run-folder conventions (``folder``). The
end (``report``) derives the breakdown, the link fit and the figure with ``analysis.transfer``.
"""

__all__: list[str] = []
