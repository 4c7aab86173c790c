"""``python -m analysis.characterize``: read a characterization dataset.

Examples::

    python -m analysis.characterize recommend results/characterization.parquet \\
        --slo ttft=2000,itl=100 --users 16 --cost cpu-default=0.10 --cost cpu-found=0.10
    python -m analysis.characterize curves results/characterization.parquet --slo itl=100 --out results/curves
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from analysis.characterize.curves import SloError, capacities, curve_figure, latency_throughput, parse_slo
from analysis.characterize.dataset import PERCENTILES, DatasetError, read_dataset
from analysis.characterize.page import page_html
from analysis.characterize.recommend import NothingMeets, parse_costs, recommend
from benchcore.atomic import atomic_write_bytes
from benchcore.cli import BadInput, run_cli
from microbench.results.layout import hold_folder

__all__ = ["build_parser", "main"]

SLO_HELP = "limits in ms: ttft=…, itl=…, e2e=… (nttft=… in ms per input token), e.g. ttft=2000,itl=100"


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m analysis.characterize",
        description=__doc__,
        epilog="Exit codes: 0 done, 2 bad input (a message names the problem and the fix).",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = p.add_subparsers(dest="command", required=True)
    r = sub.add_parser("recommend", help="the cheapest configuration per model for N users within an SLO")
    r.add_argument(
        "dataset", type=Path, help="the Parquet table `python -m microbench.characterize` appends to"
    )
    r.add_argument("--slo", required=True, help=SLO_HELP)
    r.add_argument("--users", type=int, required=True, help="concurrent users to serve")
    r.add_argument(
        "--cost",
        action="append",
        default=[],
        metavar="CFG=USD_PER_H",
        help="price per device-hour of a configuration (or of a device name); repeat",
    )
    r.add_argument(
        "--percentile", choices=PERCENTILES, default="p90", help="latency percentile the SLO is on"
    )
    r.add_argument("--json", action="store_true", help="print JSON instead of a table")
    c = sub.add_parser("curves", help="latency–throughput curves and SLO capacities per configuration")
    c.add_argument("dataset", type=Path)
    c.add_argument("--slo", help=SLO_HELP + " (capacities only with one)")
    c.add_argument("--percentile", choices=PERCENTILES, default="p90")
    c.add_argument(
        "--out",
        type=Path,
        required=True,
        metavar="DIR",
        help="folder for curves.csv/png, capacity.json, report.html",
    )
    return p


def _recommend(args: argparse.Namespace) -> int:
    table = read_dataset(args.dataset)
    slo = parse_slo(args.slo)
    try:
        costs = parse_costs(args.cost)
        recs = recommend(table, slo, args.users, costs, args.percentile)
    except KeyError as exc:
        raise BadInput(str(exc.args[0])) from None
    except (ValueError, NothingMeets) as exc:
        raise BadInput(str(exc)) from None
    if args.json:
        print(json.dumps([r.model_dump(mode="json") for r in recs], indent=2))
        return 0
    print(f"SLO {args.slo} (ms, {args.percentile}), {args.users} users; fit: isotonic in users (scipy)")
    for rec in recs:
        print(f"\nmodel {rec.model}: best {rec.best}")
        for ch in rec.choices:
            cost = (
                f"${ch.usd_per_user_hour:.4f}/user-h ({ch.devices} × device)"
                if ch.devices
                else "cannot serve"
            )
            print(f"  {ch.config:<24} {cost:<32} {ch.note}")
    return 0


def _curves(args: argparse.Namespace) -> int:
    table = read_dataset(args.dataset)
    slo = parse_slo(args.slo) if args.slo else None
    with hold_folder(args.out):
        curve = latency_throughput(table, args.percentile)
        atomic_write_bytes(args.out / "curves.csv", curve.to_csv(index=False).encode())
        fig = curve_figure(table, args.percentile)
        fig.savefig(args.out / "curves.png", dpi=120)
        caps = capacities(table, slo, args.percentile) if slo is not None else []
        if slo is not None:
            dump = [c.model_dump(mode="json") for c in caps]
            atomic_write_bytes(args.out / "capacity.json", json.dumps(dump, indent=2).encode())
            for c in caps:
                more = "+" if c.censored else ""
                print(f"{c.config}: capacity {c.users}{more} users ({args.percentile}, {args.slo})")
        page = page_html(table, caps, args.slo or "no SLO given", args.percentile)
        atomic_write_bytes(args.out / "report.html", page.encode())
    print(f"wrote {args.out}/curves.csv, curves.png, report.html" + (", capacity.json" if slo else ""))
    return 0


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)

    def body() -> int:
        try:
            return _recommend(args) if args.command == "recommend" else _curves(args)
        except (DatasetError, SloError) as exc:
            raise BadInput(str(exc)) from None

    return run_cli(body)


if __name__ == "__main__":
    sys.exit(main())
