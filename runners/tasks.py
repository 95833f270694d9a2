"""Celery tasks: small, idempotent, passed ids only. The work is in runners.engine.

run_step claims a step by a conditional update and runs it (or starts its remote process
detached); poll_step takes one look at a detached process and schedules the next look with a
countdown, so no task and no SSH session stays open for the length of a workload. Transient SSH
errors are retried by re-dispatching with an exponential back-off (runners.engine). Each task
carries soft and hard time limits; run_step's come from its step kind at dispatch (runners.dispatch,
which sends these tasks by name).

A worker that starts also looks for the steps a dead predecessor of the same name held (worker_ready below),
so that they are resumed at the next sweep.
"""
from __future__ import annotations

import logging
from datetime import timedelta

from celery import shared_task
from celery.signals import worker_ready
from django.conf import settings
from django.db import connections, transaction
from django.utils import timezone

from runners import engine, traces
from runners.models import Status, Step

log = logging.getLogger(__name__)


@shared_task(name="runners.tasks.advance_job", soft_time_limit=60, time_limit=90)
def advance_job(job_id: int) -> None:
    with transaction.atomic():
        engine.advance(job_id)


@shared_task(bind=True, name="runners.tasks.run_step")
def run_step(self, step_id: int) -> str:
    return engine.execute_step(step_id, worker=self.request.hostname or "worker")


@shared_task(name="runners.tasks.poll_step", soft_time_limit=120, time_limit=180)
def poll_step(step_id: int, token: str) -> str:
    return engine.poll_step(step_id, token)


@shared_task(name="runners.tasks.cancel_step", soft_time_limit=120, time_limit=180)
def cancel_step(step_id: int) -> str:
    return engine.cancel_step(step_id)


@shared_task(name="runners.tasks.reconcile", soft_time_limit=120, time_limit=180)
def reconcile() -> dict:
    return engine.reconcile()


@shared_task(name="runners.tasks.analyse_trace", soft_time_limit=1800, time_limit=1900)
def analyse_trace(trace_id: int) -> str:
    """Read and analyse an uploaded trace (runners.traces.analyse_row): never inside a web request."""
    return traces.analyse_row(trace_id)


@shared_task(name="runners.tasks.contact_node", soft_time_limit=90, time_limit=120)
def contact_node(node_id: int) -> str:
    return engine.contact_node(node_id)


@worker_ready.connect
def resume_what_a_dead_predecessor_held(sender=None, **kwargs) -> None:
    """A worker (re)started under a node name finds steps still claimed under that name: its predecessor died
    (a supervisor restarted it). They are marked stale now, so the next sweep resumes them within
    FXPILOT_RECONCILE_SECONDS instead of after FXPILOT_STALE_SECONDS. Skipped when another live worker answers
    to the same name (two workers must not share one; then the heartbeat rule decides)."""
    name = getattr(sender, "hostname", None)
    if not name:
        return
    try:
        orphans = Step.objects.filter(status=Status.RUNNING, claimed_by__startswith=f"{name}#")
        if not orphans.exists():
            return
        replies = sender.app.control.ping(destination=[name], timeout=1.5)
        if len(replies) > 1:
            log.warning("another live worker answers to %s: its steps are left to the heartbeat rule", name)
            return
        stale = timezone.now() - timedelta(seconds=settings.FXPILOT_STALE_SECONDS * 2)
        count = orphans.update(heartbeat=stale)
        log.warning("%s was restarted: %d step(s) its predecessor held are resumed by the next sweep", name, count)
    except Exception:  # noqa: BLE001 — a worker must start even if this look fails; the sweep still runs
        log.exception("could not look for steps a previous %s held", name)
    finally:
        connections.close_all()
