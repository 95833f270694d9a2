"""Every instance of a cache arm shows its own /metrics (issue 28): node 2's counters never vouch for node 1's."""
from __future__ import annotations

import json

from gates.judge import evaluate, synthetic
from gates.plan import load_plan

PLAN = load_plan("default")


def two_nodes(*, node1_metrics: bool) -> list[tuple[str, bytes]]:
    """G3 as the placement rule spreads it: concurrency 8 and 16 (with recompute) on node1, 32 on node2."""
    frame = synthetic.table1_frame(seed=5, repetitions=synthetic.FIRST_LOOK)  # a look of the plan's design
    frame["instance"] = ["node2:8001" if c == 32 else "node1:8001" for c in frame["concurrency"]]
    summaries = synthetic.phase_summaries(frame)
    for summary in summaries:
        summary["instance"] = "node2:8001" if summary["concurrency"] == 32 else "node1:8001"
        if not node1_metrics and summary["instance"] == "node1:8001" and summary["arm"] != "recompute":
            summary["metrics_before"], summary["metrics_after"] = {}, {}  # the workload said UNVERIFIED
            summary["metrics_error"] = "GET /metrics on node1:8001 answered HTTP 404"
    return [("records.jsonl", synthetic.jsonl(synthetic.records(frame))),
            ("records.summary.json", synthetic.jsonl(summaries)),
            ("node1/inventory.json", json.dumps(synthetic.inventory()).encode()),
            ("node2/inventory.json", json.dumps(synthetic.inventory("node2")).encode())]


def hit_check(verdict: dict) -> dict:
    return next(c for c in verdict["validity"]["checks"] if c["name"] == "hit-behaviour-matches-arm")


def test_both_nodes_with_their_own_counters_are_verified():
    verdict = evaluate(PLAN, 3, two_nodes(node1_metrics=True))
    assert hit_check(verdict)["ok"], hit_check(verdict)["detail"]
    assert verdict["verdict"] != "invalid"


def test_one_node_without_metrics_makes_the_gate_invalid_naming_that_node():
    verdict = evaluate(PLAN, 3, two_nodes(node1_metrics=False))
    check = hit_check(verdict)
    assert not check["ok"]
    assert verdict["verdict"] == "invalid"
    for arm in ("fx", "local_nvme"):
        assert f"{arm}/measure on node node1 (instance node1:8001): cannot be verified" in check["detail"]
    assert "node2" not in check["detail"].split("cannot be verified")[0]
    assert "on node node2" not in check["detail"]
    # every criterion says why: the reason names the node
    assert all(c["verdict"] == "invalid" for c in verdict["criteria"])
    assert all("on node node1 (instance node1:8001)" in c["explanation"] for c in verdict["criteria"])
