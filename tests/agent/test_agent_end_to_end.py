"""The site agent end to end: a real agent process ↔ the real control-plane API (live server) ↔ a real sshd.

The agent runs as a process of its own with nothing but its three variables (URL, token, state folder). The
control plane's side is runners.ssh.connect(node), which for a site with an enrolled agent hands out an
AgentConnection: every command and file becomes a call the agent takes over HTTP.

* a command's output reaches the job's live log, and its exit code comes back;
* a file goes to the node and back, its hashes checked on both ends;
* the agent stopped (SIGSTOP) for longer than its long poll, then continued: the call under way and the one
  queued meanwhile are both answered, each once;
* the agent restarted mid-call: SIGTERM lets the call finish and post before it exits 0; after SIGKILL the
  control plane gives the call up as connection-lost, and the agent started again (same key) serves the next;
* a call of a second site is never taken by this site's agent.
"""
from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest

from infra.lifetime import die_with_parent
from tests.runners.conftest import credential, job, job_text, make_node, pilot, site, sshd, user_key  # noqa: F401

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.django_db(transaction=True)


class AgentProcess:
    """`python -m runners.agent` with only its variables; its log in a file."""

    def __init__(self, url: str, token: str, state: Path, log: Path) -> None:
        self.url, self.token, self.state, self.log_path = url, token, state, log
        self.proc: subprocess.Popen | None = None

    def env(self) -> dict:
        return {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PYTHONPATH": str(ROOT),
                "FXPILOT_AGENT_URL": self.url, "FXPILOT_AGENT_TOKEN": self.token, "FXPILOT_AGENT_STATE": str(self.state)}

    def _start(self) -> AgentProcess:
        handle = open(self.log_path, "a")
        self.proc = subprocess.Popen([sys.executable, "-m", "runners.agent"], cwd=ROOT, env=self.env(),
                                     stdout=handle, stderr=subprocess.STDOUT, preexec_fn=die_with_parent())
        handle.close()
        return self

    def log(self) -> str:
        return self.log_path.read_text() if self.log_path.exists() else ""

    def start(self) -> AgentProcess:
        self.since = len(self.log())  # a restarted process's lines are looked for after its predecessor's
        return self._start()

    def wait_for_log(self, text: str, timeout: float = 600) -> None:
        deadline = time.monotonic() + timeout
        while text not in self.log()[getattr(self, "since", 0):]:
            assert self.proc.poll() is None, f"the agent exited ({self.proc.returncode}):\n{self.log()}"
            assert time.monotonic() < deadline, f"hung: the agent did not log {text!r} in {timeout:g} s:\n{self.log()}"
            time.sleep(0.05)

    def signal(self, signum) -> None:
        self.proc.send_signal(signum)

    def stop(self, timeout: float = 600, *, graceful: bool = True) -> int:
        """SIGTERM (the agent waits for its request for work under way: up to 20 s) or SIGKILL."""
        if self.proc is None or self.proc.poll() is not None:
            return self.proc.returncode if self.proc else 0
        self.proc.send_signal(signal.SIGCONT)
        if not graceful:
            self.proc.kill()
        else:
            self.proc.terminate()
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise


@pytest.fixture
def agent_settings(settings):
    settings.FXPILOT_AGENT_PICKUP_SECONDS = 30.0
    settings.FXPILOT_AGENT_SILENCE_SECONDS = 30.0
    return settings


@pytest.fixture
def enrolled(site, credential, live_server, tmp_path, agent_settings):  # noqa: F811
    """The site's agent enrolled (a token), started, and its hello done (the credential sealed to it)."""
    from runners import agents

    agent, token = agents.create_agent(site)
    process = AgentProcess(live_server.url, token, tmp_path / "agent-state", tmp_path / "agent.log").start()
    process.wait_for_log("serving site")
    agent.refresh_from_db()
    credential.refresh_from_db()
    assert agent.public_key and credential.sealed_key and not credential.private_key_encrypted
    process.agent = agent
    yield process
    process.stop(graceful=False)  # the graceful stop is test_an_agent_restart_mid_call's
    log = process.log()
    assert token not in log and "PRIVATE KEY" not in log
    assert (tmp_path / "agent-state" / "agent.key").read_text().strip() not in log


def _connect(node):
    from runners import ssh
    from runners.agentlink import AgentConnection

    conn = ssh.connect(node)
    assert isinstance(conn, AgentConnection)
    return conn


def _calls(**filters):
    from runners.models import AgentCall

    return list(AgentCall.objects.filter(**filters).order_by("pk"))


def test_a_command_runs_through_the_agent_and_its_output_reaches_the_job_log(enrolled, make_node, sshd, job):  # noqa: F811
    node = make_node(sshd)
    with _connect(node) as conn:
        result = conn.run("echo first line; echo to stderr >&2; printf 'no newline'", job=job, timeout=600)
        assert result.exit_code == 0
        assert result.stdout_tail == "first line\nno newline"
        assert result.stderr_tail == "to stderr\n"
        failed = conn.run("echo before; exit 7", job=job, check=False)
        assert failed.exit_code == 7 and failed.stdout_tail == "before\n"
    text = job_text(job)
    assert "first line\n" in text and "to stderr\n" in text and "no newline" in text and "before\n" in text
    assert text.count("\nfirst line\n") == 1  # once (and once more in the echoed command line)
    calls = _calls(node=node)
    assert {c.state for c in calls} == {"done"} and {c.agent_id for c in calls} == {enrolled.agent.pk}
    assert [c.op for c in calls] == ["contact", "run", "run"]


def test_a_file_goes_to_the_node_and_back_with_its_hashes_checked(enrolled, make_node, sshd, job, tmp_path):  # noqa: F811
    from runners.artifacts import sha256_file

    node = make_node(sshd)
    data = os.urandom(2 * 1024 * 1024 + 5)
    digest = hashlib.sha256(data).hexdigest()
    remote = tmp_path / "on-node" / "payload.bin"
    remote.parent.mkdir()
    with _connect(node) as conn:
        assert conn.upload(data, str(remote), mode=0o640) == digest
        assert remote.read_bytes() == data and (remote.stat().st_mode & 0o777) == 0o640
        assert not Path(str(remote) + ".part").exists()
        assert conn.remote_sha256(str(remote)) == digest
        back = tmp_path / "back.bin"
        assert conn.fetch_to(str(remote), back) == digest
        assert sha256_file(back) == digest
        artifact = conn.download(str(remote), job=job, name="payload.bin", kind="raw")
        assert artifact.sha256 == digest and artifact.size == len(data)


def test_a_pause_longer_than_the_poll_loses_nothing(enrolled, make_node, sshd, job):  # noqa: F811
    """SIGSTOP for 22 s (the long poll is 20 s) while a command runs and another call is queued, then SIGCONT."""
    node = make_node(sshd)
    results: dict[str, object] = {}
    with _connect(node) as conn:
        def run_long() -> None:
            results["long"] = conn.run("sleep 2; echo long-done", job=job, timeout=600)

        runner = threading.Thread(target=run_long)
        runner.start()
        deadline = time.monotonic() + 600
        while not _calls(node=node, op="run", state="taken"):
            assert time.monotonic() < deadline, "hung: no agent took the call in 600 s"
            time.sleep(0.05)
        enrolled.signal(signal.SIGSTOP)
        paused = time.monotonic()
        try:
            time.sleep(1)
            queued: dict[str, object] = {}
            second = threading.Thread(target=lambda: queued.update(r=conn.run("echo while-away", job=job, timeout=600)))
            second.start()
            time.sleep(max(0.0, 22 - (time.monotonic() - paused)))
        finally:
            enrolled.signal(signal.SIGCONT)
        runner.join(600)
        second.join(600)
    assert results["long"].exit_code == 0 and results["long"].stdout_tail == "long-done\n"
    assert queued["r"].exit_code == 0 and queued["r"].stdout_tail == "while-away\n"
    text = job_text(job)
    assert text.count("\nlong-done\n") == 1 and text.count("\nwhile-away\n") == 1  # (besides the echoed commands)
    assert {c.state for c in _calls(node=node)} == {"done"}


def test_an_agent_restart_mid_call(enrolled, make_node, sshd, job, agent_settings, tmp_path):  # noqa: F811
    from runners.ssh import ConnectionLost

    node = make_node(sshd)
    with _connect(node) as conn:
        # SIGTERM: no new work, the running call finishes and posts, then exit 0.
        outcome: dict[str, object] = {}
        runner = threading.Thread(target=lambda: outcome.update(r=conn.run("sleep 2; echo finished", job=job,
                                                                           timeout=600)))
        runner.start()
        deadline = time.monotonic() + 600
        while not _calls(node=node, op="run", state="taken"):
            assert time.monotonic() < deadline, "hung: no agent took the call in 600 s"
            time.sleep(0.05)
        enrolled.signal(signal.SIGTERM)
        assert enrolled.proc.wait(timeout=600) == 0
        runner.join(600)
        assert outcome["r"].exit_code == 0 and outcome["r"].stdout_tail == "finished\n"
        assert "SIGTERM: taking no new work" in enrolled.log()

        # Started again with the same state folder: the same key, no new enrolment.
        key = (enrolled.state / "agent.key").read_text()
        enrolled.start().wait_for_log("serving site", timeout=600)
        assert (enrolled.state / "agent.key").read_text() == key
        assert conn.run("echo again", timeout=600).stdout_tail == "again\n"

        # SIGKILL mid-call: the control plane gives the call up when the agent falls silent.
        agent_settings.FXPILOT_AGENT_SILENCE_SECONDS = 4.0
        killed: dict[str, object] = {}

        def run_killed() -> None:
            try:
                conn.run("sleep 30; echo never", job=job, timeout=600)
            except ConnectionLost as exc:
                killed["exc"] = exc

        runner = threading.Thread(target=run_killed)
        runner.start()
        enrolled.wait_for_log("`sleep 30; echo never`")
        time.sleep(0.5)
        enrolled.proc.kill()
        enrolled.proc.wait()
        runner.join(600)
        assert "fell silent" in str(killed["exc"])
        agent_settings.FXPILOT_AGENT_SILENCE_SECONDS = 30.0
        enrolled.start().wait_for_log("serving site", timeout=600)
        # The killed agent's request for work may still be waiting in the control plane (nobody tells it the agent
        # died): the new process's hello ends it, so a call queued now reaches the new process at once.
        # (A call handed to the dead process's poll would never be answered: the run below would fail. How soon
        # the new process gets it depends on the machine's load and is not asserted: issue 47.)
        assert conn.run("echo after the crash", timeout=600).stdout_tail == "after the crash\n"
    assert "\nnever\n" not in job_text(job)  # (the echoed command line holds the word)
    expired = _calls(node=node, op="run", state="expired")
    assert len(expired) == 1


def test_a_call_of_a_second_site_never_reaches_this_agent(enrolled, make_node, sshd, pilot, user_key,  # noqa: F811
                                                          agent_settings):
    from runners import agents, sealing
    from runners.credentials import create_credential
    from runners.models import Node, Site
    from runners.ssh import Unreachable

    other = Site.objects.create(pilot=pilot, name="Second site", queue=f"site-{uuid.uuid4().hex[:8]}")
    other_agent, _token = agents.create_agent(other)
    _private, public = sealing.new_keypair()
    agents.register_key(other_agent, public, version="test")  # an agent that exists but is not running
    other_credential = create_credential(other, "second key", user_key.text)
    assert other_credential.sealed_key and other_credential.sealed_to_id == other_agent.pk
    key = sshd.host_key
    other_node = Node.objects.create(site=other, name="second-node", host="127.0.0.1", port=sshd.port,
                                     username=sshd.username, credential=other_credential,
                                     host_key_state=Node.HostKeyState.ACCEPTED, host_key_type=key.get_name(),
                                     host_key=key.get_base64(), host_key_fingerprint=key.fingerprint)
    agent_settings.FXPILOT_AGENT_PICKUP_SECONDS = 3.0
    # given up after the pickup time set here (the message names it), not the default 30 s
    with pytest.raises(Unreachable, match=r"did not take the call within 3(\.0)? s"):
        _connect(other_node)
    [call] = _calls(node=other_node)
    assert call.state == "expired" and call.agent_id is None and call.taken_at is None
    # This site's agent is alive and serving meanwhile.
    agent_settings.FXPILOT_AGENT_PICKUP_SECONDS = 30.0
    with _connect(make_node(sshd)) as conn:
        assert conn.run("echo mine", timeout=600).stdout_tail == "mine\n"
    assert "second-node" not in enrolled.log()


def test_check_reaches_hello_and_prints_the_site_and_the_key(site, credential, live_server, tmp_path):  # noqa: F811
    from runners import agents, sealing

    agent, token = agents.create_agent(site)
    process = AgentProcess(live_server.url, token, tmp_path / "state", tmp_path / "unused.log")
    out = subprocess.run([sys.executable, "-m", "runners.agent", "--check"], cwd=ROOT, env=process.env(),
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr
    agent.refresh_from_db()
    assert f"site: {site.name} ({site.code})" in out.stdout
    assert f"agent key: {sealing.fingerprint(agent.public_key)} (made now)" in out.stdout
    assert token not in out.stdout + out.stderr
    process.token = "fxa_" + "0" * 40
    refused = subprocess.run([sys.executable, "-m", "runners.agent", "--check"], cwd=ROOT, env=process.env(),
                             capture_output=True, text=True, timeout=600)
    assert refused.returncode == 1 and "refuses this agent's token" in refused.stderr
