"""Issue 27 item 2's edges: checking a stored report runs on the checks' queue under the same hourly limit as an
uploaded PDF (no request verifies anything), and a gate report that awaits the customer approver's
countersignature is in "who acts next" — home, overview and the notification sweep."""
from __future__ import annotations

from pathlib import Path

import pytest
from django.conf import settings
from django.core.files.uploadedfile import SimpleUploadedFile
from django.urls import reverse
from django.utils import timezone

from gates import lifecycle
from gates.models import Notification, Profile, Report, UploadVerification
from portal import notifications
from portal.tasks import verify_upload
from runners.pending import pending_actions


@pytest.fixture
def sent(monkeypatch):
    """What the portal sends to a worker (nothing runs it unless the test does)."""
    messages = []
    monkeypatch.setattr(verify_upload, "apply_async", lambda args, **options: messages.append((args, options)))
    return messages


# ── A stored report is checked by a worker ──────────────────────────────────────────────────────────────────────


def test_checking_a_stored_report_is_queued_and_the_page_follows_the_worker(client, world, sent,
                                                                             django_capture_on_commit_callbacks):
    from reports.service import create_gate_report

    report = create_gate_report(world.gate, world.evaluation)
    client.force_login(world.dave)  # a viewer may check a stored report (docs/portal.md)
    offer = client.get(reverse("report_check", args=[report.code])).content.decode()
    assert 'id="check-stored"' in offer and "Verified" not in offer and report.sha256 in offer
    assert not UploadVerification.objects.filter(report=report).exists()  # a GET queues nothing
    with django_capture_on_commit_callbacks(execute=True):
        response = client.post(reverse("report_check", args=[report.code]))
    row = UploadVerification.objects.get(report=report)
    assert response.status_code == 302 and response["Location"] == reverse("report_verification", args=[row.code])
    assert sent == [((row.pk,), {"queue": settings.FXPILOT_CHECK_QUEUE})]  # the checks' queue, as an upload
    assert row.state == "queued" and row.result is None and row.requested_by == world.dave
    assert row.sha256 == report.sha256 and row.path == ""
    page = client.get(response["Location"]).content.decode()
    assert "Verifying…" in page and "hx-get" in page and "Verified" not in page and report.sha256 in page

    assert verify_upload(row.pk) == "done"  # the worker's part
    row.refresh_from_db()
    assert row.result["ok"] is True, row.result
    page = client.get(response["Location"], HTTP_HX_REQUEST="true").content.decode()
    assert 'id="verify-result"' in page and "Not verified" not in page and "hx-get" not in page
    assert Path(settings.DATA_DIR, report.path).is_file()  # checked where it is kept, and kept


def test_a_stored_report_changed_in_the_store_is_an_error_said_in_chinese(client, world, sent):
    path = Path(settings.DATA_DIR) / world.report.path
    path.chmod(0o644)
    path.write_bytes(b"%PDF-1.7\n% changed behind the row\n")
    client.force_login(world.bob)
    location = client.post(reverse("report_check", args=[world.report.code]))["Location"]
    row = UploadVerification.objects.get(report=world.report)
    assert verify_upload(row.pk) == "error"
    row.refresh_from_db()
    assert row.error.startswith("The stored report cannot be checked:")
    assert row.result["reason"]["template"].startswith("The stored report cannot be checked:")  # as made, no verdict
    page = client.get(location).content.decode()
    assert "The stored report cannot be checked" in page and "Verified" not in page
    Profile.objects.update_or_create(user=world.bob, defaults={"language": "zh-hans"})
    client.cookies.load({settings.LANGUAGE_COOKIE_NAME: "zh-hans"})
    page = client.get(location).content.decode()
    assert "The stored report cannot be checked" not in page and "无法检查" in page


def test_stored_reports_and_uploads_share_one_hourly_limit(client, world, sent, settings):
    settings.FXPILOT_CHECKS_PER_HOUR = 2
    client.force_login(world.carol)
    assert client.post(reverse("report_check", args=[world.report.code])).status_code == 302
    upload = SimpleUploadedFile("r.pdf", b"%PDF-1.7\n% a pdf\n", "application/pdf")
    assert client.post(reverse("report_verify"), {"file": upload}).status_code == 302
    refused = client.post(reverse("report_check", args=[world.report.code]))
    assert refused.status_code == 429 and 'id="checks-throttled"' in refused.content.decode()
    upload = SimpleUploadedFile("r.pdf", b"%PDF-1.7\n% a pdf\n", "application/pdf")
    assert client.post(reverse("report_verify"), {"file": upload}).status_code == 429
    assert UploadVerification.objects.filter(requested_by=world.carol).count() == 2
    # an hour later the person may ask again; another person was never limited by carol's checks
    UploadVerification.objects.filter(requested_by=world.carol).update(created=timezone.now() - timezone.timedelta(
        minutes=61))
    assert client.post(reverse("report_check", args=[world.report.code])).status_code == 302
    client.force_login(world.bob)
    assert client.post(reverse("report_check", args=[world.report.code])).status_code == 302


def test_another_organisation_cannot_check_a_report_nor_read_a_check(client, world, sent):
    client.force_login(world.charlie)
    assert client.get(reverse("report_check", args=[world.report.code])).status_code == 404
    assert client.post(reverse("report_check", args=[world.report.code])).status_code == 404
    assert not UploadVerification.objects.filter(report=world.report).exists() and not sent
    client.force_login(world.bob)
    location = client.post(reverse("report_check", args=[world.report.code]))["Location"]
    client.force_login(world.carol)  # same pilot, not the person who asked
    assert client.get(location).status_code == 404
    client.force_login(world.bob)
    from gates.models import Membership

    Membership.objects.filter(user=world.bob).delete()  # he left the customer: his check is no longer his to read
    assert client.get(location).status_code == 404


# ── A gate report awaiting the approver's countersignature is in "who acts next" ─────────────────────────────────


def _waiting_for(client) -> str:
    """The home page's "Waiting for you" section."""
    home = client.get(reverse("home")).content.decode()
    start = home.find('id="todo-h"')
    return home[start:home.find("</section>", start)] if start >= 0 else ""


def _signed_off(world) -> None:
    lifecycle.sign_off_gate(world.gate, world.alice, decision="approve")
    lifecycle.sign_off_gate(world.gate, world.bob, decision="approve")
    world.gate.refresh_from_db()
    world.pilot.refresh_from_db()
    assert world.gate.state == "signed_off"


def _countersigned(report: Report, by) -> Report:
    """A countersigned version's row, as reports.service.countersign writes it (no PDF needed for who acts next)."""
    return Report.objects.create(pilot=report.pilot, gate=report.gate, evaluation=report.evaluation, kind=report.kind,
                                 language=report.language, path=report.path + ".c", sha256="c" * 64, size=1,
                                 signatures=2, version=report.version, supersedes=report, countersigned_by=by,
                                 countersigned_at=timezone.now(), created=timezone.now())


def test_a_signed_off_gates_report_waits_for_the_approvers_countersignature(client, world):
    countersign = [a for a in pending_actions(world.pilot) if a["action"] == "countersign_gate_report"]
    assert countersign == []  # awaiting sign-off: the report does not yet state both decisions
    lifecycle.sign_off_gate(world.gate, world.bob, decision="approve")
    assert not [a for a in pending_actions(world.pilot) if a["action"] == "countersign_gate_report"]
    lifecycle.sign_off_gate(world.gate, world.alice, decision="approve")
    world.pilot.refresh_from_db()  # G2 is open now
    actions = [a for a in pending_actions(world.pilot) if a["action"] == "countersign_gate_report"]
    assert [(a["role"], a["subject"]) for a in actions] == [("customer_approver", world.report)]

    client.force_login(world.bob)
    home = client.get(reverse("home")).content.decode()
    assert "Countersign the gate report" in home and reverse("reports", args=[world.pilot.code]) in home
    overview = client.get(reverse("pilot", args=[world.pilot.code])).content.decode()
    assert "Countersign the gate report" in overview and "Bob" in overview and world.report.sha256[:16] in overview
    assert "Countersign the gate report" in _waiting_for(client)
    client.force_login(world.alice)  # the vendor lead sees who acts, but it is not his to do
    assert "Countersign the gate report" not in _waiting_for(client)

    notifications.sweep()
    notes = Notification.objects.filter(kind="countersign_gate_report")
    assert [(n.user, n.subject) for n in notes] == [
        (world.bob, f"{world.pilot.name}: read and countersign the G1 report (version 1)")]
    Profile.objects.update_or_create(user=world.bob, defaults={"language": "zh-hans"})
    notifications.relocalise(world.bob, "zh-hans")
    assert "read and countersign" not in Notification.objects.get(kind="countersign_gate_report").subject

    _countersigned(world.report, world.bob)
    assert not [a for a in pending_actions(world.pilot) if a["action"] == "countersign_gate_report"]
    assert "Countersign the gate report" not in client.get(reverse("pilot", args=[world.pilot.code])).content.decode()


def test_only_the_latest_version_of_the_approved_evidence_counts_and_an_ended_pilot_is_swept(world):
    from gates.models import Evaluation
    from tests.portal.conftest import verdict

    other = Evaluation.objects.create(gate=world.gate, job=world.job, plan_version=world.pilot.signed_plan,
                                      verdict="pass", result=verdict(), simulated=True,
                                      created=world.evaluation.created - timezone.timedelta(hours=1))
    Report.objects.create(pilot=world.pilot, gate=world.gate, evaluation=other, kind=Report.Kind.GATE,
                          path="reports/older.pdf", sha256="e" * 64, size=1, simulated=True)
    _signed_off(world)
    newer = Report.objects.create(pilot=world.pilot, gate=world.gate, evaluation=world.evaluation,
                                  kind=Report.Kind.GATE, language="zh-hans", path="reports/v2.pdf", sha256="d" * 64,
                                  size=1, version=2, supersedes=world.report, simulated=True)
    subjects = [a["subject"] for a in pending_actions(world.pilot) if a["action"] == "countersign_gate_report"]
    assert subjects == [newer]  # the version to read now, not the evidence nobody approved
    world.pilot.state = "halted"
    world.pilot.save(update_fields=["state"])
    assert notifications.sweep() >= 1  # an ended pilot is still looked at while a report awaits him
    assert Notification.objects.filter(user=world.bob, kind="countersign_gate_report",
                                       key=f"countersign_gate_report:{newer.code}").exists()
