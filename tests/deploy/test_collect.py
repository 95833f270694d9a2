"""Collection over real SSH: files come back as artifacts hashed on both ends."""
from __future__ import annotations

import pytest

from runners.artifacts import read_artifact
from runners.collect import collect
from runners.deployment import DeployError


def test_files_come_back_as_artifacts_and_again_as_the_same_ones(sim_nodes):
    node, root = sim_nodes.nodes[0], sim_nodes.servers[0].root
    records = root / "fxpilot-runs" / "r1" / "records.jsonl"
    records.parent.mkdir(parents=True, exist_ok=True)
    records.write_text('{"schema": "fxpilot.request/1", "simulated": true}\n')
    (root / "fxpilot-runs" / "r1" / "records.jsonl.summary.json").write_text('{"schema": "fxpilot.phase/1"}\n')
    paths = ["~/fxpilot-runs/r1/records.jsonl", "~/fxpilot-runs/r1/records.jsonl.summary.json"]
    first = collect(sim_nodes.job, None, node, paths)
    assert [(a.name, a.kind, a.simulated) for a in first] == [("node1/records.jsonl", "records", True),
                                                              ("node1/records.jsonl.summary.json", "phase-summary", True)]
    assert read_artifact(first[0]) == records.read_bytes()
    assert [a.pk for a in collect(sim_nodes.job, None, node, paths)] == [a.pk for a in first]


def test_a_missing_file_is_named_and_the_rest_is_kept(sim_nodes):
    node, root = sim_nodes.nodes[1], sim_nodes.servers[1].root
    (root / "kept.log").write_text("server log\n")
    with pytest.raises(DeployError, match=r"collected 1 file\(s\), but missing: ~/not-there.jsonl"):
        collect(sim_nodes.job, None, node, {"~/kept.log": "node2/kept.log", "~/not-there.jsonl": "node2/x.jsonl"})
    assert sim_nodes.job.artifacts.filter(name="node2/kept.log", kind="server-log").exists()


def test_a_file_that_changed_since_it_was_collected_is_named_not_replaced(sim_nodes):
    node, root = sim_nodes.nodes[0], sim_nodes.servers[0].root
    (root / "a.jsonl").write_text("{}\n")
    (root / "b.jsonl").write_text("{}\n")
    first = collect(sim_nodes.job, None, node, ["~/a.jsonl"])
    (root / "a.jsonl").write_text("{}\n{}\n")
    with pytest.raises(DeployError, match="a.jsonl: .*already stored for this job"):
        collect(sim_nodes.job, None, node, ["~/a.jsonl", "~/b.jsonl"])
    assert read_artifact(first[0]) == b"{}\n"
    assert sim_nodes.job.artifacts.filter(name="node1/b.jsonl").exists()
