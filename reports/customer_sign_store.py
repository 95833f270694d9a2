"""The control plane's side of customer countersignatures: enrolled certificates, and the check of an upload.

The control plane holds no customer private key. An approver enrols the certificate he made himself
(reports.customer_sign `init`); the file is kept under DATA_DIR/signing/customers/<username>/<fingerprint>.pem
(never overwritten) with `current` naming the one in force, and every enrolment is appended to
DATA_DIR/signing/customers/enrolments.jsonl (who, whose, when, fingerprint, subject). A certificate is public:
whoever holds this folder can read it, not sign with it.

`check_upload` accepts a countersigned file only when it is the stored version's exact bytes followed by exactly
one incremental revision that adds one signature, made with the enrolled certificate, that verifies (the vendor's
signature still valid, only a signature added after it). Every refusal is a finding (reports.findings) naming why.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from io import BytesIO
from pathlib import Path

from asn1crypto import x509 as asn1_x509
from cryptography.hazmat.primitives import serialization
from django.conf import settings
from django.utils import timezone
from django.utils.translation import gettext_noop
from pyhanko.pdf_utils.reader import PdfFileReader

from gates.lifecycle import audit
from gates.models import AuditAction, Membership, Pilot
from reports import customer_sign, sign
from reports.findings import Finding, english, said
from reports.verify import DAMAGE, verify_pdf

ENROLMENT_LOG = "enrolments.jsonl"


class Refused(Exception):
    """An enrolment or a countersigned upload refused; `.finding` says why (in the reader's language on a page)."""

    def __init__(self, finding: Finding):
        self.finding, self.reason = finding, english(finding)
        super().__init__(self.reason)


@dataclass(frozen=True)
class Enrolment:
    username: str
    organisation: str
    fingerprint: str
    subject: str
    enrolled_at: str
    path: Path

    @property
    def certificate(self) -> customer_sign.Certificate:
        return customer_sign.parse_certificate(self.path.read_bytes(), source=str(self.path))


def directory() -> Path:
    return Path(settings.DATA_DIR) / "signing" / "customers"


def _user_folder(username: str) -> Path:
    sign.approver_paths(directory(), username)  # validates the name for a file name
    return directory() / username


def enrol(user, organisation, pem: bytes, *, who=None) -> Enrolment:
    """Enrol `pem` (the approver's certificate file) for `user`, a customer approver of `organisation`."""
    try:
        cert = customer_sign.parse_certificate(pem)
    except customer_sign.CustomerSignError as error:
        raise Refused(said(gettext_noop("the certificate was not enrolled: %(error)s"), error=error)) from None
    folder = _user_folder(user.get_username())
    folder.mkdir(parents=True, exist_ok=True)
    target = folder / f"{cert.fingerprint}.pem"
    if not target.exists():
        sign._write_new(target, cert.pem, 0o644)
    current = folder / "current"
    temporary = folder / f".current.{os.getpid()}"
    temporary.write_text(cert.fingerprint + "\n")
    os.replace(temporary, current)
    when = timezone.now().isoformat()
    entry = {"enrolled_at": when, "username": user.get_username(), "organisation": organisation.name,
             "fingerprint": cert.fingerprint, "root_fingerprint": cert.root_fingerprint, "subject": cert.subject,
             "by": getattr(who or user, "username", str(who))}
    with open(directory() / ENROLMENT_LOG, "a", encoding="utf-8") as log:
        log.write(json.dumps(entry, ensure_ascii=False) + "\n")
    _audit(user, organisation, entry)
    return Enrolment(user.get_username(), organisation.name, cert.fingerprint, cert.subject, when, target)


def _audit(user, organisation, entry: dict) -> None:
    """An audit event on each of the organisation's pilots, once gates.models.AuditAction has `SIGNER_ENROLLED`."""
    action = getattr(AuditAction, "SIGNER_ENROLLED", None)
    if action is None:
        return
    membership = Membership.objects.filter(user=user, organisation=organisation).first()
    for pilot in Pilot.objects.filter(customer=organisation):
        audit(pilot, user, action, membership or pilot, **entry)


def enrolments(username: str | None = None) -> list[dict]:
    """The enrolment log (oldest first), of one person or of everyone."""
    try:
        lines = (directory() / ENROLMENT_LOG).read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        return []
    entries = [json.loads(line) for line in lines if line.strip()]
    return [e for e in entries if username is None or e.get("username") == username]


def enrolled(user) -> Enrolment | None:
    """The certificate in force for `user`, or None."""
    username = user.get_username()
    try:
        folder = _user_folder(username)
        fp = (folder / "current").read_text().strip()
    except (FileNotFoundError, sign.SigningError):
        return None
    entry = next((e for e in reversed(enrolments(username)) if e.get("fingerprint") == fp), {})
    return Enrolment(username, entry.get("organisation", ""), fp, entry.get("subject", ""),
                     entry.get("enrolled_at", ""), folder / f"{fp}.pem")


def enrolled_certificates() -> list[bytes]:
    """Every certificate ever enrolled (a report countersigned before a re-enrolment still verifies)."""
    folder = directory()
    if not folder.is_dir():
        return []
    return [path.read_bytes() for path in sorted(folder.glob("*/*.pem"))]


def _upload_path(report, user) -> Path:
    sign.approver_paths(directory(), user.get_username())  # validates the name for a file name
    return Path(settings.DATA_DIR) / "signing" / "uploads" / str(report.code) / f"{user.get_username()}.pdf"


def keep_upload(report, user, data: bytes) -> Path:
    """The approver's countersigned upload, kept for the worker that checks and stores it (DATA_DIR is shared by the
    web tier and the control workers, docs/operations.md); a later upload of the same person replaces it."""
    path = _upload_path(report, user)
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    temporary = path.with_name(f".{path.name}.{os.getpid()}")
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as handle:
        handle.write(data)
    os.replace(temporary, path)
    return path


def take_upload(report, user) -> bytes | None:
    """The kept upload, removed as it is read: one upload is checked once, whatever the outcome."""
    path = _upload_path(report, user)
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return None
    path.unlink(missing_ok=True)
    return data


def _signatures(data: bytes):
    reader = PdfFileReader(BytesIO(data), strict=False)
    return reader, list(reader.embedded_signatures)


def check_upload(stored: bytes, uploaded: bytes, enrolment: Enrolment, vendor_roots) -> None:
    """Raise Refused unless `uploaded` is `stored` + one incremental revision adding one signature made with the
    enrolled certificate, and the whole file verifies (vendor's signature by the vendor's root, the customer's by
    the enrolled certificate)."""
    if not uploaded.startswith(stored):
        raise Refused(said(gettext_noop(
            "the uploaded file does not begin with the exact bytes of the version read; countersign the file "
            "downloaded from this page, unchanged")))
    if len(uploaded) == len(stored):
        raise Refused(said(gettext_noop("the uploaded file is the version read itself: it carries no countersignature")))
    try:
        before_reader, before = _signatures(stored)
        after_reader, after = _signatures(uploaded)
        revisions_before = before_reader.xrefs.total_revisions
        revisions_after = after_reader.xrefs.total_revisions
    except DAMAGE as error:
        raise Refused(said(gettext_noop("the uploaded file is not a readable PDF (%(error)s)"),
                           error=f"{type(error).__name__}: {error}")) from None
    if revisions_after != revisions_before + 1:
        raise Refused(said(gettext_noop(
            "the uploaded file adds %(n)s revisions to the version read; a countersignature adds exactly one"),
            n=revisions_after - revisions_before))
    if len(after) != len(before) + 1:
        raise Refused(said(gettext_noop(
            "the uploaded file adds %(n)s signatures to the version read; a countersignature adds exactly one"),
            n=len(after) - len(before)))
    try:
        carried = after[-1].signer_cert.dump()
    except Exception as error:  # noqa: BLE001 — a mangled CMS blob is a refusal, not a crash
        raise Refused(said(gettext_noop("the added signature's certificate cannot be read (%(error)s)"),
                           error=error)) from None
    cert = enrolment.certificate
    if carried != cert.leaf.public_bytes(serialization.Encoding.DER):
        other = asn1_x509.Certificate.load(carried)
        raise Refused(said(gettext_noop(
            "the added signature was made with the certificate %(subject)s (SHA-256 %(other)s…), not the one "
            "enrolled for you (SHA-256 %(enrolled)s…)"), subject=other.subject.human_friendly,
            other=other.sha256.hex()[:16], enrolled=enrolment.fingerprint[:16]))
    result = verify_pdf(uploaded, list(vendor_roots), customer_certs=[cert.pem])
    if not result.ok:
        raise Refused(said(gettext_noop("the countersigned file does not verify: %(reasons)s"),
                           reasons="; ".join(result.reasons)))
    parties = [s.party for s in result.signatures]
    if parties[-1] != "customer" or any(p != "vendor" for p in parties[:len(before)]):
        raise Refused(said(gettext_noop("the signatures do not belong to the parties expected (%(parties)s)"),
                           parties=", ".join(parties)))
