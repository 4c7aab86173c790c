"""One run-folder convention: every manifest names its job; a folder opens as the job that wrote it; a
stored file this suite cannot read is named with why (issue #33)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from microbench.results.layout import BatteryFolder, RunFolder, TransferFolder, job_folder, new_manifest
from microbench.results.records import RunRecord, UnreadableRecord, read_record

REFERENCE = Path(__file__).resolve().parents[2] / "results"


@pytest.mark.parametrize("kind", [RunFolder, TransferFolder, BatteryFolder])
def test_a_new_manifest_names_its_job_and_the_folder_opens_as_that_job(tmp_path: Path, kind: type) -> None:
    folder = kind(tmp_path / "run")
    folder.write_manifest(new_manifest(folder, {"grid": 1}, {"kind": "sim"}, seed=3, notes=["n"]))
    manifest = folder.read_manifest()
    assert manifest.job == kind.JOB and manifest.seed == 3 and manifest.notes == ["n"]
    assert manifest.hardware and manifest.packages
    assert type(job_folder(folder.root)) is kind


def test_manifests_from_before_the_job_field_are_told_apart_by_their_records(tmp_path: Path) -> None:
    for name, kind in (("reference-cpu", RunFolder), ("transfer-cpu-push", TransferFolder)):
        root = tmp_path / name
        root.mkdir()
        shutil.copy(REFERENCE / name / "manifest.json", root / "manifest.json")
        if (REFERENCE / name / "runs").is_dir():
            shutil.copytree(REFERENCE / name / "runs", root / "runs")
        assert root.joinpath("manifest.json").read_text().find('"job"') == -1
        assert type(job_folder(root)) is kind, name


def test_a_folder_without_a_manifest_is_refused_with_its_name(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"no manifest\.json"):
        job_folder(tmp_path)


@pytest.mark.parametrize(
    ("body", "says"),
    [
        ({"schema_version": 99}, "has schema_version 99; this suite reads versions 1, 2 of a RunRecord"),
        ({}, "names no schema_version; this suite reads versions 1, 2 of a RunRecord"),
        ([1, 2], "is not a stored RunRecord (a JSON object)"),
        ({"schema_version": 2, "run_id": 3}, "is not a valid RunRecord (v2): run_id: Input should be"),
    ],
)
def test_a_record_this_suite_cannot_read_is_named_with_why(tmp_path: Path, body: object, says: str) -> None:
    path = tmp_path / "D0_P256_r0.json"
    path.write_text(json.dumps(body))
    with pytest.raises(UnreadableRecord) as caught:
        read_record(path, RunRecord)
    assert str(caught.value).startswith(f"{path} {says}"), caught.value
    assert "\n" not in str(caught.value)  # one line, no pydantic report
