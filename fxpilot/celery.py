"""The Celery app and its schedule. Tasks live in the apps' `tasks` modules (runners.tasks, portal.tasks), found by
autodiscovery and sent by name; queues are per customer site (see docs/operations.md). A worker's own start-up
work that reads the runners' rows (resuming the steps a dead predecessor held) is runners.tasks'. This module
imports no app (docs/architecture.md)."""
import os
import signal

from celery import Celery
from celery.signals import beat_embedded_init, worker_init

from infra.broker import use_fxpilot_transport
from infra.lifetime import STOP_WITH_PARENT, set_death_signal, stop_group_when_orphaned

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "fxpilot.settings")
# Redis URLs use infra.broker.Transport: kombu's, repaired so that a broker restart or a bad
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


# Seconds a worker whose parent died has for its orderly stop (a soft shutdown of 5 s, then the cold one)
# before its whole process group is killed.
ORPHAN_GRACE_SECONDS = 15.0


@worker_init.connect
def stop_with_the_process_that_started_it(**kwargs) -> None:
    """A worker started by a parent that must not leave it behind (the demo sets FXPILOT_STOP_WITH_PARENT to its
    pid) stops, with its pool and beat, at most ORPHAN_GRACE_SECONDS after that parent died — also when its
    orderly stop hangs (on a broker that died at the same moment, say)."""
    parent = os.environ.get(STOP_WITH_PARENT, "")
    if parent.isdigit():
        stop_group_when_orphaned(int(parent), ORPHAN_GRACE_SECONDS)


@beat_embedded_init.connect
def beat_stops_with_its_worker(**kwargs) -> None:
    """The embedded beat is a forked child of the worker: without a death signal it outlives a worker killed with
    SIGKILL and goes on sending the schedule to a broker nobody serves. Beat ignores SIGTERM, so its death
    signal is SIGKILL (it loses nothing but the last run times of its schedule)."""
    set_death_signal(signal.SIGKILL)
