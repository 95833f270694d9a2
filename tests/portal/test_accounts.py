"""Accounts people can live with (issue 27, item 4): password change and reset with Django's views (mail through
the configured backend, a reset that does not say whether an account exists), and API tokens that expire, listed
and revoked by their owner on the account page and with `manage.py api_token`."""
from __future__ import annotations

import re
from datetime import timedelta
from io import StringIO

import pytest
from django.core import mail
from django.core.management import CommandError, call_command
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from gates.models import ApiToken
from portal.views import account
from tests.portal.test_zh_pages import page_sentences

NEW = "a-new-long-passphrase-9"


@pytest.fixture
def outbox(settings):
    settings.EMAIL_BACKEND = "django.core.mail.backends.locmem.EmailBackend"
    settings.SITE_URL = "https://fxpilot.example.com"
    mail.outbox = []

    def sent() -> list:
        for thread in list(account.SENDING):
            thread.join(600)
        return mail.outbox

    return sent


def login(client, username, password):
    return client.post(reverse("login"), {"username": username, "password": password})


# ── The password ────────────────────────────────────────────────────────────────────────────────────────────────


def test_a_person_changes_the_password_and_the_old_one_stops_working(demo):
    other_session = Client()
    other_session.force_login(demo.carol)
    client = Client()
    assert login(client, "carol", demo.password).status_code == 302
    assert client.get(reverse("password_change")).status_code == 200
    wrong = client.post(reverse("password_change"), {"old_password": "nope", "new_password1": NEW, "new_password2": NEW})
    assert wrong.status_code == 200 and "incorrectly" in wrong.content.decode()
    response = client.post(reverse("password_change"),
                           {"old_password": demo.password, "new_password1": NEW, "new_password2": NEW})
    assert response.status_code == 302 and response["Location"] == reverse("password_change_done")
    assert client.get(reverse("home")).status_code == 200  # this session stays
    assert other_session.get(reverse("home")).status_code == 302  # the other one ended
    assert login(Client(), "carol", demo.password).status_code == 200
    assert login(Client(), "carol", NEW).status_code == 302


def test_a_reset_link_by_mail_sets_a_new_password_once(demo, outbox):
    client = Client()
    response = client.post(reverse("password_reset"), {"email": "carol@example.test"})
    assert response.status_code == 302 and response["Location"] == reverse("password_reset_done")
    [message] = outbox()
    assert message.to == ["carol@example.test"] and "carol" in message.body
    link = re.search(r"https://fxpilot\.example\.com(/accounts/reset/\S+/)", message.body)
    assert link, message.body  # the portal's own address (SITE_URL), never the request's Host header
    page = client.get(link.group(1), follow=True)
    assert page.status_code == 200 and "new_password1" in page.content.decode()
    done = client.post(page.redirect_chain[-1][0], {"new_password1": NEW, "new_password2": NEW})
    assert done.status_code == 302 and done["Location"] == reverse("password_reset_complete")
    assert login(Client(), "carol", NEW).status_code == 302
    again = Client().get(link.group(1), follow=True).content.decode()
    assert "does not work any more" in again  # spent


def test_a_reset_does_not_say_whether_an_account_exists(demo, outbox, settings):
    settings.ALLOWED_HOSTS = ["testserver", "evil.example"]
    known = Client().post(reverse("password_reset"), {"email": "carol@example.test"}, HTTP_HOST="evil.example")
    unknown = Client().post(reverse("password_reset"), {"email": "nobody@example.test"})
    assert known.status_code == unknown.status_code == 302 and known["Location"] == unknown["Location"]
    pages = [re.sub(r'name="csrfmiddlewaretoken" value="[^"]+"', "", Client().get(answer["Location"]).content.decode())
             for answer in (known, unknown)]
    assert pages[0] == pages[1]
    [message] = outbox()
    assert message.to == ["carol@example.test"] and "evil.example" not in message.body


def test_reset_mails_to_one_address_stop_at_the_limit_and_the_answer_stays_the_same(demo, outbox, settings):
    settings.FXPILOT_RESET_MAILS_PER_ADDRESS = 3
    answers = [Client().post(reverse("password_reset"), {"email": "carol@example.test"}) for _ in range(4)]
    answers.append(Client().post(reverse("password_reset"), {"email": "Carol@Example.test "}))
    assert {(a.status_code, a["Location"]) for a in answers} == {(302, reverse("password_reset_done"))}
    assert [m.to for m in outbox()] == [["carol@example.test"]] * 3
    Client().post(reverse("password_reset"), {"email": "bob@example.test"})  # another person's mail still goes
    assert [m.to for m in outbox()][-1] == ["bob@example.test"]


def test_reset_requests_from_one_client_stop_at_the_limit_and_other_clients_go_on(demo, outbox, settings):
    from django.core.cache import cache

    settings.FXPILOT_RESET_REQUESTS_PER_CLIENT = 2
    for email in ("carol@example.test", "bob@example.test", "alice@example.test"):
        Client(REMOTE_ADDR="203.0.113.7").post(reverse("password_reset"), {"email": email})
    assert [m.to for m in outbox()] == [["carol@example.test"], ["bob@example.test"]]
    Client(REMOTE_ADDR="203.0.113.8").post(reverse("password_reset"), {"email": "alice@example.test"})
    assert [m.to for m in outbox()][-1] == ["alice@example.test"]
    # the counts are kept under keyed hashes (any cache backend: locmem here, Redis under .ci/run): no address, mail
    # or client, is written to the cache
    keys = [account.reset_key("client", "203.0.113.7"), account.reset_key("address", "alice@example.test")]
    assert cache.get(keys[0]) == 3 and cache.get(keys[1]) == 2
    assert not any("203.0.113" in key or "example.test" in key for key in keys)


def test_the_reset_mail_is_in_the_persons_language(demo, outbox):
    from gates.models import Profile

    Profile.objects.update_or_create(user=demo.bob, defaults={"language": "zh-hans"})
    Client().post(reverse("password_reset"), {"email": "bob@example.test"})
    [message] = outbox()
    assert "密码" in message.subject and "密码" in message.body


def test_the_account_and_password_pages_are_in_chinese(demo, client):
    client.force_login(demo.bob)
    client.post(reverse("set_language"), {"language": "zh-hans"})
    ApiToken.issue(demo.bob, "脚本")
    client.post(reverse("account_token_create"), {"name": "报表", "days": 90})
    pages = [reverse("account"), reverse("password_change")]
    for url in pages:
        html = client.get(url).content.decode()
        assert page_sentences(html, ["bob", "Bob", "Brown", "Authorization: Bearer"]) == [], url
    new = client.post(reverse("account_token_create"), {"name": "报表", "days": 30}).content.decode()
    assert page_sentences(new, ["bob", "Bob", "Brown", "Authorization: Bearer"]) == []
    anonymous = Client(HTTP_ACCEPT_LANGUAGE="zh-hans")
    for url in (reverse("password_reset"), reverse("password_reset_done"), reverse("password_reset_complete"),
                reverse("password_reset_confirm", args=["MQ", "bad-token"]), reverse("login")):
        html = anonymous.get(url, follow=True).content.decode()
        assert page_sentences(html) == [], url


# ── API tokens ──────────────────────────────────────────────────────────────────────────────────────────────────


def _api(key: str):
    return Client().get("/api/v1/pilots", HTTP_AUTHORIZATION=f"Bearer {key}")


def test_a_person_makes_a_token_on_the_account_page_shown_once_with_its_expiry(demo, client):
    client.force_login(demo.alice)
    response = client.post(reverse("account_token_create"), {"name": "my script", "days": 30})
    page = response.content.decode()
    key = re.search(r"fxp_[\w-]+", page).group(0)
    token = ApiToken.objects.get(user=demo.alice)
    assert token.name == "my script" and response["Cache-Control"] == "no-store"
    assert abs(token.expires - (timezone.now() + timedelta(days=30))) < timedelta(minutes=1)
    assert _api(key).status_code == 200
    listed = client.get(reverse("account")).content.decode()
    assert token.prefix in listed and key not in listed  # listed by its prefix; the key is never shown again


def test_the_default_expiry_is_ninety_days(demo):
    token, _key = ApiToken.issue(demo.alice, "x")
    assert abs(token.expires - (timezone.now() + timedelta(days=90))) < timedelta(minutes=1)
    with pytest.raises(ValueError):
        ApiToken.issue(demo.alice, "x", days=400)


def test_an_expired_token_is_refused_with_a_clear_401(demo):
    token, key = ApiToken.issue(demo.alice, "old")
    ApiToken.objects.filter(pk=token.pk).update(expires=timezone.now() - timedelta(minutes=1))
    response = _api(key)
    assert response.status_code == 401 and "expired" in response.json()["error"]
    assert response["WWW-Authenticate"].startswith("Bearer")
    assert _api("fxp_unknown").json()["error"] == "the API token is unknown"


def test_the_owner_revokes_a_token_and_nobody_else_can(demo, client):
    token, key = ApiToken.issue(demo.alice, "ci")
    client.force_login(demo.bob)
    assert client.post(reverse("account_token_revoke", args=[token.pk])).status_code == 404
    assert token.prefix not in client.get(reverse("account")).content.decode()
    assert _api(key).status_code == 200
    client.force_login(demo.alice)
    assert client.post(reverse("account_token_revoke", args=[token.pk])).status_code == 302
    token.refresh_from_db()
    assert token.revoked and token.revoked_at is not None
    response = _api(key)
    assert response.status_code == 401 and "revoked" in response.json()["error"]
    assert client.get(reverse("account_token_revoke", args=[token.pk])).status_code == 405


def test_the_command_issues_lists_and_revokes(demo):
    out, err = StringIO(), StringIO()
    call_command("api_token", "alice", "--name", "nightly", "--days", "7", stdout=out, stderr=err)
    key = out.getvalue().strip()
    token = ApiToken.objects.get(user=demo.alice)
    assert key.startswith(token.prefix) and "expires" in err.getvalue()
    assert abs(token.expires - (timezone.now() + timedelta(days=7))) < timedelta(minutes=1)
    listing = StringIO()
    call_command("api_token", "--list", stdout=listing)
    assert token.prefix in listing.getvalue() and "active" in listing.getvalue() and key not in listing.getvalue()
    revoked = StringIO()
    call_command("api_token", "--revoke", token.prefix, stdout=revoked)
    assert "revoked" in revoked.getvalue()
    assert _api(key).status_code == 401
    listing = StringIO()
    call_command("api_token", "--list", "alice", stdout=listing)
    assert "revoked" in listing.getvalue()
    with pytest.raises(CommandError):
        call_command("api_token", "--revoke", "fxp_nothing")
    with pytest.raises(CommandError):
        call_command("api_token", "alice", "--days", "0")
