"""The Celery app. Tasks live in runners.tasks; queues are per customer site (see docs/operations.md)."""
import logging
import os
import signal

from celery import Celery
from celery.signals import beat_embedded_init, worker_init, worker_ready

from fxpilot.broker import use_fxpilot_transport
from fxpilot.lifetime import STOP_WITH_PARENT, set_death_signal, stop_group_when_orphaned

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "fxpilot.settings")
# Redis URLs use fxpilot.broker.Transport: kombu's, repaired so that a broker restart or a bad
# message cannot end a worker (see that module).
use_fxpilot_transport()
log = logging.getLogger("fxpilot.celery")

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


@worker_ready.connect
def resume_what_a_dead_predecessor_held(sender=None, **kwargs) -> None:
    """A worker (re)started under a node name finds steps still claimed under that name: its predecessor died
    (a supervisor restarted it). They are marked stale now, so the next sweep resumes them within
    FXPILOT_RECONCILE_SECONDS instead of after FXPILOT_STALE_SECONDS. Skipped when another live worker answers
    to the same name (two workers must not share one; then the heartbeat rule decides)."""
    from datetime import timedelta

    from django.conf import settings
    from django.db import connections
    from django.utils import timezone

    from runners.models import Status, Step

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
