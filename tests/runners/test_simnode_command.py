"""manage.py simnode: run nodes, register them, change faults at runtime; the simulated tools' state."""
from __future__ import annotations

import io

import pytest
from django.core.management import CommandError, call_command

from runners import ssh
from runners.models import Node
from runners.simnode.state import load_state, storage_kind


def test_simnode_runs_registers_and_accepts_host_keys(tmp_path, site):
    out = io.StringIO()
    call_command("simnode", nodes=2, dir=str(tmp_path), register_site=str(site.code), accept_host_keys=True, run_for=0,
                 stdout=out)
    text = out.getvalue()
    assert "SIMULATED GPU nodes (simulated: true)" in text and "registered 2 simulated nodes" in text
    nodes = list(Node.objects.filter(site=site).order_by("name"))
    assert [n.name for n in nodes] == ["node1", "node2"] and all(n.simulated for n in nodes)
    assert all(n.host_key_state == Node.HostKeyState.ACCEPTED and n.host_key_fingerprint in text for n in nodes)
    assert nodes[0].credential.public_fingerprint and (tmp_path / "client_key").exists()


def test_simnode_leaves_host_keys_pending_unless_told(tmp_path, site):
    out = io.StringIO()
    call_command("simnode", nodes=1, dir=str(tmp_path), register_site=str(site.code), run_for=0, stdout=out)
    assert Node.objects.get(site=site).host_key_state == Node.HostKeyState.UNKNOWN
    assert "accept_host_key" in out.getvalue()


def test_faults_change_at_runtime_and_bad_ones_are_named(tmp_path):
    call_command("simnode", nodes=1, dir=str(tmp_path), fault=["node1:slow-disk=2"], run_for=0, stdout=io.StringIO())
    assert load_state(tmp_path / "node1")["faults"]["slow_disk"] == 2.0
    call_command("simnode", "fault", "node1", "fx-down", "on", dir=str(tmp_path), stdout=io.StringIO())
    call_command("simnode", "fault", "--dir", str(tmp_path), "node1", "drop-ssh-after", "3", stdout=io.StringIO())
    faults = load_state(tmp_path / "node1")["faults"]
    assert faults["fx_down"] is True and faults["drop_ssh_after_seconds"] == 3.0
    with pytest.raises(CommandError, match="unknown fault 'fx-sideways'"):
        call_command("simnode", "fault", "node1", "fx-sideways", "on", dir=str(tmp_path))
    with pytest.raises(CommandError, match="'maybe' is not a valid value"):
        call_command("simnode", "fault", "node1", "fx-down", "maybe", dir=str(tmp_path))
    with pytest.raises(CommandError, match="there is no node3"):
        call_command("simnode", nodes=2, dir=str(tmp_path), fault=["node3:fx-missing"], run_for=0)


def test_the_simulated_storage_tools_act_on_the_sandbox(simnodes, make_node):
    server = simnodes(1)[0]
    node = make_node(server)
    nqn = "nqn.2026-01.com.example.fx:fx100.pool0"
    with ssh.connect(node) as conn:
        assert "subnqn:  " + nqn in conn.run("nvme discover -t rdma -a 192.168.100.10 -s 4420").stdout
        with pytest.raises(ssh.CommandFailed, match="contains a mounted filesystem"):
            conn.run("mkfs.xfs /dev/nvme1n1")
        conn.run("touch ~/mnt/fx/kv-chunk && umount ~/mnt/fx")
        with pytest.raises(ssh.CommandFailed, match="appears to contain an existing filesystem"):
            conn.run("mkfs.xfs /dev/nvme1n1")
        conn.run(f"nvme disconnect -n {nqn}")
        assert "/dev/nvme1n1" not in conn.run("nvme list -o json").stdout
        conn.run(f"nvme connect -t rdma -n {nqn} -a 192.168.100.10 -s 4420 && mount /dev/nvme1n1 ~/mnt/fx")
        assert "/dev/nvme1n1 on " + str(server.root / "mnt" / "fx") in conn.run("mount").stdout
        # the SSH user is not root: the link is changed only through (password-less) sudo, as on a real node
        refused = conn.run("ip link set dev ens1f0np0 down", check=False)
        assert refused.exit_code == 2 and "RTNETLINK answers: Operation not permitted" in refused.stderr_tail
        assert not load_state(server.root)["faults"]["fx_down"]
        conn.run("sudo -n ip link set dev ens1f0np0 down")
        assert "PORT_DOWN" in conn.run("ibv_devinfo").stdout and load_state(server.root)["faults"]["fx_down"]
        with pytest.raises(ssh.CommandFailed, match="Input/output error"):
            conn.run("fio --name=x --filename=$HOME/mnt/fx/f --rw=read --bs=1M --size=64M --output-format=json")
    state = load_state(server.root)
    assert storage_kind(server.root / "mnt" / "fx" / "a", state) == "fx"
    assert storage_kind(server.root / "mnt" / "nvme0" / "b", state) == "local_nvme"
    assert storage_kind("/tmp", state) == "other"
