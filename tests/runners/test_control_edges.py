"""Edges of the node layer: the pid logged is the command's own, a connection is opened once, teardown does every part."""
from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest

from runners import detached, ssh
from runners.deployment import DeployError, Deployment
from runners.teardown import teardown_arm


def established(port: int) -> set[str]:
    """The established client connections to ``port`` on 127.0.0.1 that this test process holds, as ``ss`` lines
    (by pid: a parallel session's client to a server that had the same port is not ours)."""
    out = subprocess.run(["ss", "-Htnp", "state", "established", f"( dport = :{port} and dst 127.0.0.1 )"],
                         capture_output=True, text=True, check=True).stdout
    mine = f"pid={os.getpid()},"
    return {" ".join(line.split()) for line in out.splitlines() if mine in line}


def test_the_pid_of_a_detached_command_is_the_command_itself_not_its_wrapper(simnodes, make_node):
    node = make_node(simnodes(1)[0])
    proc = detached.start(node, "~/runs/own-pid", "exec sleep 30")
    try:
        cmdline = Path(f"/proc/{proc.pid}/cmdline").read_bytes().split(b"\0")
        assert cmdline[0].endswith(b"sleep") and cmdline[1] == b"30", cmdline
        assert detached.poll(node, proc).running
    finally:
        detached.cancel(node, proc, grace_seconds=1)
    # Killing the logged pid ends the command (the wrapper then records its exit code).
    proc = detached.start(node, "~/runs/own-pid-2", "exec sleep 30")
    subprocess.run(["kill", "-TERM", str(proc.pid)], check=True)
    deadline = time.monotonic() + 600
    while (status := detached.poll(node, proc)).running and time.monotonic() < deadline:
        time.sleep(0.1)
    assert status.state == "exited" and status.exit_code == 143


def test_a_connection_used_as_a_context_manager_is_opened_once_and_closed(simnodes, make_node):
    server = simnodes(1)[0]
    node = make_node(server)
    # A connection another test left open to an earlier server that had this port is not ours.
    before = established(server.port)
    for _ in range(3):
        with ssh.connect(node) as conn:
            conn.run("true", echo=False)
            assert len(established(server.port) - before) == 1
    deadline = time.monotonic() + 600
    while established(server.port) - before and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not established(server.port) - before


def test_teardown_runs_every_part_and_reports_every_failure(simnodes, make_node, job, monkeypatch):
    """The store refuses the server logs (disk full): the FX detach and the cache cleanup still run."""
    from runners import teardown

    node = make_node(simnodes(1)[0])
    proc = detached.start(node, "~/fxpilot-runs/r1/fx-abc/server", "echo serving; exec sleep 30")
    ran = []

    def script(conn, job, step, node, deployment, name, action, *args, what):
        ran.append(action)
        if action == "cleanup":
            raise DeployError(f"node {node.name}: cache cleanup failed: rm: cannot remove")
        return ""

    def full(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(teardown, "run_script", script)
    monkeypatch.setattr(ssh, "store_file", full)
    deployment = Deployment(run_id="r1", arm="fx", node=node.name, deploy_id="abc", run_dir="~/fxpilot-runs/r1",
                            arm_dir="~/fxpilot-runs/r1/fx-abc", server=proc.to_dict(), fx_user="fx-abc")
    with pytest.raises(DeployError) as caught:
        teardown_arm(job, None, node, deployment, purge_cache=True)
    message = str(caught.value)
    assert "2 part(s) failed" in message
    assert "No space left on device" in message and "cache cleanup failed" in message
    assert ran == ["detach", "cleanup"]
    assert not detached.poll(node, proc).running  # the server was stopped first
