"""The site agent's API (/agent/v1/): its token, its site and nothing else; the key sealed to it; calls taken once,
expired when overdue; output into the job's log; files hashed on arrival."""
from __future__ import annotations

import base64
import io
import threading
from datetime import timedelta

import pytest
from django.core.management import call_command
from django.db import connection
from django.utils import timezone

from runners import agents, sealing
from runners.credentials import SealedCredential, create_credential, credential_pkey
from runners.models import AgentCall, Credential, Job, SiteAgent, active_agent
from tests.agent.conftest import API, agent_client, enrol, other_site, post, sha256
from tests.runners.conftest import job_text


def queue(node, op="run", *, job=None, args=None, payload=None, deadline_in=30.0, within=600, **fields):
    return AgentCall.objects.create(site_id=node.site_id, node=node, job=job, op=op, payload=payload,
                                    request={"args": args or {"command": "true", "timeout": None},
                                             "answer_within": within},
                                    deadline=timezone.now() + timedelta(seconds=deadline_in), **fields)


def take(enrolled, slots=8):
    answer = post(enrolled.client, "work", {"slots": slots, "wait": 0})
    assert answer.status_code == 200, answer.content
    return answer.json()["calls"]


# --- the token ------------------------------------------------------------------------------------

def test_no_bad_or_revoked_token_gets_in(site, credential):
    first = enrol(site)
    for client in (agent_client("fxa_" + "x" * 40), agent_client("not-a-token")):
        answer = post(client, "work", {"slots": 1})
        assert answer.status_code == 401 and "unknown or revoked" in answer.json()["error"]
    from django.test import Client

    answer = Client().post(f"{API}/work", data={}, content_type="application/json")
    assert answer.status_code == 401 and "Bearer" in answer.json()["error"] and answer["WWW-Authenticate"] == "Bearer"
    second = enrol(site)  # rotation: the first token is revoked
    assert post(first.client, "work", {}).status_code == 401
    assert post(second.client, "work", {}).status_code == 200
    agents.revoke_agents(site)
    assert post(second.client, "work", {}).status_code == 401
    assert SiteAgent.objects.filter(site=site, revoked_at=None).count() == 0


def test_a_token_is_stored_hashed_and_seen_at_most_every_ten_seconds(site):
    agent, token = agents.create_agent(site)
    assert token.startswith("fxa_") and len(token) == 44 and agent.token_prefix == token[:8]
    assert agent.token_hash == sha256(token.encode()) and token not in agent.token_hash
    found = agents.authenticate(token, address="192.0.2.7")
    assert found.pk == agent.pk and found.last_address == "192.0.2.7"
    seen = SiteAgent.objects.get(pk=agent.pk).last_seen
    agents.authenticate(token, address="192.0.2.7")
    assert SiteAgent.objects.get(pk=agent.pk).last_seen == seen  # not written again within 10 s
    SiteAgent.objects.filter(pk=agent.pk).update(last_seen=timezone.now() - timedelta(seconds=11))
    agents.authenticate(token, address="192.0.2.7")
    assert SiteAgent.objects.get(pk=agent.pk).last_seen > seen


def test_wrong_methods_and_bad_bodies_say_what_was_wrong(enrolled):
    answer = enrolled.client.get(f"{API}/work")
    assert answer.status_code == 405 and "use POST" in answer.json()["error"]
    answer = enrolled.client.post(f"{API}/work", data="{nope", content_type="application/json")
    assert answer.status_code == 400 and "not JSON" in answer.json()["error"]
    answer = post(enrolled.client, "work", {"slots": "many"})
    assert answer.status_code == 400 and "slots must be a number" in answer.json()["error"]
    answer = enrolled.client.post(f"{API}/hello", data=b"{" + b" " * (1 << 20) + b"}",
                                  content_type="application/json")
    assert answer.status_code == 413
    answer = enrolled.client.get(f"{API}/calls/1/nothing")
    assert answer.status_code == 404 and "no such agent API endpoint" in answer.json()["error"]


# --- hello and sealing ----------------------------------------------------------------------------

def test_hello_registers_the_key_and_reseals_the_legacy_credentials(site, credential, user_key):
    assert credential.private_key_encrypted and not credential.sealed_key
    agent = enrol(site)
    assert agent.hello == {"site": site.name, "site_code": str(site.code), "resealed": 1, "sealed_to_other_key": 0}
    assert agent.agent.public_key == agent.public and agent.agent.version == "test"
    assert active_agent(site) == agent.agent
    credential.refresh_from_db()
    assert credential.private_key_encrypted == "" and credential.passphrase_encrypted == ""
    assert credential.sealed_to_id == agent.agent.pk
    # the agent opens it with its own key: the very key that was uploaded
    assert sealing.open_sealed(agent.private, credential.sealed_key).decode() == user_key.text
    assert sealing.open_sealed(agent.private, credential.sealed_passphrase) == b""
    # another key cannot, and the control plane refuses to try
    with pytest.raises(sealing.SealError):
        sealing.open_sealed(sealing.new_keypair()[0], credential.sealed_key)
    with pytest.raises(SealedCredential, match="sealed to the site agent of .*: only that agent can open it"):
        credential_pkey(credential)
    # a key uploaded now is sealed at once
    fresh = create_credential(site, "fresh", user_key.text)
    assert fresh.sealed_to_id == agent.agent.pk and fresh.private_key_encrypted == ""
    assert sealing.open_sealed(agent.private, fresh.sealed_key).decode() == user_key.text
    # the same hello again changes nothing
    again = post(agent.client, "hello", {"public_key": agent.public, "version": "test"})
    assert again.status_code == 200 and again.json()["resealed"] == 0


def test_another_key_for_the_same_token_is_refused(enrolled):
    _private, other = sealing.new_keypair()
    answer = post(enrolled.client, "hello", {"public_key": other})
    assert answer.status_code == 409 and "enrolled with another key" in answer.json()["error"]
    answer = post(enrolled.client, "hello", {"public_key": "AAAA"})
    assert answer.status_code == 400 and "public_key" in answer.json()["error"]
    enrolled.agent.refresh_from_db()
    assert enrolled.agent.public_key == enrolled.public


def test_a_re_enrolled_agent_with_the_same_key_keeps_the_site_keys(site, credential, user_key):
    first = enrol(site)
    second = enrol(site, hello=False)
    answer = post(second.client, "hello", {"public_key": first.public})
    assert answer.status_code == 200 and answer.json()["resealed"] == 1
    credential.refresh_from_db()
    assert credential.sealed_to_id == second.agent.pk
    third = enrol(site)  # a new key: the credential sealed to the old one cannot follow
    assert third.hello["resealed"] == 0 and third.hello["sealed_to_other_key"] == 1


def test_reencrypt_secrets_leaves_sealed_credentials_alone(site, credential, user_key, monkeypatch):
    enrol(site)
    legacy = other_site().credential
    before = Credential.objects.get(pk=credential.pk).sealed_key
    monkeypatch.setenv("OLD_SECRET_KEY", "the-old-secret")
    out = io.StringIO()
    call_command("reencrypt_secrets", stdout=out)
    assert "1 already under the current key; 1 sealed to a site agent" in out.getvalue()
    assert Credential.objects.get(pk=credential.pk).sealed_key == before
    assert credential_pkey(Credential.objects.get(pk=legacy.pk)).get_name() == "ssh-ed25519"


# --- one site's agent sees its own site only -------------------------------------------------------

def test_an_agent_never_sees_or_touches_another_sites_calls(enrolled, agent_node):
    b = other_site()
    agent_b = enrol(b.site)
    theirs = [queue(b.node, "run"), queue(b.node, "put", payload=b"secret bytes",
                                           args={"path": "/tmp/x", "mode": None, "size": 12, "sha256": "0" * 64}),
              queue(b.node, "get", args={"path": "/etc/hosts"})]
    mine = queue(agent_node, "run")
    calls = take(enrolled)
    assert [c["id"] for c in calls] == [mine.pk]
    # B's key is not in anything A received, and A's spec carries only A's sealed key
    b.credential.refresh_from_db()
    assert b.credential.sealed_key and b.credential.sealed_to_id == agent_b.agent.pk
    assert b.key_text not in str(calls) and b.credential.sealed_key not in str(calls)
    for call in theirs:
        for method, url, body in (("post", "output", {}), ("post", "done", {"exit_code": 0}), ("get", "payload", None),
                                  ("put", "file", b"x")):
            if method == "post":
                answer = post(enrolled.client, f"calls/{call.pk}/{url}", body)
            elif method == "get":
                answer = enrolled.client.get(f"{API}/calls/{call.pk}/{url}")
            else:
                answer = enrolled.client.put(f"{API}/calls/{call.pk}/{url}", data=body,
                                             content_type="application/octet-stream")
            assert answer.status_code == 404, (call.op, url, answer.content)
            assert answer.json() == {"error": f"no call {call.pk} for this agent"}
    # an id that does not exist answers the same
    assert post(enrolled.client, "calls/999999/output", {}).status_code == 404
    assert set(AgentCall.objects.filter(pk__in=[c.pk for c in theirs]).values_list("state", flat=True)) == {"queued"}
    # B's own agent gets them, and B's payload
    got = take(agent_b)
    assert sorted(c["id"] for c in got) == sorted(c.pk for c in theirs)
    put = next(c for c in got if c["op"] == "put")
    answer = agent_b.client.get(f"{API}/calls/{put['id']}/payload")
    assert answer.status_code == 200 and answer.content == b"secret bytes"
    answer = enrolled.client.get(f"{API}/calls/{put['id']}/payload")
    assert answer.status_code == 404


def test_the_call_carries_the_node_spec_with_the_key_sealed_to_the_agent(enrolled, agent_node, site, tmp_path,
                                                                        fake_host_key, user_key):
    from runners.models import Node

    jump = Node.objects.create(site=site, name="jump", host="203.0.113.9", username="hop", role=Node.Role.JUMP,
                               credential=agent_node.credential)
    Node.objects.filter(pk=agent_node.pk).update(jump_host=jump)
    queue(agent_node, "run", args={"command": "uname -a", "timeout": 5})
    [call] = take(enrolled)
    spec = call["node"]
    assert call["op"] == "run" and call["args"] == {"command": "uname -a", "timeout": 5}
    assert spec["host"] == "10.0.0.5" and spec["username"] == "fx" and spec["port"] == 22
    assert spec["host_key"] == f"{agent_node.host_key_type} {agent_node.host_key}"
    assert sealing.open_sealed(enrolled.private, spec["sealed_key"]).decode() == user_key.text
    assert spec["jump"]["host"] == "203.0.113.9" and spec["jump"]["host_key"] is None and spec["jump"]["jump"] is None
    assert "PRIVATE KEY" not in str(call)
    assert call["deadline"] > timezone.now().timestamp() + 590  # answer_within 600 s from the take


# --- taking and expiry ------------------------------------------------------------------------------

@pytest.mark.django_db(transaction=True)
def test_two_polls_at_once_never_take_the_same_call(enrolled, agent_node):
    calls = [queue(agent_node, "run") for _ in range(12)]
    barrier = threading.Barrier(2)
    got: list[list[int]] = [[], []]

    def poll(index):
        try:
            client = agent_client(enrolled.token)
            barrier.wait()
            for _ in range(6):
                answer = post(client, "work", {"slots": 3, "wait": 0})
                got[index] += [c["id"] for c in answer.json()["calls"]]
        finally:
            connection.close()

    threads = [threading.Thread(target=poll, args=(i,)) for i in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=600)
    assert not set(got[0]) & set(got[1])
    assert sorted(got[0] + got[1]) == sorted(c.pk for c in calls)


def test_a_take_that_lost_the_race_does_not_hand_out_the_call(enrolled, agent_node, monkeypatch):
    """The conditional update is the take: a call another poll took between the look-up and the update is skipped."""
    call = queue(agent_node, "run")
    original_filter = AgentCall.objects.filter

    def race(*args, **kwargs):
        if kwargs.get("state") == AgentCall.State.QUEUED and kwargs.get("pk") == call.pk:
            original_filter(pk=call.pk).update(state=AgentCall.State.TAKEN)  # the other poll wins
        return original_filter(*args, **kwargs)

    monkeypatch.setattr(AgentCall.objects, "filter", race)
    assert take(enrolled) == []


def test_a_call_past_its_deadline_is_never_handed_out(enrolled, agent_node):
    late = queue(agent_node, "run", deadline_in=-1)
    answer = post(enrolled.client, "work", {"slots": 4, "wait": 0.3})
    assert answer.json() == {"calls": []}
    late.refresh_from_db()
    assert late.state == "expired" and late.finished is not None
    # a taken call whose answer deadline passes is refused, and the agent told to stop
    queue(agent_node, "run", within=0.05)
    [call] = take(enrolled)
    import time

    time.sleep(0.1)
    answer = post(enrolled.client, f"calls/{call['id']}/output", {})
    assert answer.status_code == 410 and "expired" in answer.json()["error"]


def test_finished_calls_are_pruned_after_a_week(enrolled, agent_node):
    from runners import agentapi

    old = queue(agent_node, "put", payload=b"x", state="done")
    AgentCall.objects.filter(pk=old.pk).update(finished=timezone.now() - timedelta(days=8))
    recent = queue(agent_node, "run", state="expired", finished=timezone.now() - timedelta(days=1))
    waiting = queue(agent_node, "run")
    agentapi._pruned["at"] = 0.0
    assert agentapi.prune_finished() == 1
    assert set(AgentCall.objects.values_list("pk", flat=True)) == {recent.pk, waiting.pk}
    assert agentapi.prune_finished() == 0  # not again within the hour


def test_the_wait_is_capped_and_an_empty_poll_writes_nothing(enrolled, agent_node):
    import time

    started = time.monotonic()
    answer = post(enrolled.client, "work", {"slots": 2, "wait": 0.3})
    assert answer.json() == {"calls": []} and 0.25 <= time.monotonic() - started  # it waited (an upper bound: load)
    answer = post(enrolled.client, "work", {"slots": 0, "wait": 600})
    assert answer.json() == {"calls": []}  # nothing asked for, answered at once


def test_an_idle_poll_looks_in_the_database_about_once_a_second_and_a_queued_call_wakes_it(enrolled, agent_node):
    """It looked every 0.1 s, two queries each time, for as long as an agent was connected (infra.wakeup)."""

    from django.test.utils import CaptureQueriesContext

    from infra import wakeup
    from runners.agentapi import calls_queued

    with CaptureQueriesContext(connection) as idle:
        answer = post(enrolled.client, "work", {"slots": 2, "wait": 2.5})
    assert answer.json() == {"calls": []}
    assert len(idle) <= 16, [q["sql"][:80] for q in idle]  # about 3 looks of 2 queries, and the request's own
    # A call queued while the poll waits is handed out on the word, not at the next look: a word said before the
    # poll began (here, to keep the test in one thread) is kept for it.
    call = queue(agent_node)
    assert wakeup.notify(calls_queued(agent_node.site_id))
    answer = post(enrolled.client, "work", {"slots": 2, "wait": 10})
    assert [c["id"] for c in answer.json()["calls"]] == [call.pk]  # (how soon depends on the load: not asserted)


def test_a_word_wakes_one_waiter_and_without_redis_the_wait_is_a_short_sleep(settings):
    import time

    from infra import wakeup

    name = f"test-{time.monotonic_ns()}"
    heard = []
    waiter = threading.Thread(target=lambda: heard.append(wakeup.wait(name, 600)))
    waiter.start()
    time.sleep(0.3)
    assert wakeup.notify(name)
    waiter.join(600)
    assert heard == [True]
    assert wakeup.wait(name, 0.2) is False  # the word was heard once
    settings.CELERY_BROKER_URL = "memory://"
    assert wakeup.notify(name) is False
    started = time.monotonic()
    # a short sleep, not the whole wait: a bound only a wait for all 900 s reaches, however loaded the machine
    assert wakeup.wait(name, 900) is False and time.monotonic() - started < 600


def test_work_before_hello_is_refused(site, credential):
    agent = enrol(site, hello=False)
    answer = post(agent.client, "work", {"slots": 1})
    assert answer.status_code == 409 and "hello" in answer.json()["error"]


# --- output, done, files ------------------------------------------------------------------------------

def test_output_goes_to_the_job_log_in_whole_lines_and_answers_cancel(enrolled, agent_node, job):
    call = queue(agent_node, "run", job=job)
    [given] = take(enrolled)
    url = f"calls/{call.pk}/output"

    def send(stdout=b"", stderr=b""):
        return post(enrolled.client, url, {"stdout": base64.b64encode(stdout).decode(),
                                           "stderr": base64.b64encode(stderr).decode()})

    assert send(b"line one\nline t").json() == {"cancel": False}
    assert job_text(job, "stdout") == "line one\n"
    snow = "é".encode()
    assert send(b"wo\nhalf " + snow[:1]).status_code == 200
    assert send(snow[1:] + b" done\n", b"warn\n").status_code == 200
    assert job_text(job, "stdout") == "line one\nline two\nhalf é done\n"
    assert job_text(job, "stderr") == "warn\n"
    assert post(enrolled.client, url, {}).status_code == 200  # a keep-alive
    Job.objects.filter(pk=job.pk).update(cancel_requested=True)
    assert send(b"last words").json() == {"cancel": True}
    answer = post(enrolled.client, f"calls/{call.pk}/done", {"exit_code": 3})
    assert answer.status_code == 200
    call.refresh_from_db()
    assert call.state == "done" and call.result == {"exit_code": 3}
    assert call.stdout_tail == "line one\nline two\nhalf é done\nlast words" and call.stderr_tail == "warn\n"
    assert job_text(job, "stdout").endswith("last words")
    # a done call takes nothing more
    assert send(b"more\n").status_code == 410
    answer = post(enrolled.client, f"calls/{call.pk}/done", {"exit_code": 0})
    assert answer.status_code == 410 and "already done" in answer.json()["error"]
    assert given["id"] == call.pk


def test_done_checks_its_body_and_wakes_the_waiter_once_it_is_kept(enrolled, agent_node,
                                                                   django_capture_on_commit_callbacks):
    from infra import wakeup
    from runners.agentapi import call_answered

    call = queue(agent_node, "run")
    take(enrolled)
    url = f"calls/{call.pk}/done"
    with django_capture_on_commit_callbacks(execute=True) as refused:
        answer = post(enrolled.client, url, {})
    assert refused == []  # a refused answer wakes nobody
    assert answer.status_code == 400 and "exit_code" in answer.json()["error"]
    answer = post(enrolled.client, url, {"error": {"kind": "weird", "message": "x"}})
    assert answer.status_code == 400 and "error.kind must be one of" in answer.json()["error"]
    answer = post(enrolled.client, url, {"error": {"kind": "host-key-pending", "message": "x", "offered_key": "junk"}})
    assert answer.status_code == 400
    with django_capture_on_commit_callbacks(execute=True):
        answer = post(enrolled.client, url, {"error": {"kind": "unreachable", "message": "no route"}})
    assert answer.status_code == 200
    call.refresh_from_db()
    assert call.result == {"error": {"kind": "unreachable", "message": "no route"}}
    assert wakeup.wait(call_answered(call.pk), 600)  # the word for the control plane's waiter on this call


def test_a_file_is_hashed_on_arrival_and_capped(enrolled, agent_node, settings):
    from runners.agentapi import received_file

    data = b"records\n" * 5000
    call = queue(agent_node, "get", args={"path": "~/out/records.jsonl"})
    take(enrolled)
    answer = post(enrolled.client, f"calls/{call.pk}/done", {})
    assert answer.status_code == 400 and "no file was uploaded" in answer.json()["error"]
    answer = enrolled.client.put(f"{API}/calls/{call.pk}/file", data=data, content_type="application/octet-stream")
    assert answer.status_code == 200 and answer.json() == {"sha256": sha256(data), "size": len(data)}
    # sent again (a retry): the first copy is replaced, not left behind
    first = received_file(AgentCall.objects.get(pk=call.pk))
    answer = enrolled.client.put(f"{API}/calls/{call.pk}/file", data=data, content_type="application/octet-stream")
    assert answer.status_code == 200 and not first.exists()
    assert post(enrolled.client, f"calls/{call.pk}/done", {}).status_code == 200
    call.refresh_from_db()
    assert call.result["sha256"] == sha256(data) and call.result["size"] == len(data)
    assert received_file(call).read_bytes() == data
    # above the cap: refused before anything is read
    settings.FXPILOT_AGENT_MAX_FILE = 1024
    big = queue(agent_node, "get", args={"path": "~/big"})
    take(enrolled)
    answer = enrolled.client.put(f"{API}/calls/{big.pk}/file", data=b"x" * 2048, content_type="application/octet-stream")
    assert answer.status_code == 413 and "FXPILOT_AGENT_MAX_FILE" in answer.json()["error"]
    # a file for a run call, or a payload of a get, does not exist
    run = queue(agent_node, "run")
    take(enrolled)
    assert enrolled.client.put(f"{API}/calls/{run.pk}/file", data=b"x",
                               content_type="application/octet-stream").status_code == 404
    assert enrolled.client.get(f"{API}/calls/{big.pk}/payload").status_code == 404


def test_the_payload_of_a_put_is_served_to_the_agent_that_took_it(enrolled, agent_node):
    data = bytes(range(256)) * 10
    call = queue(agent_node, "put", payload=data, args={"path": "~/x", "mode": 0o644, "size": len(data),
                                                        "sha256": sha256(data)})
    answer = enrolled.client.get(f"{API}/calls/{call.pk}/payload")
    assert answer.status_code == 410  # not taken yet
    take(enrolled)
    answer = enrolled.client.get(f"{API}/calls/{call.pk}/payload")
    assert answer.status_code == 200 and answer.content == data and answer["Content-Type"] == "application/octet-stream"
    answer = post(enrolled.client, f"calls/{call.pk}/done", {"sha256": "zz"})
    assert answer.status_code == 400 and "sha256" in answer.json()["error"]
    assert post(enrolled.client, f"calls/{call.pk}/done", {"sha256": sha256(data)}).status_code == 200


def test_the_portal_request_cap_does_not_apply_to_the_agent_api(enrolled, agent_node, settings):
    """The portal refuses bodies above FXPILOT_MAX_REQUEST_BYTES; the agent API has its own limits."""
    settings.FXPILOT_MAX_REQUEST_BYTES = 1024
    call = queue(agent_node, "get", args={"path": "~/f"})
    take(enrolled)
    answer = enrolled.client.put(f"{API}/calls/{call.pk}/file", data=b"y" * 4096,
                                 content_type="application/octet-stream")
    assert answer.status_code == 200, answer.content


# --- the command ------------------------------------------------------------------------------------------

def test_site_agent_print_env_prints_the_agents_whole_configuration_once(site, monkeypatch):
    out = io.StringIO()
    call_command("site_agent", site.queue, "--print-env", "--url", "https://fxpilot.example.com/", stdout=out)
    text = out.getvalue()
    values = dict(line.split("=", 1) for line in text.splitlines() if line and not line.startswith("#"))
    assert set(values) == {"FXPILOT_AGENT_URL", "FXPILOT_AGENT_TOKEN", "FXPILOT_AGENT_STATE"}
    assert values["FXPILOT_AGENT_URL"] == "https://fxpilot.example.com"
    assert values["FXPILOT_AGENT_STATE"] == f"/var/lib/fxpilot-agent/{site.queue}"
    assert "shown this once" in text
    for secret in ("DATABASE_URL", "SECRET_KEY", "S3", "AWS", "CELERY"):
        assert secret not in text
    first = agents.authenticate(values["FXPILOT_AGENT_TOKEN"])
    assert first is not None and first.site_id == site.pk
    # by the site's code, again: a fresh token, the first one revoked
    out = io.StringIO()
    call_command("site_agent", str(site.code), "--print-env", stdout=out)
    token = next(line.split("=", 1)[1] for line in out.getvalue().splitlines() if line.startswith("FXPILOT_AGENT_TOKEN="))
    assert token != values["FXPILOT_AGENT_TOKEN"] and agents.authenticate(values["FXPILOT_AGENT_TOKEN"]) is None
    assert "FXPILOT_AGENT_URL=http://127.0.0.1:8000" in out.getvalue()
    listed = io.StringIO()
    call_command("site_agent", "--list", stdout=listed)
    assert token not in listed.getvalue() and values["FXPILOT_AGENT_TOKEN"] not in listed.getvalue()
    assert token[:8] in listed.getvalue() and "active" in listed.getvalue() and "revoked" in listed.getvalue()
    call_command("site_agent", site.queue, "--revoke", stdout=io.StringIO())
    assert agents.authenticate(token) is None
    from django.core.management import CommandError

    with pytest.raises(CommandError, match="no active agent"):
        call_command("site_agent", site.queue, "--revoke", stdout=io.StringIO())
    with pytest.raises(CommandError, match="no site matches"):
        call_command("site_agent", "nowhere", "--print-env", stdout=io.StringIO())
