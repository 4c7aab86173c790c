"""The route job's pure parts on hand-built data with known answers: the policy decision and its inputs,
the predicted table, the workload's seeded shape, the counterbalanced order, and the replay figures."""

from __future__ import annotations

import pandas as pd
import pytest

from analysis.breakeven import LinkProfile
from engine_harness.model_kv import ModelKV
from engine_harness.step_model import StepModel
from microbench.results.route import EngineLoad, ReplayRecord
from microbench.route.config import RouteConfig
from microbench.route.decide import decide
from microbench.route.derive import ReplayFigures, ab_effects, policy_summary, replay_figures
from microbench.route.predicted import predicted_policy
from microbench.route.router import prompt_tokens
from microbench.route.workload import COLD, DECODE, RouteWorkload, shapes

STEP = StepModel(alpha_ms=10, beta_d_ms=0, beta_c_ms=0.1, gamma_ns=0)
LINK = LinkProfile(name="l", basis="assumed", assumption="test", setup_latency_ms=50, bandwidth_gbit_s=8)
MODEL = ModelKV(
    "m", layers=1, kv_heads=1, head_dim=500, dtype_bytes=1
)  # 1000 B/token: 1 µs per token at 8 Gbit/s


@pytest.fixture
def table():
    return predicted_policy(STEP, LINK, MODEL, 100, [0, 2, 4], [100, 1000])


def test_the_predicted_table_holds_the_step_models_delay_and_the_links_transfer(table) -> None:
    cells = table.cells.set_index(["decode_batch_size", "new_prefill_tokens"])
    # D=2, P=1000 at chunk 100: ceil(1000/98)=11 steps; each costs 0.1 ms × its chunk more than a decode
    # step; the decodes wait 2 × 0.1 × 1000 = 200 ms in all
    assert cells.loc[(2, 1000), "interference_ms"] == pytest.approx(200.0)
    assert cells.loc[(0, 1000), "interference_ms"] == 0
    assert cells.loc[(2, 1000), "transfer_ms"] == pytest.approx(50 + 1000 * 1000 * 8 / 8e9 * 1e3)
    assert cells.loc[(2, 1000), "decision"] == "offload" and cells.loc[(2, 100), "decision"] == "local"


def test_fixed_policies_ignore_the_inputs_and_the_table_reads_them(table) -> None:
    assert not decide("colocated", None, 4, 1000, 100).offload
    assert decide("disaggregated", None, 0, 10, 100).offload
    d = decide("table", table, 4, 1000, 100)
    assert d.offload and d.interference_ms == pytest.approx(400.0) and not d.clamped
    assert (d.decode_running, d.prompt_tokens, d.chunk) == (4, 1000, 100)
    assert not decide("table", table, 4, 100, 100).offload  # 40 ms < 51 ms: local
    with pytest.raises(ValueError, match="needs an offload table"):
        decide("table", None, 1, 1, 100)


def test_outside_the_table_the_query_is_clamped_and_says_so_and_no_decode_means_local(table) -> None:
    far = decide("table", table, 9, 50_000, 4096)
    assert far.clamped and far.offload and "asked at D=4, P=1000, chunk=100" in far.reason
    alone = decide("table", table, 0, 50_000, 100)
    assert not alone.offload and alone.interference_ms == 0 and "no running decode" in alone.reason


def test_prompt_tokens_counts_a_token_id_prompt_only() -> None:
    assert prompt_tokens({"prompt": [1, 2, 3]}) == 3
    assert prompt_tokens({"prompt": "some text"}) == 0


def test_the_workload_shape_is_fixed_by_its_seed_and_the_order_is_a_rotation() -> None:
    w = RouteWorkload(decode_streams=2, cold_tokens=[10, 20], bursts=2, burst_size=3)
    a, b = shapes(w, 7), shapes(w, 7)
    assert a == b and a != shapes(w, 8)
    assert [s.kind for s in a].count(DECODE) == 2 and [s.kind for s in a].count(COLD) == 6
    assert all(s.offset_s == 0 for s in a if s.kind == DECODE)
    assert [s.offset_s for s in a] == sorted(s.offset_s for s in a)
    cfg = RouteConfig(policies=["colocated", "disaggregated", "table"], repetitions=3, table="t.json")
    rounds = cfg.rounds()
    for position in range(3):  # every policy in every position exactly once over three rounds
        assert sorted(r[position] for r in rounds) == ["colocated", "disaggregated", "table"]


def _record(policy: str, rep: int = 0, **kw: object) -> ReplayRecord:
    base = dict(policy=policy, repetition=rep, position=0, seed=0, started_unix_ns=0, duration_s=2.0,
                requests=3, failed_requests=0, valid=True, kv_xfer_count=2, kv_xfer_sum_ms=30.0,
                engine_load=[EngineLoad(role="decode", busy_pct=50)])  # fmt: skip
    return ReplayRecord(**(base | kw))


def _frame() -> pd.DataFrame:
    ms = 1_000_000
    rows = [  # a decode stream with gaps 10, 10, 40 ms; two cold prompts, TTFT 100 and 300 ms
        {"client_id": DECODE, "status": "ok", "send_ns": 0, "chunk_ns": [5 * ms, 15 * ms, 25 * ms, 65 * ms],
         "output_tokens": 4, "offload": False, "consumer_send_ns": 0, "consumer_first_token_ns": 5 * ms},
        {"client_id": COLD, "status": "ok", "send_ns": 0, "chunk_ns": [100 * ms, 110 * ms],
         "output_tokens": 2, "offload": True, "consumer_send_ns": 80 * ms,
         "consumer_first_token_ns": 100 * ms},
        {"client_id": COLD, "status": "ok", "send_ns": 0, "chunk_ns": [300 * ms, 400 * ms],
         "output_tokens": 2, "offload": False, "consumer_send_ns": 0, "consumer_first_token_ns": 300 * ms},
    ]  # fmt: skip
    frame = pd.DataFrame(rows)
    frame["first_chunk_ns"] = [c[0] for c in frame["chunk_ns"]]
    frame["last_chunk_ns"] = [c[-1] for c in frame["chunk_ns"]]
    frame["done_ns"] = frame["last_chunk_ns"]
    frame["input_tokens"] = frame["prompt_tokens"] = 10
    frame["slo_class"], frame["error"], frame["decide_ns"] = "", None, 2000
    return frame


def test_replay_figures_from_hand_built_stamps() -> None:
    f = replay_figures(_record("table"), _frame(), slo_ttft_ms=200, slo_tpot_ms=50)
    assert f.decode_itl_p50_ms == pytest.approx(10) and f.decode_itl_p99_ms == pytest.approx(39.4)
    assert f.decode_tpot_p50_ms == pytest.approx(20)  # (65 − 5) / 3
    assert f.cold_ttft_p50_ms == pytest.approx(200) and f.cold_ttft_p99_ms == pytest.approx(298)
    # SLO: the decode (TTFT 5, TPOT 20) and the first cold (TTFT 100, TPOT 10) meet it; the second does not
    assert f.slo_met_fraction == pytest.approx(2 / 3) and f.goodput_rps == pytest.approx(1.0)
    assert f.offload_fraction == 0.5 and f.handoff_p50_ms == pytest.approx(20)
    assert f.kv_xfer_mean_ms == 15 and f.decide_p50_us == 2
    assert f.total_latency_s == pytest.approx(0.065 + 0.110 + 0.400)
    assert f.engine_busy_pct == {"decode": 50}


def _fig(policy: str, rep: int, total: float, valid: bool = True) -> ReplayFigures:
    values = dict.fromkeys(ReplayFigures.model_fields, None)
    values |= {"policy": policy, "repetition": rep, "position": 0, "valid": valid, "total_latency_s": total}
    values["engine_busy_pct"] = {}
    return ReplayFigures(**values)


def test_summary_and_effects_count_valid_replays_only_and_name_the_baseline() -> None:
    figs = [_fig("colocated", r, 10.0 + r) for r in range(5)] + [
        _fig("table", r, 5.0 + 0.1 * r) for r in range(5)
    ]
    figs.append(_fig("table", 9, 100.0, valid=False))  # never counted
    rows = {(s.policy, s.figure): s for s in policy_summary(figs, ["colocated", "table"])}
    assert rows[("table", "total_latency_s")].median == pytest.approx(5.2)
    assert rows[("table", "total_latency_s")].replays == 5
    effects = [e for e in ab_effects(figs, baselines=("colocated",)) if e.figure == "total_latency_s"]
    (e,) = effects
    assert e.baseline == "colocated" and e.ratio == pytest.approx(5.2 / 12.0)
    assert e.verdict == "B better" and e.better == "table" and e.ci_high < 1


def test_bad_input_is_exit_2_with_the_fix_named(tmp_path, capsys) -> None:
    from microbench.route.cli import main

    assert main(["--policies", "table", "--out", str(tmp_path / "a")]) == 2
    assert "python -m analysis.policy build" in capsys.readouterr().err
    assert main(["--table", str(tmp_path / "none.json"), "--out", str(tmp_path / "b")]) == 2
    assert "does not exist" in capsys.readouterr().err
    assert main(["--resume"]) == 2
    assert "--resume needs --out" in capsys.readouterr().err
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()  # nothing written


def test_a_decode_gap_inside_two_prefill_windows_is_shared_by_their_prompt_tokens() -> None:
    from microbench.route.boundary import boundary_rows, local_decode_delay_ms

    ms = 1_000_000
    frame = pd.DataFrame(
        [  # one decode stream with gaps 10, 10, 50, 10 ms (median 10: one excess of 40 ms ending at 80 ms)
            {"client_id": DECODE, "status": "ok", "chunk_ns": [0, 10 * ms, 20 * ms, 70 * ms, 80 * ms],
             "send_ns": 0, "first_chunk_ns": 0, "prompt_tokens": 64},
            {"client_id": COLD, "status": "ok", "chunk_ns": [75 * ms], "send_ns": 25 * ms,
             "first_chunk_ns": 75 * ms, "prompt_tokens": 100},
            {"client_id": COLD, "status": "ok", "chunk_ns": [90 * ms], "send_ns": 30 * ms,
             "first_chunk_ns": 90 * ms, "prompt_tokens": 300},
        ]
    )  # fmt: skip
    delay = local_decode_delay_ms(frame)
    # the 50 ms gap ends at 70 ms, inside both windows: its 40 ms excess splits 100:300; the last gap is
    # not in excess
    assert delay.loc[1] == pytest.approx(10.0) and delay.loc[2] == pytest.approx(30.0)
    handoff = frame.assign(consumer_send_ns=0, consumer_first_token_ns=[0, 5 * ms, 50 * ms])
    rows = {
        r.prompt_tokens: r
        for r in boundary_rows([("colocated", True, frame), ("disaggregated", True, handoff)])
    }
    assert rows[100].experiment_says == "offload"  # 10 ms of delay against a 5 ms hand-off
    assert rows[300].experiment_says == "local"  # 30 ms of delay against a 50 ms hand-off
    assert rows[100].table_offload_share is None  # no table replay: nothing predicted
