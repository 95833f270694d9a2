"""The customer's trace on the pilot overview: its analysis in a few lines, or how far a worker is with it
(portal.views.traces holds the page; this tag keeps the overview's view untouched)."""
from __future__ import annotations

from django import template

from gates.models import CustomerTrace
from portal.views import traces

register = template.Library()


@register.inclusion_tag("gates/_trace_overview.html")
def trace_overview(pilot) -> dict:
    rows = list(CustomerTrace.objects.filter(pilot=pilot).order_by("-created", "-id")[:20])
    ready = next((r for r in rows if r.state == CustomerTrace.State.READY and r.analysis), None)
    pending = next((r for r in rows if r.state in (CustomerTrace.State.QUEUED, CustomerTrace.State.ANALYSING)), None)
    context = {"pilot": pilot, "ready": ready, "pending": pending, "any": bool(rows)}
    if ready is not None:
        context.update(traces.summary(pilot, ready))
    return context
