"""The customer approver's countersignature, made on his own machine (reports.customer_sign) and uploaded here.

Two forms on the report's countersign card (templates/gates/_countersign_form.html): enrol the certificate he
made (`fxpilot-countersign init`), and upload the version he read, countersigned with his own key
(`fxpilot-countersign sign`). The portal checks the upload (reports.customer_sign_store.check_upload) and stores it
as the countersigned version (reports.service.countersign); it never signs for him.
"""
from __future__ import annotations

from uuid import UUID

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect
from django.utils.translation import gettext as _
from django.views.decorators.http import require_POST

from gates.models import Membership, ReportJob, Role
from gates.policy import Act
from portal import access
from reports import tasks as report_tasks
from reports.customer_sign_store import Refused, enrol, keep_upload
from reports.findings import in_language
from reports.service import latest_version, quick_change

MAX_CERTIFICATE_BYTES = 64 * 1024
MAX_ADDED_BYTES = 4 * 1024 * 1024  # one signature with its certificates and an optional time-stamp: far less


def _read(upload, limit: int) -> bytes | None:
    if upload is None or upload.size > limit:
        return None
    return b"".join(upload.chunks())


@login_required
@require_POST
def signer_enrol(request: HttpRequest, code: UUID) -> HttpResponse:
    """A customer approver enrols the certificate he made on his own machine (never a key)."""
    pilot = access.get_pilot_for_user(request, code)
    access.require_act(pilot, request.user, Act.COUNTERSIGN)
    if not Membership.objects.filter(user=request.user, organisation=pilot.customer,
                                     role=Role.CUSTOMER_APPROVER).exists():
        messages.error(request, _("Only a customer approver of this pilot enrols a countersigning certificate."))
        return redirect("reports", pilot.code)
    data = _read(request.FILES.get("certificate"), MAX_CERTIFICATE_BYTES)
    if data is None:
        messages.error(request, _("Choose your approver-cert.pem (at most 64 KiB) to enrol; nothing was enrolled."))
        return redirect("reports", pilot.code)
    try:
        enrolment = enrol(request.user, pilot.customer, data, who=request.user)
    except Refused as refused:
        messages.error(request, in_language(refused.finding))
    else:
        messages.success(request, _("Your countersigning certificate is enrolled: %(subject)s, SHA-256 %(fingerprint)s.")
                         % {"subject": enrolment.subject, "fingerprint": enrolment.fingerprint})
    return redirect("reports", pilot.code)


@login_required
@require_POST
def report_countersign(request: HttpRequest, code: UUID) -> HttpResponse:
    """The approver uploads the version he read, countersigned on his own machine; the POST names its SHA-256. The
    upload is kept and a worker checks it (reports.service.countersign): stored as the countersigned version when
    it is those exact bytes plus his one signature, refused naming why otherwise; the job's page follows. When
    anything behind the version changed, nothing is stored and a worker renders the new one. Nothing is verified
    or signed in this request."""
    report = access.get_report_for_user(request, code)
    pilot = report.pilot
    access.require_act(pilot, request.user, Act.COUNTERSIGN)
    named = (request.POST.get("sha256") or "").strip().lower()
    latest = latest_version(report)
    if not named:
        messages.error(request, _("A countersignature names the version you read by its SHA-256; nothing was signed."))
        return redirect("reports", pilot.code)
    if named != report.sha256 or latest.pk != report.pk or report.countersigned_by_id is not None:
        messages.warning(request, _("The report changed since you read it, so nothing was signed. Read the version "
                                    "now offered (SHA-256 %(sha256)s) and countersign that one.")
                         % {"sha256": latest.sha256})
        return redirect("reports", pilot.code)
    if quick_change(report) is not None:  # a decision or an evaluation since: a worker renders what is true now
        job = report_tasks.queue(ReportJob.Kind.RENDER, pilot=pilot, report_kind=report.kind, language=report.language,
                                 who=request.user, gate=report.gate, evaluation=report.evaluation)
        messages.warning(request, _("Something behind this report changed since it was made, so nothing was signed. "
                                    "A worker renders the new version: read it, then countersign it."))
        return redirect("report_job", job.code)
    signed = _read(request.FILES.get("signed"), report.size + MAX_ADDED_BYTES)
    if signed is None:
        messages.error(request, _("Upload the file fxpilot-countersign wrote for this version; nothing was stored."))
        return redirect("reports", pilot.code)
    keep_upload(report, request.user, signed)
    job = report_tasks.queue(ReportJob.Kind.COUNTERSIGN, pilot=pilot, report_kind=report.kind, language=report.language,
                             who=request.user, gate=report.gate, evaluation=report.evaluation, source=report,
                             sha256=named)
    return redirect("report_job", job.code)
