"""Report work done by a worker on the control queue, followed by the page that asked: rendering a report and
countersigning the exact version an approver read (gates.models.ReportJob). No request waits on either.

`run_report_job` imports `reports.service` when it runs: every worker, a site worker on a jump host too, imports
this module at start (task discovery), and must not need WeasyPrint, pyHanko, Pango or fonts to start — only the
control queue's worker renders. The task name is a string in queued messages: it does not change.
"""
from __future__ import annotations

import logging

from celery import shared_task
from django.conf import settings
from django.db import transaction

from gates.models import Report, ReportJob

log = logging.getLogger(__name__)

# Rendering the Chinese procurement report takes about half a minute on a busy machine: room for several.
SOFT_TIME_LIMIT = 900


def queue(kind: str, *, pilot, report_kind: str, language: str, who=None, gate=None, evaluation=None,
          source: Report | None = None, sha256: str = "") -> ReportJob:
    """Record a report job queued and send it to the control queue once the row is committed."""
    job = ReportJob.objects.create(kind=kind, pilot=pilot, report_kind=report_kind, language=language,
                                   requested_by=who if getattr(who, "pk", None) else None, gate=gate,
                                   evaluation=evaluation, source=source, sha256=sha256)
    transaction.on_commit(lambda: run_report_job.apply_async((job.pk,), queue=settings.CELERY_TASK_DEFAULT_QUEUE))
    return job


@shared_task(name="reports.tasks.run_report_job", ignore_result=True, soft_time_limit=SOFT_TIME_LIMIT,
             time_limit=SOFT_TIME_LIMIT + 60)
def run_report_job(pk: int) -> str:
    """Carry out one queued report job (a redelivery after a lost worker finds it running and goes on)."""
    if not ReportJob.objects.filter(pk=pk, state__in=[ReportJob.State.QUEUED, ReportJob.State.RUNNING]).update(
            state=ReportJob.State.RUNNING):
        return "not queued"  # finished already, or gone
    from reports.service import carry_out  # see the module docstring

    job = carry_out(ReportJob.objects.select_related("pilot", "gate", "evaluation", "source", "requested_by").get(pk=pk))
    if job.state == ReportJob.State.ERROR:
        log.error("report job %s failed: %s", job.code, job.error)
    return job.state
