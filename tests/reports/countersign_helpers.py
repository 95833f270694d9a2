"""The customer approver's countersignature as tests make it since issue 49 item 1: the approver's key lives on his
own side (reports.customer_sign_demo, a folder under the test's tmp_path, never the data folder), only his
certificate is enrolled, and what is uploaded is the version read countersigned there.

Every test module that countersigns has an autouse fixture calling `use_customer_side(monkeypatch, tmp_path)`, so
no key folder is left in /tmp."""
from __future__ import annotations

from pathlib import Path

from django.core.files.uploadedfile import SimpleUploadedFile

from reports.customer_sign_demo import FOLDER_ENV


def use_customer_side(monkeypatch, tmp_path: Path) -> Path:
    """The approver's own machine for this test: FXPILOT_DEMO_CUSTOMER_DIR under `tmp_path`."""
    folder = tmp_path / "customer-side"
    monkeypatch.setenv(FOLDER_ENV, str(folder))
    return folder


def approver_certificate(person, organisation) -> Path:
    """The approver's approver-cert.pem, made on his side as `fxpilot-countersign init` makes it (once), NOT
    enrolled: the test enrols it the way he does (the portal's enrol form, or reports.customer_sign_store.enrol)."""
    from reports import customer_sign
    from reports.customer_sign_demo import approver_folder

    folder = approver_folder(person)
    if not (folder / customer_sign.KEY_FILE).exists():
        customer_sign.init(folder, person.get_full_name() or person.get_username(), organisation.name)
    return folder / customer_sign.CERT_FILE


def enrol_in_portal(client, person, pilot):
    """`person` (logged in on `client`) enrols the certificate he made on his side with the portal's enrol form."""
    from django.urls import reverse

    pem = approver_certificate(person, pilot.customer).read_bytes()
    return client.post(reverse("signer_enrol", args=[pilot.code]),
                       {"certificate": SimpleUploadedFile("approver-cert.pem", pem)}, follow=True)


def countersigned_upload(report, person) -> bytes:
    """The stored bytes of `report` countersigned on `person`'s side with his own key (enrolled on first use), as
    `fxpilot-countersign sign` writes them."""
    from reports import service
    from reports.customer_sign_demo import countersigned_bytes

    return countersigned_bytes(service.report_bytes(report), person, report.pilot.customer)


def countersign(report, person, sha256: str | None = None):
    """reports.service.countersign with the upload made on the customer's side."""
    from reports import service

    return service.countersign(report, person, sha256=sha256 or report.sha256,
                               signed=countersigned_upload(report, person))


def signed_file(report, person) -> SimpleUploadedFile:
    """The countersigned file as the portal's countersign form uploads it (field `signed`)."""
    return SimpleUploadedFile(f"{report.code}-countersigned.pdf", countersigned_upload(report, person),
                              content_type="application/pdf")


def keep_countersigned_upload(report, person) -> Path:
    """The countersigned file kept for a worker's countersign job, as the portal's POST keeps it."""
    from reports.customer_sign_store import keep_upload

    return keep_upload(report, person, countersigned_upload(report, person))
