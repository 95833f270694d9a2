"""The JSON API: pilots, gates, runs, verdicts, artifacts and reports, scoped exactly like the portal.

Authentication: `Authorization: Bearer <token>` (tokens from the account page or `manage.py api_token`; each
expires, an expired or revoked one answers 401 saying which), or the portal session. Every object is reached through Pilot.objects.for_user; anything else answers 404.
The OpenAPI 3.1 description is served at /api/openapi.json.
"""
from __future__ import annotations

import hashlib
from collections.abc import Callable
from functools import wraps
from uuid import UUID

from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpRequest, JsonResponse
from django.shortcuts import get_object_or_404
from django.utils import timezone
from django.views.decorators.csrf import csrf_exempt

from gates.models import ApiToken, Evaluation, Gate, Pilot, Report
from gates.outcome import outcome_of
from portal import access
from portal.api_schema import schema
from reports.exports import ExportError, run_results
from runners.orchestration import job_progress, log_since


def _error(status: int, message: str) -> JsonResponse:
    response = JsonResponse({"error": message}, status=status)
    if status == 401:
        response["WWW-Authenticate"] = 'Bearer realm="fxpilot"'
    return response


def _token_user(request: HttpRequest):
    """The token's owner, or the reason it is refused (a sentence for the 401)."""
    header = request.headers.get("Authorization", "")
    scheme, _, key = header.partition(" ")
    if scheme.lower() not in ("bearer", "token") or not key.strip():
        return None, "the Authorization header must be 'Bearer <token>'"
    digest = hashlib.sha256(key.strip().encode()).hexdigest()
    token = ApiToken.objects.select_related("user").filter(key_sha256=digest).first()
    if token is None or not token.user.is_active:
        return None, "the API token is unknown"
    if token.revoked:
        return None, f"the API token {token.prefix}… was revoked; make a new one on your account page (/accounts/)"
    if token.expired:
        return None, (f"the API token {token.prefix}… expired on {token.expires:%Y-%m-%d %H:%M} UTC; make a new one "
                      "on your account page (/accounts/) or with manage.py api_token")
    ApiToken.objects.filter(pk=token.pk).update(last_used=timezone.now())
    return token.user, ""


def api_view(view: Callable) -> Callable:
    """Authenticate, then answer in JSON whatever happens: 401, 403 (the role lacks the capability), 404, 405."""

    @csrf_exempt  # read-only: every method but GET and HEAD is refused below, before anything runs
    @wraps(view)
    def wrapper(request: HttpRequest, *args, **kwargs):
        if request.method not in ("GET", "HEAD"):
            response = _error(405, f"{request.method} is not allowed: the API is read-only (GET)")
            response["Allow"] = "GET, HEAD"
            return response
        if "Authorization" in request.headers:
            user, refused = _token_user(request)
            if user is None:
                return _error(401, refused)
        elif request.user.is_authenticated:
            user = request.user
        else:
            return _error(401, "authenticate with 'Authorization: Bearer <token>' (manage.py api_token)")
        request.api_user = user
        try:
            return view(request, *args, **kwargs)
        except Http404:
            return _error(404, "not found")
        except PermissionDenied as refused:
            return _error(403, str(refused) or "your role in this pilot does not allow this")

    return wrapper


def _pilot(request: HttpRequest, code: UUID) -> Pilot:
    return access.pilot_for(request.api_user, code)


def _iso(value) -> str | None:
    return value.isoformat() if value else None


def pilot_json(pilot: Pilot) -> dict:
    return {
        "id": str(pilot.code), "name": pilot.name, "customer": pilot.customer.name, "vendor": pilot.vendor.name,
        "model_under_test": pilot.model_under_test, "llm_model": pilot.llm_model, "state": pilot.state,
        "current_gate": pilot.current_gate or None, "halted_reason": pilot.halted_reason or None,
        "start_date": pilot.start_date.isoformat(), "outcome": outcome_of(pilot).as_dict(),
    }


def gate_json(gate: Gate) -> dict:
    return {
        "gate": gate.label, "number": gate.number, "name": gate.name, "state": gate.state, "verdict": gate.verdict or None,
        "planned_start": gate.planned_start.isoformat(), "planned_end": gate.planned_end.isoformat(),
        "opened_at": _iso(gate.opened_at), "closed_at": _iso(gate.closed_at), "overdue": gate.is_overdue,
    }


def evaluation_json(evaluation: Evaluation) -> dict:
    return {
        "id": evaluation.pk, "gate": f"G{evaluation.gate.number}", "verdict": evaluation.verdict,
        "simulated": evaluation.simulated, "created": _iso(evaluation.created),
        "plan_version": evaluation.plan_version.number, "inputs": evaluation.inputs, "result": evaluation.result,
    }


def job_json(job) -> dict:
    return {
        "id": str(job.code), "kind": job.kind, "gate": job.gate.label if job.gate_id else None, "status": job.status,
        "error": job.error or None, "created": _iso(job.created), "started": _iso(job.started),
        "finished": _iso(job.finished), "cancel_requested": job.cancel_requested,
    }


def artifact_json(artifact) -> dict:
    return {
        "id": str(artifact.code), "name": artifact.name, "kind": artifact.kind, "sha256": artifact.sha256,
        "size": artifact.size, "simulated": artifact.simulated, "created": _iso(artifact.created),
        "download": f"/api/v1/artifacts/{artifact.code}/download",
    }


def report_json(report: Report) -> dict:
    return {
        "id": str(report.code), "kind": report.kind, "gate": report.gate.label if report.gate_id else None,
        "language": report.language, "sha256": report.sha256, "size": report.size, "simulated": report.simulated,
        "signatures": report.signatures, "created": _iso(report.created),
        "download": f"/api/v1/reports/{report.code}/download",
    }


@api_view
def pilots(request: HttpRequest) -> JsonResponse:
    items = Pilot.objects.for_user(request.api_user).select_related("customer", "vendor")
    return JsonResponse({"pilots": [pilot_json(p) for p in items]})


@api_view
def pilot_detail(request: HttpRequest, pilot: UUID) -> JsonResponse:
    obj = _pilot(request, pilot)
    data = pilot_json(obj)
    data["gates"] = [gate_json(g) for g in obj.gates.select_related("pilot")]
    plan = obj.signed_plan
    data["signed_plan"] = {"version": plan.number, "sha256": plan.sha256, "signed_at": _iso(plan.signed_at)} if plan else None
    return JsonResponse(data)


@api_view
def gates(request: HttpRequest, pilot: UUID) -> JsonResponse:
    obj = _pilot(request, pilot)
    return JsonResponse({"gates": [gate_json(g) for g in obj.gates.select_related("pilot")]})


def _gate(request: HttpRequest, pilot: UUID, number: int) -> Gate:
    return get_object_or_404(Gate.objects.select_related("pilot"), pilot=_pilot(request, pilot), number=number)


@api_view
def gate_detail(request: HttpRequest, pilot: UUID, number: int) -> JsonResponse:
    gate = _gate(request, pilot, number)
    data = gate_json(gate)
    latest = gate.evaluations.select_related("gate", "plan_version").first()
    data["latest_verdict"] = evaluation_json(latest) if latest else None
    data["signoffs"] = [
        {"party": s.party, "person": s.person.get_full_name() or s.person.get_username(), "decision": s.decision,
         "comment": s.comment, "evidence_sha256": s.evidence_sha256, "created": _iso(s.created)}
        for s in gate.signoffs.select_related("person")
    ]
    return JsonResponse(data)


@api_view
def verdicts(request: HttpRequest, pilot: UUID, number: int) -> JsonResponse:
    gate = _gate(request, pilot, number)
    items = gate.evaluations.select_related("gate", "plan_version")
    return JsonResponse({"verdicts": [evaluation_json(e) for e in items]})


@api_view
def runs(request: HttpRequest, pilot: UUID) -> JsonResponse:
    obj = _pilot(request, pilot)
    return JsonResponse({"runs": [job_json(j) for j in obj.jobs.select_related("gate")]})


def _job(request: HttpRequest, code: UUID):
    return access.job_for(request.api_user, code)


@api_view
def run_detail(request: HttpRequest, run: UUID) -> JsonResponse:
    job = _job(request, run)
    data = job_json(job)
    data["pilot"] = str(job.pilot.code)
    data["steps"] = [
        {"seq": s.seq, "name": s.name, "arm": s.arm or None, "node": s.node.name if s.node_id else None, "status": s.status,
         "attempts": s.attempts, "requests_done": s.requests_done, "requests_total": s.requests_total,
         "started": _iso(s.started), "finished": _iso(s.finished), "error": s.error or None}
        for s in job.steps.select_related("node")
    ]
    data["progress"] = job_progress(job)
    return JsonResponse(data)


@api_view
def run_log(request: HttpRequest, run: UUID) -> JsonResponse:
    job = _job(request, run)
    try:
        after = max(0, int(request.GET.get("after", "0")))
    except ValueError:
        return _error(400, "'after' must be a whole number (the last chunk number you have)")
    return JsonResponse({"chunks": [chunk._asdict() for chunk in log_since(job, after)], "finished": job.is_finished})


@api_view
def run_artifacts(request: HttpRequest, run: UUID) -> JsonResponse:
    job = _job(request, run)
    return JsonResponse({"artifacts": [artifact_json(a) for a in job.artifacts.all()]})


@api_view
def run_results_view(request: HttpRequest, run: UUID) -> JsonResponse:
    """The run's results per arm × concurrency × phase as AIPerf's and llm-d's formats and the CSV's rows, with the
    customer's own measurements beside them (reports.exports, docs/results.md)."""
    job = _job(request, run)
    try:
        return JsonResponse(run_results(job))
    except ExportError as error:
        return _error(404, str(error))


@api_view
def artifact_download(request: HttpRequest, artifact: UUID):
    return access.serve_artifact(access.artifact_for(request.api_user, artifact, may=access.RAW_DATA))


@api_view
def reports(request: HttpRequest, pilot: UUID) -> JsonResponse:
    obj = _pilot(request, pilot)
    return JsonResponse({"reports": [report_json(r) for r in obj.reports.select_related("gate")]})


@api_view
def report_download(request: HttpRequest, report: UUID):
    # A signed report attaches the raw data: the same capability as an artifact (docs/portal.md).
    return access.serve_report(access.report_for(request.api_user, report, may=access.RAW_DATA))


def not_found(request: HttpRequest, *args, **kwargs) -> JsonResponse:
    return _error(404, "not found")


def openapi(request: HttpRequest) -> JsonResponse:
    return JsonResponse(schema())
