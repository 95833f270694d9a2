"""Report context + language → PDF/A-3b bytes (WeasyPrint), with the raw artifacts and manifest.json attached.

No database access: everything comes from the context built by context.py. Every attached file is
re-hashed here, so a file altered on disk after it was stored cannot slip into a report.
"""
from __future__ import annotations

import hashlib
import json
import logging
import mimetypes
import re
import unicodedata
import urllib.parse
import urllib.request
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from xml.sax.saxutils import escape, quoteattr

import pydyf
from django.conf import settings
from django.template.loader import render_to_string
from django.utils import translation
from django.utils.safestring import SafeString, mark_safe
from django.utils.translation import gettext as _
from django.utils.translation import gettext_lazy
from weasyprint import HTML, Attachment
from weasyprint.urls import URLFetcher, URLFetcherResponse

from gates.models import Gate, Party, Pilot, Role, SignOff
from reports import findings, units
from reports.charts import font_stack, gate_charts, reuse_chart
from reports.context import read_attachment
from reports.units import figure, interval
from reports.verify import MANIFEST_NAME, MANIFEST_SCHEMA
from reports.words import procurement_summary
from runners.artifacts import ArtifactMismatch

VERDICT_LABELS = {
    "pass": gettext_lazy("Pass"), "marginal": gettext_lazy("Marginal"), "fail": gettext_lazy("Fail"),
    "invalid": gettext_lazy("Invalid"), "": gettext_lazy("Not evaluated"), None: gettext_lazy("Not evaluated"),
}
COMPARISON_LABELS = {
    "absolute": gettext_lazy("absolute value"), "speedup": gettext_lazy("speed-up (baseline ÷ candidate)"),
    "reduction": gettext_lazy("reduction (1 − candidate ÷ baseline)"), "gain": gettext_lazy("gain (candidate ÷ baseline − 1)"),
    "drift": gettext_lazy("drift (late steady windows ÷ early steady windows − 1)"),
}
OPS = {">=": "≥", "<=": "≤", ">": ">", "<": "<", "==": "="}
TEMPLATES = {"gate": "reports/gate.html", "procurement": "reports/procurement.html"}
logger = logging.getLogger(__name__)


class ReportError(Exception):
    """A report that cannot be made honestly (e.g. an artifact no longer matches its hash)."""


def fmt_bytes(value: float | None) -> str:
    if value is None:
        return "—"
    for unit, size in (("PB", 1e15), ("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if abs(value) >= size:
            return f"{value / size:.2f} {unit}"
    return f"{value:.0f} B"


def criterion_rows(verdict: dict[str, Any], language: str) -> list[dict[str, Any]]:
    rows = []
    for criterion in verdict.get("criteria") or []:
        unit = criterion.get("unit", "")
        cells = [{
            "concurrency": cell.get("concurrency", "—"), "value": figure(cell.get("value"), unit),
            "ci": interval(cell.get("ci"), unit),
            "candidate_value": figure(cell.get("candidate_value")), "baseline_value": figure(cell.get("baseline_value")),
            "n": f"{cell.get('n_candidate', '—')} / {cell.get('n_baseline', '—')}",
            "verdict": cell.get("verdict", ""), "verdict_label": VERDICT_LABELS.get(cell.get("verdict"), cell.get("verdict")),
        } for cell in criterion.get("cells") or []]
        zh = language.startswith("zh")
        description = (criterion.get("description_zh") if zh else "") or criterion.get("description", "")
        arms = criterion.get("candidate", "") + (f" vs {criterion['baseline']}" if criterion.get("baseline") else "")
        rows.append({
            "key": criterion.get("key", ""), "description": description, "metric": criterion.get("metric", ""),
            "statistic": criterion.get("statistic", ""),
            "comparison": COMPARISON_LABELS.get(criterion.get("comparison"), criterion.get("comparison", "")),
            "arms": arms or "—", "phase": criterion.get("phase", ""),
            "bar": f"{OPS.get(criterion.get('op'), criterion.get('op', ''))} {figure(criterion.get('threshold'), unit)}",
            "value": figure(criterion.get("value"), unit),
            "ci": interval(criterion.get("ci"), unit),
            "confidence": f"{criterion.get('confidence', 0.95) * 100:.0f} %", "n": criterion.get("n", "—"),
            "concurrency": ", ".join(str(c.get("concurrency")) for c in criterion.get("cells") or [] if c.get("concurrency")) or "—",
            "verdict": criterion.get("verdict", ""), "verdict_label": VERDICT_LABELS.get(criterion.get("verdict"), ""),
            "rule": (criterion.get("rule_zh") if zh else "") or criterion.get("rule", ""),
            "explanation": (criterion.get("explanation_zh") if zh else "") or criterion.get("explanation", ""), "cells": cells,
        })
    return rows


def manifest(context: dict[str, Any], language: str, files: list[dict[str, Any]]) -> dict[str, Any]:
    pilot, gate = context["pilot"], context.get("gate") or {}
    return {
        "schema": MANIFEST_SCHEMA,
        "report": {
            "code": context["code"], "kind": context["kind"], "language": language, "created": context["created"],
            "pilot_code": pilot["code"], "pilot_name": pilot["name"], "customer": pilot["customer"],
            "vendor": pilot["vendor"], "gate": gate.get("number"), "gate_name": gate.get("name"),
            "gate_name_zh": gate.get("name_zh"),
            "verdict": (context.get("evaluation") or {}).get("verdict"),
            "evaluation": (context.get("evaluation") or {}).get("id"),
            "evidence_sha256": (context.get("evaluation") or {}).get("evidence_sha256"),
            "plan_sha256": (context.get("verdict") or {}).get("plan_sha256") or context.get("plan_sha256", ""),
            "simulated": bool(context["simulated"]), "generator": "fxpilot",
        },
        "artifacts": files,
        "missing_inputs": context.get("missing_inputs", []),
    }


def _attachments(context: dict[str, Any]) -> tuple[list[Attachment], list[dict[str, Any]]]:
    attachments, files = [], []
    for item in context["attachments"]:
        try:
            data = read_attachment(item)
        except ArtifactMismatch as error:
            raise ReportError(f"artifact {item['name']}: {error}") from None
        except OSError as error:
            raise ReportError(f"artifact {item['name']}: cannot read {item.get('storage_name')}: {error.strerror}") from None
        sha256 = hashlib.sha256(data).hexdigest()
        if item.get("sha256") and item["sha256"] != sha256:
            raise ReportError(f"artifact {item['name']}: the stored file hashes to {sha256}, recorded as {item['sha256']}")
        entry = {"file": item["file"], "name": item["name"], "kind": item.get("kind", ""), "sha256": sha256,
                 "size": len(data), "simulated": bool(item.get("simulated")), "node": item.get("node", "")}
        files.append(entry)
        attachments.append(Attachment(string=data, name=item["file"], relationship="Data",
                                      description=f"{item['name']} sha256:{sha256}"))
    return attachments, files


HOW_LABELS = {
    "measured": gettext_lazy("measured at your concurrency"), "interpolated": gettext_lazy("interpolated (log2 scale)"),
    "outside": gettext_lazy("outside the measured range: not projected"), "none": gettext_lazy("not measured"),
    "own-traffic": gettext_lazy("your own replayed traffic"), "measured-overall": gettext_lazy("measured (all levels)"),
    "sample-trace": gettext_lazy("generated sample trace — not the customer's traffic"),
}


def _display_time(iso: str) -> str:
    try:
        return datetime.fromisoformat(iso).astimezone(UTC).strftime("%Y-%m-%d %H:%M UTC")
    except ValueError:
        return iso


# Characters left as they are inside a CSS string; every other one is written as a hex escape.
_CSS_PLAIN = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789 .,-_·:()[]#+×—–/")


def css_string(text: str) -> SafeString:
    """A quoted CSS string for page margin boxes (inside <style>, where HTML escaping does not apply).

    ASCII letters, digits and a few harmless signs stay; every other ASCII character (quotes, backslash,
    <, >, &, @, ;, {, }, line and form feeds…) is a six-digit hex escape, which ends unambiguously, so no
    value can close the string, the rule or the <style> element. Control characters were replaced
    before (clean_text); printable non-ASCII text (Chinese names) stays as it is.
    """
    out = []
    for char in clean_text(str(text)):
        if char in _CSS_PLAIN or (ord(char) > 0x7F and unicodedata.category(char)[0] not in "CZ"):
            out.append(char)
        elif char == " " or unicodedata.category(char) == "Zs":
            out.append(" ")
        else:
            out.append(f"\\{ord(char):06X} ")  # the space ends the escape and is not shown
    return mark_safe('"' + "".join(out) + '"')


def clean_text(text: str) -> str:
    """A user value as the report shows it: control and format characters (NUL, CR, form feed, bidi
    overrides, line separators…) become U+FFFD, visibly, so they neither break the PDF's XML metadata
    nor hide text; tab and line feed stay."""
    return "".join(
        char if char in "\t\n" or unicodedata.category(char) not in ("Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp")
        else "\ufffd"
        for char in text
    )


def clean_context(value: Any) -> Any:
    """Every string in the context (names, comments, inventory, verdict texts) through clean_text."""
    if isinstance(value, str):
        return clean_text(value)
    if isinstance(value, dict):
        return {clean_context(k) if isinstance(k, str) else k: clean_context(v) for k, v in value.items()}
    if type(value) in (list, tuple):
        return type(value)(clean_context(v) for v in value)
    return value


class StaticOnlyFetcher(URLFetcher):
    """WeasyPrint's URL fetcher for reports: data: URLs and the project's own static files, nothing else.

    No HTTP, FTP or file outside the static folders is ever opened, whatever a template or a value
    names; each refusal is kept (refused) and logged, and the resource is left out.
    """

    def __init__(self, roots: list[Path] | None = None):
        super().__init__(allowed_protocols=("data", "file"), allow_redirects=False, timeout=1)
        self.roots = [Path(r).resolve() for r in (roots if roots is not None else static_roots())]
        self.refused: list[str] = []

    def fetch(self, url, headers=None):
        scheme = url.split(":", 1)[0].lower() if ":" in url else ""
        if scheme == "data":
            return super().fetch(url, headers)
        if scheme == "file":
            path = Path(urllib.request.url2pathname(urllib.parse.urlsplit(url).path)).resolve()
            for root in self.roots:
                if path.is_relative_to(root) and path.is_file():
                    return URLFetcherResponse(url, body=path.read_bytes(),
                                              headers={"Content-Type": mimetypes.guess_type(path.name)[0]
                                                       or "application/octet-stream"})
        self.refused.append(url)
        logger.warning("report renderer: refused to fetch %s (only the project's static files are served)", url[:200])
        raise ValueError(f"refused: reports fetch only the project's own static files, not {url[:200]}")


def static_roots() -> list[Path]:
    return [Path(p) for p in getattr(settings, "STATICFILES_DIRS", [])] + [Path(settings.STATIC_ROOT)]


def _watermark_url(text: str) -> str:
    svg = ('<svg xmlns="http://www.w3.org/2000/svg" width="600" height="840" viewBox="0 0 600 840">'
           f'<text x="300" y="420" font-family={quoteattr(font_stack())} font-size="64" font-weight="bold" '
           f'fill="#dc2626" fill-opacity="0.10" text-anchor="middle" transform="rotate(-50 300 420)">{escape(text)}</text></svg>')
    return "data:image/svg+xml," + urllib.parse.quote(svg)


def _localised(context: dict[str, Any]) -> dict[str, Any]:
    """State, party, role and decision labels in the active language (the context was built in another)."""
    def signoffs(rows: list[dict]) -> list[dict]:
        return [dict(row, party_label=_label(Party, row["party"]), role_label=_label(Role, row["role"]),
                     decision_label=_label(SignOff.Decision, row["decision"])) for row in rows]

    def gate(item: dict | None) -> dict | None:
        return dict(item, state_label=_label(Gate.State, item["state"])) if item else item

    out = dict(context, gate=gate(context.get("gate")), signoffs=signoffs(context.get("signoffs") or []),
               plan_signoffs=signoffs(context.get("plan_signoffs") or []))
    out["pilot"] = dict(context["pilot"], state_label=_label(Pilot.State, context["pilot"]["state"]))
    if "gates" in context:
        out["gates"] = [dict(item, gate=gate(item["gate"]), signoffs=signoffs(item["signoffs"])) for item in context["gates"]]
    return out


def _label(choices, value: str) -> str:
    try:
        return str(choices(value).label)
    except ValueError:
        return value


STRATUM_LABELS = {"first": gettext_lazy("first turns with nothing to reuse"),
                  "shared_prefix": gettext_lazy("first turns sharing a prefix with other sessions"),
                  "returning": gettext_lazy("returning turns"), "": gettext_lazy("all requests")}
PHASE_LABELS = {"measure": gettext_lazy("cold-recovery window"), "replay": gettext_lazy("trace replay"),
                "soak": gettext_lazy("soak"), "capacity": gettext_lazy("capacity check"),
                "share": gettext_lazy("cross-instance sharing")}
ARM_LABELS = {"fx": "FX", "dram": "DRAM", "local_nvme": gettext_lazy("local NVMe"),
              "recompute": gettext_lazy("full recompute")}


def tier_display(tiers: dict[str, Any] | None, account: dict[str, Any] | None) -> dict[str, Any]:
    """G4's tier shares and the predicted-vs-measured account, with every figure formatted by reports.units (the
    one formatter) in the active language; "not measured" where the run or the verdict has no figure."""
    missing = _("not measured")

    def share(value: Any) -> str:
        return missing if value is None else units.percent(value, 1)

    def ratio(value: Any) -> str:
        return missing if value is None else units.fixed(value, 2) + "×"

    rows = []
    for row in (tiers or {}).get("rows") or []:
        rows.append({"arm": str(ARM_LABELS.get(row["arm"], row["arm"])),
                     "phase": str(PHASE_LABELS.get(row.get("phase"), row.get("phase"))),
                     "stratum": str(STRATUM_LABELS.get(row.get("stratum") or "", row.get("stratum"))),
                     "overall": not row.get("stratum"), "requests": row.get("requests"),
                     "hbm": share(row.get("hbm")), "dram": share(row.get("dram")),
                     "fx": share(row.get("fx")) if row.get("disk_tier") else "—",  # no disk tier in this arm
                     "recomputed": share(row.get("recomputed"))})
    out: dict[str, Any] = {"tier_rows": rows, "tiers_measured": tiers is not None}
    if account is None:
        out["account"] = None
        return out

    def with_ci(value: Any, ci: list | None) -> str:
        if value is None:
            return missing
        low, high = (list(ci or []) + [None, None])[:2]
        return ratio(value) + ("" if low is None or high is None else f" [{ratio(low)}, {ratio(high)}]")

    out["account"] = {
        "trace_ideal": share(account.get("trace_ideal")), "sample_ideal": share(account.get("sample_ideal")),
        "predicted_fx": share(account.get("predicted_fx")), "trace_fx": share(account.get("trace_fx")),
        "sizes": (missing if not (account.get("hbm_tokens") or account.get("dram_tokens")) else
                  _("HBM %(hbm)s tokens, DRAM %(dram)s tokens") % {"hbm": units.number(account.get("hbm_tokens") or 0),
                                                                   "dram": units.number(account.get("dram_tokens") or 0)}),
        "repetitions": [{"n": r["repetition"], "fx": share(r.get("fx")), "dram": share(r.get("dram")),
                         "hbm": share(r.get("hbm")), "cached": share(r.get("cached"))}
                        for r in account.get("repetitions") or []],
        "predicted_speedup": ratio(account.get("predicted_speedup")), "predicted_at": account.get("predicted_at"),
        "measured_speedup": with_ci(account.get("measured_speedup"), account.get("measured_ci")),
        "beyond_dram": with_ci(account.get("beyond_dram"), account.get("beyond_dram_ci")),
        "reasons": [findings.in_language(r) for r in account.get("reasons") or []],
    }
    return out


def render_html(context: dict[str, Any], language: str, files: list[dict[str, Any]] | None = None) -> str:
    with translation.override(language):
        context = _localised(clean_context(context))
        if files is not None:
            files = clean_context(files)
        kind = context["kind"]
        extra: dict[str, Any] = {}
        if kind == "gate":
            extra["criteria"] = criterion_rows(context["verdict"], language)
            extra["charts"] = gate_charts(context["verdict"])
        else:
            extra["summary"] = procurement_summary(context, language.lower().startswith("zh"))
            extra["gate_sections"] = [
                dict(item, criteria=criterion_rows(item["verdict"], language),
                     verdict_label=VERDICT_LABELS.get((item["evaluation"] or {}).get("verdict"), ""),
                     charts=gate_charts(item["verdict"]) if item["gate"]["number"] in (3, 4) else [])
                for item in context["gates"]]
            extra["reuse_chart"] = reuse_chart(context["sizing"].get("reuse"))
            extra["sizing_display"] = {
                "per_token": fmt_bytes(context["sizing"].get("kv_bytes_per_token")),
                "kv": fmt_bytes(context["sizing"].get("kv_bytes")),
                "capacity": fmt_bytes(context["sizing"].get("capacity_bytes")),
            }
            extra["projection_rows"] = [dict(row, value_display=figure(row["value"], row["unit"]),
                                             how_label=HOW_LABELS.get(row["how"], row["how"]),
                                             low_display=figure(row["low"], row["unit"]),
                                             ci_display=interval(row.get("ci"), row["unit"]))
                                        for row in context["projections"]]
        extra.update(tier_display(context.get("tier_shares"), context.get("predicted_vs_measured")))
        is_zh = language.lower().startswith("zh")
        explanation = (context.get("verdict") or {}).get("explanation_zh" if is_zh else "explanation") or ""
        gate = context.get("gate") or {}
        verdict = (context.get("evaluation") or {}).get("verdict")
        css = {
            "header": css_string(f"fxpilot · {context['pilot']['name']}"),
            "banner": css_string(_("SIMULATION — not evidence")),
            "verdict": css_string((f"G{gate['number']} · " if gate else "")
                                  + (str(VERDICT_LABELS.get(verdict, verdict)) if gate else _("Procurement report"))),
            "footer": css_string(_("Report %(code)s") % {"code": context["code"]}),
            "page": css_string(_("Page")),
        }
        return render_to_string(TEMPLATES[kind], {
            **context, **extra, "language": language, "is_zh": is_zh,
            "html_lang": "zh-Hans" if is_zh else "en",
            "manifest_files": files if files is not None else context["attachments"],
            "watermark": _watermark_url(_("SIMULATION")) if context["simulated"] else "",
            "gate_explanation": explanation, "created_display": _display_time(context["created"]), "verdict_labels": VERDICT_LABELS, "css": css, "verdict_label": VERDICT_LABELS.get(verdict, verdict),
        })


def render_pdf(context: dict[str, Any], language: str) -> bytes:
    """The unsigned PDF/A-3b. `context` needs `code` and `created` (set by the service) besides context.py's keys."""
    attachments, files = _attachments(context)
    document = manifest(context, language, files)
    attachments.append(Attachment(
        string=json.dumps(document, indent=1, ensure_ascii=False).encode(), name=MANIFEST_NAME,
        relationship="Supplement", description="fxpilot report manifest: every attached file with its SHA-256"))
    html = render_html(context, language, files)
    fetcher = StaticOnlyFetcher()
    base = static_roots()[0].resolve().as_uri() + "/"
    return HTML(string=html, base_url=base, url_fetcher=fetcher).write_pdf(
        pdf_variant="pdf/a-3b", attachments=attachments, finisher=own_page_resources)


_DRAWN = re.compile(rb"/([^\s/\[\]()<>{}%]+) Do\b")


def own_page_resources(document, pdf) -> None:
    """Give each page a resources dictionary that names only the forms and images the page draws.

    WeasyPrint gives every page one shared dictionary naming every form XObject of the document (a chart's label,
    a page's watermark). A PDF reader follows a page's resources by name and does not mind; a signature validator
    that checks what changed after a signature (pyHanko's difference analysis, run on every countersigned report)
    walks every path from the catalogue to every object, and with P pages and F forms that is P × F paths to each
    font beneath a form: 13.7 s of CPU for a countersigned 23-page report (benchmarks/README.md). Each page here
    keeps the shared dictionary's other entries (fonts, graphics states, patterns, colour spaces) and the forms
    its content stream draws (`/name Do`); a form's own resources are its own already.
    """
    pages = [pdf.objects[number] for number in pdf.pages["Kids"][::3]]
    shared = pdf.objects[int(pages[0]["Resources"].split()[0])] if pages else None
    if shared is None or "XObject" not in shared or any(page["Resources"] != shared.reference for page in pages):
        return  # not the layout this was written for: the document stays as WeasyPrint made it
    drawn = []
    for page in pages:
        contents = pdf.objects[int(page["Contents"].split()[0])]
        text = b"\n".join(part if isinstance(part, bytes) else str(part).encode() for part in contents.stream)
        drawn.append({name.decode() for name in _DRAWN.findall(text)})
    forms = dict(shared["XObject"])
    for index, (page, names) in enumerate(zip(pages, drawn, strict=True)):
        own = shared if index == 0 else pydyf.Dictionary(shared)  # the first page keeps the shared object
        own["XObject"] = pydyf.Dictionary({name: ref for name, ref in forms.items() if name in names})
        if index:
            pdf.add_object(own)
            page["Resources"] = own.reference
