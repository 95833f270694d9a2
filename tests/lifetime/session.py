"""A test session for tests/lifetime/test_session_watcher.py, which runs it in a pytest process of its own and kills
that process with SIGKILL. Not collected by the suite (its name does not start with test_).

Its one test starts what the suite's fixtures start, with those fixtures where they exist: a Celery worker and its
pool (tests/broker), OpenSSH's sshd (tests/runners) and a process detached over it by runners/remote/detach.sh as
deploy.sh's servers are, a simulated node and a process detached on it, and a process whose environment carries no
mark, named in a pid file (infra.lifetime.watch_files). It writes their pids to FXPILOT_LIFETIME_PROBE and waits.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
import uuid
from pathlib import Path

import paramiko
import pytest

from infra.lifetime import WATCHED_BY, watch_files
from tests.broker.conftest import Procs
from tests.runners.conftest import simnodes, sshd, user_key  # noqa: F401  (the suite's own fixtures)

REPO = Path(__file__).resolve().parents[2]
DETACH = REPO / "runners" / "remote" / "detach.sh"
PROBE = os.environ.get("FXPILOT_LIFETIME_PROBE")


def _detach(host: str, port: int, username: str, key_path: Path, folder: str) -> int:
    """`detach.sh` over SSH, as runners.detached.start runs it: the pid of the process it detached."""
    client = paramiko.SSHClient()
    client.set_missing_host_key_policy(paramiko.AutoAddPolicy())
    client.connect(host, port=port, username=username, key_filename=str(key_path), look_for_keys=False,
                   allow_agent=False, timeout=600)
    try:
        _, stdout, stderr = client.exec_command(f"bash {DETACH} {folder} 'exec sleep 3600'", timeout=600)
        out = stdout.read().decode()
        assert stdout.channel.recv_exit_status() == 0, stderr.read().decode()
    finally:
        client.close()
    return int(re.search(r"pid=(\d+)", out).group(1))


@pytest.mark.skipif(not PROBE, reason="run by tests/lifetime/test_session_watcher.py only")
def test_start_everything_then_wait_to_be_killed(tmp_path, sshd, simnodes, user_key):  # noqa: F811
    procs = Procs(tmp_path, os.environ["CELERY_BROKER_URL"])
    worker = procs.worker("lifetime", f"lifetime-{uuid.uuid4().hex[:6]}", concurrency=1)
    pool = [int(pid) for pid in Path(f"/proc/{worker.pid}/task/{worker.pid}/children").read_text().split()]
    over_sshd = _detach("127.0.0.1", sshd.port, sshd.username, user_key.path, str(tmp_path / "sshd-detached"))
    node = simnodes(1)[0]
    on_simnode = _detach("127.0.0.1", node.port, node.username, user_key.path, str(tmp_path / "simnode-detached"))
    unmarked = subprocess.Popen(["env", "-i", "sleep", "3600"], start_new_session=True)
    (tmp_path / "unmarked.pid").write_text(f"{unmarked.pid}\n")
    assert watch_files(tmp_path / "*.pid")
    from tests import envsetup

    broker = getattr(envsetup, "_server", None)
    pids = {"worker": [worker.pid, *pool], "sshd": [sshd.pid], "sshd-detached": [over_sshd],
            "simnode-detached": [on_simnode], "unmarked": [unmarked.pid],
            "broker": [broker.pid] if broker is not None else []}
    Path(PROBE + ".part").write_text(json.dumps({"mark": os.environ[WATCHED_BY], "pids": pids,
                                                 "pytest": os.getpid(), "main": sys.argv[0],
                                                 "data": os.environ["FXPILOT_DATA_DIR"]}))
    os.replace(PROBE + ".part", PROBE)
    time.sleep(3600)
