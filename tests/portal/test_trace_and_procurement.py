"""G4's trace uploaded on its page; G4 signed off by both parties makes the procurement report, pinned on the overview."""
from __future__ import annotations

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.urls import reverse

from gates import lifecycle
from gates.models import CustomerTrace, Notification, Report, ReportJob
from portal.notifications import sweep
from tests.portal.conftest import report_work_here
from tests.reports.countersign_helpers import countersigned_upload, enrol_in_portal, signed_file, use_customer_side
from tests.reports.test_service import CUSTOMER_TRACE, _evaluate
from tests.reports.test_truth import _walk_to
from tests.traces.helpers import run_trace_jobs


@pytest.fixture(autouse=True)
def _customer_side(tmp_path, monkeypatch):
    use_customer_side(monkeypatch, tmp_path)


def _upload(client, pilot, data: bytes, name: str = "ours.csv"):
    """Upload on the G4 page, let the worker read it, and show the trace page (the G4 page when it is good)."""
    answer = client.post(reverse("gate_trace", args=[pilot.code, 4]), {"trace": SimpleUploadedFile(name, data)})
    if answer.status_code != 302:
        return answer
    if run_trace_jobs() == ["ready"]:
        return client.get(reverse("gate", args=[pilot.code, 4]))
    return client.get(reverse("pilot_traces", args=[pilot.code]))


def test_either_party_uploads_the_trace_and_a_bad_one_names_its_line(signed_pilot, client):
    pilot = signed_pilot.pilot
    client.force_login(signed_pilot.carol)  # the customer's engineer
    page = _upload(client, pilot, b"session_id,turn,prompt_tokens,output_tokens,arrival_offset_s\na,1,x,1,0\n")
    assert "line 2, column prompt_tokens" in page.content.decode()
    assert CustomerTrace.objects.get().state == "refused" and not CustomerTrace.objects.filter(state="ready").exists()
    CustomerTrace.objects.all().delete()
    page = _upload(client, pilot, CUSTOMER_TRACE).content.decode()
    trace = CustomerTrace.objects.get()
    assert trace.sessions == 10 and trace.sha256 in page and "90th percentile" in page
    client.force_login(signed_pilot.charlie)
    assert _upload(client, pilot, CUSTOMER_TRACE).status_code == 404


def _jobs_done() -> list[str]:
    """Carry out the queued report jobs as the control queue's worker does (the same task, in this process)."""
    from reports.tasks import run_report_job

    return [run_report_job(pk) for pk in ReportJob.objects.filter(state="queued").order_by("pk").values_list("pk", flat=True)]


def test_signing_off_g4_as_both_parties_pins_the_countersigned_procurement_report(signed_pilot, client):
    pilot = signed_pilot.pilot
    pilot.signed_people = (signed_pilot.alice, signed_pilot.bob)
    _walk_to(pilot, 4)
    evaluation = _evaluate(pilot, 4)
    lifecycle.record_verdict(pilot.gate(4), evaluation, who="test")
    for person in (signed_pilot.alice, signed_pilot.bob):
        client.force_login(person)
        client.post(reverse("gate_signoff", args=[pilot.code, 4]), {"decision": "approve", "comment": ""})
    pilot.refresh_from_db()
    assert pilot.state == "completed"
    assert not Report.objects.exists()  # nothing was rendered in a request: a worker makes it
    assert _jobs_done() == ["done"]
    made = Report.objects.get(kind="procurement")
    assert made.countersigned_by is None and made.signatures == 1
    # Until bob countersigns, he is the one who must act: the overview, his home page and a notification.
    overview = client.get(reverse("pilot", args=[pilot.code])).content.decode()
    assert "Countersign the procurement report" in overview and "Bob Wang" in overview and made.sha256[:16] in overview
    assert "Nobody" not in overview
    assert sweep() >= 1  # the beat's sweep: ended pilots whose procurement report awaits him are swept too
    assert Notification.objects.filter(user=signed_pilot.bob, kind="countersign_report").exists()
    client.force_login(signed_pilot.bob)
    assert "Countersign the procurement report" in client.get(reverse("home")).content.decode()
    # he enrols the certificate he made on his own side (issue 49); the upload form is offered from then on
    assert "Your countersigning certificate is enrolled" in enrol_in_portal(client, signed_pilot.bob, pilot).content.decode()
    listing = client.get(reverse("reports", args=[pilot.code])).content.decode()
    assert f'name="sha256" value="{made.sha256}"' in listing  # the version offered, by its hash
    # countersigned on his own side with his own key (issue 49), the file uploaded with the hash of what he read
    answer = client.post(reverse("report_countersign", args=[made.code]),
                         {"sha256": made.sha256, "signed": signed_file(made, signed_pilot.bob)})
    job = ReportJob.objects.get(kind="countersign")
    assert answer.status_code == 302 and answer["Location"] == reverse("report_job", args=[job.code])
    page = client.get(answer["Location"]).content.decode()
    assert "hx-get" in page and made.sha256 in page and "A worker is adding your countersignature" in page
    assert _jobs_done() == ["done"]
    final = Report.objects.get(kind="procurement", supersedes__isnull=False)
    assert final.countersigned_by == signed_pilot.bob and final.version == made.version
    page = client.get(reverse("report_job", args=[job.code])).content.decode()
    assert "hx-get" not in page and final.sha256 in page and "Your signature was added" in page
    overview = client.get(reverse("pilot", args=[pilot.code])).content.decode()
    assert "Proven: every gate passed" in overview and reverse("report_download", args=[final.code]) in overview
    assert "Countersign the procurement report" not in overview
    listing = client.get(reverse("reports", args=[pilot.code])).content.decode()
    assert "final" in listing and "superseded" in listing and "countersigned by Bob Wang" in listing


def test_the_countersign_post_names_the_version_read_and_waits_for_no_rendering(signed_pilot, client):
    """The POST answers at once in both languages; an old or missing hash signs nothing; a decision since the
    report was made has a worker render the new version instead; other organisations get 404, other roles 403."""

    from reports import service

    pilot = signed_pilot.pilot
    _evaluate(pilot, 3)
    old = service.create_procurement_report(pilot)
    report = service.create_procurement_report(pilot)
    client.force_login(signed_pilot.bob)
    countersigned = countersigned_upload(report, signed_pilot.bob)  # made on his side, with his own key

    def post(subject, sha256, **kwargs):
        """The countersign form: the hash of the version read and the file countersigned on his side."""
        data = {"sha256": sha256, "signed": SimpleUploadedFile("countersigned.pdf", countersigned)}
        return client.post(reverse("report_countersign", args=[subject.code]), data, **kwargs)

    for language in ("en", "zh-hans"):
        client.post(reverse("set_language"), {"language": language, "next": "/"})
        with report_work_here() as ran:
            answer = post(report, report.sha256)
        assert answer.status_code == 302 and ran == []  # the work is left to a worker
    assert ReportJob.objects.filter(kind="countersign", sha256=report.sha256).count() == 2
    assert Report.objects.count() == 2  # nothing signed or rendered in the request
    ReportJob.objects.all().delete()
    client.post(reverse("set_language"), {"language": "en", "next": "/"})
    for sha256 in ("", old.sha256):
        answer = post(report, sha256, follow=True)
        assert answer.status_code == 200 and "nothing was signed" in answer.content.decode()
    # the right hash but no countersigned file: nothing is kept or queued
    answer = client.post(reverse("report_countersign", args=[report.code]), {"sha256": report.sha256}, follow=True)
    assert answer.status_code == 200 and "nothing was stored" in answer.content.decode()
    answer = post(old, old.sha256, follow=True)
    assert "The report changed since you read it" in answer.content.decode() and report.sha256 in answer.content.decode()
    assert not ReportJob.objects.exists()
    _evaluate(pilot, 3)  # evidence recorded since: the new version is rendered, nothing is signed
    answer = post(report, report.sha256)
    assert ReportJob.objects.get().kind == "render" and answer.status_code == 302
    client.force_login(signed_pilot.charlie)
    assert post(report, report.sha256).status_code == 404
    assert client.get(reverse("report_job", args=[ReportJob.objects.get().code])).status_code == 404
    client.force_login(signed_pilot.carol)
    assert post(report, report.sha256).status_code == 403
    assert ReportJob.objects.count() == 1 and Report.objects.count() == 2
