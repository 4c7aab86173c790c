"""Why the decodes pause in a sim table replay (issue #40 follow-up), from the decode worker's own step log:
every long step beside the running decodes is the prefill of a cold prompt the table kept local — the
interference it predicted and accepted — never an offloaded prompt (its KV arrives; the decode worker
computes its last token only). The other pauses a client sees are steps the loaded host ran late, in
every policy alike, not the router."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
import yaml
from test_route_sim import CHUNK, LARGE, SMALL, STEP_ARGS, write_link_and_table

from microbench.results.layout import RouteFolder
from microbench.route.cli import main
from microbench.route.workload import COLD, RouteWorkload

pytestmark = [pytest.mark.integration, pytest.mark.clock]  # reads the clock: the clock pass


def test_the_table_replays_decode_pauses_are_the_local_prefills_it_predicted(tmp_path: Path) -> None:
    write_link_and_table(tmp_path)
    log = tmp_path / "decode-steps.jsonl"
    workload = RouteWorkload(
        decode_streams=4, decode_tokens=110, cold_tokens=[SMALL, LARGE], bursts=3, burst_size=2,
        burst_gap_s=0.5, first_burst_s=0.25, burst_spread_s=0.05,
    )  # fmt: skip
    cfg = {
        "name": "gaps", "policies": ["table"], "repetitions": 1, "table": str(tmp_path / "table.json"),
        "connector": str(tmp_path / "connector.yaml"), "workload": workload.model_dump(), "pause_s": 0.1,
        "engine": {"kind": "sim", "chunk_size": CHUNK, "extra_args": STEP_ARGS}, "startup_timeout_s": 60,
        "decode_args": ["--step-log", str(log)],
    }  # fmt: skip
    (tmp_path / "gaps.yaml").write_text(yaml.safe_dump(cfg))
    assert main(["--config", str(tmp_path / "gaps.yaml"), "--out", str(tmp_path / "gaps")]) == 0
    [(record, frame)] = RouteFolder(tmp_path / "gaps").replays()
    assert record.valid
    steps = pd.DataFrame([json.loads(line) for line in log.read_text().splitlines()])
    chunks = [(int(tokens), int(ctx)) for c in steps["prefill_chunks"] for _, tokens, ctx in c]
    prompt = {}  # request id on the decode worker → its prompt's length (its last chunk's end)
    for c in steps["prefill_chunks"]:
        prompt |= {rid: max(prompt.get(rid, 0), int(tokens + ctx)) for rid, tokens, ctx in c}
    # an offloaded prompt never prefills on the decode worker: its only chunk there is its last token
    assert (1, LARGE - 1) in chunks
    assert all(tokens == 1 for tokens, ctx in chunks if tokens + ctx == LARGE)
    beside = steps[steps["num_decode_reqs"] >= workload.decode_streams]
    base = beside["model_duration_s"].median() * 1e3
    long = beside[beside["model_duration_s"] * 1e3 > 1.3 * base]
    assert len(long) > 0  # the table kept the small prompts local: their prefill pauses the decodes
    for _, step in long.iterrows():  # each long step is a local small prompt's prefill, nothing else
        assert step["prefill_chunks"] and all(prompt[rid] == SMALL for rid, _, _ in step["prefill_chunks"])
    # and its size is what the table predicted and accepted: the decodes' aggregate delay per local prompt
    cold = frame[frame["client_id"] == COLD]
    local = cold[~cold["offload"].astype(bool)]
    assert (local["prompt_tokens"] == SMALL).all() and (local["interference_ms"] < local["transfer_ms"]).all()
    measured = ((long["model_duration_s"] * 1e3 - base) * long["num_decode_reqs"]).sum()
    predicted = local["interference_ms"].sum()
    assert measured == pytest.approx(predicted, rel=0.3), (measured, predicted)
