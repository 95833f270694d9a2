"""Cache hits reconciled between the records and /metrics (gates/judge/counters.py).

vLLM 0.20.1 leaves `prompt_tokens_details` out of a usage when nothing was cached, so a miss is a record
with `cached_tokens: null`; the judge must count it as 0, and records that disagree with the server's
counters make the run invalid, naming the cell.
"""
from __future__ import annotations

import json

from gates.judge import counters, evaluate, load_inputs
from gates.judge.records import Inputs
from tests.judge.helpers import jsonl, plan_with, request

G2_HIT = [{"key": "g2-hit", "metric": "hit_ratio", "statistic": "mean", "comparison": "absolute", "candidate": "fx",
           "op": ">=", "threshold": 0.9, "unit": "fraction"}]


def _cell(hits: int, misses: int, *, prompt: int = 1024, reported_miss: int | None = None, repetition: int = 1,
          instance: str = "node1:8002") -> list[dict]:
    """A measure cell of the fx arm: `hits` requests whose whole prompt (less one token) came from cache."""
    out = []
    for i in range(hits + misses):
        hit = i < hits
        record = request("fx", 0.5 if hit else 2.0, t_send=float(i), session=f"s{i:03d}", repetition=repetition,
                         concurrency=8, prompt_tokens=prompt, instance=instance, simulated=False)
        record["cached_tokens"] = (prompt - 1) if hit else reported_miss
        out.append(record)
    return out


def _summary(records: list[dict], hits_by_metrics: float, *, window: str | None = None, **cell) -> dict:
    first = records[0]
    summary = {
        "schema": "fxpilot.phase/1", "run_id": "test", "arm": first["arm"], "instance": first["instance"],
        "phase": first["phase"], "concurrency": first["concurrency"], "repetition": first["repetition"],
        "requests": len(records), "simulated": False, "versions": {"vllm": "0.20.1", "lmcache": "0.3.9"},
        "metrics_before": {"vllm:prompt_tokens_total": 100.0, "vllm:prefix_cache_hits_total": 7.0,
                           "vllm:external_prefix_cache_hits_total": 50.0},
        "metrics_after": {"vllm:prompt_tokens_total": 100.0 + sum(r["prompt_tokens"] for r in records),
                          "vllm:prefix_cache_hits_total": 7.0,
                          "vllm:external_prefix_cache_hits_total": 50.0 + hits_by_metrics},
    }
    if window:
        summary["metrics_window"] = window
    summary.update(cell)
    return summary


def _inputs(records: list[dict], summaries: list[dict]) -> Inputs:
    return load_inputs([("fx.jsonl", jsonl(records)),
                        ("fx.summary.json", "".join(json.dumps(s) + "\n" for s in summaries).encode())])


def test_a_vllm_0201_cell_where_half_missed_has_the_hit_ratio_that_metrics_say():
    records = _cell(4, 4)                   # the misses carry cached_tokens: null, as vLLM 0.20.1 sends them
    metrics = 4 * 1023.0
    inputs, check = counters.reconcile(_inputs(records, [_summary(records, metrics)]))
    assert check["ok"], check
    cached = inputs.requests["cached_tokens"].tolist()
    assert sorted(cached) == [0.0] * 4 + [1023.0] * 4
    verdict = evaluate(plan_with(G2_HIT, gate=2), 2, [("fx.jsonl", jsonl(records)),
                                                     ("fx.summary.json", json.dumps(_summary(records, metrics)).encode())])
    hit = next(c for c in verdict["criteria"] if c["key"] == "g2-hit")
    by_metrics = metrics / (8 * 1024)
    assert abs(hit["value"] - by_metrics) < 1e-3, (hit["value"], by_metrics)
    assert hit["verdict"] != "pass"          # 50 % is not ≥ 90 %, whatever the nulls would have suggested


def test_records_that_claim_more_hits_than_the_server_counted_make_the_run_invalid_naming_the_cell():
    records = _cell(8, 0, repetition=2)
    verdict = evaluate(plan_with(G2_HIT, gate=2), 2, [("fx.jsonl", jsonl(records)),
                                                     ("fx.summary.json",
                                                      json.dumps(_summary(records, 4 * 1023.0)).encode())])
    assert verdict["verdict"] == "invalid"
    check = next(c for c in verdict["validity"]["checks"] if c["name"] == counters.CHECK_NAME)
    assert not check["ok"]
    assert "fx/measure@8 rep 2 (node1:8002)" in check["detail"] and "8184" in check["detail"] \
        and "4092" in check["detail"]


def test_records_and_metrics_that_agree_pass_the_check():
    records = _cell(8, 0)
    _, check = counters.reconcile(_inputs(records, [_summary(records, 8 * 1023.0)]))
    assert check["ok"] and "agree" in check["detail"]


def test_a_window_where_nobody_reported_and_metrics_counted_no_hit_is_all_misses():
    records = [dict(r, arm="recompute") for r in _cell(0, 8)]
    inputs, check = counters.reconcile(_inputs(records, [_summary(records, 0.0)]))
    assert check["ok"]
    assert inputs.requests["cached_tokens"].tolist() == [0.0] * 8


def test_a_window_with_hits_but_no_reported_figure_is_left_alone_and_said_so():
    records = _cell(0, 8)
    inputs, check = counters.reconcile(_inputs(records, [_summary(records, 2048.0)]))
    assert check["ok"] and "not cross-checked" in check["detail"]
    assert inputs.requests["cached_tokens"].isna().all()


def test_summaries_of_one_loop_share_a_window_and_are_checked_together():
    measure = _cell(4, 0)
    fault = [dict(r, phase="fault", session=f"f{i}") for i, r in enumerate(_cell(0, 4, reported_miss=0))]
    summaries = [_summary(measure, 4 * 1023.0, window="w1"), _summary(fault, 4 * 1023.0, window="w1", phase="fault")]
    _, check = counters.reconcile(_inputs(measure + fault, summaries))
    assert check["ok"], check
    # Without the shared window each summary would be compared with its own cell, and the fault cell disagree.
    for summary in summaries:
        del summary["metrics_window"]
    _, check = counters.reconcile(_inputs(measure + fault, summaries))
    assert not check["ok"] and "fx/fault@8 rep 1" in check["detail"]


def test_a_counter_reset_by_a_restart_counts_from_zero():
    records = _cell(2, 0)
    summary = _summary(records, 0.0)
    summary["metrics_before"]["vllm:external_prefix_cache_hits_total"] = 90000.0
    summary["metrics_after"]["vllm:external_prefix_cache_hits_total"] = 2046.0   # below "before": restarted
    _, check = counters.reconcile(_inputs(records, [summary]))
    assert check["ok"], check


def test_summaries_that_match_no_records_make_the_run_invalid_naming_them():
    """Held-out case (issue 26): fx summaries under another run id whose /metrics say 60 % tier hits while the records
    say 99 %. They match no record, so nothing compared them: the check says so and the run is invalid."""
    from gates.judge import evaluate, synthetic
    from gates.plan import load_plan

    files = synthetic.gate_inputs(3, simulated=False)
    out = []
    for name, data in files:
        if name.endswith(".summary.json"):
            rows = [json.loads(line) for line in data.decode().splitlines()]
            for row in rows:
                if row["arm"] == "fx" and row["concurrency"] == 8:
                    row["run_id"] = "another-run"
                    after = dict(row["metrics_after"])
                    after["vllm:external_prefix_cache_hits_total"] = 0.6 * after["vllm:prompt_tokens_total"]
                    row["metrics_after"] = after
            data = synthetic.jsonl(rows)
        out.append((name, data))
    verdict = evaluate(load_plan("default"), 3, out)
    check = next(c for c in verdict["validity"]["checks"] if c["name"] == "hit-counters-agree")
    assert verdict["verdict"] == "invalid" and not check["ok"], check
    assert "phase summaries with /metrics match no request record by run id, instance and cell: fx/measure@8" in \
        check["detail"] and "(run another-run, instance" in check["detail"], check["detail"]
