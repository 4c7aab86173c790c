"""The heatmap notebook executes against a run folder and shows the heatmap.

The run folder is ``$ANALYSIS_RUN_DIR`` when set (CI points it at the committed ``results/reference-cpu``),
else the reference run when it exists, else a run synthesised here from a known step model.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from analysis.synthetic import synthesize_run
from engine_harness.step_model import StepModel

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")

REPO = Path(__file__).resolve().parents[2]
NOTEBOOK = REPO / "notebooks" / "interference_heatmaps.ipynb"


def _run_dir(tmp_path: Path) -> Path:
    if os.environ.get("ANALYSIS_RUN_DIR"):
        return Path(os.environ["ANALYSIS_RUN_DIR"]).resolve()
    reference = REPO / "results" / "reference-cpu"
    if (reference / "runs").is_dir():
        return reference
    return synthesize_run(
        tmp_path / "synthetic-run", chunks=(2048, 8192), decode_batches=(0, 1, 4, 8),
        prefill_tokens=(512, 2048, 8192), repetitions=2,
    )  # fmt: skip


@pytest.mark.integration
def test_notebook_executes_and_shows_the_heatmap(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    run_dir = _run_dir(tmp_path)
    monkeypatch.setenv("ANALYSIS_RUN_DIR", str(run_dir))
    monkeypatch.setenv("MPLBACKEND", "module://matplotlib_inline.backend_inline")
    nb = nbformat.read(NOTEBOOK, as_version=4)
    client = nbclient.NotebookClient(
        nb, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(NOTEBOOK.parent)}}
    )
    client.execute()  # raises CellExecutionError on any failing cell

    outputs = [out for cell in nb.cells if cell.cell_type == "code" for out in cell.get("outputs", [])]
    assert not [o for o in outputs if o.get("output_type") == "error"]
    text = "".join(o.get("text", "") for o in outputs if o.get("output_type") == "stream")
    assert f"run {run_dir.name}" in text and "valid" in text
    shown = " ".join(str(o.get("data", {}).get("text/plain", "")) for o in outputs)
    assert "R² of the step model" in shown  # the report's criteria, each naming what it judged
    heatmap_cell = next(
        c for c in nb.cells if c.cell_type == "code" and "plots.penalty_heatmaps(table)" in c.source
    )
    images = [o for o in heatmap_cell.outputs if "image/png" in o.get("data", {})]
    assert images, "the heatmap cell shows no PNG"
    assert len(images[0]["data"]["image/png"]) > 10_000  # a real figure, not an empty canvas
    pngs = sum("image/png" in o.get("data", {}) for o in outputs)
    assert pngs >= 5  # heatmaps ×2, sensitivity, timeline, model comparison, offload region


@pytest.mark.integration
def test_notebook_ab_section_shows_a_known_effect(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    grid = {"chunks": (2048,), "decode_batches": (0, 4), "prefill_tokens": (2048, 8192), "repetitions": 5}
    base = StepModel()
    slower = StepModel(**{k: 1.3 * v for k, v in base.model_dump().items() if k.endswith(("_ms", "_ns"))})
    run_a = synthesize_run(tmp_path / "a", params=base, seed=1, **grid)  # type: ignore[arg-type]
    run_b = synthesize_run(tmp_path / "b", params=slower, seed=2, **grid)  # type: ignore[arg-type]
    monkeypatch.setenv("ANALYSIS_RUN_DIR", str(run_a))
    monkeypatch.setenv("ANALYSIS_RUN_B", str(run_b))
    monkeypatch.setenv("MPLBACKEND", "module://matplotlib_inline.backend_inline")
    nb = nbformat.read(NOTEBOOK, as_version=4)
    nbclient.NotebookClient(
        nb, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(NOTEBOOK.parent)}}
    ).execute()
    ab = next(c for c in nb.cells if c.cell_type == "code" and "compare_runs(" in c.source)
    text = "".join(o.get("text", "") for o in ab.outputs if o.get("output_type") == "stream")
    table = " ".join(str(o.get("data", {}).get("text/plain", "")) for o in ab.outputs)
    assert "A/B: b against a" in text and table.count("B worse") == 4  # every cell: the steps cost 1.3×
    assert any(len(o.get("data", {}).get("image/png", "")) > 10_000 for o in ab.outputs)  # the B/A heatmap
