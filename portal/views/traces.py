"""The customer's trace, before any GPU time (issue 24, item 7): uploaded on the pilot at any stage, read and
analysed by a worker (runners.traces.receive → runners.tasks.analyse_trace), its analysis shown with charts.

Everything goes through portal.access: a person outside the pilot gets 404 on every URL here (the progress
JSON too); seeing the analysis needs membership of the pilot, uploading the trace the raw-data roles (who
may also download it, on the G4 page's link). The web request only hashes and stores the file.
"""
from __future__ import annotations

from typing import Any
from uuid import UUID

from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.utils import translation
from django.views.decorators.http import require_POST

from gates import policy
from gates.models import CustomerTrace, Pilot
from gates.plan import TRACE_GATE
from gates.policy import Act
from gates.sizing import SessionLengths, SizingSettingsError, compute
from gates.traces.predict import predicted_gain
from portal import access
from portal.forms import TraceUploadForm
from portal.uploads import receive_upload
from reports import charts
from runners import traces as runner_traces

UPLOAD = access.RAW_DATA


def _plan_of(pilot: Pilot):
    version = pilot.signed_plan or pilot.latest_plan
    try:
        return version.to_plan() if version is not None else None
    except Exception:  # a plan that no longer reads predicts nothing; its own page says why
        return None


def capacity(pilot: Pilot, reuse: dict[str, Any] | None) -> dict[str, Any] | None:
    """The FX capacity that captures the plan's reuse share of this trace's reachable reuse (gates.sizing)."""
    if not reuse or not reuse.get("known"):
        return None
    deployment = pilot.deployment or {}
    model = deployment.get("model") or pilot.llm_model
    try:
        found = compute(model=model, settings=pilot.sizing, vllm_flags=deployment.get("extra_vllm_flags") or [],
                        lengths=SessionLengths([], ""), sessions_kept=pilot.sessions_kept, reuse=reuse)
    except SizingSettingsError:
        found = compute(model=model, settings={}, lengths=SessionLengths([], ""), sessions_kept=pilot.sessions_kept,
                        reuse=reuse)
    if found.capacity_basis != "reuse-curve":
        return {"model": model, "missing": found.missing, "share": (found.reuse or {}).get("share")}
    return {"model": model, "share": found.reuse["share"], "tokens": found.reuse["capacity_tokens"],
            "kv_bytes_per_token": found.kv_bytes_per_token, "kv_bytes": found.kv_bytes,
            "capacity_bytes": found.capacity_bytes, "tb": (found.capacity_bytes or 0) / 1e12, "fx_units": found.fx_units,
            "unit_basis": found.fx_unit_usable_tb_basis, "missing": found.missing}


def summary(pilot: Pilot, trace: CustomerTrace) -> dict[str, Any]:
    """What the overview and the trace page say about an analysed trace: reuse, capacity, predicted gain."""
    analysis = trace.analysis or {}
    reuse = analysis.get("reuse") or {}
    plan = _plan_of(pilot)
    reference = (plan.planning or {}).get("reference") if plan is not None else None
    bar = None
    if plan is not None:
        bar = next((c.threshold for c in plan.gate(TRACE_GATE).criteria if c.key == "g4-replay-speedup"), None)
    size = capacity(pilot, reuse)
    share = (size or {}).get("share") or 0.95
    return {"trace": trace, "analysis": analysis, "reuse": reuse, "capacity": size,
            "prediction": predicted_gain(reuse, reference, pilot.customer_concurrency, share=share, bar=bar)}


def trace_charts(analysis: dict[str, Any]) -> list[charts.Chart]:
    return charts.trace_charts(analysis)


def latest(pilot: Pilot) -> CustomerTrace | None:
    """The newest upload of the pilot, whatever its state (the page says if it is still being read)."""
    return CustomerTrace.objects.filter(pilot=pilot).order_by("-created", "-id").first()


def _may_upload(pilot: Pilot, roles) -> bool:
    return policy.may(Act.UPLOAD_TRACE, pilot.gate(TRACE_GATE), roles)



@login_required
def pilot_traces(request: HttpRequest, code: UUID, trace: int | None = None) -> HttpResponse:
    """The pilot's traces: the upload form, every upload with its state, and one analysis with its charts."""
    pilot = access.get_pilot_for_user(request, code)
    roles = access.roles_of(pilot, request.user)
    rows = list(CustomerTrace.objects.filter(pilot=pilot).select_related("uploaded_by", "gate").order_by("-created", "-id"))
    if trace is not None:
        shown = get_object_or_404(CustomerTrace, pilot=pilot, pk=trace)
    else:
        shown = next((r for r in rows if r.state == CustomerTrace.State.READY), rows[0] if rows else None)
    language = translation.get_language() or "en"
    for row in [*rows, *([shown] if shown is not None else [])]:  # the page's headline too, not only the table
        row.refusal_text = (row.refusal or {}).get("zh-hans" if language.startswith("zh") else "en", "")
    context = {
        "pilot": pilot, "rows": rows, "shown": shown, "form": TraceUploadForm(),
        "can_upload": _may_upload(pilot, roles), "can_download": bool(roles & UPLOAD),
        "replayed_by_g4": runner_traces.current(pilot.gate(TRACE_GATE)),
    }
    if shown is not None and shown.state == CustomerTrace.State.READY and shown.analysis:
        context.update(summary(pilot, shown))
        context["charts"] = trace_charts(shown.analysis)
    return render(request, "gates/traces.html", context)


@login_required
@require_POST
def trace_upload(request: HttpRequest, code: UUID) -> HttpResponse:
    """Keep the file and queue its analysis; the answer comes before a row of it is read."""
    pilot = access.get_pilot_for_user(request, code)
    roles = access.require_act(pilot, request.user, Act.UPLOAD_TRACE)
    row = receive_upload(request, pilot, pilot.gate(TRACE_GATE), roles)
    if row is not None:
        return redirect("pilot_trace", pilot.code, row.pk)
    return redirect("pilot_traces", pilot.code)


@login_required
def trace_progress(request: HttpRequest, code: UUID, trace: int) -> HttpResponse:
    """How far the worker is with one upload (polled by its page)."""
    pilot = access.get_pilot_for_user(request, code)
    row = get_object_or_404(CustomerTrace, pilot=pilot, pk=trace)
    done = row.state in (CustomerTrace.State.READY, CustomerTrace.State.REFUSED)
    if request.headers.get("HX-Request"):
        response = render(request, "gates/_trace_progress.html", {"pilot": pilot, "row": row})
        if done:
            response["HX-Refresh"] = "true"    # the page then shows the analysis, or why it was refused
        return response
    return JsonResponse({"state": row.state, "state_label": row.get_state_display(), "progress": row.progress,
                         "stage": row.stage, "done": done})
