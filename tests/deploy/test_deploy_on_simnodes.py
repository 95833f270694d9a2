"""The deploy step over real SSH on simulated nodes: failures name their reason and teardown still runs."""
from __future__ import annotations

import socket

import pytest

from runners.config import default_simulated
from runners.deploy import deploy_arm
from runners.deployment import DeployError
from runners.models import Artifact, Step
from runners.simnode.state import update_state
from runners.teardown import teardown_arm


def disconnected(state: dict) -> None:
    state["fx"]["connected"] = False
    state["fx"]["mounted_at"] = None


def test_a_deploy_on_a_port_in_use_fails_with_the_reason_and_detaches_fx(sim_nodes):
    node, server = sim_nodes.nodes[0], sim_nodes.servers[0]
    update_state(server.root, disconnected)
    holder = socket.socket()
    holder.bind(("127.0.0.1", 0))
    holder.listen()
    port = holder.getsockname()[1]
    sim_nodes.pilot.deployment = default_simulated() | {"ports": {"base": 0, "arms": {"fx": port}}}
    sim_nodes.pilot.save()
    step = Step.objects.create(job=sim_nodes.job, seq=1, name="deploy", node=node, arm="fx")
    try:
        with pytest.raises(DeployError, match=f"port {port} is already in use") as caught:
            deploy_arm(sim_nodes.job, step, node, "fx")
    finally:
        holder.close()
    state = server.state()
    assert not state["fx"]["connected"] and not state["fx"]["mounted_at"]
    step.refresh_from_db()
    assert step.result["deployment"]["torn_down"] is True
    assert Artifact.objects.filter(job=sim_nodes.job, kind="config", name__endswith="/lmcache.yaml").exists()
    teardown_arm(sim_nodes.job, step, node, caught.value.deployment)


def test_a_missing_model_path_fails_with_the_reason(sim_nodes):
    node = sim_nodes.nodes[1]
    sim_nodes.pilot.deployment = default_simulated() | {"model": "~/models/not-there"}
    sim_nodes.pilot.save()
    with pytest.raises(DeployError, match="model path .*/models/not-there does not exist"):
        deploy_arm(sim_nodes.job, None, node, "recompute")


def test_an_unreachable_fx_target_fails_with_the_reason(sim_nodes):
    node, server = sim_nodes.nodes[0], sim_nodes.servers[0]
    update_state(server.root, disconnected)
    sim_nodes.pilot.deployment = default_simulated()
    sim_nodes.pilot.deployment["fx_target"]["address"] = "192.168.100.99"
    sim_nodes.pilot.save()
    with pytest.raises(DeployError, match="192.168.100.99:4420 is unreachable over rdma"):
        deploy_arm(sim_nodes.job, None, node, "fx")


def test_a_server_that_dies_at_start_fails_the_deploy_with_its_log(sim_nodes):
    node = sim_nodes.nodes[1]
    sim_nodes.pilot.deployment = default_simulated() | {"extra_vllm_flags": ["--no-such-vllm-flag"]}
    sim_nodes.pilot.save()
    step = Step.objects.create(job=sim_nodes.job, seq=1, name="deploy", node=node, arm="local_nvme")
    with pytest.raises(DeployError, match="the server exited before it was healthy") as caught:
        deploy_arm(sim_nodes.job, step, node, "local_nvme")
    assert "--no-such-vllm-flag" in caught.value.log_tail
    assert "last lines of the server log" in str(caught.value)
    assert sim_nodes.job.artifacts.filter(kind="server-log", name__startswith=caught.value.deployment.name_prefix).exists()
    step.refresh_from_db()
    assert step.result["deployment"]["torn_down"] is True


def test_a_missing_fx_mount_point_fails_with_the_reason(sim_nodes):
    node, server = sim_nodes.nodes[1], sim_nodes.servers[1]
    update_state(server.root, disconnected)
    mount_point = server.root / "mnt" / "fx"
    mount_point.unlink() if mount_point.is_symlink() else mount_point.rmdir()  # a link to the shared array, or a dir
    sim_nodes.pilot.deployment = default_simulated()
    sim_nodes.pilot.save()
    with pytest.raises(DeployError, match=r"the mount point .*/mnt/fx does not exist .*deployment.paths.fx_mount"):
        deploy_arm(sim_nodes.job, None, node, "fx")
    assert not server.state()["fx"]["connected"]
