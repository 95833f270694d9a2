"""Evidence the judge must see before it believes a run: who answered (the simulator is never real), whether
/metrics showed the GPU cache cold, and what G4's path cut really did."""
from __future__ import annotations

import json

from gates.judge import evaluate, synthetic
from gates.plan import load_plan

PLAN = load_plan("default")


def g3_files(frame=None, summaries=None) -> list[tuple[str, bytes]]:
    frame = synthetic.table1_frame(seed=5) if frame is None else frame
    summaries = synthetic.phase_summaries(frame) if summaries is None else summaries
    return [("records.jsonl", synthetic.jsonl(synthetic.records(frame))),
            ("records.summary.json", synthetic.jsonl(summaries)),
            ("node1/inventory.json", json.dumps(synthetic.inventory()).encode())]


def check(verdict: dict, name: str) -> dict:
    return next(c for c in verdict["validity"]["checks"] if c["name"] == name)


def test_a_cache_arm_measured_without_metrics_is_invalid_not_cold():
    frame = synthetic.table1_frame(seed=5)
    summaries = [{**s, "metrics_before": {}, "metrics_after": {}} for s in synthetic.phase_summaries(frame)]
    verdict = evaluate(PLAN, 3, g3_files(frame, summaries))
    hits = check(verdict, "hit-behaviour-matches-arm")
    assert verdict["verdict"] == "invalid" and not hits["ok"]
    assert "fx/measure: cannot be verified: no /metrics" in hits["detail"]
    assert "local_nvme/measure: cannot be verified: no /metrics" in hits["detail"]
    assert "recompute/measure: cannot" not in hits["detail"]  # recompute's records say 0 cached: that is checkable


def test_records_of_a_real_node_answered_by_the_simulator_are_simulated():
    frame = synthetic.table1_frame(seed=5).assign(simulated=False)
    summaries = synthetic.phase_summaries(frame)
    for summary in summaries:
        summary["metrics_after"] = {**summary["metrics_after"], "fxpilot_simulated": 1.0}
        summary["metrics_before"] = {**summary["metrics_before"], "fxpilot_simulated": 1.0}
    inventory = {**synthetic.inventory(), "simulated": False}
    files = g3_files(frame, summaries)[:2] + [("node1/inventory.json", json.dumps(inventory).encode())]
    verdict = evaluate(PLAN, 3, files)
    mixed = check(verdict, "no-simulated-mixed-with-real")
    assert verdict["simulated"] is True and verdict["verdict"] == "invalid" and not mixed["ok"]
    assert "fxpilot_simulated" in mixed["detail"] and "simulator" in mixed["detail"]


def g4_files(change=None) -> list[tuple[str, bytes]]:
    """The default plan's G4 inputs, their phase summaries changed by `change(summary)` first."""
    files = synthetic.gate_inputs(4)
    out = []
    for name, data in files:
        if name.endswith(".summary.json") and change is not None:
            rows = [json.loads(line) for line in data.decode().splitlines()]
            for row in rows:
                change(row)
            data = synthetic.jsonl(rows)
        out.append((name, data))
    return out


def criterion(verdict: dict, key: str) -> dict:
    return next(c for c in verdict["criteria"] if c["key"] == key)


def test_a_fault_window_whose_cut_was_refused_is_invalid_saying_so():
    def refused(summary):
        if "fault" in summary:
            summary["fault"] = {"cut_exit": 2, "cut_error": "RTNETLINK answers: Operation not permitted",
                                "restore_exit": 2, "eviction": {"reset": "prefix cache reset"}}
    verdict = evaluate(PLAN, 4, g4_files(refused))
    cut = check(verdict, "fault-path-cut-confirmed")
    assert verdict["verdict"] == "invalid" and not cut["ok"]  # infrastructure: an error, never a failed gate
    assert "the cut command exited 2 (RTNETLINK answers: Operation not permitted): the FX path was not cut" in cut["detail"]
    assert "the restore command exited 2" in cut["detail"]
    assert criterion(verdict, "g4-fault-answers")["verdict"] == "invalid"


def test_a_failed_eviction_after_the_restore_or_no_fault_record_is_invalid():
    def unevicted(summary):
        if "fault" in summary:
            summary["fault"]["eviction"] = {"error": "POST /reset_prefix_cache answered HTTP 500"}
    cut = check(evaluate(PLAN, 4, g4_files(unevicted)), "fault-path-cut-confirmed")
    assert not cut["ok"] and "the eviction after the restore failed (POST /reset_prefix_cache answered HTTP 500)" in cut["detail"]
    verdict = evaluate(PLAN, 4, g4_files(lambda s: s.pop("fault", None)))
    assert not check(verdict, "fault-path-cut-confirmed")["ok"] and verdict["verdict"] == "invalid"


def test_recovery_is_judged_on_external_tier_hits_not_on_cached_tokens():
    good = evaluate(PLAN, 4, g4_files())
    assert check(good, "fault-path-cut-confirmed")["ok"] and check(good, "external-hits-measured")["ok"]
    recovery = criterion(good, "g4-fault-recovery")
    assert recovery["metric"] == "external_hit_ratio" and recovery["verdict"] == "pass"

    # the records say every token was cached, but /metrics says HBM served them: the tier did not come back
    def hbm(summary):
        if summary["phase"] == "recovery":
            prompt = summary["metrics_after"]["vllm:prompt_tokens_total"]
            summary["metrics_after"].update({"vllm:prefix_cache_hits_total": prompt * 0.95,
                                             "vllm:external_prefix_cache_hits_total": prompt * 0.01,
                                             "vllm:external_prefix_cache_queries_total": prompt * 0.05})
    verdict = evaluate(PLAN, 4, g4_files(hbm))
    recovery = criterion(verdict, "g4-fault-recovery")
    assert recovery["value"] == 0.2 and recovery["cells"][0]["verdict"] == "fail"
    assert "external-tier share of the prompt tokens HBM missed" in recovery["explanation"]

    # without /metrics of its own the recovery cannot be verified
    def blind(summary):
        if summary["phase"] == "recovery":
            summary["metrics_before"], summary["metrics_after"] = {}, {}
    verdict = evaluate(PLAN, 4, g4_files(blind))
    measured = check(verdict, "external-hits-measured")
    assert verdict["verdict"] == "invalid" and "g4-fault-recovery: cannot be verified: no /metrics" in measured["detail"]


def test_a_real_cache_arm_must_have_run_lmcache():
    frame = synthetic.table1_frame(seed=5).assign(simulated=False)
    inventory = ("node1/inventory.json", json.dumps({**synthetic.inventory(), "simulated": False}).encode())

    def judged(connector):
        summaries = synthetic.phase_summaries(frame)
        for summary in summaries:
            if summary["arm"] != "recompute":
                if connector is None:
                    summary["versions"].pop("kv_connector")
                else:
                    summary["versions"]["kv_connector"] = connector
        return evaluate(PLAN, 3, g3_files(frame, summaries)[:2] + [inventory])

    assert check(judged("LMCacheConnectorV1"), "kv-connector-is-lmcache")["ok"]
    example = judged("ExampleConnector")
    found = check(example, "kv-connector-is-lmcache")
    assert example["verdict"] == "invalid" and not found["ok"]
    assert "fx: the server ran the KV connector ExampleConnector (per the deploy manifest), not LMCacheConnectorV1" \
        in found["detail"]
    assert "cannot be verified" in check(judged(None), "kv-connector-is-lmcache")["detail"]


def test_a_real_cold_read_needs_o_direct_or_a_dropped_page_cache():
    frame = synthetic.table1_frame(seed=5).assign(simulated=False)
    inventory = ("node1/inventory.json", json.dumps({**synthetic.inventory(), "simulated": False}).encode())

    def judged(odirect: bool, dropped: str):
        summaries = synthetic.phase_summaries(frame)
        for summary in summaries:
            if summary["arm"] != "recompute":
                summary["versions"]["page_cache"] = {"use_odirect": odirect, "drop_page_cache": True}
                summary["eviction"] = {"reset": "prefix cache reset", "drop-caches": dropped}
        return evaluate(PLAN, 3, g3_files(frame, summaries)[:2] + [inventory])

    assert check(judged(True, "page cache NOT dropped: not root"), "page-cache-bypassed")["ok"]
    assert check(judged(False, "page cache dropped"), "page-cache-bypassed")["ok"]
    verdict = judged(False, "page cache NOT dropped: not root (use O_DIRECT in LMCache or run the client as root)")
    bypass = check(verdict, "page-cache-bypassed")
    assert verdict["verdict"] == "invalid" and not bypass["ok"]
    assert bypass["detail"].startswith("fx: neither O_DIRECT") and "page cache NOT dropped: not root" in bypass["detail"]
