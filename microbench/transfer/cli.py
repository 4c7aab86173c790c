"""``python -m microbench.transfer``: the PD-disaggregation transfer lifecycle, measured (seed 002, #2).

A producer (prefill) and a consumer (decode) engine joined by a vLLM KV connector, and the in-repo
proxy between them: per P and repetition, one cold prompt goes producer (``max_tokens=1``) → KV
hand-off → consumer, every phase stamped; the same P on one engine gives the colocated TTFT. The end
fits ``setup + P × kv_bytes_per_token / bandwidth`` and writes it as the ``measured-local`` link profile.

Examples::

    python -m microbench.transfer                                   # NIXL between two CPU engines
    python -m microbench.transfer --config sweeps/transfer-smoke.yaml
    python -m microbench.transfer --P 1024 4096 --reps 1 --connector example-storage
    python -m microbench.transfer --connector nixl-push-cpu --out results/push   # NIXL push mode
    python -m microbench.transfer --resume                          # continue the newest transfer run
                                                                    # (failed and invalid points again)
"""

from __future__ import annotations

import argparse
import datetime as dt
import sys
from pathlib import Path
from typing import Any

from benchcore.cli import EXIT_FAILURES, BadInput, run_cli
from benchcore.console import console as make_console
from benchcore.flags import add_config, add_out, duration
from benchcore.provenance import git_commit, hardware_info, new_run_id, package_versions
from engine_harness.engines import engine_kind
from engine_harness.flags import add_engine_flags, engine_overrides
from engine_harness.kv_connectors import CONNECTOR_DISTRIBUTIONS, list_connectors
from microbench.measure.engine_pair import run_pair_job
from microbench.results.layout import TransferFolder
from microbench.results.records import Manifest
from microbench.transfer.config import TransferConfig, TransferConfigError, load_transfer_config
from microbench.transfer.runner import TransferRunner

__all__ = ["build_parser", "main", "manifest_notes"]

REPO = Path(__file__).resolve().parents[2]
_KEYS = ("prefill_tokens", "repetitions", "connector", "decode_tokens", "producer_chunk", "consumer_chunk",
         "producer_cores", "consumer_cores", "token_range", "colocated", "alone", "phase_timeout_s",
         "stall_timeout_s", "spinners")  # fmt: skip


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m microbench.transfer",
        description=(__doc__ or "").split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    a = p.add_argument
    add_config(p, "sweeps/transfer-smoke.yaml")
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
    a(
        "--no-alone",
        dest="alone",
        action="store_false",
        default=None,
        help="skip the lone-engine baseline (no connector, no peer; an extra engine start)",
    )
    a(
        "--spinners",
        choices=["leave", "sched-idle"],
        help="threads spinning while their engine idles (NIXL's UCX progress thread): leave them (default) "
        "or move them to SCHED_IDLE",
    )
    a(
        "--phase-timeout",
        type=duration,
        dest="phase_timeout_s",
        help="per phase of a request, e.g. 10m (default 600s)",
    )
    a(
        "--stall-timeout",
        type=duration,
        dest="stall_timeout_s",
        help="no progress this long and an engine counts as hung: the run stops (default 60s)",
    )
    add_engine_flags(
        p, kinds=["vllm", "sim"], default_text="vllm: both roles, the embedded CPU default", reachable=False
    )
    add_out(p, "results/<UTC time>-transfer-<name>")
    a(
        "--resume",
        action="store_true",
        help="continue the run in --out (default: the newest transfer run under results/); failed and "
        "invalid points are measured again",
    )
    return p


def manifest_notes(cfg: TransferConfig) -> list[str]:
    """The caveats a reader of the results must know, stored in the manifest."""
    preset = cfg.connector_preset()
    producer, consumer = cfg.producer_spec(), cfg.consumer_spec()
    notes = [
        f"connector {preset.name}: {preset.description}",
        "colocated TTFT is measured on the producer engine (same settings, no kv_transfer_params) while "
        "the consumer engine idles beside it; alone TTFT on the same engine started with no connector and "
        "no peer",
        "phases are client/proxy perf_counter_ns stamps in one process; engine-side times are /metrics "
        "histogram-sum deltas around each request",
    ]
    cores = f"cores: producer {producer.cpu_threads_bind or 'unpinned'}, consumer "
    cores += f"{consumer.cpu_threads_bind or 'unpinned'} on one host; "
    notes.append(
        cores + "contention is measured, not assumed: idle CPU of each engine per stage in "
        "idle_cpu.json, and the lone engine (no connector, no peer) as the uncontended baseline (mode alone)"
        if cfg.alone
        else cores + "no lone-engine baseline in this run (--no-alone): the contention is not measured"
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


def _newest_run(results: Path) -> Path | None:
    runs = sorted(results.glob("*transfer*/manifest.json")) if results.is_dir() else []
    return max(runs, key=lambda p: p.stat().st_mtime).parent if runs else None


def _resume(
    args: argparse.Namespace, overrides: dict[str, Any]
) -> tuple[TransferFolder, TransferConfig, bool]:
    root = args.out or _newest_run(REPO / "results")
    if root is None:
        raise TransferConfigError("--resume: no transfer run under results/; name one with --out DIR")
    folder = TransferFolder(root)
    if not folder.exists():
        raise TransferConfigError(f"--resume: {folder.root} has no manifest.json (not a transfer run folder)")
    given = [k for k, v in overrides.items() if k != "engine" and v is not None]
    given += [k for k, v in overrides["engine"].items() if v is not None] + (
        ["--config"] if args.config else []
    )
    if given:
        raise TransferConfigError(f"--resume continues the stored definition; drop {', '.join(given)}")
    return folder, TransferConfig.model_validate(folder.read_manifest().sweep), True


def _resolve(args: argparse.Namespace) -> tuple[TransferFolder, TransferConfig, bool]:
    overrides: dict[str, Any] = {k: getattr(args, k) for k in _KEYS}
    overrides["engine"] = {k: v for k, v in engine_overrides(args).items() if v is not None}
    if args.resume:
        return _resume(args, overrides)
    cfg = load_transfer_config(args.config, overrides)
    folder = TransferFolder(args.out or REPO / "results" / new_run_id(f"transfer-{cfg.name}"))
    if folder.exists():
        raise TransferConfigError(f"run {folder.root} exists: pass --resume to continue it, or another --out")
    return folder, cfg, False


def _write_manifest(folder: TransferFolder, cfg: TransferConfig) -> None:
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
            packages=package_versions() | package_versions(CONNECTOR_DISTRIBUTIONS),
            git_commit=git_commit(REPO),
            seed=0,
            notes=manifest_notes(cfg),
        )
    )


def _run(args: argparse.Namespace, state: dict[str, Path]) -> int:
    try:
        folder, cfg, resumed = _resolve(args)
    except TransferConfigError as exc:
        raise BadInput(str(exc)) from None
    state["out"] = folder.root
    with folder.lock():
        return _measure(folder, cfg, resumed)


def _measure(folder: TransferFolder, cfg: TransferConfig, resumed: bool) -> int:
    # imported here: the end-of-run fit and figure pull in statsmodels and matplotlib (≈ 2.5 s), which a
    # run needs only at its end, and --help or a refused flag not at all
    from microbench.transfer.report import finish_run

    console = make_console()
    if not resumed:
        try:
            _write_manifest(folder, cfg)
        except OSError as exc:
            raise BadInput(
                f"cannot write the run folder {folder.root}: {exc}; choose another --out"
            ) from None
    console.print(f"run folder: {folder.root}", soft_wrap=True)
    resume = f"python -m microbench.transfer --resume --out {folder.root}"
    runner = TransferRunner(folder, cfg, console)
    failed = run_pair_job(
        runner.run, console, resume, "measured points are kept", lambda: finish_run(folder, cfg, console)
    )
    return failed or (EXIT_FAILURES if runner.failures else 0)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    state: dict[str, Path] = {}
    return run_cli(lambda: _run(args, state), lambda: state.get("out"))


if __name__ == "__main__":
    sys.exit(main())
