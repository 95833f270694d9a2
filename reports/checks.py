"""Validity checks of a verdict for people: a title per check and its detail in the reader's language.

The judge writes each check's detail in English (gates/judge/validity.py) and, beside it, the catalogue
sentences and values it was made of (`detail_said`): those are said here through gettext. A check without
them (a verdict stored before them) is shown as the judge wrote it, a problem under a translated lead.
"""
from __future__ import annotations

from typing import Any

from django.utils.translation import gettext as _
from django.utils.translation import gettext_lazy

from reports.findings import in_language

TITLES = {
    "kv-connector-is-lmcache": gettext_lazy("The cache arms ran vLLM's LMCache connector"),
    "page-cache-bypassed": gettext_lazy("Cold reads bypassed the page cache"),
    "fault-path-cut-confirmed": gettext_lazy("The FX path was really cut and restored"),
    "external-hits-measured": gettext_lazy("External-tier hits measured from /metrics"),
    "no-simulated-mixed-with-real": gettext_lazy("Simulated and real inputs are not mixed"),
    "no-duplicate-requests": gettext_lazy("No request counted twice"),
    "versions-recorded": gettext_lazy("Software versions recorded"),
    "arms-and-levels-present": gettext_lazy("Every compared arm and level measured"),
    "min-requests-per-cell": gettext_lazy("Enough requests in every cell"),
    "min-cell-seconds": gettext_lazy("Every cell long enough"),
    "repetitions": gettext_lazy("Enough repetitions"),
    "hit-behaviour-matches-arm": gettext_lazy("Cache behaviour matches each arm"),
    "client-not-bottleneck": gettext_lazy("The load client was not the bottleneck"),
    "output-hashes-present": gettext_lazy("Probe outputs hashed"),
    "share-read-on-another-instance": gettext_lazy("Shared sessions read on another instance"),
    "chunk-hash-shared": gettext_lazy("One deterministic chunk hash on every sharing instance"),
    "enough-requests-for-rates": gettext_lazy("Enough requests to show every rate bar"),
    "inventory-complete": gettext_lazy("Every GPU and RDMA port recorded"),
    "hit-counters-agree": gettext_lazy("Records and the server's counters agree on cache hits"),
    "repetitions-complete": gettext_lazy("Every planned repetition up to the look judged"),
    "no-copied-repetitions": gettext_lazy("No repetition copies another's timings"),
    "clocks-agree": gettext_lazy("The instances' clocks agree"),
}

def detail(name: str, ok: bool, text: str, parts: list[dict] | None = None) -> str:
    """The check's detail in the active language (the figures kept as measured): its catalogue sentences and their
    values when the judge recorded them (`detail_said`), else the English it wrote (verdicts stored before)."""
    text = text or ""
    if parts:
        said = "; ".join(in_language(part) for part in parts)
        return said if ok else _("The judge reports: %(problems)s") % {"problems": said}
    if not ok:
        return _("The judge reports: %(problems)s") % {"problems": text}
    return text


def localised(validity: dict[str, Any] | None) -> dict[str, Any] | None:
    """The verdict's validity block with a title and a translated detail on every check."""
    if not validity:
        return validity
    checks = [dict(check, title=str(TITLES.get(check.get("name"), check.get("name", ""))),
                   detail_text=detail(check.get("name", ""), bool(check.get("ok")), check.get("detail", ""),
                                      check.get("detail_said")))
              for check in validity.get("checks") or []]
    return dict(validity, checks=checks)
