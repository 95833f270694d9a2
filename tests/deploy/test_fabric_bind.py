"""Cross-node sharing on a real cluster: a node's servers listen on its fabric address, where the other node reaches them."""
from __future__ import annotations

import shlex
import socket

import pytest

from runners import ssh
from runners.config import DeploymentSettingsError, default_simulated, validate_deployment
from runners.deploy import deploy_arm
from runners.teardown import teardown_arm


def test_fabric_addresses_are_validated_by_node_name_and_address():
    settings = validate_deployment(default_simulated() | {"fabric_addresses": {"node1": "10.1.0.11", "node2": "fd00::12"}})
    assert settings.bind_address("node1") == "10.1.0.11" and settings.bind_address("node3") == "127.0.0.1"
    assert validate_deployment(settings.to_dict()).fabric_addresses == settings.fabric_addresses
    for bad, field in (({"node1": "0.0.0.0"}, "fabric_addresses.node1"), ({"node1": "gpu1; rm -rf /"}, "fabric_addresses.node1"),
                       ({"node 1": "10.0.0.1"}, "fabric_addresses"), ({"node1": "224.0.0.1"}, "fabric_addresses.node1")):
        with pytest.raises(DeploymentSettingsError) as caught:
            validate_deployment(default_simulated() | {"fabric_addresses": bad})
        assert caught.value.field == field


def _listening(host: str, port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(2)
        return sock.connect_ex((host, port)) == 0


def test_a_server_deployed_on_a_fabric_address_is_reached_there_by_the_other_node(sim_nodes):
    node1, node2 = sim_nodes.nodes
    sim_nodes.pilot.deployment = default_simulated() | {"fabric_addresses": {node1.name: "127.0.0.2",
                                                                             node2.name: "127.0.0.3"}}
    sim_nodes.pilot.save()
    deployment = deploy_arm(sim_nodes.job, None, node1, "recompute")
    try:
        assert deployment.host == "127.0.0.2" and deployment.url == f"http://127.0.0.2:{deployment.port}"
        assert _listening("127.0.0.2", deployment.port)
        assert not _listening("127.0.0.1", deployment.port)  # not on the loopback any more
        # The reading client on node2 reaches node1's server through node1's fabric address.
        script = "import sys, urllib.request; print(urllib.request.urlopen(sys.argv[1], timeout=600).status)"
        answer = ssh.run(node2, f"python3 -c {shlex.quote(script)} {shlex.quote(deployment.url + '/health')}")
        assert answer.stdout.strip() == "200"
    finally:
        teardown_arm(sim_nodes.job, None, node1, deployment)
