"""Who acts next comes from one place (runners.pending): the home page, the pilot's overview and the notifications
say the same, host keys included, and a halted pilot waits for nobody."""

from __future__ import annotations

from django.urls import reverse

from gates import lifecycle
from gates.lifecycle import NextAction
from gates.models import Evaluation, Notification
from portal import notifications
from runners.pending import pending_actions
from tests.portal.conftest import add_lab


def _told(client, person, pilot) -> tuple[str, str]:
    client.force_login(person)
    home = client.get(reverse("home")).content.decode()
    overview = client.get(reverse("pilot", args=[pilot.code])).content.decode()
    return home, overview


def test_a_waiting_host_key_is_on_the_home_page_the_overview_and_in_a_notification(client, signed_pilot):
    pilot = signed_pilot.pilot
    _site, _credential, node = add_lab(signed_pilot, "SHA256:waitingkey")
    actions = {(a["action"], getattr(a["subject"], "pk", None)) for a in pending_actions(pilot)}
    assert (NextAction.ACCEPT_HOST_KEY, node.pk) in actions and (NextAction.RUN_GATE, pilot.gate(1).pk) in actions
    home, overview = _told(client, signed_pilot.alice, pilot)
    assert "Accept a host key — node1" in home and reverse("node", args=[node.code]) in home
    assert "Accept a host key" in overview and "SHA256:waitingkey" in overview
    notifications.sweep([pilot])
    note = Notification.objects.get(user=signed_pilot.alice, kind=NextAction.ACCEPT_HOST_KEY)
    assert "SHA256:waitingkey" in note.subject and note.url == reverse("node", args=[node.code])
    home, _overview = _told(client, signed_pilot.bob, pilot)  # the customer approver does not accept host keys
    assert "Accept a host key — node1" not in home and "Accept a host key <small>(Vendor engineer)" in home


def test_a_halted_pilot_waits_for_nobody(client, signed_pilot):
    pilot = signed_pilot.pilot
    add_lab(signed_pilot, "SHA256:waitingkey")
    gate = pilot.gate(1)
    evaluation = Evaluation.objects.create(gate=gate, plan_version=pilot.signed_plan, verdict="fail",
                                           result={"verdict": "fail", "criteria": [{"key": "k", "verdict": "fail"}]})
    lifecycle.record_verdict(gate, evaluation)
    pilot.refresh_from_db()
    assert pending_actions(pilot) == []
    home, overview = _told(client, signed_pilot.alice, pilot)
    assert "Accept a host key" not in home and "Accept a host key" not in overview
    assert notifications.sweep([pilot]) == 0
