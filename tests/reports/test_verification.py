"""A signed gate report verifies with fxpilot, pyHanko's CLI and poppler; every kind of tampering is caught."""
from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from io import BytesIO
from pathlib import Path

import pytest
from django.conf import settings
from pyhanko.pdf_utils import generic
from pyhanko.pdf_utils.incremental_writer import IncrementalPdfFileWriter
from weasyprint import HTML, Attachment

from reports import render, sign
from reports.verify import MANIFEST_SCHEMA, verify_pdf
from tests.reports.verdicts import gate_context, table1_verdict

RECORDS = b"".join(json.dumps({"schema": "fxpilot.request/1", "arm": "fx", "session": f"s{i}", "simulated": True}).encode()
                   + b"\n" for i in range(200))


def _attachments() -> list[dict]:
    return [
        {"file": "verdict.json", "name": "verdict.json", "kind": "verdict", "data": b'{"verdict": "pass"}',
         "simulated": True, "node": ""},
        {"file": "node1_records_fx.jsonl", "name": "node1/records/fx.jsonl", "kind": "records", "data": RECORDS,
         "sha256": hashlib.sha256(RECORDS).hexdigest(), "simulated": True, "node": "node1"},
    ]


@pytest.fixture(scope="module")
def signed(tmp_path_factory, vendor_signer, ca) -> Path:
    pdf = render.render_pdf(gate_context(table1_verdict(), attachments=_attachments()), "en")
    data = sign.sign_pdf(pdf, vendor_signer, field_name=sign.VENDOR_FIELD, reason="test", certify=True)
    path = tmp_path_factory.mktemp("signed") / "g3.pdf"
    path.write_bytes(data)
    return path


def _write(tmp_path: Path, data: bytes, name: str = "tampered.pdf") -> Path:
    path = tmp_path / name
    path.write_bytes(data)
    return path


def _manage(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "manage.py", *args], cwd=settings.BASE_DIR, capture_output=True, text=True,
                          timeout=600)


def _pdfsig(path: Path) -> str:
    return subprocess.run(["pdfsig", "-nocert", str(path)], capture_output=True, text=True, timeout=600).stdout


def test_a_fresh_report_verifies_and_says_which_report_it_is(signed, ca):
    result = verify_pdf(signed.read_bytes(), [ca / "root-cert.pem"])
    assert result.ok, result.reasons
    assert result.report["kind"] == "gate" and result.report["gate"] == 3 and result.report["language"] == "en"
    assert result.report["pilot_code"] == "3f2b6c1e-0000-4000-8000-000000000001" and result.report["simulated"] is True
    assert [a.file for a in result.attachments] == ["verdict.json", "node1_records_fx.jsonl"]
    assert all(a.ok for a in result.attachments)
    assert "pilot:3f2b6c1e-0000-4000-8000-000000000001" in result.metadata["Keywords"]
    assert "gate:3" in result.metadata["Keywords"]
    [signature] = result.signatures
    assert signature.trusted and signature.covers_whole_file and "FX Storage" in signature.signer


def test_verify_report_exits_zero_for_the_signed_report(signed, ca):
    done = _manage("verify_report", str(signed), "--root", str(ca / "root-cert.pem"))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "VERIFIED" in done.stdout and "G3" in done.stdout and "no time-stamp authority" in done.stdout


def test_pyhanko_cli_validates_it_against_the_root(signed, ca):
    done = subprocess.run(["pyhanko", "sign", "validate", "--trust", str(ca / "root-cert.pem"), "--trust-replace",
                           str(signed)], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr


def test_pdfsig_says_valid_and_total_document_signed(signed):
    out = _pdfsig(signed)
    assert "Signature is Valid" in out and "Total document signed" in out and "Not total" not in out


@pytest.fixture(scope="module")
def nss_db(tmp_path_factory, ca) -> Path:
    """An NSS database trusting only the vendor's root, for pdfsig's certificate check (Debian libnss3-tools)."""
    folder = tmp_path_factory.mktemp("nss")
    subprocess.run(["certutil", "-N", "-d", f"sql:{folder}", "--empty-password"], check=True, timeout=600)
    subprocess.run(["certutil", "-A", "-d", f"sql:{folder}", "-n", "fxpilot-root", "-t", "CT,C,C", "-a",
                    "-i", str(ca / "root-cert.pem")], check=True, timeout=600)
    return folder


def test_pdfsig_trusts_the_signer_through_the_vendor_root(signed, nss_db, other_ca, tmp_path):
    out = subprocess.run(["pdfsig", "-nssdir", f"sql:{nss_db}", str(signed)], capture_output=True, text=True).stdout
    assert "Certificate is Trusted" in out and "Signature is Valid" in out
    stranger = sign.load_signer(other_ca / "signer-key.pem", other_ca / "signer-cert.pem", [other_ca / "root-cert.pem"])
    forged = _write(tmp_path, sign.sign_pdf(HTML(string="<p>x</p>").write_pdf(pdf_variant="pdf/a-3b"), stranger,
                                            field_name=sign.VENDOR_FIELD, reason="forged"))
    out = subprocess.run(["pdfsig", "-nssdir", f"sql:{nss_db}", str(forged)], capture_output=True, text=True).stdout
    assert "Certificate is Trusted" not in out


def test_one_flipped_byte_fails(signed, ca, tmp_path):
    data = bytearray(signed.read_bytes())
    position = len(data) // 3
    data[position] ^= 0x01
    path = _write(tmp_path, bytes(data))
    result = verify_pdf(bytes(data), [ca / "root-cert.pem"])
    assert not result.ok
    assert any("changed" in r or "readable" in r or "cannot be validated" in r for r in result.reasons), result.reasons
    done = _manage("verify_report", str(path), "--root", str(ca / "root-cert.pem"))
    assert done.returncode == 1 and "NOT VERIFIED" in done.stdout
    assert "Signature is Valid" not in _pdfsig(path)


def test_bytes_appended_after_the_end_fail(signed, ca, tmp_path):
    data = signed.read_bytes() + b"\n%extra\n"
    result = verify_pdf(data, [ca / "root-cert.pem"])
    assert not result.ok
    assert any("not total document signed" in r for r in result.reasons), result.reasons
    path = _write(tmp_path, data)
    assert "Not total document signed" in _pdfsig(path)
    done = _manage("verify_report", str(path), "--root", str(ca / "root-cert.pem"))
    assert done.returncode == 1 and "not total document signed" in done.stdout


def _replace_attachment(data: bytes, file_name: str, new: bytes) -> bytes:
    """An incremental update that swaps one embedded file's bytes, as a forger would."""
    writer = IncrementalPdfFileWriter(BytesIO(data), strict=False)
    names_dict = writer.root["/Names"]
    tree = names_dict["/EmbeddedFiles"]
    names = tree["/Names"]
    for index in range(0, len(names), 2):
        if str(names[index]) == file_name:
            spec = names[index + 1].get_object()
            stream = generic.StreamObject({generic.NameObject("/Type"): generic.NameObject("/EmbeddedFile")}, stream_data=new)
            spec["/EF"] = generic.DictionaryObject({generic.NameObject("/F"): writer.add_object(stream)})
    # Whichever containers are indirect objects get rewritten in the new revision.
    for container, key in ((writer.root, "/Names"), (names_dict, "/EmbeddedFiles"), (tree, "/Names")):
        ref = container.raw_get(key)
        if isinstance(ref, generic.IndirectObject):
            writer.mark_update(ref)
    for index in range(1, len(names), 2):
        if isinstance(names.raw_get(index), generic.IndirectObject):
            writer.mark_update(names.raw_get(index))
    writer.update_root()
    out = BytesIO()
    writer.write(out)
    return out.getvalue()


def test_an_attachment_swapped_after_signing_fails(signed, ca, tmp_path):
    forged = b"".join(line.replace(b"s1", b"s9") + b"\n" for line in RECORDS.splitlines())
    data = _replace_attachment(signed.read_bytes(), "node1_records_fx.jsonl", forged)
    result = verify_pdf(data, [ca / "root-cert.pem"])
    assert not result.ok
    assert any("node1_records_fx.jsonl" in r and "manifest says" in r for r in result.reasons), result.reasons
    assert any("not total document signed" in r for r in result.reasons), result.reasons


def test_an_attachment_swapped_before_signing_fails_on_the_manifest(ca, vendor_signer):
    """Even a file signed by the vendor's own key fails when an attachment differs from its manifest entry."""
    manifest = {"schema": MANIFEST_SCHEMA, "report": {"kind": "gate"},
                "artifacts": [{"file": "records.jsonl", "name": "records.jsonl", "sha256": hashlib.sha256(RECORDS).hexdigest(),
                               "size": len(RECORDS)}]}
    pdf = HTML(string="<p>report</p>").write_pdf(pdf_variant="pdf/a-3b", attachments=[
        Attachment(string=RECORDS.replace(b"s1", b"s9"), name="records.jsonl"),
        Attachment(string=json.dumps(manifest).encode(), name="manifest.json")])
    data = sign.sign_pdf(pdf, vendor_signer, field_name=sign.VENDOR_FIELD, reason="test", certify=True)
    result = verify_pdf(data, [ca / "root-cert.pem"])
    assert not result.ok and result.signatures[0].ok
    assert result.reasons == [f"attachment 'records.jsonl': hashes to {result.attachments[0].actual_sha256}, "
                              f"the manifest says {hashlib.sha256(RECORDS).hexdigest()}"]


def test_a_report_signed_by_another_key_fails(other_ca, ca, tmp_path):
    stranger = sign.load_signer(other_ca / "signer-key.pem", other_ca / "signer-cert.pem", [other_ca / "root-cert.pem"])
    pdf = render.render_pdf(gate_context(table1_verdict()), "en")
    data = sign.sign_pdf(pdf, stranger, field_name=sign.VENDOR_FIELD, reason="forged", certify=True)
    result = verify_pdf(data, [ca / "root-cert.pem"])
    assert not result.ok
    assert any("does not chain to a trusted root" in r for r in result.reasons), result.reasons
    path = _write(tmp_path, data)
    done = subprocess.run(["pyhanko", "sign", "validate", "--trust", str(ca / "root-cert.pem"), "--trust-replace",
                           str(path)], capture_output=True, text=True, timeout=600)
    assert done.returncode != 0


def test_an_unsigned_pdf_fails(ca):
    result = verify_pdf(HTML(string="<p>x</p>").write_pdf(), [ca / "root-cert.pem"])
    assert not result.ok and "the PDF carries no signature" in result.reasons


def test_garbage_fails_with_a_reason(ca):
    result = verify_pdf(b"not a pdf at all", [ca / "root-cert.pem"])
    assert not result.ok and result.reasons[0].startswith("not a readable PDF")


def test_every_page_of_a_simulated_report_says_simulation(signed):
    pages = subprocess.run(["pdftotext", "-layout", str(signed), "-"], capture_output=True, text=True, timeout=600).stdout
    pages = [p for p in pages.split("\f") if p.strip()]
    assert len(pages) >= 3
    assert all("SIMULATION" in page for page in pages)
    assert "It proves nothing about" in pages[0]
    assert "No time-stamp authority was used" in " ".join(pages[0].split())


def test_a_countersignature_keeps_both_signatures_verifiable(signed, ca, tmp_path):
    key, cert, created = sign.setup_approver(ca, "bob", "Bob Wang", "Example Cloud")
    assert created
    approver = sign.load_signer(key, cert, [ca / "root-cert.pem"])
    data = signed.read_bytes()
    twice = sign.sign_pdf(data, approver, field_name=sign.next_approver_field(data), reason="approve")
    assert twice.startswith(data)
    result = verify_pdf(twice, [ca / "root-cert.pem"])
    assert result.ok, result.reasons
    assert [s.field for s in result.signatures] == ["VendorSignature", "CustomerApproval1"]
    assert not result.signatures[0].covers_whole_file and result.signatures[1].covers_whole_file
    out = _pdfsig(_write(tmp_path, twice))
    assert out.count("Signature is Valid") == 2 and "Total document signed" in out


def test_signing_keeps_the_pdf_a_identification_and_agreeing_metadata(signed):
    """PDF/A-3b: pdfaid part 3 / B in XMP, no PDF 2.0 bump, Info and XMP naming the same producer."""
    from pyhanko.pdf_utils.reader import PdfFileReader

    reader = PdfFileReader(BytesIO(signed.read_bytes()), strict=False)
    xmp = reader.root["/Metadata"].get_object().data.decode()
    assert 'pdfaid:part="3"' in xmp and 'pdfaid:conformance="B"' in xmp
    assert "/Version" not in reader.root
    producer = str(reader.trailer_view["/Info"].get_object()["/Producer"])
    assert f'pdf:Producer="{producer}"' in xmp
    associated = [reader.root["/AF"].raw_get(i) for i in range(len(reader.root["/AF"]))]
    assert len(associated) == len(set(associated)) == 3  # each attachment once, as an associated file


def test_a_flipped_byte_anywhere_is_a_reason_never_a_crash(signed, ca):
    data = signed.read_bytes()
    for position in range(7, len(data), len(data) // 24):
        damaged = bytearray(data)
        # ^0x01, not ^0x20: flipping the case of a hex digit in the signature value changes no byte it encodes.
        damaged[position] ^= 0x01
        result = verify_pdf(bytes(damaged), [ca / "root-cert.pem"])
        assert not result.ok and result.reasons, position
