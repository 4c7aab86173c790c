"""``python -m engine_harness``: start an engine with the suite's settings, or inspect a running one.

python -m engine_harness serve [--preset cpu] [--engine vllm] [--chunk 2048] [--port 8000] [--out DIR] …
python -m engine_harness inspect http://127.0.0.1:8000 [--engine vllm]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path

import aiohttp

from benchcore.cli import BadInput, run_cli
from benchcore.flags import add_out, duration
from engine_harness.engines import DEFAULT_PRESET, ENGINE_KINDS, EngineSpec, engine_kind, resolve_spec
from engine_harness.flags import add_engine_flags, engine_overrides
from engine_harness.handles import model_cards
from engine_harness.launch import EngineError, EngineProcess
from engine_harness.metrics import MetricsError, scrape
from engine_harness.process_group import core_text, isolation_plan

__all__ = ["main"]


def _spec_from_args(args: argparse.Namespace) -> EngineSpec:
    if args.url:
        raise ValueError("serve starts an engine; --url is for an engine someone else started (inspect it)")
    overrides = engine_overrides(args)
    return resolve_spec(
        args.preset or DEFAULT_PRESET,
        kind=overrides["kind"],
        model=overrides["model"],
        api_key_env=overrides["api_key_env"],
        served_model_name=args.served_model_name,
        port=args.port,
        host=args.host,
        chunk_size=args.chunk,
        prefix_caching=False if args.no_prefix_caching else None,
        enforce_eager=True if args.enforce_eager else None,
        max_model_len=args.max_model_len,
        max_num_seqs=args.max_num_seqs,
        log_iteration_details=True if args.log_iteration_details else None,
        isolate_worker=True if args.isolate_worker else None,
        extra_args=overrides["extra_args"],
    )


async def _serve(spec: EngineSpec, log_path: Path, timeout_s: float) -> None:
    print(f"starting {spec.kind} engine for {spec.model}; log: {log_path}", flush=True)
    async with EngineProcess(spec, log_path, startup_timeout_s=timeout_s) as engine:
        print(
            f"ready in {engine.startup_s:.1f} s: {engine.base_url} (version {engine.version}, "
            f"model name {spec.model_name!r}); Ctrl-C stops it",
            flush=True,
        )
        print("argv: " + " ".join(engine.argv), flush=True)
        if spec.isolate_worker:
            plan = isolation_plan(spec.cpu_threads_bind)
            print(
                f"worker on core(s) {core_text(plan.worker)}, the rest on {core_text(plan.host)}: run the "
                f"client there too (taskset -c {core_text(plan.host)} …)",
                flush=True,
            )
        await engine.wait_exit()
        raise EngineError(f"engine exited by itself; see {log_path}")


async def _inspect(url: str, kind: str) -> dict[str, object]:
    names = engine_kind(kind).metrics
    base = url.rstrip("/")
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as session:
        try:
            model_ids = [m.get("id") for m in await model_cards(session, base)]
        except (aiohttp.ClientResponseError, KeyError, TypeError):
            model_ids = []
        version = None
        async with session.get(f"{base}{engine_kind(kind).version_path}") as resp:
            if resp.status == 200:
                version = (await resp.json(content_type=None)).get("version")
        snap = await scrape(session, base)
    summary = {
        "requests_running": snap.total(names.requests_running),
        "requests_waiting": snap.total(names.requests_waiting),
        "kv_cache_usage": snap.total(names.kv_cache_usage),
        "prompt_tokens": snap.total(names.prompt_tokens),
        "generation_tokens": snap.total(names.generation_tokens),
        "prefix_cache_queries": snap.total(names.prefix_cache_queries),
        "prefix_cache_hits": snap.total(names.prefix_cache_hits),
        "preemptions": snap.total(names.preemptions),
        "engine_steps": (snap.histogram(names.iteration_tokens) or {}).get(float("inf")),
    }
    return {"url": base, "version": version, "models": model_ids, "metrics": summary}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m engine_harness", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="start an engine and hold it until Ctrl-C")
    add_engine_flags(serve, kinds=sorted(k for k, v in ENGINE_KINDS.items() if v.launched))
    serve.add_argument("--served-model-name")
    serve.add_argument("--host", help="bind address (default 127.0.0.1)")
    serve.add_argument("--port", type=int, help="port (default: a free one)")
    serve.add_argument("--chunk", type=int, help="max-num-batched-tokens / chunked-prefill-size")
    serve.add_argument("--no-prefix-caching", action="store_true")
    serve.add_argument("--enforce-eager", action="store_true")
    serve.add_argument("--max-model-len", type=int)
    serve.add_argument("--max-num-seqs", type=int)
    serve.add_argument(
        "--log-iteration-details",
        action="store_true",
        help="log every engine step (vLLM: iteration details; SGLang: every decode batch, stamped lines)",
    )
    serve.add_argument(
        "--isolate-worker",
        action="store_true",
        help="vLLM or SGLang on CPU: the worker's threads alone on every core but the last (vLLM: "
        "VLLM_CPU_OMP_THREADS_BIND; SGLang: its scheduler pinned there once up, one OpenMP thread per "
        "core), the engine's other processes on the last; run the client there too (serve prints how)",
    )
    add_out(serve, "results/serve-<UTC time>; the engine's log is DIR/engine.log")
    serve.add_argument(
        "--startup-timeout", type=duration, default=600.0, help="wait for /health (default 10m)"
    )
    inspect = sub.add_parser("inspect", help="print a running engine's model, version and metrics summary")
    inspect.add_argument("url", help="base URL, e.g. http://127.0.0.1:8000")
    inspect.add_argument(
        "--engine",
        default="vllm",
        choices=sorted(ENGINE_KINDS),
        metavar="KIND",
        help="which engine's metric-name table to read /metrics with (default vllm)",
    )
    return parser


def _run(args: argparse.Namespace, out: Path) -> int:
    try:
        if args.command == "serve":
            asyncio.run(_serve(_spec_from_args(args), out / "engine.log", args.startup_timeout))
        else:
            print(json.dumps(asyncio.run(_inspect(args.url, args.engine)), indent=2))
    except (EngineError, MetricsError, ValueError, aiohttp.ClientError) as exc:
        raise BadInput(str(exc)) from None
    return 0


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    out = getattr(args, "out", None) or Path("results") / f"serve-{time.strftime('%Y%m%d-%H%M%S')}"
    return run_cli(lambda: _run(args, out), lambda: out if args.command == "serve" else None)


if __name__ == "__main__":
    sys.exit(main())
