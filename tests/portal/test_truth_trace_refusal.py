"""A refused upload's page says why in its headline, not only in the table (issue 46)."""
from __future__ import annotations

import html

import pytest
from django.urls import reverse

from gates.models import CustomerTrace, Party

pytestmark = pytest.mark.django_db


def test_the_refusal_is_on_the_pages_headline(client, world):
    pilot = world.pilot
    row = CustomerTrace.objects.create(
        pilot=pilot, gate=pilot.gate(4), name="weka-conversations.jsonl", path="traces/none", sha256="0" * 64, size=10,
        party=Party.CUSTOMER, state=CustomerTrace.State.REFUSED,
        refusal={"en": "line 1, field requests: not a trace format fxpilot reads", "zh-hans": "第 1 行：不是可读的格式"})
    client.force_login(world.alice)
    page = html.unescape(client.get(reverse("pilot_trace", args=[pilot.code, row.pk])).content.decode())
    headline = page.split('id="trace-refused"')[1].split("</p>")[0]
    assert "weka-conversations.jsonl was refused:" in headline and "field requests" in headline
