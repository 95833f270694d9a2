"""Who may see and do what in the portal. Every lookup starts from Pilot.objects.for_user.

Objects of a pilot the person does not belong to answer 404 (their existence is not revealed);
a member whose role does not allow an action gets 403, and the page does not offer it.
"""

from __future__ import annotations

from uuid import UUID

from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpRequest
from django.shortcuts import get_object_or_404

from gates.lifecycle import PLAN_EDITORS, SIGNING_ROLE
from gates.models import Gate, Membership, Pilot, Report, Role

# What each role may do, by capability; "view" is any membership of the pilot's organisations.
OPERATE = frozenset({Role.VENDOR_ENGINEER})
SIGN = frozenset(SIGNING_ROLE.values())
EDIT_PLAN = frozenset(PLAN_EDITORS)
RAW_DATA = frozenset({Role.VENDOR_ENGINEER, Role.VENDOR_LEAD, Role.CUSTOMER_ENGINEER, Role.CUSTOMER_APPROVER})
EXTEND = frozenset({Role.VENDOR_ENGINEER, *SIGN})


def roles_of(pilot: Pilot, user) -> frozenset[str]:
    """The person's roles in this pilot, computed once per pilot object."""
    cached = getattr(pilot, "_portal_roles", None)
    if cached is None or cached[0] != getattr(user, "pk", None):
        roles = frozenset(
            Membership.objects.filter(user=user, organisation_id__in=[pilot.customer_id, pilot.vendor_id]).values_list(
                "role", flat=True
            )
        )
        pilot._portal_roles = cached = (getattr(user, "pk", None), roles)
    return cached[1]


def can(pilot: Pilot, user, roles: frozenset[str]) -> bool:
    return bool(roles_of(pilot, user) & roles)


def require_role(pilot: Pilot, user, roles: frozenset[str]) -> frozenset[str]:
    """404 for a person outside the pilot, 403 for a member whose roles do not include one of `roles`."""
    mine = roles_of(pilot, user)
    if not mine:
        raise Http404("No such pilot")
    if not mine & roles:
        raise PermissionDenied("Your role in this pilot does not allow this.")
    return mine


def pilots_for(request: HttpRequest):
    return Pilot.objects.for_user(request.user).select_related("customer", "vendor")


def get_pilot_for_user(request: HttpRequest, code: UUID) -> Pilot:
    pilot = get_object_or_404(pilots_for(request), code=code)
    if not roles_of(pilot, request.user):
        raise Http404("No such pilot")
    return pilot


def get_gate_for_user(request: HttpRequest, code: UUID, number: int) -> Gate:
    pilot = get_pilot_for_user(request, code)
    gate = get_object_or_404(Gate, pilot=pilot, number=number)
    gate.pilot = pilot
    return gate


def get_report_for_user(request: HttpRequest, code: UUID) -> Report:
    report = get_object_or_404(
        Report.objects.select_related("pilot__customer", "pilot__vendor", "gate"),
        code=code,
        pilot__in=Pilot.objects.for_user(request.user),
    )
    if not roles_of(report.pilot, request.user):
        raise Http404("No such report")
    return report


def get_for_user(request: HttpRequest, queryset, code: UUID, pilot_path: str):
    """An object reached through its parent pilot (`pilot_path` is the lookup to it, e.g. "site__pilot")."""
    obj = get_object_or_404(queryset, code=code, **{f"{pilot_path}__in": Pilot.objects.for_user(request.user)})
    pilot = obj
    for part in pilot_path.split("__"):
        pilot = getattr(pilot, part)
    if not roles_of(pilot, request.user):
        raise Http404("No such object")
    return obj, pilot
