"""Small template helpers of the portal: names in the reader's language, numbers and durations."""

from __future__ import annotations

from typing import Any

from django import template
from django.utils import translation
from django.utils.safestring import SafeString, mark_safe
from django.utils.translation import gettext as _
from django.utils.translation import gettext_lazy

from gates.judge import explain
from gates.models import AuditAction, Gate, Pilot, PlanVersion
from reports import findings, units
from reports.context import root_certificate
from reports.templatetags import evidence
from runners.models import Status

register = template.Library()
# The filters the signed reports use as well (verdict_label, checks, starter_label) are the reports app's library
# `evidence`: the portal's pages offer them too, so a page and a report read evidence the same way.
register.filters.update(evidence.register.filters)


@register.filter
def local_name(obj: Any) -> str:
    """`name_zh` (or `description_zh`) for a Chinese reader when it is filled, else the English one."""
    chinese = (translation.get_language() or "").startswith("zh")
    for field in ("name", "description"):
        if hasattr(obj, field):
            return (getattr(obj, f"{field}_zh", "") if chinese else "") or getattr(obj, field)
    return str(obj)


@register.filter
def percent(value: Any, digits: int = 0) -> str:
    """A fraction as a percentage at `digits` decimals, rounded as every figure is (reports.units.percent)."""
    if value in (None, ""):
        return "—"
    return units.percent(float(value), int(digits))


@register.filter
def number(value: Any, digits: int = 3) -> str:
    """A figure to `digits` significant places, in the reader's number format (reports.units, as the reports)."""
    return units.number(value, digits)


@register.filter
def duration(seconds: Any) -> str:
    if seconds in (None, ""):
        return "—"
    seconds = int(float(seconds))
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return _("%(h)d h %(m)02d min") % {"h": hours, "m": minutes}
    if minutes:
        return _("%(m)d min %(s)02d s") % {"m": minutes, "s": secs}
    return _("%(s)d s") % {"s": secs}


@register.filter
def get(mapping: Any, key: Any) -> Any:
    return mapping.get(key) if isinstance(mapping, dict) else None


@register.filter
def svg(markup: str) -> SafeString:
    """Chart SVG produced by our own chart module (never user input)."""
    return mark_safe(markup)  # noqa: S308 - server-generated chart markup


@register.simple_tag
def interval(ci: Any, unit: str = "") -> str:
    """[low, high] in the criterion's unit (reports.units, as the reports)."""
    return units.interval(ci, unit)


OPERATOR_SYMBOLS = {">=": "≥", "<=": "≤", ">": ">", "<": "<", "==": "="}


@register.filter
def op_symbol(op: str) -> str:
    return OPERATOR_SYMBOLS.get(op, op)


@register.simple_tag
def vendor_root() -> dict:
    """The vendor root a reader must trust: subject and SHA-256 fingerprint."""
    return root_certificate()


def simulated_pilot_ids(pilots) -> set[int]:
    """The pilots among `pilots` whose data is simulated: a simulated evaluation or a simulated node (two queries)."""
    ids = [p.pk for p in pilots]
    return (set(Pilot.objects.filter(pk__in=ids, gates__evaluations__simulated=True).values_list("pk", flat=True))
            | set(Pilot.objects.filter(pk__in=ids, sites__nodes__simulated=True).values_list("pk", flat=True)))


@register.filter
def simulated(pilot) -> bool:
    """Whether the pilot shows simulated data (its pages then say "Simulated — not evidence" in words)."""
    known = getattr(pilot, "simulated", None)
    if isinstance(known, bool):
        return known
    pilot.simulated = bool(simulated_pilot_ids([pilot]))
    return pilot.simulated


@register.filter
def measure(criterion: Any) -> str:
    """What a criterion measures — its metric and statistic — in the reader's language ("TTFT p50", "命中率 均值")."""
    chinese = (translation.get_language() or "").startswith("zh")
    metric, statistic = getattr(criterion, "metric", ""), getattr(criterion, "statistic", "")
    names = (explain.METRIC_ZH, explain.STAT_ZH) if chinese else (explain.METRIC_EN, explain.STAT_EN)
    return " ".join(part for part in (names[0].get(metric, metric), names[1].get(statistic, statistic)) if part)


@register.filter
def in_unit(value: Any, unit: str = "") -> str:
    """A criterion's figure in its unit, as a person reads it (reports.units, as the reports)."""
    return units.figure(value, unit)


@register.filter
def finding(value: Any) -> str:
    """One of the report verifier's findings in the reader's language (as made: reports.findings); a result stored
    before findings were kept shows its English sentence."""
    if isinstance(value, dict) and "template" in value:
        return findings.in_language(value)
    return str(value) if value else ""


@register.filter
def report_gate_name(report: Any) -> str:
    """The gate's name a verified report's manifest gives, in the reader's language when the manifest has it."""
    if not isinstance(report, dict):
        return ""
    chinese = (translation.get_language() or "").startswith("zh")
    return (report.get("gate_name_zh") if chinese else "") or report.get("gate_name") or ""


AUDIT_OBJECTS = {
    "pilot": gettext_lazy("pilot"), "planversion": gettext_lazy("plan version"), "criterion": gettext_lazy("criterion"),
    "gate": gettext_lazy("gate"), "job": gettext_lazy("run"), "report": gettext_lazy("report"),
    "customertrace": gettext_lazy("customer trace"), "site": gettext_lazy("site"), "node": gettext_lazy("node"),
    "credential": gettext_lazy("SSH key"), "signoff": gettext_lazy("sign-off"),
}


@register.filter
def audit_action(action: str) -> str:
    """An audit entry's action in the reader's language (the recorded code is shown beside it)."""
    try:
        return str(AuditAction(action).label)
    except ValueError:  # lifecycle.audit writes AuditAction only; a row from elsewhere shows its code
        return action


@register.filter
def audit_object(object_type: str) -> str:
    return str(AUDIT_OBJECTS.get(object_type, object_type))


@register.filter
def audit_state(state: str, object_type: str = "") -> str:
    """A recorded state in the reader's language: a pilot's, a plan version's or a gate's (else as recorded)."""
    if not state:
        return "∅"
    choices = {"pilot": Pilot.State, "planversion": PlanVersion.State, "gate": Gate.State}.get(object_type)
    choices = choices or Status
    try:
        return str(choices(state).label)
    except ValueError:
        return state
