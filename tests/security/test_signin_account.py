"""The per-account limit across addresses (issue 49, item 4): 100 wrong passwords from 25 addresses, then the right
one is refused for a growing delay, not for ever; a few failures from anywhere hold nobody back; the page says how
long to wait."""
from __future__ import annotations

from datetime import timedelta

from axes.models import AccessAttempt
from django.test import Client
from django.urls import reverse

from portal.signin import account_wait


def login(client, username: str, password: str):
    return client.post(reverse("login"), {"username": username, "password": password})


def test_spraying_one_account_from_many_addresses_delays_the_right_password_until_the_delay_has_passed(demo, settings):
    for n in range(100):
        login(Client(REMOTE_ADDR=f"203.0.113.{n % 25 + 1}"), "bob", f"guess{n}")
    wait = account_wait("bob")
    assert 0 < wait <= settings.FXPILOT_LOGIN_ACCOUNT_MAX_DELAY
    refused = login(Client(REMOTE_ADDR="198.51.100.9"), "bob", demo.password)
    assert refused.status_code == 429
    assert "for this account" in refused.content.decode()
    assert login(Client(REMOTE_ADDR="198.51.100.9"), "carol", demo.password).status_code == 302   # others are free
    # once the delay after the last failure has passed, the person gets in from a new address
    AccessAttempt.objects.filter(username="bob").update(
        attempt_time=AccessAttempt.objects.get(username="bob", ip_address="203.0.113.1").attempt_time
        - timedelta(seconds=settings.FXPILOT_LOGIN_ACCOUNT_MAX_DELAY + 1))
    assert account_wait("bob") == 0
    assert login(Client(REMOTE_ADDR="198.51.100.10"), "bob", demo.password).status_code == 302


def test_the_delay_doubles_past_the_limit_and_a_few_failures_hold_nobody_back(demo, settings):
    limit = settings.FXPILOT_LOGIN_FAILURES_PER_ACCOUNT
    for n in range(limit - 1):
        login(Client(REMOTE_ADDR=f"192.0.2.{n + 1}"), "carol", "wrong")
    assert account_wait("carol") == 0
    assert login(Client(REMOTE_ADDR="192.0.2.200"), "carol", demo.password).status_code == 302
    login(Client(REMOTE_ADDR="192.0.2.201"), "carol", "wrong")   # the limit reached: 1 s
    assert 0 < account_wait("carol") <= 1
    for n in range(3):
        AccessAttempt.objects.filter(username="carol").update(
            attempt_time=AccessAttempt.objects.order_by("-attempt_time").values_list("attempt_time", flat=True)[0]
            - timedelta(seconds=120))   # each earlier delay has passed
        login(Client(REMOTE_ADDR=f"192.0.2.{210 + n}"), "carol", "wrong")
    assert 4 < account_wait("carol") <= 8   # limit + 3 failures: 2³ s
