"""Finding a pilot from what a person types on the command line (its name, the start of its code, or its id)."""
from __future__ import annotations

from django.core.management.base import CommandError

from gates.models import Pilot

REFUSED = 4
"""The exit code of a command that could not start (no such pilot, a closed gate, …)."""


def find_pilot(text: str) -> Pilot:
    text = text.strip()
    matches = list(Pilot.objects.filter(name=text))
    if not matches and len(text) >= 4:
        matches = [p for p in Pilot.objects.all() if str(p.code).startswith(text.lower())]
    if not matches and text.isdigit():
        matches = list(Pilot.objects.filter(pk=int(text)))
    if len(matches) != 1:
        raise CommandError(f"{'no' if not matches else 'more than one'} pilot matches {text!r} (give its name or code)",
                           returncode=REFUSED)
    return matches[0]
