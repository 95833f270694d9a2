"""The pilot's settings in the portal: the customer's concurrency, sessions kept, one FX unit's capacity and the
deployment settings, with their defaults shown, validated as `manage.py deployment --set` validates them, audited."""
from __future__ import annotations

import html

import pytest
import yaml
from django.urls import reverse

from gates.models import AuditEvent
from runners.config import default_simulated

pytestmark = pytest.mark.django_db


def _post(client, pilot, **fields):
    data = {"customer_concurrency": pilot.customer_concurrency, "sessions_kept": pilot.sessions_kept,
            "fx_unit_usable_tb": "", "deployment": ""}
    data.update(fields)
    return client.post(reverse("pilot_settings", args=[pilot.code]), data)


def test_the_settings_are_saved_validated_and_audited(client, world):
    pilot = world.pilot
    client.force_login(world.alice)
    page = html.unescape(client.get(reverse("pilot_settings", args=[pilot.code])).content.decode())
    assert "the default: not the customer's figure yet" in page and 'id="customer_concurrency"' in page
    before = pilot.customer_concurrency
    deployment = yaml.safe_dump(default_simulated())
    response = _post(client, pilot, customer_concurrency="48", fx_unit_usable_tb="61.4", deployment=deployment)
    assert response.status_code == 302
    pilot.refresh_from_db()
    assert pilot.customer_concurrency == 48 and pilot.sizing["fx_unit_usable_tb"] == 61.4 and pilot.deployment
    event = AuditEvent.objects.filter(pilot=pilot, action="pilot.sizing_set").latest("created")
    assert event.detail["settings"]["customer_concurrency"] == {"from": before, "to": 48}

    bad = dict(default_simulated(), sizes={"max_local_cpu_size": "lots"})
    response = _post(client, pilot, customer_concurrency="0", deployment=yaml.safe_dump(bad))
    assert response.status_code == 400
    text = html.unescape(response.content.decode())
    assert "Customer concurrency: 0 must be between 1 and 100,000" in text
    response = _post(client, pilot, deployment=yaml.safe_dump(bad))
    assert response.status_code == 400 and "deployment.sizes.max_local_cpu_size" in html.unescape(response.content.decode())
    response = _post(client, pilot, deployment="model: [unclosed")
    assert response.status_code == 400 and "not valid YAML or JSON" in html.unescape(response.content.decode())
    pilot.refresh_from_db()
    assert pilot.customer_concurrency == 48  # a refused form changes nothing


def test_people_who_may_not_change_them_read_them(client, world):
    client.force_login(world.carol)  # a customer engineer: reads them, changes nothing
    page = client.get(reverse("pilot_settings", args=[world.pilot.code]))
    assert page.status_code == 200 and 'id="save-settings"' not in page.content.decode()
    assert _post(client, world.pilot, customer_concurrency="64").status_code == 403
