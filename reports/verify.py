"""Verify a signed evidence report: every signature, the file's coverage, and each attachment's hash.

Pure: bytes and trust roots in, a VerificationResult out. `ok` holds only when every signature is
intact, valid and chains to a given root, the last one covers the file to its last byte (bytes
appended after it fail, although some validators still say VALID), earlier ones were followed only
by further signatures, and every attachment re-hashes to what manifest.json says.

Each finding is made as a sentence of the catalogue and the values in it (`said`): `reasons`, `problems` and
`problem` are those sentences in English (the command line, the stored result), `findings`, `problem_findings`
and `problem_finding` keep them as made (reports.findings), so a page says them in its reader's language without
reading the English back.
"""
from __future__ import annotations

import hashlib
import json
import logging
import zlib
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from io import BytesIO
from pathlib import Path
from typing import Any

from asn1crypto import pem
from asn1crypto import x509 as asn1_x509
from django.utils.translation import gettext_noop
from pyhanko.pdf_utils import generic, misc
from pyhanko.pdf_utils.reader import PdfFileReader
from pyhanko.sign.diff_analysis import ModificationLevel
from pyhanko.sign.validation import validate_pdf_signature
from pyhanko.sign.validation.status import SignatureCoverageLevel
from pyhanko_certvalidator import ValidationContext

from reports.findings import Finding, english, said
from reports.sign import APPROVER_FIELD_PREFIX, VENDOR_FIELD

MANIFEST_NAME = "manifest.json"
# What pyHanko and zlib raise on a damaged file: each becomes a reason, never a crash.
DAMAGE = (misc.PdfError, ValueError, KeyError, IndexError, TypeError, AttributeError, zlib.error)
MANIFEST_SCHEMA = "fxpilot.report-manifest/1"

@dataclass
class SignatureCheck:
    field: str
    signer: str
    issuer: str
    signing_time: str | None
    timestamped: bool
    intact: bool
    valid: bool
    trusted: bool
    covers_whole_file: bool
    modification: str
    ok: bool
    problems: list[str] = field(default_factory=list)
    problem_findings: list[Finding] = field(default_factory=list)
    fingerprint: str = ""  # SHA-256 of the signer's certificate (DER)
    trust_anchor: str = ""  # SHA-256 of the root it chained to (DER), when it did
    party: str = ""  # "vendor", "customer" or "unknown"; "" when no customer certificates were given


@dataclass
class AttachmentCheck:
    file: str
    name: str
    expected_sha256: str | None
    actual_sha256: str
    size: int
    ok: bool
    problem: str = ""
    problem_finding: Finding | None = None


@dataclass
class VerificationResult:
    ok: bool
    reasons: list[str]
    signatures: list[SignatureCheck]
    attachments: list[AttachmentCheck]
    report: dict[str, Any]
    metadata: dict[str, str]
    findings: list[Finding] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def load_trust_roots(sources: Sequence[Path | str | bytes]) -> list[asn1_x509.Certificate]:
    """Certificates from PEM/DER files or bytes."""
    roots = []
    for source in sources:
        data = source if isinstance(source, bytes) else Path(source).read_bytes()
        if pem.detect(data):
            roots += [asn1_x509.Certificate.load(der) for _, _, der in pem.unarmor(data, multiple=True)]
        else:
            roots.append(asn1_x509.Certificate.load(data))
    return roots


def verify_pdf(data: bytes, trust_roots: Sequence[Path | str | bytes | asn1_x509.Certificate], *,
               customer_certs: Sequence[Path | str | bytes] | None = None) -> VerificationResult:
    """`trust_roots` are the vendor's roots. With `customer_certs` (the customers' enrolled certificate files: the
    signing certificate, then its root), each signature is said to be the vendor's (it chains to a vendor root) or a
    customer's (its certificate is an enrolled one), and a signature of neither party, or a customer approval made
    with a certificate of the vendor's root (which the vendor could have made), is a finding."""
    result = VerificationResult(ok=False, reasons=[], signatures=[], attachments=[], report={}, metadata={})
    _verify(data, trust_roots, result, result.findings, customer_certs)
    result.reasons = [english(finding) for finding in result.findings]
    result.ok = not result.findings
    return result


def _customer_certificates(sources) -> tuple[dict[bytes, asn1_x509.Certificate], list[asn1_x509.Certificate]]:
    """Enrolled customer certificate files: {leaf DER: leaf}, and their roots."""
    leaves, roots = {}, []
    for source in sources:
        certs = load_trust_roots([source])
        if certs:
            leaves[certs[0].dump()] = certs[0]
            roots.append(certs[-1])
    return leaves, roots


def _verify(data: bytes, trust_roots, result: VerificationResult, reasons: list[Finding],
            customer_certs=None) -> None:
    roots = [r for r in trust_roots if isinstance(r, asn1_x509.Certificate)]
    roots += load_trust_roots([r for r in trust_roots if not isinstance(r, asn1_x509.Certificate)])
    vendor_anchors = {root.sha256.hex() for root in roots}
    customer_leaves, customer_roots = _customer_certificates(customer_certs or [])
    if not roots:
        reasons.append(said(gettext_noop(
            "no trust root given: a signature can only be trusted against the vendor's root certificate")))
    try:
        reader = PdfFileReader(BytesIO(data), strict=False)
        embedded = list(reader.embedded_signatures)
    except DAMAGE as error:
        reasons.append(said(gettext_noop("not a readable PDF: %(error)s"), error=error))
        return
    result.metadata = _metadata(reader)
    if not embedded:
        reasons.append(said(gettext_noop("the PDF carries no signature")))
    context = ValidationContext(trust_roots=roots + customer_roots, allow_fetching=False)
    for position, sig in enumerate(embedded):
        check = _check_signature(sig, context, data, last=position == len(embedded) - 1)
        check.problem_findings += _foreign_certificates(sig, roots + customer_roots)
        if customer_certs is not None:
            check.problem_findings += _party(check, sig, vendor_anchors, customer_leaves)
        check.problems = [english(problem) for problem in check.problem_findings]
        check.ok = not check.problems
        result.signatures.append(check)
        reasons += [said(gettext_noop("signature %(field)s (%(signer)s): %(problem)s"), field=repr(check.field),
                         signer=check.signer, problem=problem) for problem in check.problem_findings]
    files = _embedded_files(reader, reasons)
    _check_attachments(files, result, reasons)


def _party(check: SignatureCheck, sig, vendor_anchors: set[str], customer_leaves: dict) -> list[Finding]:
    """Whose signature this is: the vendor's when it chains to a vendor root, a customer's when its certificate is
    one the customer enrolled (a certificate the customer made on his own machine, with a root of his own)."""
    try:
        der = sig.signer_cert.dump()
    except Exception:  # noqa: BLE001 — _check_signature said it already
        der = b""
    if der and der in customer_leaves and check.trust_anchor not in vendor_anchors:
        check.party = "customer"
    elif check.trust_anchor and check.trust_anchor in vendor_anchors:
        check.party = "vendor"
    else:
        check.party = "unknown"
        return [said(gettext_noop("it belongs to neither party: its certificate is not issued by the vendor's root "
                                  "nor enrolled by the customer"))]
    if check.party == "vendor" and check.field.startswith(APPROVER_FIELD_PREFIX):
        return [said(gettext_noop("a customer approval made with a certificate of the vendor's root: the vendor "
                                  "could have made it, so it is not the customer's signature"))]
    if check.party == "customer" and check.field == VENDOR_FIELD:
        return [said(gettext_noop("the vendor's signature field is signed with a customer's certificate"))]
    return []


def _check_signature(sig, context: ValidationContext, data: bytes, *, last: bool) -> SignatureCheck:
    problems: list[Finding] = []
    signer = issuer = fingerprint = ""
    try:
        cert = sig.signer_cert
        signer, issuer = cert.subject.human_friendly, cert.issuer.human_friendly
        fingerprint = cert.sha256.hex()
    except Exception as error:  # noqa: BLE001 — a mangled CMS blob is a verdict, not a crash
        problems.append(said(gettext_noop("the signer certificate cannot be read (%(error)s)"), error=error))
    byte_range = [int(x) for x in sig.byte_range]
    covers_whole_file = len(byte_range) == 4 and byte_range[2] + byte_range[3] == len(data)
    if len(byte_range) == 4 and not _clean_placeholder(data[byte_range[1]:byte_range[2]]):
        problems.append(said(gettext_noop(
            "bytes were changed in the signature's placeholder (outside the signature value)")))
    try:
        # pyHanko logs the details of a broken signature itself; the result below carries them.
        logging.getLogger("pyhanko").disabled = True
        status = validate_pdf_signature(sig, context)
    except Exception as error:  # noqa: BLE001 — pyHanko raises many kinds on broken input
        problems.append(said(gettext_noop("cannot be validated (%(error)s)"), error=f"{type(error).__name__}: {error}"))
        return SignatureCheck(field=str(sig.field_name), signer=signer, issuer=issuer, signing_time=None,
                              timestamped=False, intact=False, valid=False, trusted=False,
                              covers_whole_file=covers_whole_file, modification="unknown", ok=False,
                              problem_findings=problems, fingerprint=fingerprint)
    finally:
        logging.getLogger("pyhanko").disabled = False
    level = status.modification_level
    if not status.intact:
        problems.append(said(gettext_noop("the signed bytes were changed (digest mismatch)")))
    elif not status.valid:
        problems.append(said(gettext_noop("the signature value does not match the signer's certificate")))
    if status.intact and status.valid and not status.trusted:
        problems.append(said(gettext_noop("the signer's certificate does not chain to a trusted root%(detail)s"),
                             detail=f" ({status.trust_problem_indic})" if status.trust_problem_indic else ""))
    if last:
        if not covers_whole_file or status.coverage != SignatureCoverageLevel.ENTIRE_FILE:
            problems.append(said(gettext_noop("not total document signed: %(n)s bytes after the signed range"),
                                 n=len(data) - sum(byte_range[2:4])))
    elif status.coverage != SignatureCoverageLevel.ENTIRE_REVISION or level is None or level > ModificationLevel.FORM_FILLING:
        problems.append(said(gettext_noop(
            "the document was changed after this signature by more than further signatures (%(level)s)"), level=level))
    if status.docmdp_ok is False:
        problems.append(said(gettext_noop("a change after this signature is not permitted by its certification (DocMDP)")))
    when = status.timestamp_validity.timestamp if status.timestamp_validity else status.signer_reported_dt
    path = getattr(status, "validation_path", None)
    anchor = path[0].sha256.hex() if path is not None and status.trusted else ""
    return SignatureCheck(
        field=str(sig.field_name), signer=signer, issuer=issuer,
        signing_time=when.isoformat() if when else None, timestamped=status.timestamp_validity is not None,
        intact=bool(status.intact), valid=bool(status.valid), trusted=bool(status.trusted),
        covers_whole_file=covers_whole_file, modification=level.name if level is not None else "unknown",
        ok=not problems, problem_findings=problems, fingerprint=fingerprint, trust_anchor=anchor,
    )


def _foreign_certificates(sig, roots: list[asn1_x509.Certificate]) -> list[Finding]:
    """Certificates carried in the signature are not covered by it: each must be the signer's, or a trusted
    root byte for byte, or issued by one — an altered copy of the root would otherwise pass unnoticed."""
    try:
        carried = list(sig.signed_data["certificates"])
        signer = sig.signer_cert
    except Exception as error:  # noqa: BLE001 — a mangled CMS blob is a verdict, not a crash
        return [said(gettext_noop("the certificates carried in the signature cannot be read (%(error)s)"), error=error)]
    trusted = {root.dump() for root in roots}
    trusted_names = {root.subject.dump() for root in roots}
    problems = _unsigned_fields(sig, signer)
    for choice in carried:
        cert = choice.chosen
        if cert.dump() == signer.dump() or cert.dump() in trusted:
            continue
        if cert.subject.dump() in trusted_names:
            problems.append(said(gettext_noop("a carried copy of the trusted root %(name)s differs from the root"),
                                 name=repr(cert.subject.human_friendly)))
        elif cert.issuer.dump() not in trusted_names:
            problems.append(said(gettext_noop("the signature carries a certificate that no trusted root issued (%(name)s)"),
                                 name=cert.subject.human_friendly))
    return problems


def _unsigned_fields(sig, signer) -> list[Finding]:
    """The signer identifier and the digest algorithm list sit outside what the signature covers: they must agree
    with the signer's certificate and the digest actually used."""
    problems = []
    signer_info = sig.signer_info
    sid = signer_info["sid"]
    if sid.name == "issuer_and_serial_number":
        chosen = sid.chosen
        if chosen["issuer"].dump() != signer.issuer.dump() or chosen["serial_number"].native != signer.serial_number:
            problems.append(said(gettext_noop("the signer identifier does not match the signer's certificate")))
    used = signer_info["digest_algorithm"]["algorithm"].native
    listed = {algo["algorithm"].native for algo in sig.signed_data["digest_algorithms"]}
    if used not in listed:
        problems.append(said(gettext_noop(
            "the signature's digest algorithm list %(listed)s does not name the digest used (%(used)s)"),
            listed=sorted(listed), used=used))
    return problems


def _clean_placeholder(hole: bytes) -> bool:
    """The unsigned gap of a signature is <hex of one DER object, then zeros>; anything else was tampered with."""
    if len(hole) < 2 or hole[:1] != b"<" or hole[-1:] != b">":
        return False
    digits = hole[1:-1]
    if len(digits) % 2 or not all(c in b"0123456789abcdefABCDEF" for c in digits):
        return False
    der = bytes.fromhex(digits.decode())
    if len(der) < 2 or der[0] != 0x30:
        return False
    if der[1] < 0x80:
        end = 2 + der[1]
    else:
        count = der[1] & 0x7F
        end = 2 + count + int.from_bytes(der[2:2 + count], "big")
    return end <= len(der) and not any(der[end:])


def _metadata(reader: PdfFileReader) -> dict[str, str]:
    try:
        info = reader.trailer_view.get("/Info")
        if info is None:
            return {}
        info = info.get_object()
        return {str(key).lstrip("/"): str(value) for key, value in info.items()
                if isinstance(value, (generic.TextStringObject, generic.ByteStringObject, str))}
    except DAMAGE:
        return {}


def _name_tree(node, seen: set[int]) -> list[tuple[str, Any]]:
    """Leaves of a PDF name tree (/Names pairs, /Kids recursively)."""
    if id(node) in seen:
        return []
    seen.add(id(node))
    pairs = []
    names = node.get("/Names")
    if names is not None:
        names = names.get_object()
        for index in range(0, len(names) - 1, 2):
            pairs.append((str(names[index]), names[index + 1].get_object()))
    for kid in node.get("/Kids", []) or []:
        pairs += _name_tree(kid.get_object(), seen)
    return pairs


def _embedded_files(reader: PdfFileReader, reasons: list[Finding]) -> dict[str, bytes]:
    try:
        names = reader.root.get("/Names")
        tree = names.get_object().get("/EmbeddedFiles") if names is not None else None
        if tree is None:
            reasons.append(said(gettext_noop(
                "the PDF has no attached files; an evidence report carries its raw artifacts and manifest.json")))
            return {}
        pairs = _name_tree(tree.get_object(), set())
    except DAMAGE as error:
        reasons.append(said(gettext_noop("the attached files cannot be read: %(error)s"),
                            error=f"{type(error).__name__}: {error}"))
        return {}
    files: dict[str, bytes] = {}
    for name, spec in pairs:
        try:
            stream = spec["/EF"].get_object()
            files[name] = (stream.get("/UF") or stream["/F"]).get_object().data
        except DAMAGE as error:
            # A damaged stream is a finding about this file, not a reason to stop checking the rest.
            reasons.append(said(gettext_noop("attachment %(name)s cannot be read (%(error)s)"), name=repr(name),
                                error=f"{type(error).__name__}: {error}"))
            files[name] = b""
    return files


def _check_attachments(files: dict[str, bytes], result: VerificationResult, reasons: list[Finding]) -> None:
    raw = files.pop(MANIFEST_NAME, None)
    if raw is None:
        if files or not reasons:
            reasons.append(said(gettext_noop("no %(manifest)s attached: the attachments cannot be checked"),
                                manifest=MANIFEST_NAME))
        return
    try:
        manifest = json.loads(raw)
        if manifest.get("schema") != MANIFEST_SCHEMA:
            raise ValueError(f"schema is {manifest.get('schema')!r}, expected {MANIFEST_SCHEMA!r}")
        listed = {item["file"]: item for item in manifest["artifacts"]}
    except (ValueError, KeyError, TypeError, AttributeError) as error:
        reasons.append(said(gettext_noop("%(manifest)s is not a valid report manifest: %(error)s"),
                            manifest=MANIFEST_NAME, error=error))
        return
    result.report = dict(manifest.get("report") or {})
    for file_name, item in listed.items():
        data = files.pop(file_name, None)
        if data is None:
            problem = said(gettext_noop("listed in the manifest but not attached"))
            check = AttachmentCheck(file_name, item.get("name", ""), item.get("sha256"), "", 0, False)
        else:
            actual = hashlib.sha256(data).hexdigest()
            matches = actual == item.get("sha256") and len(data) == item.get("size", len(data))
            problem = None if matches else said(gettext_noop("hashes to %(actual)s, the manifest says %(listed)s"),
                                                actual=actual, listed=item.get("sha256"))
            check = AttachmentCheck(file_name, item.get("name", ""), item.get("sha256"), actual, len(data), matches)
        _attach(result, reasons, check, problem)
    for file_name, data in files.items():
        _attach(result, reasons, AttachmentCheck(file_name, "", None, hashlib.sha256(data).hexdigest(), len(data), False),
                said(gettext_noop("attached but not listed in the manifest")))


def _attach(result: VerificationResult, reasons: list[Finding], check: AttachmentCheck, problem: Finding | None) -> None:
    if problem is not None:
        check.problem, check.problem_finding = english(problem), problem
        reasons.append(said(gettext_noop("attachment %(name)s: %(problem)s"), name=repr(check.file), problem=problem))
    result.attachments.append(check)


PARTY_WORDS = {
    "vendor": "the vendor's signature (供应商的签名), by the vendor's root",
    "customer": "the customer's signature (客户的签名), by the certificate the customer enrolled",
    "unknown": "belongs to neither party (不属于任何一方)",
}


def describe(result: VerificationResult) -> str:
    """A few lines for a person: which report, each signature, the attachments, the verdict."""
    report = result.report
    lines = []
    if report:
        gate = f" G{report['gate']}" if report.get("gate") else ""
        lines.append(f"Report: {report.get('kind', '?')}{gate} of pilot {report.get('pilot_name', '?')} "
                     f"({report.get('pilot_code', '?')}), language {report.get('language', '?')}, "
                     f"code {report.get('code', '?')}" + (" — SIMULATION, not evidence" if report.get("simulated") else ""))
    for sig in result.signatures:
        if sig.party:
            lines.append(f"Signature {sig.field} — {PARTY_WORDS.get(sig.party, sig.party)}: certificate SHA-256 "
                         f"{sig.fingerprint or '?'}, root SHA-256 {sig.trust_anchor or 'none trusted'}")
        lines.append(f"Signature {sig.field}: {sig.signer} at {sig.signing_time or 'unknown time'} "
                     f"({'time-stamped' if sig.timestamped else 'no time-stamp authority'}) — "
                     f"intact={sig.intact} trusted={sig.trusted} whole-file={sig.covers_whole_file} "
                     f"after={sig.modification}: {'OK' if sig.ok else 'FAILED'}")
    good = sum(1 for a in result.attachments if a.ok)
    lines.append(f"Attachments: {good} of {len(result.attachments)} re-hash to the manifest")
    lines += [f"FAILED: {reason}" for reason in result.reasons]
    lines.append("VERIFIED" if result.ok else "NOT VERIFIED")
    return "\n".join(lines)
