"""Issue 49 item 1: the customer's countersignature is made with a key only the customer holds.

The approver makes his key and certificate with the customer-side command (reports.customer_sign, run here without
Django), enrols only the certificate, countersigns the exact version on "his machine" (a folder outside the data
folder) and uploads the file; the portal stores it only when it is those bytes plus his one signature. With the
control plane's data folder alone no customer signature can be made: a forgery with the vendor's root is refused
and `verify_report` names it the vendor's."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from io import BytesIO
from pathlib import Path

import pytest
from django.conf import settings
from django.core.files.uploadedfile import SimpleUploadedFile
from django.urls import reverse

from gates.judge import synthetic, verdicts
from gates.models import AuditEvent, Evaluation, Report, ReportJob
from gates.plan import load_plan
from reports import customer_sign, customer_sign_store, service, sign
from runners.artifacts import store_bytes
from runners.models import Job

SCRIPT = Path(settings.BASE_DIR) / "scripts" / "fxpilot-countersign"


def _customer_command(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    """The customer-side command with Django made unimportable: it needs pyHanko and cryptography only."""
    code = ("import sys, runpy; sys.modules['django'] = None; "
            f"sys.argv = ['fxpilot-countersign', *{list(args)!r}]; runpy.run_path({str(SCRIPT)!r}, run_name='__main__')")
    env = {k: v for k, v in os.environ.items() if k not in ("DJANGO_SETTINGS_MODULE", "FXPILOT_DATA_DIR")}
    return subprocess.run([sys.executable, "-c", code], cwd=cwd, env=env, capture_output=True, text=True, timeout=600)


@pytest.fixture(autouse=True)
def _no_enrolment_yet():
    """The data folder outlives a test: each starts with no customer certificate enrolled."""
    shutil.rmtree(customer_sign_store.directory(), ignore_errors=True)


@pytest.fixture
def report(signed_pilot):
    pilot = signed_pilot.pilot
    files = synthetic.gate_inputs(3)
    gate = pilot.gate(3)
    job = Job.objects.create(pilot=pilot, gate=gate)
    for name, data in files:
        store_bytes(job, name, data, kind="records" if name.endswith(".jsonl") else "probe", simulated=True)
    result = verdicts.evaluate(load_plan(), 3, files)
    evaluation = Evaluation.objects.create(gate=gate, job=job, plan_version=pilot.signed_plan, verdict=result["verdict"],
                                           result=result, inputs=result["inputs"], simulated=result["simulated"])
    return service.create_gate_report(gate, evaluation, language="en")


@pytest.fixture
def bob_side(tmp_path, signed_pilot):
    """Bob's own machine: his key made there by the customer-side command; only the certificate is enrolled."""
    folder = tmp_path / "bob-machine"
    done = _customer_command("init", "--dir", str(folder), "--name", "Bob Wang", "--organisation",
                             signed_pilot.pilot.customer.name, cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "never upload it" in done.stdout
    customer_sign_store.enrol(signed_pilot.bob, signed_pilot.pilot.customer,
                              (folder / customer_sign.CERT_FILE).read_bytes(), who=signed_pilot.bob)
    return folder


def _sign_on_customer_side(folder: Path, data: bytes, tmp_path: Path, name: str = "report.pdf") -> bytes:
    source = tmp_path / name
    source.write_bytes(data)
    out = tmp_path / f"{name}.signed.pdf"
    done = _customer_command("sign", str(source), "--dir", str(folder), "-o", str(out), cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    return out.read_bytes()


def test_the_data_folder_holds_no_customer_key_and_a_forgery_made_with_it_is_refused(signed_pilot, report, bob_side,
                                                                                    tmp_path):
    data_dir = Path(settings.DATA_DIR)
    keys = sorted(p.relative_to(data_dir).as_posix() for p in data_dir.rglob("*.pem") if b"PRIVATE KEY" in p.read_bytes())
    assert keys == ["signing/root-key.pem", "signing/signer-key.pem"]  # the vendor's only; no approver folder
    assert not (data_dir / "signing" / "approvers").exists()
    # The attacker holds the data folder: he can issue a "Bob Wang" certificate from the vendor's root and sign.
    attacker = tmp_path / "attacker"
    for name in ("root-key.pem", "root-cert.pem"):
        (attacker / name).parent.mkdir(exist_ok=True)
        (attacker / name).write_bytes((data_dir / "signing" / name).read_bytes())
    key, cert, _ = sign.setup_approver(attacker, "bob", "Bob Wang", signed_pilot.pilot.customer.name)
    stored = service.report_bytes(report)
    forged = sign.sign_pdf(stored, sign.load_signer(key, cert, [attacker / "root-cert.pem"]),
                           field_name=sign.next_approver_field(stored), reason="Approved by Bob Wang")
    with pytest.raises(customer_sign_store.Refused, match="not the one enrolled for you"):
        service.countersign(report, signed_pilot.bob, sha256=report.sha256, signed=forged)
    assert not Report.objects.filter(countersigned_by__isnull=False).exists()
    check = service.verify_report_bytes(forged)
    assert not check.ok and [s.party for s in check.signatures] == ["vendor", "vendor"]
    assert any("the vendor could have made it" in reason for reason in check.reasons)
    # Nor can the enrolled certificate (public, in the data folder) be used with any key found there.
    enrolled = customer_sign_store.enrolled(signed_pilot.bob)
    with pytest.raises(sign.SigningError, match="does not belong to the key"):
        sign.load_signer(data_dir / "signing" / "signer-key.pem", enrolled.path)
    # verify_report says so too, and names both parties' certificates.
    path = tmp_path / "forged.pdf"
    path.write_bytes(forged)
    done = subprocess.run([sys.executable, "manage.py", "verify_report", str(path)], cwd=settings.BASE_DIR,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "NOT VERIFIED" in done.stdout and "the vendor could have made it" in done.stdout


def test_a_countersignature_made_by_the_customer_command_is_uploaded_and_verify_report_names_two_parties(
        client, signed_pilot, report, tmp_path):
    folder = tmp_path / "bob-machine"
    assert _customer_command("init", "--dir", str(folder), "--name", "Bob Wang", "--organisation", "Example Cloud",
                             cwd=tmp_path).returncode == 0
    client.force_login(signed_pilot.bob)
    page = client.get(reverse("reports", args=[signed_pilot.pilot.code])).content.decode()
    assert "No countersigning certificate is enrolled for you" in page
    refused = client.post(reverse("signer_enrol", args=[signed_pilot.pilot.code]), {
        "certificate": SimpleUploadedFile("k.pem", (folder / customer_sign.KEY_FILE).read_bytes())}, follow=True)
    assert "holds a private key" in refused.content.decode() and customer_sign_store.enrolled(signed_pilot.bob) is None
    pem = (folder / customer_sign.CERT_FILE).read_bytes()
    enrolled = client.post(reverse("signer_enrol", args=[signed_pilot.pilot.code]), {
        "certificate": SimpleUploadedFile("approver-cert.pem", pem)}, follow=True).content.decode()
    fingerprint = customer_sign.parse_certificate(pem).fingerprint
    assert "is enrolled" in enrolled and fingerprint in enrolled  # shown on the report's card
    assert customer_sign_store.enrolments("bob")[-1]["fingerprint"] == fingerprint

    response = client.get(reverse("report_download", args=[report.code]))
    download = b"".join(response.streaming_content) if response.streaming else response.content
    assert download == service.report_bytes(report)
    signed = _sign_on_customer_side(folder, download, tmp_path)
    answer = client.post(reverse("report_countersign", args=[report.code]), {
        "sha256": report.sha256, "signed": SimpleUploadedFile("countersigned.pdf", signed)})
    job = ReportJob.objects.get(kind=ReportJob.Kind.COUNTERSIGN, source=report)
    assert answer.status_code == 302 and answer["Location"] == reverse("report_job", args=[job.code])
    assert not Report.objects.filter(supersedes=report).exists()  # the request only kept the upload and queued
    assert service.carry_out(job).state == ReportJob.State.DONE, job.error  # the control worker's part
    countersigned = Report.objects.get(supersedes=report)
    assert job.result == countersigned
    assert countersigned.countersigned_by == signed_pilot.bob and countersigned.signatures == 2
    assert service.report_bytes(countersigned) == signed  # the uploaded bytes, as he made them
    event = AuditEvent.objects.get(action="report.countersigned", object_id=str(countersigned.pk))
    assert event.detail["certificate_sha256"] == fingerprint
    check = service.verify_report_bytes(signed)
    assert check.ok, check.reasons
    assert [s.party for s in check.signatures] == ["vendor", "customer"]
    assert check.signatures[1].fingerprint == fingerprint

    again = client.post(reverse("report_countersign", args=[report.code]), {
        "sha256": report.sha256, "signed": SimpleUploadedFile("countersigned.pdf", signed)}, follow=True)
    assert "nothing was signed" in again.content.decode()  # one countersignature per version
    assert Report.objects.filter(supersedes=report).count() == 1

    path = tmp_path / "countersigned.pdf"
    path.write_bytes(signed)
    done = subprocess.run([sys.executable, "manage.py", "verify_report", str(path), "--customer-cert",
                           str(folder / customer_sign.CERT_FILE)], cwd=settings.BASE_DIR, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Vendor root (供应商根证书)" in done.stdout and "Customer certificate (客户证书)" in done.stdout
    assert "the vendor's signature (供应商的签名)" in done.stdout
    assert f"the customer's signature (客户的签名), by the certificate the customer enrolled: certificate SHA-256 " \
           f"{fingerprint}" in done.stdout


def _one_byte_changed(data: bytes) -> bytes:
    """The same file with one hex digit of the vendor's signature value changed (still a readable PDF)."""
    at = data.index(b"/Contents <") + 200
    changed = bytearray(data)
    changed[at] = ord("1") if changed[at] != ord("1") else ord("2")
    return bytes(changed)


def test_another_key_other_bytes_or_more_than_a_signature_are_refused_naming_why(signed_pilot, report, bob_side,
                                                                                tmp_path):
    stored = service.report_bytes(report)
    other = tmp_path / "someone-else"
    assert _customer_command("init", "--dir", str(other), "--name", "Bob Wang", "--organisation", "Example Cloud",
                             cwd=tmp_path).returncode == 0
    cases = {
        "not the one enrolled for you": _sign_on_customer_side(other, stored, tmp_path, "other-key.pdf"),
        "does not begin with the exact bytes": _sign_on_customer_side(
            bob_side, _one_byte_changed(stored), tmp_path, "other-bytes.pdf"),
        "adds 2 revisions": _sign_on_customer_side(
            bob_side, _sign_on_customer_side(bob_side, stored, tmp_path, "once.pdf"), tmp_path, "twice.pdf"),
        "carries no countersignature": stored,
    }
    # One revision that adds the signature and changes a page as well.
    from pyhanko.pdf_utils import generic
    from pyhanko.pdf_utils.incremental_writer import IncrementalPdfFileWriter

    writer = IncrementalPdfFileWriter(BytesIO(stored), strict=False)
    page_ref = writer.root["/Pages"]["/Kids"].raw_get(0)
    page_ref.get_object()["/Rotate"] = generic.NumberObject(90)
    writer.mark_update(page_ref)
    signer = sign.load_signer(bob_side / customer_sign.KEY_FILE, bob_side / customer_sign.CERT_FILE,
                              [bob_side / customer_sign.CERT_FILE])
    from pyhanko.sign import fields, signers

    meta = signers.PdfSignatureMetadata(field_name="CustomerApproval1", md_algorithm="sha256",
                                        subfilter=fields.SigSeedSubFilter.PADES)
    cases["changed after this signature by more than further signatures"] = \
        signers.PdfSigner(meta, signer=signer).sign_pdf(writer).getvalue()
    for reason, upload in cases.items():
        with pytest.raises(customer_sign_store.Refused, match=reason):
            service.countersign(report, signed_pilot.bob, sha256=report.sha256, signed=upload)
    with pytest.raises(customer_sign_store.Refused, match="holds no customer key"):
        service.countersign(report, signed_pilot.bob, sha256=report.sha256)
    # Through the worker, a refusal is the job's error, naming why; the kept upload is taken once.
    customer_sign_store.keep_upload(report, signed_pilot.bob, cases["not the one enrolled for you"])
    job = ReportJob.objects.create(kind=ReportJob.Kind.COUNTERSIGN, pilot=report.pilot, report_kind=report.kind,
                                   language=report.language, requested_by=signed_pilot.bob, gate=report.gate,
                                   evaluation=report.evaluation, source=report, sha256=report.sha256)
    job = service.carry_out(job)
    assert job.state == ReportJob.State.ERROR and "not the one enrolled for you" in job.error
    assert customer_sign_store.take_upload(report, signed_pilot.bob) is None
    assert not Report.objects.filter(supersedes=report).exists()


def test_the_customer_command_refuses_another_version_than_the_one_named(tmp_path, bob_side):
    pdf = tmp_path / "r.pdf"
    pdf.write_bytes(b"%PDF-1.7\n%%EOF\n")
    done = _customer_command("sign", str(pdf), "--dir", str(bob_side), "--expect-sha256", "0" * 64, cwd=tmp_path)
    assert done.returncode == 1 and "it is not the version you meant to countersign" in done.stderr
    again = _customer_command("init", "--dir", str(bob_side), "--name", "B", "--organisation", "O", cwd=tmp_path)
    assert again.returncode == 1 and "exists already" in again.stderr  # a key is never overwritten


def test_a_passphrase_protected_key_is_used_only_with_its_passphrase(tmp_path, monkeypatch):
    folder = tmp_path / "locked"
    monkeypatch.setenv(customer_sign.PASSPHRASE_ENV, "correct horse")
    assert _customer_command("init", "--dir", str(folder), "--name", "Bob Wang", "--organisation", "Example Cloud",
                             cwd=tmp_path).returncode == 0
    assert (folder / customer_sign.KEY_FILE).read_bytes().startswith(b"-----BEGIN ENCRYPTED PRIVATE KEY-----")
    pdf = tmp_path / "r.pdf"
    pdf.write_bytes(b"%PDF-1.7\n%%EOF\n")
    monkeypatch.delenv(customer_sign.PASSPHRASE_ENV)
    locked = _customer_command("sign", str(pdf), "--dir", str(folder), cwd=tmp_path)
    assert locked.returncode == 1 and "give the key's passphrase" in locked.stderr, locked.stderr
    monkeypatch.setenv(customer_sign.PASSPHRASE_ENV, "correct horse")
    opened = _customer_command("sign", str(pdf), "--dir", str(folder), cwd=tmp_path)
    assert opened.returncode == 1 and "not a readable PDF" in opened.stderr, opened.stderr  # the key opened


def test_the_demo_countersigns_through_the_customer_side_outside_the_data_folder(signed_pilot, report, tmp_path,
                                                                               monkeypatch):
    from portal.management.commands.demo import Command
    from reports import customer_sign_demo

    data_dir = Path(settings.DATA_DIR).resolve()
    default = customer_sign_demo.customer_side_root()
    assert default == data_dir.parent / f"{data_dir.name}-customer-side"  # next to the data folder, not in it
    monkeypatch.setenv(customer_sign_demo.FOLDER_ENV, str(data_dir / "customer-side"))
    with pytest.raises(customer_sign.CustomerSignError, match="inside the control plane's data folder"):
        customer_sign_demo.customer_side_root()
    monkeypatch.setenv(customer_sign_demo.FOLDER_ENV, str(tmp_path / "customer-side"))
    Command().countersign(report.gate, signed_pilot.bob)
    countersigned = Report.objects.get(countersigned_by=signed_pilot.bob)
    assert (tmp_path / "customer-side" / "bob" / customer_sign.KEY_FILE).is_file()
    check = service.verify_report_bytes(service.report_bytes(countersigned))
    assert check.ok, check.reasons
    assert [s.party for s in check.signatures] == ["vendor", "customer"]
    assert not [p for p in data_dir.rglob("*.pem") if b"PRIVATE KEY" in p.read_bytes()
                and "signing/customers" in p.as_posix()]
