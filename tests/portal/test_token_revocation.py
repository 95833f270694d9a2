"""A person's API tokens end with the password they were made under (issue 49, item 4): a change on the account
page, a reset by e-mail and an operator's set_password each revoke every usable token of that person (401 after),
and nobody else's."""
from __future__ import annotations

import re

from django.test import Client
from django.urls import reverse

from gates.models import ApiToken
from tests.portal.test_accounts import NEW, _api, login, outbox  # noqa: F401 — the outbox fixture


def test_a_password_change_revokes_the_persons_tokens_and_only_theirs(demo):
    _, carols = ApiToken.issue(demo.carol, "script")
    _, alices = ApiToken.issue(demo.alice, "ci")
    assert _api(carols).status_code == 200
    client = Client()
    assert login(client, "carol", demo.password).status_code == 302
    response = client.post(reverse("password_change"),
                           {"old_password": demo.password, "new_password1": NEW, "new_password2": NEW})
    assert response.status_code == 302
    refused = _api(carols)
    assert refused.status_code == 401 and "revoked" in refused.content.decode()
    assert ApiToken.objects.get(user=demo.carol).revoked_at is not None
    assert _api(alices).status_code == 200
    _, fresh = ApiToken.issue(demo.carol, "after")   # a token made under the new password works
    assert _api(fresh).status_code == 200


def test_a_reset_by_mail_and_an_operators_set_password_revoke_too(demo, outbox):  # noqa: F811
    _, before_reset = ApiToken.issue(demo.carol, "script")
    client = Client()
    client.post(reverse("password_reset"), {"email": "carol@example.test"})
    [message] = outbox()
    link = re.search(r"https?://[^/\s]+(/accounts/reset/\S+/)", message.body).group(1)
    page = client.get(link, follow=True)
    assert client.post(page.redirect_chain[-1][0], {"new_password1": NEW, "new_password2": NEW}).status_code == 302
    assert _api(before_reset).status_code == 401

    _, before_operator = ApiToken.issue(demo.bob, "x")
    demo.bob.set_password("yet-another-long-passphrase-3")
    demo.bob.save()
    assert _api(before_operator).status_code == 401
    _, unchanged = ApiToken.issue(demo.bob, "y")
    demo.bob.first_name = "Robert"
    demo.bob.save()   # a save without a new password revokes nothing
    assert _api(unchanged).status_code == 200
