"""Two languages chosen per person, and notifications: on the home page and by email, once per event."""

from __future__ import annotations

import pytest
from django.core import mail
from django.urls import reverse

from gates import lifecycle
from gates.models import Notification, Profile
from portal import notifications


@pytest.fixture(autouse=True)
def mail_at_once(monkeypatch):
    """The emails a worker would send once the notification is committed, sent at once (no worker here)."""
    monkeypatch.setattr(notifications, "queue_email", lambda note: notifications.send_email(note.pk))


def test_a_person_switches_to_chinese_and_it_is_remembered_at_the_next_login(client, demo):
    client.force_login(demo.carol)
    client.post(reverse("set_language"), {"language": "zh-hans", "next": reverse("home")})
    assert Profile.objects.get(user=demo.carol).language == "zh-hans"
    assert "您的试点" in client.get(reverse("home")).content.decode()
    client.post(reverse("logout"))
    client.cookies.clear()
    client.post(reverse("login"), {"username": "carol", "password": demo.password})
    page = client.get(reverse("pilot", args=[demo.pilot.code]))
    assert page["Content-Language"] == "zh-hans" and "时间线" in page.content.decode()


def test_the_language_switch_refuses_an_unknown_language_and_a_foreign_next_url(client, demo):
    client.force_login(demo.carol)
    response = client.post(reverse("set_language"), {"language": "xx", "next": "https://evil.example/"})
    assert response["Location"] == reverse("home")
    assert not Profile.objects.filter(user=demo.carol).exists()


def test_dates_follow_the_chosen_language(client, world):
    client.force_login(world.carol)
    english = client.get(reverse("gate", args=[world.pilot.code, 1])).content.decode()
    client.post(reverse("set_language"), {"language": "zh-hans"})
    chinese = client.get(reverse("gate", args=[world.pilot.code, 1])).content.decode()
    year = str(world.pilot.start_date.year)
    assert f"{year}年" in chinese and f"{year}年" not in english


def test_the_people_who_must_sign_the_plan_get_one_email_and_see_it_at_home(client, demo):
    mail.outbox.clear()
    assert notifications.sweep() >= 2
    signers = sorted(m.to[0] for m in mail.outbox)
    assert signers == ["alice@example.test", "bob@example.test"]
    assert notifications.sweep() == 0 and len(mail.outbox) == 2
    client.force_login(demo.bob)
    page = client.get(reverse("home")).content.decode()
    assert "sign plan v1" in page and "Sign the plan" in page


def test_signing_in_the_portal_notifies_whoever_must_act_next(client, demo):
    client.force_login(demo.alice)
    client.post(reverse("plan_sign", args=[demo.pilot.code]))
    assert Notification.objects.filter(user=demo.bob, kind="sign_plan").exists()
    assert not Notification.objects.filter(user=demo.alice, kind="sign_plan").exists()


def test_a_verdict_awaiting_sign_off_and_a_finished_run_notify_the_people_concerned(world):
    from django.utils import timezone

    from runners.models import Job, Status

    Job.objects.filter(pk=world.job.pk).update(status=Status.SUCCESSFUL, finished=timezone.now())
    mail.outbox.clear()
    notifications.sweep()
    kinds = set(Notification.objects.values_list("user__username", "kind"))
    assert {("bob", "sign_off_gate"), ("erin", "sign_off_gate"), ("alice", "accept_host_key")} <= kinds
    assert {("carol", "run_finished"), ("dave", "run_finished")} <= kinds
    assert ("carol", "sign_off_gate") not in kinds


def test_an_email_goes_out_in_the_recipients_language(demo):
    Profile.objects.create(user=demo.bob, language="zh-hans")
    mail.outbox.clear()
    notifications.sweep()
    to_bob = next(m for m in mail.outbox if m.to == ["bob@example.test"])
    assert "签署计划" in to_bob.subject


def test_marking_notifications_read_clears_them_from_the_home_page(client, demo):
    notifications.sweep()
    client.force_login(demo.bob)
    client.post(reverse("notifications_read"))
    assert not Notification.objects.filter(user=demo.bob, read_at__isnull=True).exists()
    lifecycle.sign_plan(demo.pilot.latest_plan, demo.bob)


def test_the_notify_command_sends_what_is_due_once(demo):
    from io import StringIO

    from django.core.management import call_command

    out = StringIO()
    call_command("notify", stdout=out)
    call_command("notify", stdout=out)
    assert out.getvalue().splitlines() == ["2 notification(s) sent", "0 notification(s) sent"]


def test_beat_runs_the_notification_sweep_on_the_default_queue(settings, demo):
    from fxpilot.celery import app
    from portal.tasks import notify

    entry = app.conf.beat_schedule["notify who must act"]
    assert entry["task"] == "gates.tasks.notify" and entry["options"]["queue"] == settings.CELERY_TASK_DEFAULT_QUEUE
    assert notify() == 2 and notify() == 0
