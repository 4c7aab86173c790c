"""The fault matrix's rows for the jobs and readers of the second round (route, characterize, calibrate,
the battery comparison): each a dict of ``fault_matrix.Row`` fields, kept here so the matrix stays one
screenful per part."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def job_rows(tmp: Path, path: dict[str, Path], urls: dict[str, str]) -> list[dict[str, Any]]:
    """Bad definition files, missing or unreadable inputs and an endpoint a job cannot use, per command."""
    not_parquet = tmp / "not.parquet"
    not_parquet.write_text("{not a table")
    empty = tmp / "empty"
    empty.mkdir(exist_ok=True)
    route, characterize = ["microbench.route"], ["microbench.characterize"]
    recommend = ["analysis.characterize", "recommend"]
    slo = ["--slo", "ttft=500", "--users", "4", "--cost", "a=1"]
    return [
        {"command": "route", "fault": "definition: YAML syntax error",
         "argv": [*route, "--config", str(path["syntax"])]},
        {"command": "route", "fault": "definition: not UTF-8",
         "argv": [*route, "--config", str(path["encoding"])]},
        {"command": "route", "fault": "offload table missing",
         "argv": [*route, "--engine", "sim", "--table", str(tmp / "no-table.csv")]},
        {"command": "characterize", "fault": "definition: YAML syntax error",
         "argv": [*characterize, "--config", str(path["syntax"])]},
        {"command": "characterize", "fault": "definition: not UTF-8",
         "argv": [*characterize, "--config", str(path["encoding"])]},
        {"command": "characterize", "fault": "--range MIN above MAX",
         "argv": [*characterize, "--engine", "sim", "--range", "5:2"]},
        {"command": "characterize", "fault": "external engine (cannot restart it)",
         "argv": [*characterize, "--engine", "external", "--url", urls["keyed"], "--model", "m"]},
        {"command": "analysis.characterize", "fault": "dataset missing",
         "argv": [*recommend, str(tmp / "none.parquet"), *slo], "out": None},
        {"command": "analysis.characterize", "fault": "dataset not Parquet",
         "argv": [*recommend, str(not_parquet), *slo], "out": None},
        {"command": "analysis.calibrate", "fault": "predict: trace folder missing",
         "argv": ["analysis.calibrate", "predict", str(tmp / "none"), "--model", str(tmp / "none")]},
        {"command": "analysis.calibrate", "fault": "report: not trace folders",
         "argv": ["analysis.calibrate", "report", str(empty), str(empty)]},
        {"command": "battery compare", "fault": "folders without a report",
         "argv": ["microbench.battery", "compare", str(empty), str(empty)]},
    ]  # fmt: skip
