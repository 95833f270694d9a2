"""Login throttling, the Content-Security-Policy, upload limits and the absence of secrets in pages."""

from __future__ import annotations

from django.core.files.uploadedfile import SimpleUploadedFile
from django.urls import reverse

from gates.models import UploadVerification
from portal.tasks import verify_upload


def login(client, username: str, password: str):
    return client.post(reverse("login"), {"username": username, "password": password})


def test_a_person_logs_in_and_out(client, demo):
    assert login(client, "alice", demo.password).status_code == 302
    assert client.get(reverse("home")).status_code == 200
    client.post(reverse("logout"))
    assert client.get(reverse("home")).status_code == 302


def test_a_wrong_password_says_so_without_saying_which_part_was_wrong(client, demo):
    page = login(client, "alice", "wrong").content.decode()
    assert "correct username and password" in page


def test_too_many_failed_logins_lock_the_name_out_even_with_the_right_password(client, demo):
    for _ in range(4):
        assert login(client, "alice", "wrong").status_code == 200
    assert login(client, "alice", "wrong").status_code == 429  # the fifth failure locks the name
    response = login(client, "alice", demo.password)
    assert response.status_code == 429 and "Too many failed attempts" in response.content.decode()
    assert client.get(reverse("home")).status_code == 302


def test_many_failed_logins_from_one_address_lock_out_other_names_too(client, demo):
    for n in range(100):
        login(client, f"nobody{n}", "wrong")
    assert login(client, "bob", demo.password).status_code == 429


def test_every_page_carries_a_content_security_policy_without_inline_script(client, world):
    client.force_login(world.alice)
    for url in (reverse("login"), reverse("home"), reverse("gate", args=[world.pilot.code, 1])):
        policy = client.get(url)["Content-Security-Policy"]
        assert "script-src 'self'" in policy and "unsafe-inline" not in policy.split("script-src")[1].split(";")[0]
        assert "frame-ancestors 'none'" in policy


def test_pages_load_htmx_from_our_own_static_files(client, world):
    client.force_login(world.alice)
    page = client.get(reverse("run", args=[world.job.code])).content.decode()
    assert "/static/vendor/htmx/htmx.min.js" in page and "<script>" not in page and "http" not in page.split("<body")[0]


def test_a_file_that_is_not_a_pdf_is_refused_at_verification(client, world):
    client.force_login(world.carol)
    upload = SimpleUploadedFile("report.pdf", b"GIF89a not a pdf", content_type="application/pdf")
    page = client.post(reverse("report_verify"), {"file": upload}).content.decode()
    assert "not a PDF" in page


def test_a_pdf_larger_than_the_limit_is_refused(client, world, settings):
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 2 * 2**20
    client.force_login(world.carol)
    upload = SimpleUploadedFile("report.pdf", b"%PDF-1.7" + b"0" * 3 * 2**20, content_type="application/pdf")
    assert "larger than the upload limit" in client.post(reverse("report_verify"), {"file": upload}).content.decode()


def test_a_damaged_pdf_gets_a_message_not_a_server_error(client, world):
    from reports.service import vendor_signer

    vendor_signer()  # the embedded signing authority, so that there is a trust root to check against
    client.force_login(world.carol)
    upload = SimpleUploadedFile("report.pdf", b"%PDF-1.7\n garbage", content_type="application/pdf")
    response = client.post(reverse("report_verify"), {"file": upload}, follow=True)
    verify_upload(UploadVerification.objects.get(requested_by=world.carol).pk)  # what the worker does
    page = client.get(response.redirect_chain[-1][0]).content.decode()
    assert response.status_code == 200 and ("could not be read" in page or "Not verified" in page)


def test_no_page_shows_the_secret_key_or_the_session_id(client, world, settings):
    client.force_login(world.alice)
    session = client.cookies[settings.SESSION_COOKIE_NAME].value
    for url in (reverse("home"), reverse("sites", args=[world.pilot.code]), reverse("audit", args=[world.pilot.code])):
        page = client.get(url).content.decode()
        assert settings.SECRET_KEY not in page and session not in page


def _verified(client, data: bytes) -> str:
    """Upload, run the verification as the worker would, and read the result page."""
    location = client.post(reverse("report_verify"), {"file": SimpleUploadedFile("r.pdf", data)})["Location"]
    verify_upload(UploadVerification.objects.order_by("-pk").first().pk)
    return client.get(location).content.decode()


def test_a_signed_report_downloaded_from_the_portal_verifies_and_a_changed_byte_does_not(client, world):
    from reports.service import create_gate_report

    report = create_gate_report(world.gate, world.evaluation)
    client.force_login(world.bob)
    data = b"".join(client.get(reverse("report_download", args=[report.code])).streaming_content)
    page = _verified(client, data)
    assert "Verified" in page and "Not verified" not in page
    location = client.post(reverse("report_check", args=[report.code]))["Location"]  # a worker checks it
    verify_upload(UploadVerification.objects.order_by("-pk").first().pk)
    page = client.get(location).content.decode()
    assert "Verified" in page and "Not verified" not in page
    tampered = data[:-200] + bytes([data[-200] ^ 1]) + data[-199:]
    page = _verified(client, tampered)
    assert "Not verified" in page or "could not be read" in page


def test_an_oversized_request_is_refused_before_its_body_is_read(client, world):
    client.force_login(world.carol)
    response = client.generic(
        "POST", reverse("report_verify"), b"x", CONTENT_TYPE="application/pdf", CONTENT_LENGTH=str(200 * 1024 * 1024)
    )
    assert response.status_code == 413
