"""Transfer lifecycle (seed 002, second microbenchmark): PD-disaggregation TTFT breakdown, measured.

``python -m microbench.transfer`` runs a producer and a consumer engine joined by a vLLM KV connector
(presets in ``engine_harness/connectors/``) behind the in-repo proxy (``proxy``), stamps every phase of
each request (``measure``), writes records in the sweep's run-folder conventions (``folder``,
``records``), fits ``setup + P × kv_bytes_per_token / bandwidth`` (``fit``) as a link profile for the
break-even analysis, and draws the TTFT breakdown (``figure``).
"""

__all__: list[str] = []
