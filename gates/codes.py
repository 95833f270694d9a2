"""Finding a record from what a person types on the command line: its full code, a unique prefix of it
(the short code the portal shows, the first 8 characters), or — for pilots — its exact name."""
from __future__ import annotations

from django.db.models import Model, QuerySet

MIN_PREFIX = 4


class CodeNotFound(LookupError):
    """No record, or more than one, matches; the message says which and what to type instead."""


def find_by_code(queryset: QuerySet, text: str, what: str, *, name_field: str | None = None) -> Model:
    """The one record of `queryset` whose code is `text`, starts with `text` (≥ 4 characters), or is named `text`."""
    text = (text or "").strip()
    if name_field:
        named = list(queryset.filter(**{name_field: text})[:2])
        if len(named) == 1:
            return named[0]
    prefix = text.lower()
    matches = []
    if len(prefix) >= MIN_PREFIX and all(ch in "0123456789abcdef-" for ch in prefix):
        # UUIDs are stored as 32 hex digits on some databases and as uuid on others: compare their text.
        codes = queryset.model.objects.filter(pk__in=queryset.values("pk")).values_list("pk", "code")
        matches = [pk for pk, code in codes if str(code).startswith(prefix)][:2]
    if len(matches) == 1:
        return queryset.get(pk=matches[0])
    hint = f"give its code or the first {MIN_PREFIX}+ characters of it" + (" or its exact name" if name_field else "")
    if not matches:
        raise CodeNotFound(f"no {what} matches {text!r} ({hint})")
    raise CodeNotFound(f"more than one {what} matches {text!r}: {hint}, longer")
