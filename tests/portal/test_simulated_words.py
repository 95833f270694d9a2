"""Wherever a pilot's simulated data shows — home, overview header, timeline, plan — it says so in words."""
from __future__ import annotations

from django.urls import reverse

from runners.models import Node, Site

WORDS = "Simulated — not evidence"


def test_a_simulated_pilot_says_so_on_home_overview_timeline_and_plan(signed_pilot, client):
    pilot = signed_pilot.pilot
    client.force_login(signed_pilot.alice)
    pages = {name: client.get(url).content.decode() for name, url in (
        ("home", reverse("home")), ("overview", reverse("pilot", args=[pilot.code])),
        ("plan", reverse("plan", args=[pilot.code])))}
    assert not any(WORDS in page for page in pages.values())  # nothing simulated yet: nothing said
    site = Site.objects.create(pilot=pilot, name="site1", queue="q-site1")
    Node.objects.create(site=site, name="node1", host="127.0.0.1", username="fxpilot", simulated=True)
    home = client.get(reverse("home")).content.decode()
    assert WORDS in home
    overview = client.get(reverse("pilot", args=[pilot.code])).content.decode()
    assert 'id="pilot-simulated"' in overview and overview.count(WORDS) >= 2  # the header and the timeline
    plan = client.get(reverse("plan", args=[pilot.code])).content.decode()
    assert 'id="pilot-simulated"' in plan and WORDS in plan
    client.cookies.load({"django_language": "zh-hans"})
    assert "模拟" in client.get(reverse("pilot", args=[pilot.code]), HTTP_ACCEPT_LANGUAGE="zh-hans").content.decode()
