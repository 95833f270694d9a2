"""Periodic portal work for Celery beat: notify whoever must act now and whoever's run has ended."""
from __future__ import annotations

from celery import shared_task

from gates.notifications import sweep


@shared_task(name="gates.tasks.notify", ignore_result=True)
def notify() -> int:
    """Idempotent: each person is told once per event, however often this runs."""
    return sweep()
