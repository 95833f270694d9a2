"""All three arms on two simulated nodes over real SSH: deploy, a short cold-recovery run, collect, teardown."""
from __future__ import annotations

import json
import shlex
import socket

from runners import ssh
from runners.artifacts import read_artifact
from runners.collect import collect_deployment
from runners.config import default_simulated
from runners.deploy import deploy_arm
from runners.models import Step
from runners.simnode.state import update_state
from runners.teardown import teardown_arm

REQUEST_FIELDS = {"schema", "run_id", "arm", "instance", "phase", "concurrency", "repetition", "session", "prompt_tokens",
                  "cached_tokens", "output_tokens", "t_send", "t_first_token", "t_end", "wall_anchor", "status", "error",
                  "simulated"}


def disconnected(state: dict) -> None:
    state["fx"]["connected"] = False
    state["fx"]["mounted_at"] = None


def cold_recovery(node, deployment) -> None:
    args = ["python3", deployment.workload, "cold-recovery", "--url", deployment.url, "--arm", deployment.arm,
            "--out", f"{deployment.records_dir}/{deployment.arm}.jsonl", "--run-id", deployment.run_id,
            "--instance", deployment.instance, "--prompt-tokens", "2048", "--turn-tokens", "64", "--output-tokens", "4",
            "-c", "8,16,32", "--repetitions", "1", "--requests-per-client", "1", "--evict", "reset", "--quiet"]
    ssh.run(node, " ".join(shlex.quote(a) for a in args), timeout=600)


def port_is_free(port: int) -> bool:
    with socket.socket() as probe:
        return probe.connect_ex(("127.0.0.1", port)) != 0


def test_three_arms_deploy_run_cold_recovery_and_tear_down(sim_nodes):
    job, (node1, node2) = sim_nodes.job, sim_nodes.nodes
    update_state(sim_nodes.servers[0].root, disconnected)
    sim_nodes.pilot.deployment = default_simulated()
    sim_nodes.pilot.save()
    placements = [("recompute", node1), ("local_nvme", node2), ("fx", node1)]
    deployments = []
    try:
        for seq, (arm, node) in enumerate(placements, start=1):
            step = Step.objects.create(job=job, seq=seq, name="deploy", node=node, arm=arm)
            deployments.append((step, node, deploy_arm(job, step, node, arm, time_scale=0.0005)))
        state = sim_nodes.servers[0].state()
        assert state["fx"]["connected"] and state["fx"]["mounted_at"], "the fx deploy attached the FX array"
        for _, node, deployment in deployments:
            cold_recovery(node, deployment)
        collected = {d.arm: collect_deployment(job, step, node, d) for step, node, d in deployments}
    finally:
        for step, node, deployment in deployments:
            teardown_arm(job, step, node, deployment)

    for step, node, deployment in deployments:
        assert port_is_free(deployment.port)
        assert job.artifacts.filter(kind="server-log", name__startswith=deployment.name_prefix).exists()
        teardown_arm(job, step, node, deployment)  # a second teardown is harmless
    state = sim_nodes.servers[0].state()
    assert not state["fx"]["connected"], "teardown detached what the run attached"

    hits = {}
    for arm, artifacts in collected.items():
        by_kind = {a.kind: a for a in artifacts}
        manifest = json.loads(read_artifact(by_kind["manifest"]))
        assert manifest["simulated"] is True and manifest["page_cache"]["method"] == "odirect"
        assert manifest["versions"]["lmcache"]["hip"] is True and manifest["versions"]["vllm"] == "0.20.1+rocm721"
        assert manifest["cache_device"] == {"recompute": None, "local_nvme": "/dev/nvme0n1", "fx": "/dev/nvme1n1"}[arm]
        records = [json.loads(line) for line in read_artifact(by_kind["records"]).splitlines()]
        assert records and all(set(r) >= REQUEST_FIELDS and r["arm"] == arm and r["simulated"] for r in records)
        assert {r["concurrency"] for r in records if r["phase"] == "measure"} == {8, 16, 32}
        assert all(r["status"] == "ok" for r in records), [r["error"] for r in records if r["status"] != "ok"]
        summaries = [json.loads(line) for line in read_artifact(by_kind["phase-summary"]).splitlines()]
        measure = [s for s in summaries if s["phase"] == "measure"]
        external = sum(s["metrics_after"].get("vllm:external_prefix_cache_hits_total", 0)
                       - s["metrics_before"].get("vllm:external_prefix_cache_hits_total", 0) for s in measure)
        hits[arm] = external / sum(r["prompt_tokens"] for r in records if r["phase"] == "measure")
    # After eviction from HBM the cache arms find the sessions' contexts (2048 of 2112 tokens) in LMCache.
    assert hits["recompute"] == 0
    assert hits["local_nvme"] > 0.8 and hits["fx"] > 0.8
