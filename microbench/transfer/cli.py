"""``python -m microbench.transfer``: the PD-disaggregation transfer lifecycle, measured (seed 002, #2).

A producer (prefill) and a consumer (decode) engine joined by a vLLM KV connector, and the in-repo
proxy between them: per P and repetition, one cold prompt goes producer (``max_tokens=1``) → KV
hand-off → consumer, every phase stamped; the same P on one engine gives the colocated TTFT. The end
fits ``setup + P × kv_bytes_per_token / bandwidth`` and writes it as the ``measured-local`` link profile.

Examples::

    python -m microbench.transfer                                   # NIXL between two CPU engines
    python -m microbench.transfer --config sweeps/transfer-smoke.yaml
    python -m microbench.transfer --P 1024 4096 --reps 1 --connector example-storage
    python -m microbench.transfer --resume                          # continue the newest transfer run
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import sys
from pathlib import Path
from typing import Any

from rich.console import Console

from benchcore.provenance import git_commit, hardware_info, new_run_id, package_versions
from engine_harness.engines import engine_kind
from engine_harness.launch import EngineError
from microbench.results.records import Manifest
from microbench.transfer.config import (
    TransferConfig,
    TransferConfigError,
    list_connectors,
    load_transfer_config,
)
from microbench.transfer.folder import TransferFolder
from microbench.transfer.report import finish_run
from microbench.transfer.runner import TransferAborted, TransferRunner

__all__ = ["build_parser", "main", "manifest_notes"]

REPO = Path(__file__).resolve().parents[2]
_KEYS = ("prefill_tokens", "repetitions", "connector", "decode_tokens", "producer_chunk", "consumer_chunk",
         "producer_cores", "consumer_cores", "token_range", "colocated")  # fmt: skip


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m microbench.transfer",
        description=(__doc__ or "").split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    a = p.add_argument
    a("--config", type=Path, help="a transfer definition, e.g. sweeps/transfer-smoke.yaml")
    a(
        "--P",
        type=int,
        nargs="+",
        dest="prefill_tokens",
        metavar="P",
        help="prompt lengths (default 1024…16384)",
    )
    a("--reps", type=int, dest="repetitions", help="repetitions per P (default 3)")
    a("--connector", help=f"connector preset: {', '.join(list_connectors())} (default nixl-cpu)")
    a("--decode-tokens", type=int, help="tokens the consumer decodes per request (default 4)")
    a(
        "--producer-chunk",
        type=int,
        help="producer token budget (default: preset's; ≥ max P if it must not chunk)",
    )
    a("--consumer-chunk", type=int, help="consumer token budget")
    a("--producer-cores", help="VLLM_CPU_OMP_THREADS_BIND of the producer (default 0)")
    a("--consumer-cores", help="VLLM_CPU_OMP_THREADS_BIND of the consumer (default 1)")
    a("--token-range", help="LO:HI token ids for prompts (default: read from the model)")
    a("--no-colocated", dest="colocated", action="store_false", default=None, help="skip the colocated TTFT")
    a("--engine", choices=["vllm", "sim"], dest="kind", help="engine kind of both roles (default vllm)")
    a("--model", help="model folder or hub name (default: the bundled tiny Qwen3-MoE)")
    a("--out", type=Path, default=REPO / "results", help="results folder (default results/)")
    a("--run-id", help="name of the run folder (default: UTC time + 'transfer-' + name)")
    a("--resume", action="store_true", help="continue a stopped run (--run-id, or the newest transfer run)")
    return p


def manifest_notes(cfg: TransferConfig) -> list[str]:
    """The caveats a reader of the results must know, stored in the manifest."""
    preset = cfg.connector_preset()
    producer, consumer = cfg.producer_spec(), cfg.consumer_spec()
    notes = [
        f"connector {preset.name}: {preset.description}",
        "colocated TTFT is measured on the producer engine (same settings, no kv_transfer_params) while the "
        "consumer engine idles beside it",
        "phases are client/proxy perf_counter_ns stamps in one process; engine-side times are /metrics "
        "histogram-sum deltas around each request",
    ]
    if engine_kind(producer.kind).cpu_thread_binding:
        notes.append(
            f"CPU contention: both engines share one host ({producer.cpu_threads_bind=}, "
            f"{consumer.cpu_threads_bind=}); idle NIXL engines were seen to keep ~half a core busy each, so "
            "absolute times include interference between the two engines"
        )
    if engine_kind(producer.kind).cpu_thread_binding and cfg.pin_engine_threads:
        notes.append(
            "every thread of each engine's processes (API server, engine core, worker) was pinned to that "
            "engine's core after start-up; VLLM_CPU_OMP_THREADS_BIND alone pins only the compute threads, "
            "and in a first probe without this the busy-polling threads of one engine shared the other's "
            "core (prefills up to ~10x slower, colocated TTFT erratic)"
        )
    if preset.producer_must_not_chunk:
        notes.append(
            f"producer token budget {producer.chunk_size} covers the largest P {max(cfg.prefill_tokens)}: "
            f"{preset.name} crashes the consumer when the producer chunks the prompt (DESIGN §2)"
        )
    return notes


def _resolve(args: argparse.Namespace) -> tuple[TransferFolder, TransferConfig, bool]:
    overrides: dict[str, Any] = {k: getattr(args, k) for k in _KEYS}
    overrides["engine"] = {"kind": args.kind, "model": args.model}
    if args.resume:
        runs = sorted(args.out.glob("*transfer*/manifest.json")) if args.out.is_dir() else []
        run_id = args.run_id or (max(runs, key=lambda p: p.stat().st_mtime).parent.name if runs else None)
        if run_id is None:
            raise TransferConfigError(f"--resume: no transfer run with a manifest in {args.out}")
        folder = TransferFolder(args.out / run_id)
        if not folder.exists():
            raise TransferConfigError(f"--resume: {folder.root} has no manifest.json")
        given = [k for k, v in overrides.items() if k != "engine" and v is not None]
        given += [k for k, v in overrides["engine"].items() if v is not None] + (
            ["--config"] if args.config else []
        )
        if given:
            raise TransferConfigError(f"--resume continues the stored definition; drop {', '.join(given)}")
        return folder, TransferConfig.model_validate(folder.read_manifest().sweep), True
    cfg = load_transfer_config(args.config, overrides)
    folder = TransferFolder(args.out / (args.run_id or new_run_id(f"transfer-{cfg.name}")))
    if folder.exists():
        raise TransferConfigError(f"run {folder.root} exists: pass --resume, or choose another --run-id")
    return folder, cfg, False


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    console = Console()
    try:
        folder, cfg, resumed = _resolve(args)
    except TransferConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if not resumed:
        from engine_harness.telemetry import NvmlSource

        folder.write_manifest(
            Manifest(
                run_id=folder.root.name,
                created_utc=dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
                sweep=cfg.model_dump(mode="json"),
                engine_spec={
                    "producer": cfg.producer_spec().model_dump(mode="json"),
                    "consumer": cfg.consumer_spec().model_dump(mode="json"),
                    "connector": cfg.connector_preset().model_dump(mode="json"),
                },
                engine_version=None,
                hardware=hardware_info(NvmlSource.gpu_names()),
                packages=package_versions() | _connector_packages(),
                git_commit=git_commit(REPO),
                seed=0,
                notes=manifest_notes(cfg),
            )
        )
    console.print(f"run folder: {folder.root}")
    runner = TransferRunner(folder, cfg, console)
    code = 0
    try:
        asyncio.run(runner.run())
    except KeyboardInterrupt:
        console.print(
            "[yellow]stopped; continue with: python -m microbench.transfer --resume --run-id "
            + folder.root.name
        )
        code = 130
    except (TransferAborted, EngineError, OSError) as exc:
        console.print(f"[red]error: {exc}")
        code = 1
    finish_run(folder, cfg, console)
    if runner.failures and code == 0:
        code = 1
    return code


def _connector_packages() -> dict[str, str]:
    import importlib.metadata

    out = {}
    for name in ("nixl", "nixl-cu12", "mooncake-transfer-engine"):
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return out


if __name__ == "__main__":
    sys.exit(main())
