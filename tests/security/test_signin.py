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
    for round_ in range(4):
        for n in range(25):
            statuses.append(login(attacker, f"victim{round_}{n}", "guess").status_code)
        own = login(attacker, "charlie", demo.password)
        statuses.append(own.status_code)
        attacker.post(reverse("logout"))
    # 100 failures from the address lock it, whatever successes came between them: every made-up name and
    # every name that never signed in from there (bob) is refused, the right password included …
    assert statuses.count(200) + statuses.count(302) < len(statuses)
    assert login(attacker, "victim00", "guess").status_code == 429
    assert login(attacker, "bob", demo.password).status_code == 429
    # … the attacker's own account, which signed in from there, keeps only its own count (nothing was reset) …
    assert login(attacker, "charlie", demo.password).status_code == 302
    # … and another address is not affected.
    assert login(Client(REMOTE_ADDR="198.51.100.2"), "bob", demo.password).status_code == 302


def test_a_locked_name_stays_locked_at_its_address_after_a_restart_but_not_elsewhere(demo):
    for _ in range(5):
        login(Client(REMOTE_ADDR="192.0.2.1"), "bob", "wrong")
    cache.clear()  # nothing of the count lives in a process's memory or the cache
    response = login(Client(REMOTE_ADDR="192.0.2.1"), "bob", demo.password)
    assert response.status_code == 429
    assert "Too many failed attempts" in response.content.decode()
    from axes.models import AccessAttempt

    # the refused right password counts as one more
    assert sum(a.failures_since_start for a in AccessAttempt.objects.filter(username="bob")) == 6
    # A stranger typing bob's name locks bob only where the stranger is: bob signs in from his own address.
    assert login(Client(REMOTE_ADDR="192.0.2.99"), "bob", demo.password).status_code == 302


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
