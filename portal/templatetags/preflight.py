"""Template filters for the node preflight: ``{{ blocker|blocker_text }}`` shows a blocker in the reader's language."""
from __future__ import annotations

from django import template

from runners.preflight import blocker_text as _blocker_text

register = template.Library()


@register.filter
def blocker_text(blocker: dict) -> str:
    return _blocker_text(blocker) if isinstance(blocker, dict) else ""
