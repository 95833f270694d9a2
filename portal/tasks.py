"""Portal work done by workers: notify whoever must act (Celery beat), verify an uploaded PDF or a stored report (the
checks' queue, FXPILOT_CHECK_QUEUE, served by the control worker: at most FXPILOT_CHECKS_AT_ONCE run at once, the
others wait their turn in the queue, so checks never hold every slot the gate runs' control work needs). Both kinds of
check are `UploadVerification` rows, counted together against FXPILOT_CHECKS_PER_HOUR a person (`checks_left`).

`verify_upload` imports `reports.service` when it runs: every worker, a site worker on a jump host too,
imports this module at start, and must not need the PDF renderer and signer for that."""
from __future__ import annotations

import hashlib
import logging
import uuid
from datetime import timedelta
from pathlib import Path

from celery import shared_task
from django.conf import settings
from django.db import transaction
from django.utils import timezone
from django.utils.translation import gettext_noop

from gates.models import UploadVerification
from portal.notifications import sweep
from reports.findings import english, said

log = logging.getLogger(__name__)
CHUNK = 1024 * 1024
# Why a check ended in `error`, as made (a sentence and its values, reports.findings): kept in the row's `result`
# as {"reason": said} for the page to say in the reader's language; `error` keeps the English for logs and admin.
NOT_CARRIED_OUT = gettext_noop("The verification could not be carried out: %(detail)s")
STORED_UNREADABLE = gettext_noop("The stored report cannot be checked: %(detail)s")
NO_TRUST_ROOT = gettext_noop("No trust root is configured (FXPILOT_SIGNING_ROOT); nothing can be trusted.")
CHANGED_IN_UPLOAD_AREA = gettext_noop("The uploaded file changed in the upload area after it was received; upload it "
                                      "again.")


@shared_task(name="gates.tasks.notify", ignore_result=True)
def notify() -> int:
    """Idempotent: each person is told once per event, however often this runs."""
    return sweep()


def upload_area() -> Path:
    folder = Path(settings.DATA_DIR) / "uploads" / "verify"
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def queue_upload_verification(upload, user) -> UploadVerification:
    """Stream the upload into the upload area with its SHA-256, record it queued, and send it to a worker."""
    path = upload_area() / f"{uuid.uuid4().hex}.pdf"
    digest, size = hashlib.sha256(), 0
    with open(path, "xb") as out:
        for chunk in upload.chunks(CHUNK):
            digest.update(chunk)
            size += len(chunk)
            out.write(chunk)
    row = UploadVerification.objects.create(requested_by=user, filename=(upload.name or "")[:255], size=size,
                                            sha256=digest.hexdigest(), path=str(path))
    _send(row)
    return row


def queue_report_check(report, user) -> UploadVerification:
    """Record a check of a stored report queued (the worker reads it from the evidence store and hashes it again)
    and send it to the checks' queue: the same task, queue, turn and hourly limit as an uploaded PDF."""
    row = UploadVerification.objects.create(requested_by=user, report=report, filename=Path(report.path).name[:255],
                                            size=report.size, sha256=report.sha256, path="")
    _send(row)
    return row


def _send(row: UploadVerification) -> None:
    transaction.on_commit(lambda: verify_upload.apply_async((row.pk,), queue=settings.FXPILOT_CHECK_QUEUE))


def checks_this_hour(user) -> int:
    """Checks the person asked for in the last hour: uploads and stored reports alike."""
    return UploadVerification.objects.filter(requested_by=user,
                                             created__gte=timezone.now() - timedelta(hours=1)).count()


def checks_left(user) -> bool:
    """May the person ask for one more check now (FXPILOT_CHECKS_PER_HOUR a person, every kind of check)?"""
    return checks_this_hour(user) < settings.FXPILOT_CHECKS_PER_HOUR


# A check running longer than the hard time limit is not running any more (its worker died): it holds no turn.
def _claim(pk: int) -> str:
    """Take the row's turn: "claimed", "busy" (FXPILOT_CHECKS_AT_ONCE others run now) or "not queued"."""
    now = timezone.now()
    alive_since = now - timedelta(seconds=settings.CELERY_TASK_TIME_LIMIT)
    with transaction.atomic():
        # Locking every queued and running row makes two workers' claims take turns (SQLite's write lock does).
        rows = list(UploadVerification.objects.select_for_update()
                    .filter(state__in=[UploadVerification.State.QUEUED, UploadVerification.State.RUNNING])
                    .values_list("pk", "state", "started"))
        if not any(row_pk == pk and state == UploadVerification.State.QUEUED for row_pk, state, _ in rows):
            return "not queued"
        running = sum(1 for row_pk, state, started in rows
                      if state == UploadVerification.State.RUNNING and started and started >= alive_since)
        if running >= settings.FXPILOT_CHECKS_AT_ONCE:
            return "busy"
        UploadVerification.objects.filter(pk=pk).update(state=UploadVerification.State.RUNNING, started=now)
        return "claimed"


BUSY_RETRY_SECONDS = 3


def _unreadable(exc: Exception) -> dict:
    finding = said(gettext_noop("The file could not be read as a signed PDF (%(error)s)."), error=type(exc).__name__)
    return {"ok": False, "reasons": [english(finding)], "findings": [finding], "signatures": [], "attachments": [],
            "report": {}, "metadata": {}}


@shared_task(name="gates.tasks.verify_upload", ignore_result=True)
def verify_upload(pk: int) -> str:
    """Verify one queued upload; the row ends `done` with the result or `error` with the reason, never stuck."""
    claim = _claim(pk)
    if claim == "not queued":
        return claim  # already taken by another delivery, or gone
    if claim == "busy":  # another check holds the turn: give the slot back and look again shortly
        verify_upload.apply_async((pk,), queue=settings.FXPILOT_CHECK_QUEUE, countdown=BUSY_RETRY_SECONDS)
        return claim
    # Imported here: a site worker imports this module too (task discovery), and must not need WeasyPrint,
    # pyHanko, Pango or fonts to start.
    from reports.service import ReportError, report_bytes, trust_roots, verify_report_bytes

    row = UploadVerification.objects.select_related("report").get(pk=pk)
    state, result, reason = UploadVerification.State.ERROR, None, None
    try:
        missing = [str(root) for root in trust_roots() if not Path(root).is_file()]
        data = None
        if missing:
            reason = said(NO_TRUST_ROOT)
        elif row.report_id is not None:  # a stored report, as it is in the evidence store now, hashed again
            try:
                data = report_bytes(row.report)
            except ReportError as exc:
                reason = said(STORED_UNREADABLE, detail=exc)
        else:
            data = Path(row.path).read_bytes()
        if data is not None:
            if hashlib.sha256(data).hexdigest() != row.sha256:
                reason = said(CHANGED_IN_UPLOAD_AREA)
            else:
                try:
                    result = verify_report_bytes(data).to_dict()
                except Exception as exc:  # a damaged file is "not verified", not infrastructure trouble
                    result = _unreadable(exc)
                state = UploadVerification.State.DONE
    except Exception as exc:  # the upload area or the trust root unreadable: infrastructure trouble
        log.exception("verifying upload %s", row.code)
        reason = said(NOT_CARRIED_OUT, detail=f"{type(exc).__name__}: {exc}")
    if state == UploadVerification.State.ERROR:
        reason = reason or said(NOT_CARRIED_OUT, detail="no reason given")
        result = {"reason": reason}
    UploadVerification.objects.filter(pk=pk).update(state=state, result=result,
                                                    error=english(reason) if reason else "", finished=timezone.now())
    if row.path:  # an upload is checked and not kept; a stored report stays where it is
        Path(row.path).unlink(missing_ok=True)
    return state
