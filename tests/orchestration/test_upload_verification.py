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
from tests.orchestration.conftest import wait_finished


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


def _wait_finished(row: UploadVerification, cluster, seconds: float = 600) -> UploadVerification:
    return wait_finished(row, cluster, seconds, every=0.25)


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
    from django.conf import settings

    # The control worker serves the checks' queue too (docs/operations.md): only that queue carries the checks.
    cluster.worker("control", [cluster.control, settings.FXPILOT_CHECK_QUEUE], concurrency=1)
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
        assert row.state == "error" and set(row.result) == {"reason"} and reason in row.error
        page = client.get(reverse("report_verification", args=[row.code])).content.decode()
        assert reason in page and "Verified" not in page and "hx-get" not in page
    # the reasons are said in the reader's language from what the worker made, the detail as it was
    client.post(reverse("set_language"), {"language": "zh-hans"})
    page = client.get(reverse("report_verification", args=[gone.code])).content.decode()
    assert "could not be carried out" not in page and "FileNotFoundError" in page
    assert verify_upload(no_root.pk) == "not queued"  # a second delivery changes nothing


# ── Checks cannot crowd out gate runs (issue 27, item 5) ────────────────────────────────────────────────────────


def test_a_check_goes_to_the_checks_queue_under_its_old_task_name(client, demo, signed_report, settings,
                                                                   django_capture_on_commit_callbacks, monkeypatch):
    sent = []
    monkeypatch.setattr(verify_upload, "apply_async", lambda args, **options: sent.append((args, options)))
    client.force_login(demo.carol)
    with django_capture_on_commit_callbacks(execute=True):
        _upload(client, signed_report)
    row = UploadVerification.objects.get()
    assert sent == [((row.pk,), {"queue": "fxpilot-checks"})]
    assert verify_upload.name == "gates.tasks.verify_upload"
    assert settings.CELERY_TASK_ROUTES["gates.tasks.verify_upload"] == {"queue": settings.FXPILOT_CHECK_QUEUE}
    assert settings.FXPILOT_CHECK_QUEUE != settings.CELERY_TASK_DEFAULT_QUEUE


def test_one_check_at_a_time_the_others_wait_in_their_queue(client, demo, signed_report, monkeypatch):
    from django.utils import timezone

    sent = []
    monkeypatch.setattr(verify_upload, "apply_async", lambda args, **options: sent.append((args, options)))
    client.force_login(demo.carol)
    _upload(client, signed_report, "a.pdf")
    _upload(client, signed_report, "b.pdf")
    first, second = (UploadVerification.objects.get(filename=name) for name in ("a.pdf", "b.pdf"))
    UploadVerification.objects.filter(pk=first.pk).update(state="running", started=timezone.now())
    assert verify_upload(second.pk) == "busy"  # the slot goes back to the worker at once
    second.refresh_from_db()
    assert second.state == "queued"
    assert sent == [((second.pk,), {"queue": "fxpilot-checks", "countdown": 3})]
    # a check whose worker died long ago holds no turn
    UploadVerification.objects.filter(pk=first.pk).update(started=timezone.now() - timezone.timedelta(hours=1))
    assert verify_upload(second.pk) == "done"


def test_checks_are_limited_per_person_with_429_in_both_languages(client, demo, signed_report, settings):
    settings.FXPILOT_CHECKS_PER_HOUR = 3
    client.force_login(demo.carol)
    assert [_upload(client, signed_report).status_code for _ in range(3)] == [302, 302, 302]
    refused = _upload(client, signed_report)
    assert refused.status_code == 429
    assert "3 checks in the last hour" in refused.content.decode()
    assert UploadVerification.objects.count() == 3
    client.post(reverse("set_language"), {"language": "zh-hans"})
    refused = _upload(client, signed_report)
    assert refused.status_code == 429 and "一小时" in refused.content.decode()
    client.force_login(demo.bob)  # another person is not held back
    assert _upload(client, signed_report).status_code == 302
    # an hour later carol may again
    UploadVerification.objects.filter(requested_by=demo.carol).update(
        created=UploadVerification.objects.first().created - __import__("datetime").timedelta(hours=2))
    client.force_login(demo.carol)
    assert _upload(client, signed_report).status_code == 302


def test_a_site_may_not_use_the_checks_queue():
    from django.core.exceptions import ValidationError

    from runners.validators import validate_site_queue

    with pytest.raises(ValidationError):
        validate_site_queue("fxpilot-checks")
