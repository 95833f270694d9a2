"""Celery tasks: small, idempotent, passed ids only. The work is in runners.engine.

run_step claims a step by a conditional update and runs it (or starts its remote process
detached); poll_step takes one look at a detached process and schedules the next look with a
countdown, so no task and no SSH session stays open for the length of a workload. Transient SSH
errors are retried by re-dispatching with an exponential back-off (runners.engine). Each task
carries soft and hard time limits; run_step's come from its step kind at dispatch (runners.dispatch,
which sends these tasks by name).
"""
from __future__ import annotations

from celery import shared_task
from django.db import transaction

from runners import engine


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


@shared_task(name="runners.tasks.contact_node", soft_time_limit=90, time_limit=120)
def contact_node(node_id: int) -> str:
    return engine.contact_node(node_id)
