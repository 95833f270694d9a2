"""read_bw is the bandwidth of retrievals the candidate's own tier served, logged with a bandwidth (judge 4)."""
from __future__ import annotations

import json

from gates.judge import evaluate
from gates.judge.lmcache_log import parse_log, to_jsonl
from tests.judge.helpers import inventory_file, jsonl, plan_with, request, summaries_file

LINE = ("(Worker_TP{gpu} pid=9) [2026-12-01 08:01:26,240] LMCache INFO: [req_id=cmpl-{i}-0] Retrieved 2048 out of 2048 "
        "required tokens (from 2304 total tokens). size: 0.2344 gb, cost 45.1200 ms, throughput: {gbps:.4f} GB/s; "
        "(cache_engine.py:986:lmcache.v1.cache_engine)")
LAYERWISE = ("(Worker_TP{gpu} pid=9) [2026-12-01 08:01:26,240] LMCache INFO: [req_id=cmpl-{i}-0] Retrieved 2048 out of "
             "2048 out of total 2304 tokens (cache_engine.py:1146:lmcache.v1.cache_engine)")
CRITERION = {"key": "g2-read", "metric": "read_bw", "statistic": "p50", "comparison": "absolute", "candidate": "fx",
             "threshold": 4.0}


def judge(log: str, tier: str | None):
    records = [request(arm="fx", phase="measure", concurrency=1, repetition=1, session=f"s{i}", ttft=1.0)
               for i in range(8)]
    plan = plan_with([CRITERION], gate=2, min_requests_per_cell=1)
    retrieves = parse_log(log, run_id=records[0]["run_id"], arm="fx", tier=tier, simulated=True)
    files = [("records.jsonl", jsonl(records)), summaries_file(records), inventory_file(),
             ("retrieve.jsonl", to_jsonl(retrieves))]
    verdict = evaluate(plan, 2, files, planned=1)
    check = next(c for c in verdict["validity"]["checks"] if c["name"] == "read-bw-measured")
    return verdict, verdict["criteria"][0], check


def test_a_version_that_logs_no_bandwidth_makes_read_bw_invalid_with_that_reason():
    log = "\n".join(LAYERWISE.format(gpu=i % 8, i=i) for i in range(32))
    verdict, criterion, check = judge(log, "fx")
    assert criterion["verdict"] == "invalid" and verdict["verdict"] == "invalid"
    assert not check["ok"] and "this LMCache version logs no bandwidth" in check["detail"]
    assert check["detail_said"][0]["template"].startswith("%(criterion)s: this LMCache version logs no bandwidth")
    assert verdict["read_bw"][0]["n"] == 0 and verdict["read_bw"][0]["retrievals"] == 32


def test_retrievals_no_one_can_attribute_to_the_fx_tier_do_not_measure_it():
    log = "\n".join(LINE.format(gpu=i % 8, i=i, gbps=5.0 + 0.01 * i) for i in range(32))
    verdict, criterion, check = judge(log, None)
    assert criterion["verdict"] == "invalid" and not check["ok"]
    assert "can be attributed to its own tier" in check["detail"]
    verdict, criterion, check = judge(log, "fx")
    assert check["ok"] and criterion["verdict"] == "pass", json.dumps(check)
    assert criterion["cells"][0]["n_candidate"] == 32


def test_records_of_another_tier_are_left_out():
    fx = [json.loads(line) for line in to_jsonl(parse_log(
        "\n".join(LINE.format(gpu=i % 8, i=i, gbps=5.0) for i in range(16)), run_id="r", arm="fx", tier="fx")).splitlines()]
    dram = [{**r, "gbps": 40.0, "tier": "dram"} for r in fx]
    from gates.judge.records import load_inputs
    from gates.judge.validity import bandwidth_retrievals
    inputs = load_inputs([("retrieve.jsonl", jsonl(fx + dram))])
    used = bandwidth_retrievals(inputs.retrieves, "fx")
    assert len(used) == 16 and set(used["gbps"]) == {5.0}


def _g2_untiered(change=None):
    """The synthetic G2 with its retrievals unattributed (LMCache's DRAM on: the configuration names no tier) and
    its phase summaries passed through change(summary)."""
    from gates.judge import synthetic
    out = []
    for name, data in synthetic.gate_inputs(2):
        rows = [json.loads(line) for line in data.decode().splitlines()] if name.endswith((".jsonl", ".summary.json")) \
            else []
        if name == "retrieve.jsonl":
            for row in rows:
                row["tier"] = None
            data = jsonl(rows)
        elif name.endswith(".summary.json") and change is not None:
            for row in rows:
                change(row)
            data = jsonl(rows)
        out.append((name, data))
    return out


def test_the_device_counters_attribute_retrievals_of_cold_windows_that_began_with_dram_emptied():
    from gates.plan import load_plan
    plan = load_plan("default")
    verdict = evaluate(plan, 2, _g2_untiered())
    cold_read = next(c for c in verdict["criteria"] if c["key"] == "g2-cold-read")
    assert cold_read["verdict"] == "pass" and cold_read["cells"][0]["n_candidate"] == 64
    assert verdict["read_bw_attribution"]["fx"] == (
        "64 retrieval(s) attributed to the fx tier by its device counters: 12 cold window(s) began with LMCache's "
        "DRAM emptied and their device bytes match their external hits")

    def one_warm(summary):
        if summary["phase"] == "measure" and summary["repetition"] == 4:
            summary["dram_cleared"] = False
    verdict = evaluate(plan, 2, _g2_untiered(one_warm))
    check = next(c for c in verdict["validity"]["checks"] if c["name"] == "read-bw-measured")
    assert not check["ok"] and "can be attributed to its own tier" in check["detail"]
    assert verdict["read_bw_attribution"]["fx"] == ("not attributed: fx/measure@8 rep 4 on records.summary.json did "
                                                    "not begin with LMCache's DRAM emptied")
