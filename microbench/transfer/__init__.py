"""Transfer lifecycle (seed 002, second microbenchmark): PD-disaggregation TTFT breakdown, measured.

``python -m microbench.transfer`` (``cli``) composes the shared floor: a producer and a consumer engine
joined by a KV-connector preset (``engine_harness.kv_connectors``), pinned to their cores
(``engine_harness.process_group``), behind the PD proxy (``microbench.measure.pd_proxy``). It stamps
every phase of each request (``measure``) under the no-progress watchdog (``engine_harness.watchdog``),
samples each engine's idle CPU (``engine_harness.idle_cpu``), then measures the producer's engine alone
as the uncontended baseline (``runner``, engines from ``engine_pair``), and writes records
(``microbench.results.transfer``) in its run folder (``microbench.results.layout.transfer``). The end
(``report``) derives the breakdown, the link fit and the figure with ``analysis.transfer``.
"""

__all__: list[str] = []
