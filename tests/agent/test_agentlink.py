"""AgentConnection: runners.ssh's interface over the site agent, with its waiting rules. The other end is a
Responder (tests/agent/conftest.py) speaking the HTTP API; the agent process itself has its own tests."""
from __future__ import annotations

import base64
import threading
import time

import pytest

from infra import wakeup
from runners import engine, ssh
from runners.agentapi import calls_queued
from runners.agentlink import AgentConnection, agent_for
from runners.models import AgentCall, Node
from tests.agent.conftest import Responder, enrol, sha256
from tests.runners.conftest import job_text

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def quick(settings):
    settings.FXPILOT_AGENT_PICKUP_SECONDS = 5.0
    settings.FXPILOT_AGENT_SILENCE_SECONDS = 5.0
    return settings


def answer_plainly(responder, call):
    """contact: connected; run: echo the command, exit 0 (or the code after `exit `); put/get: not expected."""
    if call["op"] == "contact":
        return {}
    if call["op"] == "run":
        command = call["args"]["command"]
        responder.output(call, stdout=f"ran {command}\n".encode(), stderr=b"note\n")
        code = int(command.split("exit ", 1)[1]) if "exit " in command else 0
        return {"exit_code": code}
    raise AssertionError(f"unexpected call {call['op']}")


def test_connect_goes_through_the_agent_once_the_site_has_one(site, credential, agent_node, job):
    assert agent_for(agent_node) is None
    enrolled = enrol(site, hello=False)
    assert agent_for(agent_node) is None  # enrolled, but no key registered yet: nothing is sealed to it
    enrolled = enrol(site)
    assert agent_for(agent_node).pk == enrolled.agent.pk
    with Responder(enrolled.token, answer_plainly) as responder:
        with ssh.connect(agent_node) as conn:
            assert isinstance(conn, AgentConnection) and isinstance(conn, ssh.NodeConnection)
            result = conn.run("echo hi", job=job)
            with pytest.raises(ssh.CommandFailed, match="exited with code 2: note"):
                conn.run("false; exit 2", job=job)
            unchecked = conn.run("x; exit 5", check=False)
        assert ssh.run(agent_node, "uptime", job=job).stdout == "ran uptime\n"
    assert result.ok and result.stdout == "ran echo hi\n" and result.stderr_tail == "note\n"
    assert unchecked.exit_code == 5
    assert [c["op"] for c in responder.seen] == ["contact", "run", "run", "run", "contact", "run"]
    text = job_text(job)
    assert "[gpu1] $ echo hi\n" in text and "ran echo hi\n" in text and "ran uptime\n" in text
    assert set(AgentCall.objects.values_list("state", flat=True)) == {"done"}


def test_without_an_agent_taking_the_call_the_node_is_unreachable_and_a_late_answer_is_refused(
        site, credential, agent_node, settings):
    settings.FXPILOT_AGENT_PICKUP_SECONDS = 0.4
    enrolled = enrol(site)
    with pytest.raises(ssh.Unreachable, match=r"the site agent of Test site did not take the call within 0.4 s "
                                              r"\(last seen \d+ s ago\)") as caught:
        ssh.run(agent_node, "uptime")
    assert caught.value.transient  # given up after the 0.4 s set here: the message names it
    # the call was announced to the site's waiting polls (none here: the word waits for the next one)
    assert wakeup.wait(calls_queued(agent_node.site_id), 600)
    call = AgentCall.objects.get()
    assert call.state == "expired"
    # the agent comes back: the given-up call is not handed out, and an answer to it is refused
    with Responder(enrolled.token, answer_plainly) as responder:
        time.sleep(0.8)
    assert responder.seen == []
    answer = responder.done({"id": call.pk}, {"exit_code": 0})
    assert answer.status_code == 410 and "expired" in answer.json()["error"]


def test_an_agent_that_falls_silent_loses_the_connection_and_its_late_answer_is_refused(site, credential,
                                                                                       agent_node, settings):
    settings.FXPILOT_AGENT_SILENCE_SECONDS = 0.5
    enrolled = enrol(site)
    late = []

    def slow(responder, call):
        if call["op"] == "contact":
            return {}
        responder.output(call, stdout=b"started\n")
        time.sleep(1.5)  # nothing said for longer than the silence allowance
        late.append(responder.done(call, {"exit_code": 0}))
        return None

    with Responder(enrolled.token, slow):
        with pytest.raises(ssh.ConnectionLost, match="fell silent for 0.5 s") as caught:
            ssh.run(agent_node, "sleep 100")
        assert caught.value.result.stdout == "started\n"
        deadline = time.monotonic() + 600
        while not late and time.monotonic() < deadline:
            time.sleep(0.05)
    assert late and late[0].status_code == 410
    assert AgentCall.objects.get(op="run").state == "expired"


def test_a_canceled_run_interrupts_the_wait_and_the_agent_is_told_to_stop(site, credential, agent_node, job):
    enrolled = enrol(site)
    told = []

    def keeps_going(responder, call):
        if call["op"] == "contact":
            return {}
        for _ in range(200):
            answer = responder.output(call, stdout=b"tick\n")
            if answer.status_code != 200:
                told.append(answer)
                return None
            time.sleep(0.05)
        return {"exit_code": 0}

    event = threading.Event()
    with Responder(enrolled.token, keeps_going):
        with ssh.connect(agent_node) as conn, ssh.interruptible(event, "the run was canceled"):
            threading.Timer(0.5, event.set).start()
            with pytest.raises(ssh.Interrupted, match="stopped after .*: the run was canceled"):
                conn.run("deploy.sh", job=job)
        deadline = time.monotonic() + 600
        while not told and time.monotonic() < deadline:
            time.sleep(0.05)
    assert told and told[0].status_code == 410 and "canceled" in told[0].json()["error"]
    assert AgentCall.objects.get(op="run").state == "canceled"
    assert "tick\n" in job_text(job, "stdout")


def test_a_command_past_its_timeout_is_given_up(site, credential, agent_node, settings):
    settings.FXPILOT_AGENT_SILENCE_SECONDS = 1.5  # keep-alives every 0.1 s: silence is never the reason
    enrolled = enrol(site)

    def alive_forever(responder, call):
        if call["op"] == "contact":
            return {}
        assert call["args"] == {"command": "sleep 9", "timeout": 0.3}
        for _ in range(300):
            if responder.output(call).status_code != 200:  # keep-alives only
                return None
            time.sleep(0.1)
        return {"exit_code": 0}

    with Responder(enrolled.token, alive_forever):
        with pytest.raises(ssh.CommandTimeout, match="still running after 0.3 s"):
            ssh.run(agent_node, "sleep 9", timeout=0.3)
    assert AgentCall.objects.get(op="run").state == "expired"


def test_the_agents_failures_raise_the_ssh_layers_exceptions(site, credential, agent_node, tmp_path, fake_host_key):
    enrolled = enrol(site)
    offered = fake_host_key(tmp_path, "offered")
    answers = {}

    def fail(responder, call):
        return {"error": answers[call["node"]["name"]]}

    fresh = Node.objects.create(site=site, name="fresh", host="10.0.0.6", username="fx", credential=credential)
    answers["fresh"] = {"kind": "host-key-pending", "message": "unknown host key",
                        "offered_key": f"{offered.get_name()} {offered.get_base64()}"}
    answers["gpu1"] = {"kind": "host-key-changed", "message": "changed",
                       "offered_key": f"{offered.get_name()} {offered.get_base64()}"}
    with Responder(enrolled.token, fail):
        with pytest.raises(ssh.HostKeyPending) as pending:
            ssh.connect(fresh)
        assert pending.value.fingerprint == offered.fingerprint
        fresh.refresh_from_db()
        assert fresh.host_key_state == "pending" and fresh.pending_host_key == offered.get_base64()
        with pytest.raises(ssh.HostKeyChanged) as changed:
            ssh.connect(agent_node)
        assert changed.value.offered == offered.fingerprint and changed.value.expected == agent_node.host_key_fingerprint
        for kind, exc in (("unreachable", ssh.Unreachable), ("connection-lost", ssh.ConnectionLost),
                          ("auth", ssh.AuthenticationFailed), ("invalid", ssh.InvalidNodeSettings),
                          ("io", ssh.SSHError)):
            answers["gpu1"] = {"kind": kind, "message": f"the agent says {kind}"}
            with pytest.raises(exc, match=f"the agent says {kind}"):
                ssh.connect(agent_node)
        # the engine's contact: recorded on the node as over direct SSH
        answers["fresh"]["message"] = "again"
        assert engine.contact_node(fresh.pk) == "pending-key"
        fresh.refresh_from_db()
        assert fresh.contact_message == offered.fingerprint


def test_files_go_both_ways_checked_by_hash(site, credential, agent_node, job):
    enrolled = enrol(site)
    node_files: dict[str, bytes] = {"~/out/records.jsonl": b'{"ttft": 0.12}\n' * 1000}
    corrupt = {"on": False}

    def files(responder, call):
        op, args = call["op"], call["args"]
        if op == "contact":
            return {}
        if op == "put":
            data = responder.payload(call)
            assert len(data) == args["size"] and sha256(data) == args["sha256"]
            node_files[args["path"]] = data
            return {"sha256": sha256(data + (b"!" if corrupt["on"] else b""))}
        if op == "run":
            path = args["command"].split("-- ", 1)[1].replace('"$HOME"/', "~/").strip("'")
            responder.output(call, stdout=f"{sha256(node_files[path])}  {path}\n".encode())
            return {"exit_code": 0}
        if op == "get":
            data = node_files[args["path"]]
            answer = responder.upload(call, data + (b"!" if corrupt["on"] else b""))
            assert answer.status_code == 200, answer.content
            return {}
        raise AssertionError(op)

    from runners.agentapi import tmp_dir

    before = set(tmp_dir().glob("agent-call-*"))
    with Responder(enrolled.token, files):
        with ssh.connect(agent_node) as conn:
            digest = conn.upload(b"#!/bin/sh\necho probe\n", "~/run/probe.sh", mode=0o755)
            assert digest == sha256(b"#!/bin/sh\necho probe\n") and node_files["~/run/probe.sh"].startswith(b"#!")
            artifact = conn.download("~/out/records.jsonl", job=job, name="gpu1/records.jsonl", kind="records")
            assert artifact.sha256 == sha256(node_files["~/out/records.jsonl"]) and artifact.size == 15000
            assert AgentCall.objects.get(op="get").job_id == job.pk
            assert AgentCall.objects.get(op="run").job_id is None  # the hash on the node writes nothing to the log
            corrupt["on"] = True
            with pytest.raises(ssh.TransferMismatch, match="upload of ~/x corrupted"):
                conn.upload(b"data", "~/x")
            with pytest.raises(ssh.TransferMismatch, match="download of ~/out/records.jsonl corrupted"):
                conn.download("~/out/records.jsonl", job=job, name="gpu1/again.jsonl", kind="records")
    assert set(tmp_dir().glob("agent-call-*")) == before  # nothing received is left behind


def test_a_file_too_large_for_the_agent_is_refused_before_anything_is_queued(site, credential, agent_node,
                                                                           monkeypatch):
    from runners import agentlink

    enrolled = enrol(site)
    monkeypatch.setattr(agentlink, "MAX_PAYLOAD", 10)
    with Responder(enrolled.token, answer_plainly):
        with ssh.connect(agent_node) as conn:
            with pytest.raises(ssh.SSHError, match="at most 0 MiB"):
                conn.upload(b"x" * 11, "~/big")
    assert not AgentCall.objects.filter(op="put").exists()


def test_a_credential_the_agent_cannot_open_is_refused_here(site, credential, agent_node):
    first = enrol(site)
    assert first.hello["resealed"] == 1
    enrol(site)  # re-enrolled with a new key: the credential stays sealed to the first one
    with pytest.raises(ssh.InvalidNodeSettings, match="sealed to a previous agent key"):
        ssh.connect(agent_node)
    assert not AgentCall.objects.exists()
    # with no agent at all, the control plane cannot open it either
    from runners import agents

    agents.revoke_agents(site)
    with pytest.raises(ssh.InvalidNodeSettings, match="sealed to the site agent of Test site"):
        ssh.connect(Node.objects.get(pk=agent_node.pk))


def test_output_of_a_step_lands_with_its_step(site, credential, agent_node, job):
    from runners.models import Step

    step = Step.objects.create(job=job, seq=1, name="probe", node=agent_node)
    enrolled = enrol(site)

    def chatty(responder, call):
        if call["op"] == "contact":
            return {}
        for piece in (b"par", b"tial\nsec", b"ond\n"):
            responder.output(call, stdout=piece)
        responder.output(call, stderr=base64.b64decode(base64.b64encode(b"no newline at the end")))
        return {"exit_code": 0}

    with Responder(enrolled.token, chatty):
        result = ssh.run(agent_node, "probe.sh", job=job, step=step)
    assert result.stdout == "partial\nsecond\n" and result.stderr_tail == "no newline at the end"
    chunks = list(step.chunks.order_by("seq").values_list("stream", "text"))
    assert chunks[0] == ("system", "[gpu1] $ probe.sh\n")
    assert [text for stream, text in chunks if stream == "stdout"] == ["partial\n", "second\n"]
    assert [text for stream, text in chunks if stream == "stderr"] == ["no newline at the end"]
