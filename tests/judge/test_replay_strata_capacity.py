"""G4's replay judged where the tier can help, its goodput, its fidelity to its trace's reuse and the capacity check
at pilot scale (issue 24, items 4–6; judge version 5)."""
from __future__ import annotations

import json

import numpy as np
import pandas as pd

from gates.judge import evaluate, synthetic
from gates.judge.verdicts import JUDGE_VERSION
from gates.plan import load_plan

PLAN = load_plan("default")


def files(frame: pd.DataFrame, *, sample: dict | None = None, summaries: list[dict] | None = None) -> list:
    out = [("records.jsonl", synthetic.jsonl(synthetic.records(frame))),
           ("records.summary.json", synthetic.jsonl(summaries if summaries is not None
                                                    else synthetic.phase_summaries(frame))),
           ("node1/inventory.json", json.dumps(synthetic.inventory()).encode())]
    if sample is not False:
        out.append(("replay-sample.json", json.dumps(sample or synthetic.replay_sample(frame)).encode()))
    return out


def criterion(verdict: dict, key: str) -> dict:
    return next(c for c in verdict["criteria"] if c["key"] == key)


def check(verdict: dict, name: str) -> dict:
    return next(c for c in verdict["validity"]["checks"] if c["name"] == name)


def test_the_synthetic_g4_passes_with_every_new_criterion_and_check_and_says_its_version():
    verdict = evaluate(PLAN, 4, synthetic.gate_inputs(4))
    assert int(JUDGE_VERSION) >= 5 and verdict["judge_version"] == JUDGE_VERSION and verdict["verdict"] == "pass"
    assert criterion(verdict, "g4-capacity-check")["verdict"] == "pass"
    assert check(verdict, "replay-reached-trace-reuse")["ok"] and check(verdict, "capacity-check-measured")["ok"]


def _first_turns_dominate() -> pd.DataFrame:
    """Three of four replayed requests are first turns, where FX cannot help (as slow as recompute); the returning
    turns are 4.7× faster on FX."""
    frame = synthetic.gate_frames(4)
    replay = frame["phase"] == "replay"
    index = frame.index[replay]
    first = np.arange(len(index)) % 4 != 0
    frame.loc[index, "stratum"] = np.where(first, "first", "returning")
    fx_first = index[first & (frame.loc[index, "arm"] == "fx").to_numpy()]
    shift = frame.loc[fx_first, "t_first_token"] - frame.loc[fx_first, "t_send"]
    frame.loc[fx_first, "t_first_token"] = frame.loc[fx_first, "t_send"] + shift * 9.8 / 2.1
    frame.loc[fx_first, "t_end"] = frame.loc[fx_first, "t_end"] + shift * (9.8 / 2.1 - 1)
    return frame


def test_the_replay_speedup_is_judged_on_the_strata_the_tier_can_help_with_the_mix_stated():
    frame = _first_turns_dominate()
    verdict = evaluate(PLAN, 4, files(frame))
    speedup = criterion(verdict, "g4-replay-speedup")
    assert speedup["verdict"] == "pass", speedup["explanation"]
    cell = speedup["cells"][0]
    assert cell["strata"] == ["shared_prefix", "returning"] and cell["mix"] == {"first": 72, "returning": 24}   # the fx arm's requests
    assert "returning turns" in speedup["explanation"] and "回访请求" in speedup["explanation_zh"]
    # the old bar (every replayed request) fails the same run: the median is a cold first turn in both arms
    everything = {**PLAN.workloads["replay"], "strata": ["first", "shared_prefix", "returning"]}
    from dataclasses import replace
    old = replace(PLAN, workloads={**PLAN.workloads, "replay": everything})
    assert criterion(evaluate(old, 4, files(frame)), "g4-replay-speedup")["verdict"] == "fail"


def test_goodput_counts_requests_meeting_both_objectives_per_session_and_in_model_seconds():
    frame = synthetic.gate_frames(4)
    verdict = evaluate(PLAN, 4, files(frame))
    goodput = criterion(verdict, "g4-replay-goodput")
    assert goodput["verdict"] == "pass" and goodput["cells"][0]["objectives"] == {"ttft_s": 5.0, "itl_s": 0.25}
    assert "Clopper" in goodput["cells"][0]["method"] and goodput["cells"][0]["sessions"] > 0
    # a simulated server at time scale 0.1: records are wall seconds at the scale, objectives model seconds
    summaries = synthetic.phase_summaries(frame)
    for s in summaries:
        s["metrics_after"]["fxpilot_sim_time_scale"] = 0.1
    scaled = criterion(evaluate(PLAN, 4, files(frame, summaries=summaries)), "g4-replay-goodput")
    assert scaled["value"] == 0.0 and scaled["verdict"] == "fail"   # 2.1 s of wall at 0.1 = 21 model seconds


def test_a_replay_that_missed_its_traces_reuse_is_invalid_never_judged():
    frame = synthetic.gate_frames(4)
    sample = synthetic.replay_sample(frame)
    sample["oracle"]["ideal_hit_tokens"] = int(sample["oracle"]["ideal_hit_tokens"] / 0.7)   # reached 70 %
    verdict = evaluate(PLAN, 4, files(frame, sample=sample))
    found = check(verdict, "replay-reached-trace-reuse")
    assert verdict["verdict"] == "invalid" and not found["ok"] and "70.0 %" in found["detail"]
    assert found["detail_said"][0]["values"]["source"] == "/metrics"


def test_little_reuse_reads_as_the_traffic_never_as_an_fx_failure():
    frame = synthetic.gate_frames(4, slowdown={"fx": 4.0})    # FX no faster than recompute on this traffic
    sample = synthetic.replay_sample(frame, applicable=False)
    sample["oracle"]["ideal_hit_fraction"] = 0.03
    sample["oracle"]["capacity_check"]["ideal_hit_fraction"] = 0.03
    verdict = evaluate(PLAN, 4, files(frame, sample=sample))
    speedup = criterion(verdict, "g4-replay-speedup")
    assert speedup["verdict"] == "marginal" and speedup["little_reuse"]
    assert speedup["explanation"].startswith("This traffic has little reuse: at most 3.0 %")
    assert "not an FX failure" in speedup["explanation"] and "而非 FX 的失败" in speedup["explanation_zh"]
    capped = criterion(verdict, "g4-capacity-check")
    assert capped["verdict"] == "marginal" and "little reuse" in capped["explanation"]
    assert verdict["verdict"] != "fail" and check(verdict, "replay-reached-trace-reuse")["ok"]


def test_the_capacity_check_states_measured_predicted_and_difference():
    frame = synthetic.gate_frames(4)
    for predicted, verdict in ((0.40, "pass"), (0.47, "marginal"), (0.55, "fail"), (0.30, "marginal")):
        sample = synthetic.replay_sample(frame, capped_hit_fraction=predicted)
        found = criterion(evaluate(PLAN, 4, files(frame, sample=sample)), "g4-capacity-check")
        cell = found["cells"][0]
        assert found["verdict"] == verdict, (predicted, found["explanation"])
        assert cell["measured"] == 0.4 and cell["predicted"] == predicted
        assert abs(cell["difference"] - (0.4 - predicted)) < 1e-9 and found["value"] == abs(cell["difference"])
        assert "the oracle predicts" in found["explanation"] and "预测该容量下为" in found["explanation_zh"]


def test_the_capacity_check_without_its_metrics_is_invalid_not_failed():
    frame = synthetic.gate_frames(4)
    summaries = [s for s in synthetic.phase_summaries(frame) if s["phase"] != "capacity"]
    verdict = evaluate(PLAN, 4, files(frame, summaries=summaries))
    found = check(verdict, "capacity-check-measured")
    assert verdict["verdict"] == "invalid" and not found["ok"] and "cannot be verified" in found["detail"]


def test_a_replay_that_served_more_reuse_than_its_trace_has_is_invalid():
    # issue 44 item 2: repetitions warm from an earlier one read ~190 % of what the trace allows — never a pass
    frame = synthetic.gate_frames(4)
    sample = synthetic.replay_sample(frame)
    sample["oracle"]["ideal_hit_tokens"] = int(sample["oracle"]["ideal_hit_tokens"] / 1.9)
    verdict = evaluate(PLAN, 4, files(frame, sample=sample))
    found = check(verdict, "replay-reached-trace-reuse")
    assert verdict["verdict"] == "invalid" and not found["ok"]
    assert "more than the trace allows by over 5 %" in found["detail"] and "190.0 %" in found["detail"]


def test_a_disk_tier_that_read_more_than_the_trace_leaves_below_hbm_is_invalid():
    frame = synthetic.gate_frames(4)
    sample = synthetic.replay_sample(frame)
    allowed = sample["oracle"]["ideal_hit_tokens"]
    summaries = synthetic.phase_summaries(frame)
    for s in summaries:
        if s["arm"] == "fx" and s["phase"] == "replay" and s["repetition"] == 1:
            s["tier_bytes"] = {"device": "nvme1n1", "device_read_bytes": 2 * allowed * 1000, "error": None,
                               "kv_bytes_per_token": 1000}
    verdict = evaluate(PLAN, 4, files(frame, sample=sample, summaries=summaries))
    found = check(verdict, "replay-reached-trace-reuse")
    assert not found["ok"] and "fx repetition 1: its disk tier served" in found["detail"]


def _capped_rows(sessions: list[str]) -> dict:
    blocks = " ".join(str(b) for b in range(1, 48))          # 47 blocks of 512 tokens: 24,000-token prompts
    return {"session": sessions, "turn": [1] * len(sessions), "prompt_tokens": [24000] * len(sessions),
            "blocks": [blocks] * len(sessions)}


def _with_rows(frame: pd.DataFrame, sessions: list[str]) -> dict:
    sample = synthetic.replay_sample(frame)
    sample["oracle"]["capacity_check"].update(rows=_capped_rows(sessions), dram_tokens=0, capacity_tokens=47 * 512)
    return sample


def test_the_capacity_check_is_recomputed_on_the_order_the_records_show():
    from gates.traces import capacity as traces_capacity
    frame = synthetic.gate_frames(4)
    capped = frame[(frame["phase"] == "capacity") & (frame["arm"] == "fx")].sort_values("t_send")
    sessions = capped["session"].tolist()
    sample = _with_rows(frame, sessions)
    verdict = evaluate(PLAN, 4, files(frame, sample=sample))
    cell = criterion(verdict, "g4-capacity-check")["cells"][0]
    expected = traces_capacity.in_order(sample["oracle"]["capacity_check"], [(s, 1) for s in sessions])
    assert cell["order"]["faithful"] and cell["order"]["inverted_pairs"] == 0
    assert cell["predicted"] == expected["predicted_in_order"] == 15 / 16     # every prompt after the first
    assert cell["predicted_oracle_order"] == 0.4
    assert "sent in the oracle's order" in check(verdict, "capacity-check-measured")["detail"]


def test_a_capped_replay_sent_in_another_order_is_invalid_never_an_fx_failure():
    frame = synthetic.gate_frames(4)
    capped = frame[(frame["phase"] == "capacity") & (frame["arm"] == "fx")].sort_values("t_send")
    sample = _with_rows(frame, capped["session"].tolist()[::-1])          # the oracle's order is the reverse
    verdict = evaluate(PLAN, 4, files(frame, sample=sample))
    found = criterion(verdict, "g4-capacity-check")
    assert found["verdict"] == "invalid" and found["cells"][0]["order"]["inverted_pairs"] == 16 * 15 // 2
    detail = check(verdict, "capacity-check-measured")["detail"]
    assert "sent in another order than the oracle's: 120 of 120 request pairs" in detail
    assert verdict["verdict"] != "fail"
