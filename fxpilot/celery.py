"""The Celery app. Tasks live in runners.tasks; queues are per customer site (see docs/operations.md)."""
import os

from celery import Celery

from fxpilot.broker import use_fxpilot_transport

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "fxpilot.settings")
# Redis URLs use fxpilot.broker.Transport: kombu's, repaired so that a broker restart or a bad
# message cannot end a worker (see that module).
use_fxpilot_transport()

app = Celery("fxpilot")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()


@app.on_after_configure.connect
def schedule_reconcile(sender: Celery, **kwargs) -> None:
    """Beat sends the reconcile sweep to the control queue: it resumes steps whose worker died."""
    from django.conf import settings

    sender.add_periodic_task(settings.FXPILOT_RECONCILE_SECONDS,
                             sender.signature("runners.tasks.reconcile", queue=settings.CELERY_TASK_DEFAULT_QUEUE),
                             name="reconcile stale steps")


@app.on_after_configure.connect
def schedule_notifications(sender: Celery, **kwargs) -> None:
    """Beat asks for the notification sweep: runs that ended and verdicts awaiting sign-off reach people by email."""
    from django.conf import settings

    sender.add_periodic_task(30.0, sender.signature("gates.tasks.notify", queue=settings.CELERY_TASK_DEFAULT_QUEUE),
                             name="notify who must act")
