"""An uploaded PDF is verified by a worker, not in the request: the page follows the row until the result is in."""
from __future__ import annotations

import hashlib
import time
from pathlib import Path

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.urls import reverse

from gates.models import UploadVerification
from portal.tasks import verify_upload


@pytest.fixture(scope="module")
def signed_report(tmp_path_factory) -> bytes:
    """A simulated gate report signed by the embedded vendor authority (the trust root workers check against)."""
    from reports import render, sign
    from reports.service import vendor_signer
    from tests.reports.verdicts import gate_context, table1_verdict

    pdf = render.render_pdf(gate_context(table1_verdict()), "en")
    return sign.sign_pdf(pdf, vendor_signer(), field_name=sign.VENDOR_FIELD, reason="test", certify=True)


def _upload(client, data: bytes, name: str = "report.pdf"):
    return client.post(reverse("report_verify"), {"file": SimpleUploadedFile(name, data, "application/pdf")})


def _wait_finished(row: UploadVerification, cluster, seconds: float = 90) -> UploadVerification:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        row.refresh_from_db()
        if row.is_finished:
            return row
        time.sleep(0.25)
    raise AssertionError(f"still {row.state} after {seconds}s\n{cluster.logs()}")


def test_the_upload_returns_at_once_and_stays_queued_without_a_worker(client, demo, signed_report):
    client.force_login(demo.carol)
    response = _upload(client, signed_report)
    row = UploadVerification.objects.get(requested_by=demo.carol)
    assert response.status_code == 302 and response["Location"] == reverse("report_verification", args=[row.code])
    time.sleep(1)  # nothing verifies it in the background either: no worker runs
    row.refresh_from_db()
    assert row.state == "queued" and row.result is None and row.size == len(signed_report)
    assert row.sha256 == hashlib.sha256(signed_report).hexdigest()
    assert Path(row.path).read_bytes() == signed_report  # kept in the upload area for the worker
    page = client.get(response["Location"]).content.decode()
    assert "Verifying…" in page and "hx-get" in page and "Verified" not in page
    assert row.sha256 in page


def test_a_real_worker_verifies_a_good_report_and_refuses_a_tampered_one(cluster, client, demo, signed_report):
    cluster.worker("control", [cluster.control], concurrency=1)
    client.force_login(demo.carol)
    tampered = bytearray(signed_report)
    tampered[len(tampered) // 2] ^= 1
    _upload(client, signed_report, "good.pdf")
    _upload(client, bytes(tampered), "tampered.pdf")
    good = _wait_finished(UploadVerification.objects.get(filename="good.pdf"), cluster)
    bad = _wait_finished(UploadVerification.objects.get(filename="tampered.pdf"), cluster)
    assert good.state == "done" and good.result["ok"] is True, good.result or good.error
    assert bad.state == "done" and bad.result["ok"] is False and bad.result["reasons"]
    page = client.get(reverse("report_verification", args=[good.code])).content.decode()
    assert 'id="verify-result"' in page and "Not verified" not in page and "Verified" in page
    assert "Simulated — not evidence" in page and 'id="vendor-root"' in page and "hx-get" not in page
    page = client.get(reverse("report_verification", args=[bad.code])).content.decode()
    assert "Not verified" in page
    assert not Path(good.path).exists() and not Path(bad.path).exists()  # checked and not kept


def test_an_upload_over_the_limit_is_refused_with_the_limit(client, demo, settings):
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 2 * 2**20
    client.force_login(demo.carol)
    response = _upload(client, b"%PDF-1.7\n" + b"0" * (3 * 2**20))
    page = response.content.decode()
    assert response.status_code == 200
    assert "larger than the upload limit of 2 MB" in page and "3.0 MB" in page
    assert not UploadVerification.objects.exists()


def test_another_person_gets_404(client, demo, signed_report):
    client.force_login(demo.carol)
    location = _upload(client, signed_report)["Location"]
    client.force_login(demo.bob)
    assert client.get(location).status_code == 404
    assert client.get(location, HTTP_HX_REQUEST="true").status_code == 404


def test_infrastructure_trouble_is_an_error_with_its_reason_never_verified(client, demo, signed_report, settings,
                                                                           tmp_path):
    client.force_login(demo.carol)
    _upload(client, signed_report, "a.pdf")
    _upload(client, signed_report, "b.pdf")
    no_root = UploadVerification.objects.get(filename="a.pdf")
    gone = UploadVerification.objects.get(filename="b.pdf")
    settings.FXPILOT_SIGNING_ROOT = str(tmp_path / "missing-root.pem")
    assert verify_upload(no_root.pk) == "error"
    settings.FXPILOT_SIGNING_ROOT = str(Path(settings.DATA_DIR) / "signing" / "root-cert.pem")
    Path(gone.path).unlink()
    assert verify_upload(gone.pk) == "error"
    for row, reason in ((no_root, "No trust root"), (gone, "could not be carried out")):
        row.refresh_from_db()
        assert row.state == "error" and row.result is None and reason in row.error
        page = client.get(reverse("report_verification", args=[row.code])).content.decode()
        assert reason in page and "Verified" not in page and "hx-get" not in page
    assert verify_upload(no_root.pk) == "not queued"  # a second delivery changes nothing
