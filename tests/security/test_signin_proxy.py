"""Login throttling behind the reverse proxy (issue 27, item 4): the client's address is the one a trusted proxy
reports, and the count is kept per name at that address, so strangers cannot lock a person out."""
from __future__ import annotations

import pytest
from axes.models import AccessAttempt
from django.test import Client, RequestFactory
from django.urls import reverse

from portal.signin import client_address

PROXY = "10.0.0.5"


def login(client, username: str, password: str, forwarded: str | None = None):
    extra = {"HTTP_X_FORWARDED_FOR": forwarded} if forwarded else {}
    return client.post(reverse("login"), {"username": username, "password": password}, **extra)


@pytest.fixture
def behind_proxy(settings):
    settings.FXPILOT_TRUSTED_PROXIES = ["10.0.0.0/24", "127.0.0.1"]
    return Client(REMOTE_ADDR=PROXY)


def test_forty_failures_with_made_up_names_through_the_proxy_leave_alice_able_to_log_in(demo, behind_proxy):
    for n in range(40):
        assert login(behind_proxy, f"stranger{n}", "guess", forwarded="203.0.113.66").status_code == 200
    response = login(behind_proxy, "alice", demo.password, forwarded="198.51.100.10")
    assert response.status_code == 302, response.status_code
    # the strangers' failures were counted on their own address, not on the proxy's
    assert set(AccessAttempt.objects.values_list("ip_address", flat=True)) == {"203.0.113.66"}


def test_forty_failures_with_made_up_names_from_alices_own_address_leave_her_able_to_log_in(demo, behind_proxy):
    """Behind one NAT (or with no proxy configured): made-up names do not add up to a lock-out of a real person."""
    for n in range(40):
        login(behind_proxy, f"stranger{n}", "guess", forwarded="198.51.100.10")
    assert login(behind_proxy, "alice", demo.password, forwarded="198.51.100.10").status_code == 302
    plain = Client(REMOTE_ADDR="192.0.2.77")
    for n in range(40):
        login(plain, f"nobody{n}", "guess")
    assert login(plain, "bob", demo.password).status_code == 302


def test_many_failures_for_alice_herself_still_throttle_alice(demo, behind_proxy):
    statuses = [login(behind_proxy, "alice", "wrong", forwarded="198.51.100.10").status_code for _ in range(6)]
    assert statuses == [200, 200, 200, 200, 429, 429]
    response = login(behind_proxy, "alice", demo.password, forwarded="198.51.100.10")
    assert response.status_code == 429 and "Too many failed attempts" in response.content.decode()


def test_a_stranger_typing_alices_name_does_not_lock_her_out(demo, behind_proxy):
    for _ in range(8):
        login(behind_proxy, "alice", "guess", forwarded="203.0.113.66")
    assert login(behind_proxy, "alice", demo.password, forwarded="203.0.113.66").status_code == 429
    assert login(behind_proxy, "alice", demo.password, forwarded="198.51.100.10").status_code == 302


def test_a_forwarded_address_is_believed_only_from_a_trusted_proxy(demo, settings):
    settings.FXPILOT_TRUSTED_PROXIES = ["10.0.0.0/24"]
    # Not through the proxy: whatever the client writes in X-Forwarded-For, its own address counts.
    direct = Client(REMOTE_ADDR="203.0.113.9")
    for n in range(5):
        login(direct, "alice", "guess", forwarded=f"198.51.100.{n}")
    assert set(AccessAttempt.objects.values_list("ip_address", flat=True)) == {"203.0.113.9"}
    assert login(direct, "alice", demo.password, forwarded="198.51.100.200").status_code == 429


@pytest.mark.parametrize("remote, forwarded, expected", [
    ("10.0.0.5", "198.51.100.10", "198.51.100.10"),
    # what the client wrote left of the proxy's own hop is ignored: the right-most untrusted hop counts
    ("10.0.0.5", "1.2.3.4, 198.51.100.10", "198.51.100.10"),
    ("10.0.0.5", "198.51.100.10, 10.0.0.7", "198.51.100.10"),  # two proxies of ours
    ("10.0.0.5", "not-an-address, 10.0.0.7", "10.0.0.7"),
    ("10.0.0.5", "", "10.0.0.5"),
    ("10.0.0.5", "[2001:db8::1]:443", "2001:db8::1"),
    ("203.0.113.9", "198.51.100.10", "203.0.113.9"),  # not a trusted proxy
])
def test_client_address(settings, remote, forwarded, expected):
    settings.FXPILOT_TRUSTED_PROXIES = ["10.0.0.0/24"]
    request = RequestFactory().get("/", REMOTE_ADDR=remote, HTTP_X_FORWARDED_FOR=forwarded)
    assert client_address(request) == expected


def test_without_trusted_proxies_the_forwarded_header_is_ignored(settings):
    settings.FXPILOT_TRUSTED_PROXIES = []
    request = RequestFactory().get("/", REMOTE_ADDR="10.0.0.5", HTTP_X_FORWARDED_FOR="198.51.100.10")
    assert client_address(request) == "10.0.0.5"
