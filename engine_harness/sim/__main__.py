"""Command line of the simulated engine: ``python -m engine_harness.sim --model NAME --port N [...]``.

Accepts the flags ``engine_harness.engines`` passes for kind ``sim`` (``--model --host --port
--max-num-batched-tokens --max-num-seqs --block-size --no-prefix-caching``) and its own (step-time model,
mode, time scale, faults, step log, ``--reuse-port`` for several sim processes on one port). Settings:
defaults → ``--params FILE.yaml`` (or a preset name) → flags. On the die faults the process exits at
once with status 70, like a crashed engine.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import os
import signal
import sys
from pathlib import Path
from typing import Any

import uvloop

from engine_harness.sim.gpu_modes import startup_lines
from engine_harness.sim.params import SimConfig, load_config
from engine_harness.sim.server import SIM_VERSION, SimServer

__all__ = ["build_parser", "config_from_args", "main"]

DIE_EXIT_STATUS = 70


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m engine_harness.sim", description=__doc__.splitlines()[0])
    a = p.add_argument
    a("--params", help="YAML file of settings (or the name of a file in engine_harness/sim/presets)")
    a("--model", help="served model name")
    a("--host")
    a("--port", type=int)
    a("--reuse-port", action="store_const", const=True, help="SO_REUSEPORT: more sim processes on one port")
    a("--mode", choices=["vllm", "sglang", "sglang-mixed"])
    a("--max-num-batched-tokens", type=int, help="token budget per step (chunk size)")
    a("--max-num-seqs", type=int)
    a("--block-size", type=int)
    a("--kv-blocks", type=int, dest="num_kv_blocks", help="KV blocks in the pool")
    a("--max-model-len", type=int)
    a("--memory-tokens", type=int, help="memory after the weights, in KV tokens (activations + KV pool)")
    a("--activation-tokens", type=float, help="activation memory per batched token, in KV tokens")
    a("--no-prefix-caching", action="store_const", const=False, dest="enable_prefix_caching")
    a("--enable-prompt-tokens-details", action="store_const", const=True)
    a("--alpha-ms", type=float, help="step model: fixed cost per step (ms)")
    a(
        "--prefill-fixed-ms",
        type=float,
        help="step model: extra fixed cost of a step carrying prompt tokens (ms)",
    )
    a("--beta-d-ms", type=float, help="step model: cost per decode token (ms)")
    a("--beta-c-ms", type=float, help="step model: cost per prefill token (ms)")
    a("--gamma-ns", type=float, help="step model: cost per chunk token × (context + chunk/2) token (ns)")
    a("--delta-ns", type=float, help="step model: cost per decode token × its context token (ns)")
    a("--lambda-ns", type=float, help="step model: cost per prefill chunk × its cached context token (ns)")
    a("--frontend-ns-per-token", type=float, help="API-server time per prompt token before the engine")
    a("--jitter", type=float, help="step model: relative std of a seeded Gaussian factor")
    a("--eager-ms", type=float, help="step model: extra cost of a step above the CUDA-graph ceiling (ms)")
    a("--cuda-graph-max-tokens", type=int, help="step model: largest step run as a CUDA graph (0: none)")
    a("--host-ms", type=float, help="host work per step before the device runs it (ms)")
    a("--host-ns-per-token", type=float, help="host work per step token (ns)")
    a("--executor", choices=["mp", "uni"], help="vLLM's executor the steps are timed as")
    a("--async-scheduling", action=argparse.BooleanOptionalAction, default=None, help="two batches in flight")
    a(
        "--vllm-log",
        action="store_const",
        const=True,
        help="log like CUDA vLLM (start-up, stamped iterations)",
    )
    a("--time-scale", type=float, help="wall seconds per model second (0: as fast as possible)")
    a("--busy-wait-ms", type=float)
    a("--seed", type=int)
    a("--eos-probability", type=float)
    a("--step-log", type=Path, dest="step_log_path", help="append every step to this JSONL file")
    a("--step-log-max", type=int, help="steps kept in memory for /sim/steps")
    a("--error-500-fraction", type=float)
    a("--error-429-fraction", type=float)
    a("--retry-after-s", type=float, help="Retry-After header (s) on injected 429s")
    a("--cut-after-chunks", type=int)
    a("--cut-fraction", type=float)
    a("--slow-start-s", type=float)
    a("--die-after-requests", type=int)
    a("--die-at-s", type=float)
    a("--death", choices=["crash", "vllm"], help="how the engine dies (crash: the port closes at once)")
    a("--stall-step", type=int)
    a("--stall-s", type=float)
    a("--kv-transfer-setup-ms", type=float, help="simulated KV link: fixed cost per hand-off (ms)")
    a("--kv-transfer-gbit-s", type=float, help="simulated KV link: bandwidth (10⁹ bit/s)")
    a("--kv-bytes-per-token", type=int, help="simulated KV link: bytes per prompt token")
    return p


_STEP_KEYS = (
    "alpha_ms", "prefill_fixed_ms", "beta_d_ms", "beta_c_ms", "gamma_ns", "delta_ns", "lambda_ns", "jitter",
    "eager_ms", "cuda_graph_max_tokens",
)  # fmt: skip
_FAULT_KEYS = (
    "error_500_fraction",
    "error_429_fraction",
    "retry_after_s",
    "cut_after_chunks",
    "cut_fraction",
    "slow_start_s",
    "die_after_requests",
    "die_at_s",
    "death",
    "stall_step",
    "stall_s",
)


_LINK_KEYS = {  # flag dest -> KvTransferModel field
    "kv_transfer_setup_ms": "setup_ms",
    "kv_transfer_gbit_s": "bandwidth_gbit_s",
    "kv_bytes_per_token": "bytes_per_token",
}


def config_from_args(argv: list[str] | None = None) -> SimConfig:
    """Parse the command line into one validated ``SimConfig``."""
    ns = vars(build_parser().parse_args(argv))
    params = ns.pop("params")
    overrides: dict[str, Any] = {k: v for k, v in ns.items() if k not in _STEP_KEYS + _FAULT_KEYS}
    overrides["step"] = {k: ns[k] for k in _STEP_KEYS}
    overrides["faults"] = {k: ns[k] for k in _FAULT_KEYS}
    link = {field: ns[flag] for flag, field in _LINK_KEYS.items()}
    for flag in _LINK_KEYS:
        overrides.pop(flag, None)
    if any(v is not None for v in link.values()):
        overrides["kv_transfer"] = link
    return load_config(params, overrides)


async def _serve(config: SimConfig) -> int:
    server = SimServer(config)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    # SIGUSR1: the engine dies, the way --death says, as the next cold prompt prefills (the fault tier's
    # "kill the engine core during an injection")
    reason = "SIGUSR1: the engine core was killed"
    loop.add_signal_handler(signal.SIGUSR1, setattr, server.engine, "die_in_prefill", reason)
    await server.start()
    # As vLLM's API server does once it is up (vllm.utils.gc_utils.freeze_gc_heap): the start-up heap is
    # frozen out of the collector, so a full pass walks only what serving made, not the whole process
    # (unfrozen, the sim's full passes stalled it for tens of ms at 2000-4000 req/s on a 16-core box and
    # requests piled up behind them).
    gc.collect()
    gc.freeze()
    if config.vllm_log:
        print("\n".join(startup_lines(config)), flush=True)
    print(
        f"{SIM_VERSION} serving {config.model!r} on {server.base_url} (mode {config.mode}, "
        f"budget {config.max_num_batched_tokens}, time_scale {config.time_scale})",
        flush=True,
    )
    died = asyncio.create_task(server.died.wait())
    stopped = asyncio.create_task(stop.wait())
    await asyncio.wait({died, stopped}, return_when=asyncio.FIRST_COMPLETED)
    if server.died.is_set():
        print(f"sim engine died: {server.engine.dead}", flush=True)
        await asyncio.sleep(0.02)  # let the requests that finished before the death write their last bytes
        os._exit(DIE_EXIT_STATUS)  # like a crash: no orderly shutdown, connections reset
    stopped.cancel()
    died.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await asyncio.gather(stopped, died)
    await server.stop()
    return 0


def main(argv: list[str] | None = None) -> int:
    try:
        config = config_from_args(argv)
    except (ValueError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if (problem := config.memory_problem()) is not None:  # as vLLM: the start fails, exit status 1
        print(f"engine start-up failed: {problem}", file=sys.stderr, flush=True)
        return 1
    # uvloop (a dependency; the clients run on it too): its C transports cost less CPU per request, which
    # sets how many requests a second one sim serves (a bare aiohttp handler streaming 4 events: 170 µs
    # a request on uvloop, 205-260 on asyncio's loop, on a loaded 2-core box, 2026-11-28)
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        return runner.run(_serve(config))


if __name__ == "__main__":
    sys.exit(main())
