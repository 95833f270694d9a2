"""Who must act next on each pilot: the plan's and the gates' actions (gates.lifecycle), the nodes' host keys,
and the customer approver's countersignature of the procurement report and of each signed-off gate's report.

The one source for the home page, a pilot's overview and the notification sweep. A halted or completed pilot
waits for nobody but the customer approver, while the latest version of its procurement report, or of the report
of a gate signed off by both parties, carries the vendor's signature only.
"""
from __future__ import annotations

from collections.abc import Iterable

from django.db.models import OuterRef, Subquery

from gates.lifecycle import FINAL, NextAction
from gates.lifecycle import pending_actions_by_pilot as plan_and_gate_actions
from gates.models import Gate, Party, Pilot, Report, Role, SignOff
from runners.models import Node


def pending_actions_by_pilot(pilots: Iterable[Pilot], current: dict[int, Gate] | None = None) -> dict[int, list[dict]]:
    """Pilot id → its actions, {'role', 'action' (a NextAction), 'subject', …}: the lifecycle's, then one
    `accept_host_key` per node whose offered host key waits for a vendor engineer (the subject is the node), then
    `countersign_report` for the customer approver of a completed or halted pilot whose latest procurement report
    is not countersigned (the subject is that report), then `countersign_gate_report` for him once per gate signed
    off by both parties whose report of the evidence he approved is not countersigned in its latest version (the
    subject is that version)."""
    pilots = list(pilots)
    actions = plan_and_gate_actions(pilots, current)
    live = [p.pk for p in pilots if p.state not in FINAL]
    for node in Node.objects.filter(site__pilot_id__in=live, host_key_state=Node.HostKeyState.PENDING).select_related(
        "site"
    ).order_by("name"):
        actions[node.site.pilot_id].append(
            {"role": Role.VENDOR_ENGINEER, "action": NextAction.ACCEPT_HOST_KEY, "subject": node}
        )
    for pilot_id, report in awaiting_countersignature(pilots).items():
        actions[pilot_id].append(
            {"role": Role.CUSTOMER_APPROVER, "action": NextAction.COUNTERSIGN_REPORT, "subject": report}
        )
    for pilot_id, reports in gate_reports_awaiting_countersignature(pilots).items():
        actions[pilot_id].extend(
            {"role": Role.CUSTOMER_APPROVER, "action": NextAction.COUNTERSIGN_GATE_REPORT, "subject": report}
            for report in reports
        )
    return actions


def awaiting_countersignature(pilots: Iterable[Pilot]) -> dict[int, Report]:
    """Pilot id → the latest version of its procurement report, for the completed or halted pilots whose latest
    version carries the vendor's signature only (one query)."""
    ended = [p.pk for p in pilots if p.state in FINAL]
    latest: dict[int, Report] = {}
    if not ended:
        return latest
    for report in Report.objects.filter(pilot_id__in=ended, kind=Report.Kind.PROCUREMENT).only(
            "id", "code", "pilot_id", "version", "created", "countersigned_by_id", "language", "sha256").order_by(
            "created", "id"):
        latest[report.pilot_id] = report
    return {pk: report for pk, report in latest.items() if report.countersigned_by_id is None}


def gate_reports_awaiting_countersignature(pilots: Iterable[Pilot]) -> dict[int, list[Report]]:
    """Pilot id → the latest version of each signed-off gate's report (of the evaluation the customer approver
    approved, any language) that carries the vendor's signature only, by gate number (one query, however many
    pilots; none when no pilot is past G1 or ended: only then can a gate be signed off)."""
    candidates = [p.pk for p in pilots if p.state in FINAL or (p.current_gate or 0) > 1]
    if not candidates:
        return {}
    approved = SignOff.objects.filter(gate_id=OuterRef("gate_id"), party=Party.CUSTOMER,
                                      decision=SignOff.Decision.APPROVE).order_by("-created", "-id")
    latest: dict[int, Report] = {}
    for report in (Report.objects.filter(pilot_id__in=candidates, kind=Report.Kind.GATE,
                                         gate__state=Gate.State.SIGNED_OFF)
                   .filter(evaluation_id=Subquery(approved.values("evaluation_id")[:1]))
                   .select_related("gate").only("id", "code", "pilot_id", "gate_id", "gate__number", "evaluation_id",
                                                "version", "created", "countersigned_by_id", "language", "sha256")
                   .order_by("created", "id")):
        latest[report.gate_id] = report
    found: dict[int, list[Report]] = {}
    for report in sorted(latest.values(), key=lambda r: r.gate.number):
        if report.countersigned_by_id is None:
            found.setdefault(report.pilot_id, []).append(report)
    return found


def pending_actions(pilot: Pilot) -> list[dict]:
    """Who must act next on one pilot (pending_actions_by_pilot)."""
    return pending_actions_by_pilot([pilot])[pilot.pk]
