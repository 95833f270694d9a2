"""A message as it is made: a sentence of the catalogue and the values in it, said in any language later.

The preflight's pattern (runners.preflight) for the report verifier's findings: nothing is parsed back out of
English. Light on purpose: the worker's tasks build one without loading the verifier.
"""
from __future__ import annotations

from typing import Any

from django.utils.translation import gettext

Finding = dict[str, Any]
"""{"template": a sentence of the catalogue with %(name)s fields, "values": {name: text, or a nested Finding}}."""


def said(template: str, **values: Any) -> Finding:
    """A finding as it is made: its sentence (marked with gettext_noop where it is written) and its values."""
    return {"template": template, "values": {k: v if isinstance(v, dict) else str(v) for k, v in values.items()}}


def _say(finding: Finding, translate) -> str:
    values = {k: _say(v, translate) if isinstance(v, dict) else v for k, v in (finding.get("values") or {}).items()}
    try:
        return translate(finding["template"]) % values
    except (KeyError, TypeError, ValueError):  # a catalogue sentence that lost a field: the English one
        return str(finding["template"]) % values


def english(finding: Finding) -> str:
    """The finding as the command line and the stored result write it."""
    return _say(finding, str)


def in_language(finding: Finding) -> str:
    """The finding in the active language."""
    return _say(finding, gettext)
