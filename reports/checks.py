"""Validity checks of a verdict for people: a title per check and its detail in the reader's language.

The judge writes each check's detail in English (gates/judge/validity.py). The sentences it writes for a
check that holds are known, so they are matched here and said again through gettext with their figures;
a problem the judge reports is shown as the judge wrote it, under a translated lead.
"""
from __future__ import annotations

import re
from typing import Any

from django.utils.translation import gettext as _
from django.utils.translation import gettext_lazy

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
}

_HIT = re.compile(r"^(?P<where>[\w.-]+/[\w.-]+)(?: /metrics:)? (?P<ratio>[\d.]+%) (?:of prompt tokens cached|external hits)$")


def _hits(part: str) -> str:
    match = _HIT.match(part.strip())
    if not match:
        return part
    if "external hits" in part:
        return _("%(where)s: %(ratio)s of prompt tokens from external hits") % match.groupdict()
    return _("%(where)s: %(ratio)s of prompt tokens cached") % match.groupdict()


def detail(name: str, ok: bool, text: str) -> str:
    """The check's detail in the active language (the figures kept as measured)."""
    text = text or ""
    if not ok:
        return _("The judge reports: %(problems)s") % {"problems": text}
    fixed = {
        "all inputs are simulated": _("all inputs are simulated"),
        "all inputs are real": _("all inputs are real"),
        "no request appears twice": _("no request appears twice"),
        "no request appears twice (compared by content)": _("no request appears twice (compared by content)"),
        "no rate bar to show": _("no rate bar to show"),
        "every node records its GPUs one by one and its RDMA port states":
            _("every node records its GPUs one by one and its RDMA port states"),
        "at least 2 repetitions for every TTFT, throughput and CV criterion; enough soak windows for drift":
            _("at least 2 repetitions for every TTFT, throughput and CV criterion; enough soak windows for drift"),
        "no phase summary with /metrics deltas": _("no phase summary with /metrics deltas"),
        "every arm, phase and concurrency level the criteria compare is present":
            _("every arm, phase and concurrency level the criteria compare is present"),
        "enough repetitions for every spread and drift criterion":
            _("enough repetitions for every spread and drift criterion"),
        "no measure phase to check": _("no measure phase to check"),
        "not checked: no phase summary reports max_in_flight": _("not checked: no phase summary reports max_in_flight"),
        "probe outputs carry output_sha256": _("probe outputs carry output_sha256"),
        "every shared session was read on another instance": _("every shared session was read on another instance"),
        "no real cache arm to check": _("no real cache arm to check"),
        "no measure phase after an eviction to check": _("no measure phase after an eviction to check"),
    }
    if text in fixed:
        return fixed[text]
    if text.startswith("not checked: no populate records"):
        return _("not checked: no populate records say which instance wrote the shared sessions")
    if match := re.fullmatch(r"every cell has at least (\d+) successful requests", text):
        return _("every cell has at least %(n)s successful requests") % {"n": match.group(1)}
    if match := re.fullmatch(r"every cell lasted at least ([\d.]+) s", text):
        return _("every cell lasted at least %(s)s s") % {"s": match.group(1)}
    if match := re.fullmatch(r"the client kept the planned concurrency in flight \((\d+) phase summaries\)", text):
        return _("the client kept the planned concurrency in flight (%(n)s phase summaries)") % {"n": match.group(1)}
    if match := re.fullmatch(r"vLLM (\S+), LMCache (\S+) \((?:node (.+)|phase summary)\)", text):
        if match.group(3):
            return _("vLLM %(v)s, LMCache %(l)s (node %(node)s)") % {"v": match.group(1), "l": match.group(2),
                                                                     "node": match.group(3)}
        return _("vLLM %(v)s, LMCache %(l)s (phase summary)") % {"v": match.group(1), "l": match.group(2)}
    if name == "fault-path-cut-confirmed":
        return "; ".join(_fault(part) for part in text.split("; "))
    if name == "external-hits-measured":
        return "; ".join(_windows(part) for part in text.split("; "))
    if name == "hit-behaviour-matches-arm":
        return "; ".join(_hits(part) for part in text.split(";"))
    if name == "enough-requests-for-rates":
        return "; ".join(_rate_cell(part) for part in text.split("; "))
    if name == "hit-counters-agree":
        return "; ".join(_counters(part) for part in text.split("; "))
    return text


def _fault(part: str) -> str:
    if match := re.fullmatch(r"(\S+) on (.+): cut and restore exited 0, evicted after the restore", part):
        return _("%(arm)s on %(where)s: cut and restore exited 0, evicted after the restore") % {
            "arm": match.group(1), "where": match.group(2)}
    return part


def _windows(part: str) -> str:
    if match := re.fullmatch(r"(\S+): (\d+) /metrics window\(s\)", part):
        return _("%(criterion)s: %(n)s /metrics window(s)") % {"criterion": match.group(1), "n": match.group(2)}
    return part


def _rate_cell(part: str) -> str:
    if match := re.fullmatch(r"(\S+) (\S+): ([\d,]+) requests", part):
        return _("%(criterion)s %(cell)s: %(n)s requests") % {"criterion": match.group(1), "cell": match.group(2),
                                                              "n": match.group(3)}
    return part


def _counters(part: str) -> str:
    if match := re.fullmatch(r"records and /metrics agree on cached tokens in (\d+) window\(s\)", part):
        return _("records and /metrics agree on cached tokens in %(n)s window(s)") % {"n": match.group(1)}
    if match := re.fullmatch(r"(\d+) successful request\(s\) without cached_tokens counted as misses \(0\)", part):
        return _("%(n)s successful request(s) without cached_tokens counted as misses (0)") % {"n": match.group(1)}
    if part.startswith("not cross-checked: "):
        return _("not cross-checked: %(why)s") % {"why": part[len("not cross-checked: "):]}
    return part


def localised(validity: dict[str, Any] | None) -> dict[str, Any] | None:
    """The verdict's validity block with a title and a translated detail on every check."""
    if not validity:
        return validity
    checks = [dict(check, title=str(TITLES.get(check.get("name"), check.get("name", ""))),
                   detail_text=detail(check.get("name", ""), bool(check.get("ok")), check.get("detail", "")))
              for check in validity.get("checks") or []]
    return dict(validity, checks=checks)
