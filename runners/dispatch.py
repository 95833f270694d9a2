"""Dispatch: put "look at job N" or "run / poll / cancel step N" on the right queue once the transaction commits.

Tasks are sent by their registered names (runners.tasks), so the engine that calls these helpers and
the tasks that call the engine never import each other. The control queue carries job advances;
a step goes to its site's queue (runners.queues), with the time limits of its kind.
"""
from __future__ import annotations

from celery import current_app
from django.db import transaction

from runners.kinds import known_kind
from runners.models import Node, Step
from runners.queues import CONTROL_QUEUE, queue_for_step

ADVANCE_JOB = "runners.tasks.advance_job"
RUN_STEP = "runners.tasks.run_step"
POLL_STEP = "runners.tasks.poll_step"
CANCEL_STEP = "runners.tasks.cancel_step"
CONTACT_NODE = "runners.tasks.contact_node"


def _send(task: str, args: tuple, **options) -> None:
    current_app.signature(task, args=args).apply_async(**options)


def dispatch_advance(job_id: int, countdown: float = 0) -> None:
    _send(ADVANCE_JOB, (job_id,), queue=CONTROL_QUEUE, countdown=countdown)


def dispatch_step(step: Step, countdown: float = 0) -> None:
    limit = known_kind(step.name).soft_time_limit
    queue = queue_for_step(step)
    transaction.on_commit(lambda: _send(RUN_STEP, (step.pk,), queue=queue, countdown=countdown,
                                        soft_time_limit=limit, time_limit=limit + 60))


def dispatch_poll(step: Step, token: str, countdown: float) -> None:
    queue = queue_for_step(step)
    transaction.on_commit(lambda: _send(POLL_STEP, (step.pk, token), queue=queue, countdown=countdown))


def dispatch_cancel(step: Step) -> None:
    queue = queue_for_step(step)
    transaction.on_commit(lambda: _send(CANCEL_STEP, (step.pk,), queue=queue))


def dispatch_contact(node: Node) -> None:
    """"Contact the node" runs on the node's site queue: only the site's worker reaches the node."""
    queue = node.site.queue
    transaction.on_commit(lambda: _send(CONTACT_NODE, (node.pk,), queue=queue, expires=600))
