"""The ten tests of the draft's §5, one module each; importing this package registers them in order."""

from microbench.battery.sections import (
    capacity,  # 5.5
    fairness,  # 5.6
    guardrail,  # 5.10
    itl,  # 5.4
    long_context,  # 5.9
    memory_pressure,  # 5.8
    prefix_cache,  # 5.7
    throughput,  # 5.2
    tradeoff,  # 5.3
    ttft,  # 5.1
)

__all__ = [
    "capacity",
    "fairness",
    "guardrail",
    "itl",
    "long_context",
    "memory_pressure",
    "prefix_cache",
    "throughput",
    "tradeoff",
    "ttft",
]
