"""Template filters the signed reports use (`{% load evidence %}`): a verdict, its validity checks and who acted,
in the reader's language. The portal's own library (`portal`) offers them too, so its pages read evidence the same way."""

from __future__ import annotations

from typing import Any

from django import template
from django.utils.translation import gettext as _

from gates.models import Gate
from reports import units
from reports.checks import localised

register = template.Library()


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


@register.filter
def starter_label(label: str) -> str:
    """Who acted when no signed-in person did, in the reader's language: "command line (user@host)"."""
    label = str(label or "")
    if label.startswith("command line (") and label.endswith(")"):
        return _("command line (%(where)s)") % {"where": label[len("command line ("):-1]}
    return label


@register.filter
def share(value: Any, places: int = 1) -> str:
    """A fraction as a percentage, rounded as every figure is (reports.units.percent): 0.3735 → "37.4 %"."""
    return units.percent(value if isinstance(value, (int, float)) else None, int(places))


@register.filter
def count(value: Any) -> str:
    """A figure grouped by thousands in the reader's number format (reports.units.number): 12031 → "12,031"."""
    return units.number(value)
