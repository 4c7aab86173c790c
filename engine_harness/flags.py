"""The engine's flags of the suite's one vocabulary (see ``benchcore.flags``), from the engine table.

``--engine KIND`` (choices: the registered kinds), ``--preset NAME``, ``--model``, ``--url``,
``--api-key-env VAR`` and ``--engine-args "…"`` (appended verbatim to the engine's argv). A job whose
engines are all its own on loopback (``reachable=False``: the transfer benchmark) has no ``--url`` or
``--api-key-env``: nothing outside it reaches those engines, so a key would guard nothing.
"""

from __future__ import annotations

import argparse
import os
import shlex
from typing import Any

from benchcore.cli import BadInput
from engine_harness.engines import ENGINE_KINDS, PRESETS

__all__ = ["add_engine_flags", "engine_overrides"]


def add_engine_flags(
    parser: argparse.ArgumentParser | argparse._ArgumentGroup,
    *,
    kinds: list[str] | None = None,
    default_text: str = "vllm: the embedded CPU default without a GPU",
    reachable: bool = True,
) -> None:
    choices = kinds or sorted(ENGINE_KINDS)
    what = f"engine kind: {', '.join(choices)} (default {default_text})"
    parser.add_argument("--engine", choices=choices, metavar="KIND", help=what)
    parser.add_argument(
        "--preset",
        choices=sorted(PRESETS),
        help="engine settings to start from (default cpu; GPU: h100, h20; SGLang reads cpu/h100/h20 as "
        "its sglang-cpu/sglang-h100/sglang-h20, and -mixed variants add --enable-mixed-chunk)",
    )
    parser.add_argument("--model", help="model folder or hub name (default: the bundled tiny Qwen3-MoE)")
    if reachable:
        parser.add_argument("--url", help="base URL of a running engine (with --engine external)")
        parser.add_argument(
            "--api-key-env",
            metavar="VAR",
            help="environment variable holding the engine's API key (a launched engine is given it "
            "through its environment, never its command line)",
        )
    parser.add_argument(
        "--engine-args", metavar="ARGS", help="extra engine arguments, one quoted string (e.g. '--seed 3')"
    )


def engine_overrides(args: argparse.Namespace) -> dict[str, Any]:
    """The engine settings the flags gave (None: not given), for ``resolve_spec`` or a layered config.
    A ``--api-key-env`` naming a variable that is not set is bad input, found before anything starts."""
    key_var = getattr(args, "api_key_env", None)
    if key_var and not os.environ.get(key_var):
        raise BadInput(f"--api-key-env {key_var}: that variable is not set; export it before the run")
    extra = shlex.split(args.engine_args) if getattr(args, "engine_args", None) else None
    return {
        "kind": args.engine,
        "preset": args.preset,
        "model": args.model,
        "url": getattr(args, "url", None),
        "api_key_env": key_var,
        "extra_args": extra,
    }
