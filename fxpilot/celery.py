"""The Celery app. Tasks live in runners.tasks; queues are per customer site (see docs/operations.md)."""
import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "fxpilot.settings")

app = Celery("fxpilot")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
