"""Notification emails leave from a Celery task, after the commit, and are retried while the mail server is down."""
from __future__ import annotations

import socket

import pytest
from django.core import mail

from gates.models import Notification
from portal import notifications

pytestmark = pytest.mark.django_db


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_a_notification_email_is_queued_after_the_commit_not_sent_in_the_request(demo, django_capture_on_commit_callbacks):
    mail.outbox.clear()
    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        created = notifications.sweep()
    assert created >= 2 and not mail.outbox  # nothing sent inside the request
    assert callbacks and all(not n.emailed for n in Notification.objects.all())


def test_a_mail_server_down_makes_the_task_retry_and_a_later_attempt_sends_once(demo, settings):
    mail.outbox.clear()
    settings.EMAIL_BACKEND = "django.core.mail.backends.smtp.EmailBackend"
    settings.EMAIL_HOST, settings.EMAIL_PORT, settings.EMAIL_TIMEOUT = "127.0.0.1", _closed_port(), 2
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(notifications, "queue_email", lambda note: None)
        notifications.sweep()
    note = Notification.objects.filter(user=demo.bob).exclude(user__email="").first()
    with pytest.raises(notifications.MailDown):
        notifications.send_email(note.pk)
    task = notifications.email_notification
    assert notifications.MailDown in task.autoretry_for and task.max_retries >= 5 and task.retry_backoff
    assert task.name == "gates.notifications.email_notification"
    note.refresh_from_db()
    assert not note.emailed

    settings.EMAIL_BACKEND = "django.core.mail.backends.locmem.EmailBackend"
    assert task.apply((note.pk,)).get() == "sent"
    assert task.apply((note.pk,)).get() == "nothing to send"
    assert [m.to for m in mail.outbox] == [["bob@example.test"]]
    note.refresh_from_db()
    assert note.emailed
