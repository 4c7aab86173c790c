"""A simulated engine with vLLM's HTTP and /metrics surface and a known step-time model.

Start it in-process with ``SimServer`` (tests, benchmarks) or as a process with
``python -m engine_harness.sim`` (engine kind ``sim``). Its ground truth is the step log:
``SimServer.step_log``, ``GET /sim/steps`` or ``--step-log FILE.jsonl``.
"""

from engine_harness.scheduler_model import Scheduler, SimRequest, StepPlan
from engine_harness.sim.engine import EngineDead, RequestStream, SimEngine
from engine_harness.sim.params import FaultConfig, SimConfig, SimStepModel, load_config
from engine_harness.sim.server import SIM_VERSION, SimServer
from engine_harness.sim.step_record import StepRecord

__all__ = [
    "SIM_VERSION",
    "EngineDead",
    "FaultConfig",
    "RequestStream",
    "Scheduler",
    "SimConfig",
    "SimEngine",
    "SimRequest",
    "SimServer",
    "SimStepModel",
    "StepPlan",
    "StepRecord",
    "load_config",
]
