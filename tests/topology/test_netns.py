"""The customer network's namespace does not outlive its session: one left by a session killed before its teardown
is removed, with its veth pair, by the next session that makes one; a live session's is left alone."""
from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.topology.netns import CustomerNetwork, available

pytestmark = pytest.mark.skipif(available() is not None, reason=str(available()))
ROOT = Path(__file__).resolve().parents[2]
HOLD = """
import sys, time
from tests.topology.netns import CustomerNetwork
net = CustomerNetwork().__enter__()
print(net.name, net.web_if, flush=True)
time.sleep(600)
"""


def _listed(kind: str, name: str) -> bool:
    argv = ["ip", "netns", "list"] if kind == "netns" else ["ip", "-o", "link", "show"]
    return any(line.split()[0 if kind == "netns" else 1].split("@")[0].rstrip(":") == name
               for line in subprocess.run(argv, capture_output=True, text=True).stdout.splitlines() if line.split())


def _holder() -> tuple[subprocess.Popen, str, str]:
    proc = subprocess.Popen([sys.executable, "-c", HOLD], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    name, web_if = proc.stdout.readline().split()
    return proc, name, web_if


def test_a_killed_sessions_namespace_is_removed_by_the_next_and_a_live_ones_is_kept():
    killed, gone_name, gone_if = _holder()
    live, live_name, live_if = _holder()
    try:
        killed.send_signal(signal.SIGKILL)
        killed.wait(600)
        assert _listed("netns", gone_name) and _listed("link", gone_if)  # what a SIGKILL leaves
        with CustomerNetwork() as net:
            assert net.exists()
            assert not _listed("netns", gone_name) and not _listed("link", gone_if)
            assert _listed("netns", live_name) and _listed("link", live_if)
        assert not net.exists()
    finally:
        live.send_signal(signal.SIGKILL)
        live.wait(600)
        time.sleep(0.1)
        with CustomerNetwork():  # removes the second holder's too
            pass
    assert not _listed("netns", live_name) and not _listed("link", live_if)
