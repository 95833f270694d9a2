"""Who must act next on each pilot: the plan's and the gates' actions (gates.lifecycle) and the nodes' host keys.

The one source for the home page, a pilot's overview and the notification sweep. A halted or completed pilot
waits for nobody.
"""
from __future__ import annotations

from collections.abc import Iterable

from gates.lifecycle import FINAL, NextAction
from gates.lifecycle import pending_actions_by_pilot as plan_and_gate_actions
from gates.models import Gate, Pilot, Role
from runners.models import Node


def pending_actions_by_pilot(pilots: Iterable[Pilot], current: dict[int, Gate] | None = None) -> dict[int, list[dict]]:
    """Pilot id → its actions, {'role', 'action' (a NextAction), 'subject', …}: the lifecycle's, then one
    `accept_host_key` per node whose offered host key waits for a vendor engineer (the subject is the node)."""
    pilots = list(pilots)
    actions = plan_and_gate_actions(pilots, current)
    live = [p.pk for p in pilots if p.state not in FINAL]
    for node in Node.objects.filter(site__pilot_id__in=live, host_key_state=Node.HostKeyState.PENDING).select_related(
        "site"
    ).order_by("name"):
        actions[node.site.pilot_id].append(
            {"role": Role.VENDOR_ENGINEER, "action": NextAction.ACCEPT_HOST_KEY, "subject": node}
        )
    return actions


def pending_actions(pilot: Pilot) -> list[dict]:
    """Who must act next on one pilot (pending_actions_by_pilot)."""
    return pending_actions_by_pilot([pilot])[pilot.pk]
