"""Workloads: the IETF draft's five reference workloads and seed-003 client-mix specs (YAML).

``reference_workload(name)`` or ``load_workload_spec(path)`` gives a ``WorkloadSpec``; ``Workload(spec,
PromptFactory(space))`` turns it into requests for a scheduler (``requests()``) or a self-timed plan
(``plan(duration_s)``).
"""

from microbench.workloads.distributions import DISTRIBUTIONS, LengthDist, parse_length_dist
from microbench.workloads.generator import Workload
from microbench.workloads.prompts import PromptFactory, TextRenderer, load_tokenizer
from microbench.workloads.reference import WORKLOADS, reference_workload
from microbench.workloads.spec import WorkloadSpec, WorkloadSpecError, load_workload_spec

__all__ = [
    "DISTRIBUTIONS",
    "WORKLOADS",
    "LengthDist",
    "PromptFactory",
    "TextRenderer",
    "Workload",
    "WorkloadSpec",
    "WorkloadSpecError",
    "load_tokenizer",
    "load_workload_spec",
    "parse_length_dist",
    "reference_workload",
]
