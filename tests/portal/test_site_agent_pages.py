"""The site agent in the portal: a credential made (its whole configuration shown once), rotated and revoked by a
vendor engineer of the pilot; the page never shows the token again; other organisations get 404 on every URL."""
from __future__ import annotations

import re

import pytest
from django.urls import reverse

from gates.models import AuditEvent
from runners.agents import authenticate, hash_token
from runners.models import SiteAgent

pytestmark = pytest.mark.django_db


def _make(client, site):
    return client.post(reverse("site_agent_create", args=[site.code]))


def test_a_vendor_engineer_makes_an_agent_credential_and_sees_its_configuration_once(client, world):
    client.force_login(world.alice)
    response = _make(client, world.site)
    assert response.status_code == 200 and response["Cache-Control"] == "no-store"
    page = response.content.decode()
    token = re.search(r"FXPILOT_AGENT_TOKEN=(fxa_[A-Za-z0-9_-]+)", page).group(1)
    assert "FXPILOT_AGENT_URL=" in page and "FXPILOT_AGENT_STATE=" in page
    for forbidden in ("DATABASE_URL", "SECRET_KEY", "S3", "BROKER"):
        assert forbidden not in page.split('id="agent-env"')[1].split("</pre>")[0]
    agent = authenticate(token)
    assert agent is not None and agent.site == world.site and agent.token_hash == hash_token(token)
    assert AuditEvent.objects.filter(action="site.agent_created", object_id=str(world.site.pk)).exists()
    # The token is never shown again: the sites page names its prefix only.
    sites = client.get(reverse("sites", args=[world.pilot.code])).content.decode()
    assert token not in sites and agent.token_prefix in sites and "waiting for the agent" in sites


def test_a_new_credential_revokes_the_old_one_and_revoke_leaves_none(client, world):
    client.force_login(world.alice)
    first = re.search(r"FXPILOT_AGENT_TOKEN=(\S+)", _make(client, world.site).content.decode()).group(1)
    second = re.search(r"FXPILOT_AGENT_TOKEN=(\S+)", _make(client, world.site).content.decode()).group(1)
    assert authenticate(first) is None and authenticate(second) is not None
    response = client.post(reverse("site_agent_revoke", args=[world.site.code]), follow=True)
    assert "revoked" in response.content.decode()
    assert authenticate(second) is None
    assert not SiteAgent.objects.filter(site=world.site, revoked_at=None).exists()
    assert AuditEvent.objects.filter(action="site.agent_revoked").count() == 1


def test_people_who_may_not_operate_nodes_cannot_and_other_organisations_get_404(client, world, demo):
    for person, status in ((demo.charlie, 404), (demo.bob, 403)):
        client.force_login(person)
        for name in ("site_agent_create", "site_agent_revoke"):
            assert client.post(reverse(name, args=[world.site.code])).status_code == status, (person, name)
    assert not SiteAgent.objects.filter(site=world.site).exists()
    client.logout()
    response = client.post(reverse("site_agent_create", args=[world.site.code]))
    assert response.status_code == 302 and not SiteAgent.objects.exists()


def test_the_agent_card_is_said_in_chinese(client, world):
    client.force_login(world.alice)
    client.post(reverse("set_language"), {"language": "zh-hans"})
    page = client.get(reverse("sites", args=[world.pilot.code])).content.decode()
    assert "站点代理" in page
