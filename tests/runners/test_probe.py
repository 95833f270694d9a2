"""The G1 probe over real SSH on simulated nodes: every field filled, every raw output re-hashable."""
from __future__ import annotations

import json

import pytest

from runners.artifacts import read_artifact, sha256_file
from runners.inventory import missing_fields
from runners.models import Artifact, Node
from runners.probe import NodeNotReady, ProbeSettingsError, probe_node, probe_nodes, probe_settings
from tests.runners.conftest import job_text


@pytest.mark.django_db(transaction=True)
def test_probing_two_simulated_nodes_fills_every_field_and_keeps_rehashable_evidence(simnodes, make_node, job):
    nodes = [make_node(server) for server in simnodes(2)]
    results = probe_nodes(nodes, job=job, fio_runtime=5)
    for node in nodes:
        inventory = results[node.name]
        assert not isinstance(inventory, Exception), inventory
        assert missing_fields(inventory) == [] and inventory["problems"] == []
        assert inventory["preflight"]["ok"] is True and inventory["preflight"]["blockers"] == []
        assert {(f["check"], f["status"]) for f in inventory["preflight"]["findings"]} >= {
            ("vllm", "ok"), ("model", "ok"), ("fx", "connected"), ("sudo", "ok")}
        assert inventory["simulated"] is True and inventory["node"] == node.name
        devices = inventory["gpus"].pop("devices")
        assert inventory["gpus"] == {"count": 8, "model": "AMD Instinct MI308X", "memory_gb": 192, "arch": "gfx942"}
        assert [(d["index"], d["model"], d["memory_gb"]) for d in devices] == [(i, "MI308X", 192) for i in range(8)]
        assert all(d["bdf"] and d["uuid"] for d in devices)
        inventory["gpus"]["devices"] = devices
        assert inventory["rocm"] == "7.2.1" and inventory["vllm"] == "0.20.1+rocm721"
        assert inventory["lmcache"]["hip"] is True and len(inventory["lmcache"]["commit"]) == 40
        assert inventory["fx"]["transport"] == "rdma" and inventory["fx"]["mounted"] and inventory["fx"]["writable"]
        assert inventory["fx"]["nqn"] == job.pilot.deployment["fx_target"]["nqn"]
        assert inventory["local_nvme"]["pcie_gen"] == 4 and inventory["local_nvme"]["size_gb"] == 2048
        assert inventory["fio"]["fx"]["read_gbps"] > inventory["fio"]["local_nvme"]["read_gbps"] > 0
        assert any(n["rdma_device"] and n["speed_gbps"] == 100 and n["state"] == "up" for n in inventory["nics"])
        node.refresh_from_db()
        assert node.inventory == inventory and node.inventory_at is not None
    artifacts = Artifact.objects.filter(job=job)
    assert artifacts.filter(name="node1/probe/amd-smi-static.json").exists()
    assert artifacts.filter(name__startswith="node2/probe/").count() >= 20
    for artifact in artifacts:
        assert sha256_file(artifact.path) == artifact.sha256 and artifact.simulated
    stored = json.loads(read_artifact(artifacts.get(name="node1/inventory.json")))
    assert stored["artifacts"]["fio-fx.json"] == artifacts.get(name="node1/probe/fio-fx.json").sha256
    assert "probe: fio-fx.json (exit 0)" in job_text(job, "stdout")


def test_a_node_whose_fx_namespace_is_missing_says_so(simnodes, make_node, job):
    server = simnodes(1, fx_missing=True)[0]
    node = make_node(server)
    with pytest.raises(NodeNotReady) as caught:
        probe_node(node, job=job, fio_runtime=1)
    assert [b["code"] for b in caught.value.blockers] == ["fx_not_offered"]
    assert "the FX target 192.168.100.10:4420 does not offer nqn.2026-01.com.example.fx:fx100.pool0 to node1" in str(caught.value)
    inventory = Node.objects.get(pk=node.pk).inventory  # kept, with everything the probe saw
    assert inventory["preflight"]["ok"] is False
    assert inventory["fx"]["namespace"] is None and inventory["fx"]["mounted"] is False
    assert inventory["fio"]["fx"]["read_gbps"] is None and inventory["fio"]["local_nvme"]["read_gbps"] > 0
    assert any("no NVMe-oF subsystem" in p for p in inventory["problems"])
    assert any(p.startswith("fio-fx.json: fio did not run") and "not mounted" in p for p in inventory["problems"])
    assert "fx.namespace" in missing_fields(inventory)


def test_a_cut_fx_path_shows_as_a_link_down(simnodes, make_node, job):
    server = simnodes(1, fx_down=True)[0]
    inventory = probe_node(make_node(server), job=job, fio_runtime=1)
    roce = next(n for n in inventory["nics"] if n["rdma_device"])
    assert roce["state"] == "down" and roce["speed_gbps"] is None
    assert inventory["fio"]["fx"]["read_gbps"] is None


def test_probe_settings_come_from_the_deployment_with_node_defaults():
    sim = probe_settings({}, simulated=True)
    assert sim.fx_mount == "~/mnt/fx" and sim.fx_nqn is None
    real = probe_settings({"paths": {"fx_mount": "/data/fx/"}, "fx_target": {"nqn": "nqn.2026-01.com.x:y"}}, simulated=False)
    assert real.fx_mount == "/data/fx" and real.local_nvme_path == "/mnt/nvme0/fxpilot" and real.fx_nqn == "nqn.2026-01.com.x:y"
    with pytest.raises(ProbeSettingsError, match="deployment.fx_target.nqn"):
        probe_settings({"fx_target": {"nqn": "not-an-nqn"}}, simulated=False)
    with pytest.raises(ProbeSettingsError, match="deployment.paths.fx_mount"):
        probe_settings({"fx_mount": "/mnt/fx\nreboot"}, simulated=False)


def test_a_probe_stops_at_an_unaccepted_host_key(simnodes, make_node, job):
    from runners.ssh import HostKeyPending

    node = make_node(simnodes(1)[0], accept=False)
    with pytest.raises(HostKeyPending):
        probe_node(node, job=job)
    assert Node.objects.get(pk=node.pk).inventory == {}
