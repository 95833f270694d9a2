"""Where a task goes: a step that touches nodes goes to its site's queue, the rest to the control queue.

A worker on a jump host inside a customer's network consumes only that site's queue
(`celery -A fxpilot worker -Q <site.queue>`); the control queue carries evaluation, reports,
job advancement and the reconcile sweep, which need only the database. The embedded default
runs one local worker on every queue (`python manage.py worker`).
"""
from __future__ import annotations

from django.conf import settings

from runners.models import Site, Step

# The control queue is Celery's default queue, so a task sent without a queue lands there.
CONTROL_QUEUE: str = settings.CELERY_TASK_DEFAULT_QUEUE
# The checks of uploaded PDFs (portal.tasks.verify_upload): the control worker serves it too, at most
# FXPILOT_CHECKS_AT_ONCE at a time, so that checks never hold every slot the control queue needs.
CHECK_QUEUE: str = settings.FXPILOT_CHECK_QUEUE


def queue_for_step(step: Step) -> str:
    """A step on a node runs where the node's site is reachable; a step without a node is control work."""
    if step.node_id is not None:
        return step.node.site.queue
    return CONTROL_QUEUE


def all_queues() -> list[str]:
    """Every queue a single embedded worker must serve: control first, the checks', then each site's."""
    sites = sorted(set(Site.objects.values_list("queue", flat=True)) - {CONTROL_QUEUE, CHECK_QUEUE})
    return [CONTROL_QUEUE, CHECK_QUEUE, *sites]
