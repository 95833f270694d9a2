"""Small template helpers of the portal: names in the reader's language, numbers and durations."""

from __future__ import annotations

from typing import Any

from django import template
from django.utils import formats, translation
from django.utils.safestring import SafeString, mark_safe
from django.utils.translation import gettext as _

from gates.models import Gate, Pilot
from gates.reports.checks import localised
from gates.reports.context import root_certificate

register = template.Library()


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
    if value in (None, ""):
        return "—"
    return formats.number_format(float(value) * 100, decimal_pos=int(digits), use_l10n=True) + " %"


@register.filter
def number(value: Any, digits: int = 3) -> str:
    """A figure to `digits` significant places, in the reader's number format."""
    if value in (None, ""):
        return "—"
    if isinstance(value, bool):
        return _("yes") if value else _("no")
    if not isinstance(value, (int, float)):
        return str(value)
    if isinstance(value, int) or float(value).is_integer():
        return formats.number_format(int(value), use_l10n=True, force_grouping=True)
    magnitude = abs(value)
    places = 0 if magnitude >= 100 else 1 if magnitude >= 10 else 2 if magnitude >= 1 else int(digits)
    return formats.number_format(value, decimal_pos=places, use_l10n=True)


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
def interval(ci: Any) -> str:
    if not ci or len(ci) != 2 or ci[0] is None:
        return "—"
    return f"[{number(ci[0])}, {number(ci[1])}]"


OPERATOR_SYMBOLS = {">=": "≥", "<=": "≤", ">": ">", "<": "<", "==": "="}


@register.filter
def op_symbol(op: str) -> str:
    return OPERATOR_SYMBOLS.get(op, op)


@register.filter
def verdict_label(value: str) -> str:
    """pass / marginal / fail / invalid in the reader's language."""
    try:
        return str(Gate.Verdict(value).label)
    except ValueError:
        return value


@register.filter
def checks(validity: Any) -> Any:
    """A verdict's validity block with each check's title and detail in the reader's language."""
    return localised(validity) if isinstance(validity, dict) else validity


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
def starter_label(label: str) -> str:
    """Who acted when no signed-in person did, in the reader's language: "command line (user@host)"."""
    label = str(label or "")
    if label.startswith("command line (") and label.endswith(")"):
        return _("command line (%(where)s)") % {"where": label[len("command line ("):-1]}
    return label
