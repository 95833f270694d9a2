"""Finding a pilot from what a person types on the command line (its name, its code or the short code the portal
shows: any unique prefix of 4 or more characters)."""
from __future__ import annotations

import getpass
import socket

from django.core.management.base import CommandError

from gates.codes import CodeNotFound, find_by_code
from gates.models import Pilot

REFUSED = 4
"""The exit code of a command that could not start (no such pilot, a closed gate, …)."""


def find_pilot(text: str) -> Pilot:
    try:
        return find_by_code(Pilot.objects.all(), text, "pilot", name_field="name")
    except CodeNotFound as error:
        raise CommandError(str(error), returncode=REFUSED) from None


def command_line_actor() -> str:
    """Who acts from a shell, for the audit log and the pages: "command line (user@host)"."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = "unknown"
    return f"command line ({user}@{socket.gethostname() or 'localhost'})"
