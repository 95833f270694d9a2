"""The customer's address policy on the jump host (issue 49, item 2): link-local and metadata addresses refused
before any connect whatever the allow-list says; FXPILOT_AGENT_ALLOW narrows the rest, by network and port; a host
name is checked on every address it resolves to; a bad entry stops the agent naming it."""
from __future__ import annotations

import ipaddress
import socket

import pytest

from runners.agent import config as agent_config
from runners.agent.nodes import AgentError, NodeConnection
from runners.agent.policy import AddressPolicy, PolicyError, Refused
from tests.agent.test_agent_process import agent_env, agent_key, spec_for  # noqa: F401 — fixtures
from tests.runners.conftest import sshd, user_key  # noqa: F401 — the real sshd and its authorised key


@pytest.mark.parametrize("address", ["169.254.169.254", "169.254.0.1", "fe80::1", "224.0.0.1", "0.0.0.0",
                                     "::ffff:169.254.169.254", "255.255.255.255"])
def test_addresses_that_are_never_allowed_are_refused_even_when_listed(address):
    policy = AddressPolicy.parse("0.0.0.0/0,::/0")
    with pytest.raises(Refused, match="never connects there"):
        policy.check(ipaddress.ip_address(address), 22, what="node x")


def test_the_allow_list_admits_by_network_and_port():
    policy = AddressPolicy.parse("10.20.0.0/16:22, [fd00::/8]:2222, 192.0.2.7")
    policy.check(ipaddress.ip_address("10.20.3.4"), 22, what="n")
    policy.check(ipaddress.ip_address("fd00::5"), 2222, what="n")
    policy.check(ipaddress.ip_address("192.0.2.7"), 8022, what="n")
    for address, port in (("10.20.3.4", 23), ("10.21.0.1", 22), ("fd00::5", 22), ("192.0.2.8", 22)):
        with pytest.raises(Refused, match="outside what the customer allows"):
            policy.check(ipaddress.ip_address(address), port, what="n")
    assert AddressPolicy.parse("").allow is None
    AddressPolicy.parse("").check(ipaddress.ip_address("127.0.0.1"), 22, what="n")


@pytest.mark.parametrize("entry", ["gpu1.example.com", "10.0.0.0/33", "10.0.0.1:0", "10.0.0.1:99999", "[fd00::1]x"])
def test_a_bad_entry_stops_the_agent_naming_it(tmp_path, entry):
    env = agent_env(tmp_path, FXPILOT_AGENT_ALLOW=entry)
    with pytest.raises(agent_config.ConfigError, match="FXPILOT_AGENT_ALLOW"):
        agent_config.load(env)
    with pytest.raises(PolicyError):
        AddressPolicy.parse(entry)


class _Counting:
    """Counts connects: a refused node must see none."""

    def __init__(self, monkeypatch):
        self.calls = 0
        real = socket.socket.connect

        def counted(sock, address):
            self.calls += 1
            return real(sock, address)

        monkeypatch.setattr(socket.socket, "connect", counted)


def test_a_metadata_node_is_refused_as_invalid_without_a_connect(spec_for, agent_key, monkeypatch):  # noqa: F811
    counting = _Counting(monkeypatch)
    spec = spec_for(host="169.254.169.254", port=80)
    with pytest.raises(AgentError) as caught:
        NodeConnection(spec, agent_key).open()
    assert caught.value.kind == "invalid"
    assert "address policy" in str(caught.value) and "169.254.169.254" in str(caught.value)
    assert counting.calls == 0


def test_a_name_resolving_to_a_refused_address_is_refused_and_an_allowed_node_is_reached(
        spec_for, agent_key, sshd, monkeypatch):  # noqa: F811
    spec = spec_for(host="localhost")
    narrow = AddressPolicy.parse("10.0.0.0/8")
    with pytest.raises(AgentError) as caught:
        NodeConnection(spec, agent_key, policy=narrow).open()
    assert caught.value.kind == "invalid" and "outside what the customer allows" in str(caught.value)
    allowed = AddressPolicy.parse(f"127.0.0.0/8:{sshd.port}, [::1]:{sshd.port}")
    with NodeConnection(spec_for(), agent_key, policy=allowed) as conn:
        code, out, _ = conn.capture("echo reached")
    assert code == 0 and out.strip() == b"reached"
    with pytest.raises(AgentError) as caught:
        NodeConnection(spec_for(), agent_key, policy=AddressPolicy.parse("127.0.0.0/8:1")).open()
    assert caught.value.kind == "invalid"
