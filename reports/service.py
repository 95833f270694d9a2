"""Make, store and countersign reports: the only part of reports that writes files and rows.

A stored report is never modified: a countersignature writes a new file and a new Report row.
Files live in the evidence storage (runners.artifacts) as reports/<pilot code>/<report code>.pdf: under
DATA_DIR, read-only, by default; in the S3-compatible store when one is configured.
"""
from __future__ import annotations

import hashlib
import uuid
from datetime import UTC
from pathlib import Path

from django.conf import settings
from django.core.exceptions import PermissionDenied
from django.utils import timezone, translation

from gates.lifecycle import audit
from gates.models import AuditAction, Evaluation, Gate, Membership, Pilot, Report, Role, SignOff
from reports import sign
from reports.context import gate_report_context, procurement_report_context, root_certificate
from reports.render import ReportError, render_pdf
from reports.verify import VerificationResult, verify_pdf
from runners.artifacts import ArtifactMismatch, evidence_storage, get_bytes, put_bytes

__all__ = ["ReportError", "countersign", "create_gate_report", "create_procurement_report", "finish_pilot",
           "latest_versions", "procurement_report_of", "report_bytes", "report_path", "signing_directory", "trust_roots",
           "verify_report_bytes"]


def signing_directory() -> Path:
    return Path(settings.DATA_DIR) / "signing"


def _uses_embedded_default() -> bool:
    folder = signing_directory()
    return (Path(settings.FXPILOT_SIGNING_KEY) == folder / "signer-key.pem"
            and Path(settings.FXPILOT_SIGNING_CERT) == folder / "signer-cert.pem"
            and Path(settings.FXPILOT_SIGNING_ROOT) == folder / "root-cert.pem")


def vendor_signer():
    """The vendor's signer; the embedded default creates its CA on first use (production never does)."""
    if _uses_embedded_default() and not settings.PRODUCTION and not Path(settings.FXPILOT_SIGNING_CERT).exists():
        sign.setup_authority(signing_directory(), passphrase=settings.FXPILOT_SIGNING_KEY_PASSPHRASE or None)
    return sign.load_signer(Path(settings.FXPILOT_SIGNING_KEY), Path(settings.FXPILOT_SIGNING_CERT),
                            [Path(settings.FXPILOT_SIGNING_ROOT)], settings.FXPILOT_SIGNING_KEY_PASSPHRASE or None)


def trust_roots() -> list[Path]:
    return [Path(settings.FXPILOT_SIGNING_ROOT)]


def normalise_language(language: str) -> str:
    code = (language or "en").strip().lower().replace("_", "-")
    if code in ("zh", "zh-cn", "zh-sg"):
        code = "zh-hans"
    known = [c for c, _ in settings.LANGUAGES]
    if code not in known:
        raise ValueError(f"language {language!r} is not offered; use one of {', '.join(known)}")
    return code


def report_path(report: Report) -> Path:
    """The local file of a report, with the embedded file-system storage only (use report_bytes to read)."""
    return Path(settings.DATA_DIR) / report.path


def report_bytes(report: Report) -> bytes:
    """The stored PDF, hashed again: a file altered in the store raises ReportError."""
    try:
        return get_bytes(report.path, report.sha256)
    except ArtifactMismatch as exc:
        raise ReportError(str(exc)) from None


def _store(pilot: Pilot, code: uuid.UUID, data: bytes) -> tuple[str, str]:
    relative = f"reports/{pilot.code}/{code}.pdf"
    sha256 = hashlib.sha256(data).hexdigest()
    if evidence_storage().exists(relative):  # a report's name is new: a stored report is never replaced
        raise ReportError(f"{relative} already exists in the evidence store")
    put_bytes(relative, data, sha256)
    return relative, sha256


def _require_verified(data: bytes, what: str) -> None:
    """Nothing is stored that its own verifier rejects (e.g. a certificate that does not chain to the root)."""
    check = verify_report_bytes(data)
    if not check.ok:
        raise ReportError(f"the signed {what} does not verify against FXPILOT_SIGNING_ROOT, so it was not stored: "
                          + "; ".join(check.reasons))


def _make(context: dict, *, pilot: Pilot, gate: Gate | None, evaluation: Evaluation | None, language: str,
          who, countersigner=None, supersedes: Report | None = None) -> Report:
    """Render, sign as the vendor and, for a countersigned version, as the customer approver; then store."""
    language = normalise_language(language)
    signer = vendor_signer()
    approver = _approver_signer(countersigner, pilot) if countersigner is not None else None
    code, created = uuid.uuid4(), timezone.now()
    context.update(code=str(code), created=created.isoformat(timespec="seconds"), language=language)
    context["signing"].update(signer=sign.signer_name(signer), root=root_certificate())
    if countersigner is not None:
        with translation.override(language):
            role = str(Role(Role.CUSTOMER_APPROVER).label)
        context["signing"].update(
            version=supersedes.version + 1 if supersedes else 1,
            supersedes={"code": str(supersedes.code), "version": supersedes.version} if supersedes else None,
            countersignature={"person": _name(countersigner), "role": role, "organisation": pilot.customer.name,
                              "at": created.astimezone(UTC).strftime("%Y-%m-%d %H:%M UTC")})
    pdf = render_pdf(context, language)
    what = f"{gate.label} report" if gate else "procurement report"
    signed = sign.sign_pdf(pdf, signer, field_name=sign.VENDOR_FIELD, certify=True, tsa_url=settings.FXPILOT_TSA_URL or None,
                           reason=f"fxpilot {what} of {pilot.name}", location=pilot.vendor.name)
    if approver is not None:
        signed = sign.sign_pdf(signed, approver, field_name=sign.next_approver_field(signed),
                               tsa_url=settings.FXPILOT_TSA_URL or None,
                               reason=f"Approved by {_name(countersigner)} for {pilot.customer.name}",
                               location=pilot.customer.name)
    _require_verified(signed, what)
    path, sha256 = _store(pilot, code, signed)
    report = Report.objects.create(
        code=code, pilot=pilot, gate=gate, evaluation=evaluation, kind=context["kind"], language=language, path=path,
        sha256=sha256, size=len(signed), simulated=bool(context["simulated"]), signatures=2 if approver else 1,
        created=created, version=context["signing"]["version"], supersedes=supersedes,
        countersigned_by=countersigner, countersigned_at=created if countersigner is not None else None,
    )
    if countersigner is None:
        audit(pilot, who or "reports", AuditAction.REPORT_CREATED, report, kind=report.kind, gate=gate.number if gate else None,
              language=language, sha256=sha256, simulated=report.simulated)
    else:
        audit(pilot, countersigner, AuditAction.REPORT_COUNTERSIGNED, report, source=str(supersedes.code) if supersedes else "",
              version=report.version, sha256=sha256)
    return report


def _name(user) -> str:
    return user.get_full_name() or user.get_username()


def create_gate_report(gate: Gate, evaluation: Evaluation | None = None, *, language: str = "en", who=None) -> Report:
    """Render, sign and store the report of one gate evaluation (the latest when none is given)."""
    context = gate_report_context(gate, evaluation)
    evaluation = evaluation or gate.latest_evaluation
    return _make(context, pilot=gate.pilot, gate=gate, evaluation=evaluation, language=language, who=who)


def create_procurement_report(pilot: Pilot, *, language: str = "en", who=None) -> Report:
    context = procurement_report_context(pilot)
    return _make(context, pilot=pilot, gate=None, evaluation=None, language=language, who=who)


def verify_report_bytes(data: bytes) -> VerificationResult:
    return verify_pdf(data, trust_roots())


def _approver_signer(user, pilot: Pilot):
    folder = signing_directory()
    key_path, cert_path = sign.approver_paths(folder, user.get_username())
    if not cert_path.exists():
        if not _uses_embedded_default() or settings.PRODUCTION:
            raise sign.SigningError(f"{cert_path}: no certificate for {user.get_username()}; issue one with your CA "
                                    "(or `python manage.py signing_setup --approver USERNAME` with the embedded root)")
        vendor_signer()  # the embedded root must exist before it issues an approver certificate
        sign.setup_approver(folder, user.get_username(), user.get_full_name() or user.get_username(), pilot.customer.name,
                            passphrase=settings.FXPILOT_SIGNING_KEY_PASSPHRASE or None)
    return sign.load_signer(key_path, cert_path, [Path(settings.FXPILOT_SIGNING_ROOT)])


def countersign(report: Report, user) -> Report:
    """The customer approver's signature: a new version rendered now (sign-offs and history as they stand), signed by
    the vendor and then by the approver, superseding `report`. The earlier file stays as it was."""
    pilot = report.pilot
    if not Membership.objects.filter(user=user, organisation=pilot.customer, role=Role.CUSTOMER_APPROVER).exists():
        raise PermissionDenied(f"{user.get_username()} is not a customer approver of {pilot.customer.name}")
    if report.is_superseded:
        raise ReportError(f"report {report.code} is superseded by a later version; countersign that one")
    data = report_bytes(report)
    check = verify_report_bytes(data)
    if not check.ok:
        raise ReportError(f"{report.path} does not verify, so it is not countersigned: {'; '.join(check.reasons)}")
    if report.kind == Report.Kind.GATE:
        if report.evaluation_id is None:
            raise ReportError(f"report {report.code} no longer names the evaluation it reported; make a new gate report")
        gate = Gate.objects.select_related("pilot").get(pk=report.gate_id)  # its state now, not when first reported
        context = gate_report_context(gate, Evaluation.objects.get(pk=report.evaluation_id))
    else:
        _refuse_stale_procurement(report)
        context = procurement_report_context(pilot)
    return _make(context, pilot=Pilot.objects.get(pk=pilot.pk), gate=report.gate, evaluation=report.evaluation,
                 language=report.language, who=user, countersigner=user, supersedes=report)


def _refuse_stale_procurement(report: Report) -> None:
    """A procurement report is rendered again for the countersignature from the pilot as it stands: refuse when
    that is no longer what the approver read (a later report, or evidence or decisions recorded since)."""
    pilot = report.pilot
    newer = pilot.reports.filter(kind=Report.Kind.PROCUREMENT, language=report.language, created__gt=report.created)
    if newer.exists():
        raise ReportError(f"report {report.code} is not the pilot's latest procurement report; countersign "
                          f"{newer.order_by('-created').first().code}")
    changed = (Evaluation.objects.filter(gate__pilot=pilot, created__gt=report.created).exists()
               or SignOff.objects.filter(pilot=pilot, created__gt=report.created).exists())
    if changed:
        raise ReportError(f"the pilot's evidence or sign-offs changed after report {report.code} was made; make a new "
                          "procurement report, read it, and countersign that one")


def latest_versions(reports) -> list[Report]:
    """Reports with every superseded version left out (the list a reader needs; the history keeps the rest)."""
    reports = list(reports)
    superseded = {r.supersedes_id for r in reports if r.supersedes_id}
    return [r for r in reports if r.pk not in superseded]


def finish_pilot(pilot: Pilot, *, who=None, language: str = "en") -> Report | None:
    """The pilot's last act: the procurement report once G4 is signed off (none twice for the same evidence)."""
    pilot.refresh_from_db()
    g4 = pilot.gates.filter(number=4).first()
    if g4 is None or g4.state != Gate.State.SIGNED_OFF:
        return None
    latest = g4.latest_evaluation
    done = Report.objects.filter(pilot=pilot, kind=Report.Kind.PROCUREMENT, language=language,
                                 created__gte=latest.created if latest else pilot.created).first()
    return done or create_procurement_report(pilot, language=language, who=who or "reports")


def procurement_report_of(pilot: Pilot) -> Report | None:
    """The report pinned on a completed pilot: the latest version of its procurement report."""
    reports = latest_versions(pilot.reports.filter(kind=Report.Kind.PROCUREMENT).order_by("-created"))
    return reports[0] if reports else None
