"""The verify page names the report, its pilot and gate, says "simulated", and shows the vendor root's fingerprint."""
from __future__ import annotations

from django.core.files.uploadedfile import SimpleUploadedFile
from django.urls import reverse

from gates.models import UploadVerification
from portal.tasks import verify_upload
from reports import service
from reports.context import root_certificate
from tests.reports.test_service import _evaluate


def test_the_verify_page_names_a_simulated_report_and_the_root_to_trust(signed_pilot, client):
    evaluation = _evaluate(signed_pilot.pilot, 1)
    report = service.create_gate_report(evaluation.gate, evaluation)
    client.force_login(signed_pilot.bob)
    location = client.post(reverse("report_verify"), {"file": SimpleUploadedFile(
        "r.pdf", service.report_bytes(report), content_type="application/pdf")})["Location"]
    verify_upload(UploadVerification.objects.get(requested_by=signed_pilot.bob).pk)  # what the worker does
    page = client.get(location).content.decode()
    assert "Verified" in page and "Simulated — not evidence" in page and str(report.code) in page
    assert signed_pilot.pilot.name in page and "Gate report G1" in page
    assert root_certificate()["sha256"] in page
