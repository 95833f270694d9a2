"""Login throttling: counted in the database (every process, across restarts), never reset by a success."""
from __future__ import annotations

from django.core.cache import cache
from django.test import Client
from django.urls import reverse


def login(client, username: str, password: str):
    return client.post(reverse("login"), {"username": username, "password": password})


def test_an_attackers_own_successful_logins_do_not_reset_the_address_count(demo):
    attacker = Client(REMOTE_ADDR="203.0.113.7")
    statuses = []
    for round_ in range(3):
        for n in range(12):
            statuses.append(login(attacker, f"victim{round_}{n}", "guess").status_code)
        own = login(attacker, "charlie", demo.password)
        statuses.append(own.status_code)
        attacker.post(reverse("logout"))
    # 30 failures from the address lock it, whatever successes came between them.
    assert statuses.count(200) + statuses.count(302) < len(statuses)
    assert login(attacker, "charlie", demo.password).status_code == 429
    # Another address is not affected.
    assert login(Client(REMOTE_ADDR="198.51.100.2"), "charlie", demo.password).status_code == 302


def test_a_locked_name_stays_locked_after_a_restart_and_from_another_address(demo):
    for n in range(5):
        login(Client(REMOTE_ADDR=f"192.0.2.{n + 1}"), "bob", "wrong")
    cache.clear()  # nothing of the count lives in a process's memory or the cache
    response = login(Client(REMOTE_ADDR="192.0.2.99"), "bob", demo.password)
    assert response.status_code == 429
    assert "Too many failed attempts" in response.content.decode()
    from axes.models import AccessAttempt

    # the refused right password counts as one more
    assert sum(a.failures_since_start for a in AccessAttempt.objects.filter(username="bob")) == 6


def test_the_name_is_counted_whatever_its_case_and_spaces(demo):
    client = Client(REMOTE_ADDR="192.0.2.50")
    for name in ("Alice", "ALICE ", " alice", "alIce"):
        assert login(client, name, "wrong").status_code == 200
    assert login(client, "alice", "wrong").status_code == 429


def test_four_failures_then_the_right_password_still_lets_the_person_in(demo):
    client = Client(REMOTE_ADDR="192.0.2.60")
    for _ in range(4):
        login(client, "carol", "wrong")
    assert login(client, "carol", demo.password).status_code == 302
