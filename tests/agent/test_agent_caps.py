"""One agent token cannot stall the portal (issue 49, item 3): one open long poll and a few requests at once per
token; a request over the cap is answered 429 at once (the agent asks again after its back-off), another agent's
token is not affected, and a slot is given back when its request ends."""
from __future__ import annotations

import threading
import time

import pytest
from django.core.cache import cache
from django.db import connection

from runners import agentapi
from tests.agent.conftest import agent_client, enrol, other_site, post
from tests.agent.test_control_plane import queue

HANG_S = 600.0   # only a hang reaches this


def _wait_until(what: str, condition) -> None:
    end = time.monotonic() + HANG_S
    while not condition():
        assert time.monotonic() < end, f"hung: waited {HANG_S:.0f} s for {what}"
        time.sleep(0.05)


@pytest.mark.django_db(transaction=True)   # the poll runs in a thread of its own
def test_a_second_open_poll_of_one_token_is_refused_at_once_and_others_are_not(enrolled, agent_node):
    answers: list = []

    def long_poll():
        try:
            answers.append(post(agent_client(enrolled.token), "work", {"slots": 1, "wait": 20}))
        finally:
            connection.close()

    first = threading.Thread(target=long_poll)
    first.start()
    key = f"agent-slot:poll:{enrolled.agent.pk}:0"
    _wait_until("the first poll to hold its slot", lambda: cache.get(key) is not None or answers)
    assert not answers, f"the first poll ended at once: {answers[0].status_code} {answers[0].content[:200]!r}"

    second = post(agent_client(enrolled.token), "work", {"slots": 1, "wait": 20})
    assert second.status_code == 429
    assert second["Retry-After"] == "1"
    assert "one open poll per token" in second.json()["error"]
    # a poll that does not wait holds no poll slot, and another agent's token has slots of its own
    assert post(agent_client(enrolled.token), "work", {"slots": 1, "wait": 0}).status_code == 200
    other = enrol(other_site().site)
    assert post(other.client, "work", {"slots": 1, "wait": 0}).status_code == 200

    call = queue(agent_node, "run")
    agentapi.wakeup.notify(agentapi.calls_queued(agent_node.site_id))
    first.join(timeout=HANG_S)
    assert not first.is_alive(), "hung: the first poll did not end after a call was queued"
    assert answers[0].status_code == 200
    assert [c["id"] for c in answers[0].json()["calls"]] == [call.pk]
    assert cache.get(key) is None   # given back
    assert post(agent_client(enrolled.token), "work", {"slots": 1, "wait": 0.1}).status_code == 200


def test_requests_over_the_per_token_cap_are_refused_with_429(enrolled):
    held = [f"agent-slot:request:{enrolled.agent.pk}:{i}" for i in range(agentapi.REQUESTS_PER_TOKEN)]
    for key in held:
        assert cache.add(key, 1, timeout=60)
    try:
        answer = post(enrolled.client, "work", {"slots": 1, "wait": 0})
        assert answer.status_code == 429
        assert f"{agentapi.REQUESTS_PER_TOKEN} requests open already" in answer.json()["error"]
    finally:
        cache.delete(held[0])
    assert post(enrolled.client, "work", {"slots": 1, "wait": 0}).status_code == 200
    assert cache.get(held[0]) is None   # the request's own slot was given back
    for key in held[1:]:
        cache.delete(key)


def test_a_bad_token_takes_no_slot(site, credential):
    answer = post(agent_client("fxa_" + "n" * 40), "work", {"slots": 1, "wait": 0})
    assert answer.status_code == 401
