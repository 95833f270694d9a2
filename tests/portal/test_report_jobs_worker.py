"""Report jobs through a REAL Celery worker on the control queue (a subprocess on the test database and a real
broker, tests/orchestration/conftest.py): the countersign POST only queues, the worker signs exactly the version
read, and the job's page shows the outcome; a change behind that version signs nothing and offers the new one."""
from __future__ import annotations

import pytest
from django.conf import settings
from django.urls import reverse

from gates import lifecycle
from gates.models import Profile, Report, ReportJob
from reports.service import (
    create_gate_report,
    create_procurement_report,
    latest_version,
    report_bytes,
    verify_report_bytes,
)
from runners.pending import pending_actions
from tests.orchestration.conftest import wait_finished
from tests.portal.conftest import report_work_here
from tests.reports.countersign_helpers import enrol_in_portal, signed_file, use_customer_side
from tests.reports.test_service import _evaluate

WAIT_SECONDS = 600  # a render and a signature: a hang bound, whatever the load


def _finished(job: ReportJob, cluster) -> ReportJob:
    return wait_finished(job, cluster, WAIT_SECONDS)


@pytest.fixture(autouse=True)
def _customer_side(tmp_path, monkeypatch):
    use_customer_side(monkeypatch, tmp_path)


def _countersign(client, report: Report, sha256: str, person) -> tuple[ReportJob, str]:
    """The approver's POST naming what he read, with the file he countersigned on his own side (issue 49): it
    answers at once with the job's page, the job queued."""
    upload = signed_file(report, person)
    with report_work_here() as ran:
        response = client.post(reverse("report_countersign", args=[report.code]), {"sha256": sha256, "signed": upload})
    assert ran == [], "the countersign POST did the work itself"
    job = ReportJob.objects.filter(kind=ReportJob.Kind.COUNTERSIGN).order_by("-created", "-pk").first()
    assert response.status_code == 302 and response["Location"] == reverse("report_job", args=[job.code])
    return job, response["Location"]


def test_a_countersignature_is_added_by_the_worker_to_exactly_the_version_read(cluster, client, signed_pilot):
    pilot, alice, bob = signed_pilot.pilot, signed_pilot.alice, signed_pilot.bob
    cluster.worker("control", [cluster.control], concurrency=1)
    gate = pilot.gate(1)
    evaluation = _evaluate(pilot, 1)
    lifecycle.record_verdict(gate, evaluation, who="test")
    first = create_gate_report(gate, evaluation)  # the run's report step: no sign-off yet

    for person in (alice, bob):  # each decision has the worker render the report again (docs/reports.md)
        client.force_login(person)
        client.post(reverse("gate_signoff", args=[pilot.code, 1]), {"decision": "approve", "comment": ""})
    gate.refresh_from_db()
    pilot.refresh_from_db()  # G2 is open now
    assert gate.state == "signed_off"
    renders = list(ReportJob.objects.filter(kind=ReportJob.Kind.RENDER))
    assert len(renders) == 2
    for job in renders:
        assert _finished(job, cluster).state == ReportJob.State.DONE, job.error
    offered = latest_version(first)
    # one new version that states both decisions (a render that finds it current makes none)
    assert offered.version in (2, 3) and offered.countersigned_by_id is None and offered.supersedes_id is not None
    assert offered in {job.result for job in renders}
    # what he is asked to do, and what he reads: the version that states the gate signed off by both
    assert [a["subject"] for a in pending_actions(pilot) if a["action"] == "countersign_gate_report"] == [offered]

    client.force_login(bob)
    # he enrols the certificate he made on his own side (issue 49); the upload form is offered from then on
    assert "Your countersigning certificate is enrolled" in enrol_in_portal(client, bob, pilot).content.decode()
    listing = client.get(reverse("reports", args=[pilot.code])).content.decode()
    assert f'name="sha256" value="{offered.sha256}"' in listing
    job, location = _countersign(client, offered, offered.sha256, bob)
    assert job.source == offered and job.sha256 == offered.sha256
    job = _finished(job, cluster)
    assert job.state == ReportJob.State.DONE, f"{job.state}: {job.error}\n{cluster.logs()}"

    page = client.get(location).content.decode()
    assert 'id="report-job-done"' in page and "hx-get" not in page and job.result.sha256 in page
    signed = job.result
    assert signed.countersigned_by == bob and signed.supersedes == offered and signed.signatures == 2
    data = b"".join(client.get(reverse("report_download", args=[signed.code])).streaming_content)
    assert data == report_bytes(signed) and data.startswith(report_bytes(offered))  # every byte he read, kept
    result = verify_report_bytes(data)
    assert result.ok, result.reasons
    assert [s.party for s in result.signatures] == ["vendor", "customer"]
    assert not [a for a in pending_actions(pilot) if a["action"] == "countersign_gate_report"]


def test_a_change_behind_the_version_read_signs_nothing_and_the_worker_offers_the_new_one(cluster, client,
                                                                                        signed_pilot):
    """bob (reading in Chinese) read the procurement report; the sizing behind it changed (no decision, no
    evaluation: only the worker's rendering tells). The worker signs nothing, says why in Chinese, and offers the
    version that states it; his countersignature of that one goes through."""
    pilot, bob = signed_pilot.pilot, signed_pilot.bob
    cluster.worker("control", [cluster.control], concurrency=1)
    _evaluate(pilot, 4)
    read = create_procurement_report(pilot)
    pilot.sizing = {**(pilot.sizing or {}), "fx_unit_usable_tb": 0.5}
    pilot.save(update_fields=["sizing"])

    Profile.objects.update_or_create(user=bob, defaults={"language": "zh-hans"})
    client.cookies.load({settings.LANGUAGE_COOKIE_NAME: "zh-hans"})
    client.force_login(bob)
    job, location = _countersign(client, read, read.sha256, bob)
    assert 'id="report-job-pending"' in client.get(location).content.decode()
    job = _finished(job, cluster)
    assert job.state == ReportJob.State.STALE, f"{job.state}: {job.error}\n{cluster.logs()}"
    assert not Report.objects.filter(countersigned_by__isnull=False).exists()  # nothing was signed
    new = job.result
    assert new.supersedes == read and new.version == 2 and new.countersigned_by_id is None

    page = client.get(location).content.decode()
    assert 'id="report-job-stale"' in page and 'id="report-job-reason"' in page
    assert "它生成之后，其所陈述的内容已发生变化" in page  # why, in his language (it was English-only)
    assert "what it states changed" not in page
    assert f'name="sha256" value="{new.sha256}"' in page  # the new version's countersign form, on the same page

    job, location = _countersign(client, new, new.sha256, bob)
    job = _finished(job, cluster)
    assert job.state == ReportJob.State.DONE, f"{job.state}: {job.error}\n{cluster.logs()}"
    assert job.result.countersigned_by == bob and job.result.supersedes == new
    data = report_bytes(job.result)
    assert data.startswith(report_bytes(new)) and verify_report_bytes(data).ok
    assert 'id="report-job-done"' in client.get(location).content.decode()
