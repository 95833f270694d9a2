"""Make, store and countersign reports: the only part of reports that writes files and rows.

A stored report is never modified: a countersignature writes a new file and a new Report row.
Files live in the evidence storage (runners.artifacts) as reports/<pilot code>/<report code>.pdf: under
DATA_DIR, read-only, by default; in the S3-compatible store when one is configured.
"""
from __future__ import annotations

import hashlib
import json
import uuid
from pathlib import Path

from django.conf import settings
from django.core.exceptions import PermissionDenied
from django.db import transaction
from django.utils import timezone, translation
from django.utils.translation import gettext_noop

from gates import policy
from gates.lifecycle import audit
from gates.models import AuditAction, Evaluation, Gate, Membership, Pilot, Report, ReportJob, Role, SignOff
from gates.policy import Act
from reports import customer_sign_store, sign
from reports.context import gate_report_context, procurement_report_context, root_certificate
from reports.findings import Finding, english, said
from reports.render import ReportError, render_pdf
from reports.verify import VerificationResult, verify_pdf
from runners.artifacts import ArtifactMismatch, evidence_storage, get_bytes, put_bytes

__all__ = ["ReportChanged", "ReportError", "basis", "carry_out", "countersign", "create_gate_report",
           "create_procurement_report", "finish_pilot", "latest_version", "latest_versions", "new_version",
           "offered_version", "procurement_report_of", "quick_change", "report_bytes", "report_path",
           "signing_directory", "trust_roots", "verify_report_bytes", "what_changed"]


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


# A report's context is always built in one language, whatever language is active where it is built (the demo, a
# worker, a request): its labels are said again in the report's language when it is rendered (reports.render), and
# its basis (below) must not change with the reader's language, or a report made in one process would look stale
# in another and the approver's first countersignature would sign nothing.
CONTEXT_LANGUAGE = "en"

# What a report states, without what only this rendering has (its code, time, language and signing words).
_NOT_STATED = frozenset({"code", "created", "language", "signing"})


def _plain(value):
    if isinstance(value, bytes | bytearray):
        return hashlib.sha256(value).hexdigest()
    return str(value)


def basis(context: dict) -> str:
    """The SHA-256 of what a report states (its context as the database gives it). Made again later from the
    database, a different hash means something behind the report changed: a decision, the gate's state, the
    evidence, the sizing, an inventory."""
    stated = {key: value for key, value in context.items() if key not in _NOT_STATED}
    return hashlib.sha256(json.dumps(stated, sort_keys=True, ensure_ascii=False, default=_plain).encode()).hexdigest()


def _make(context: dict, *, pilot: Pilot, gate: Gate | None, evaluation: Evaluation | None, language: str,
          who, supersedes: Report | None = None) -> Report:
    """Render, sign as the vendor, store. A new version of a report names the version it supersedes."""
    language = normalise_language(language)
    stated = basis(context)
    signer = vendor_signer()
    code, created = uuid.uuid4(), timezone.now()
    context.update(code=str(code), created=created.isoformat(timespec="seconds"), language=language)
    context["signing"].update(signer=sign.signer_name(signer), root=root_certificate())
    if supersedes is not None:
        context["signing"].update(version=supersedes.version + 1,
                                  supersedes={"code": str(supersedes.code), "version": supersedes.version})
    pdf = render_pdf(context, language)
    what = f"{gate.label} report" if gate else "procurement report"
    signed = sign.sign_pdf(pdf, signer, field_name=sign.VENDOR_FIELD, certify=True, tsa_url=settings.FXPILOT_TSA_URL or None,
                           reason=f"fxpilot {what} of {pilot.name}", location=pilot.vendor.name)
    _require_verified(signed, what)
    with transaction.atomic():
        if supersedes is not None:  # two workers rendering the same subject at once: one new version, not two
            Report.objects.select_for_update().get(pk=supersedes.pk)
            if Report.objects.filter(supersedes=supersedes).exists():
                raise SupersededMeanwhile(f"report {supersedes.code} (version {supersedes.version}) was superseded "
                                          "while this version was rendered; nothing was stored")
        path, sha256 = _store(pilot, code, signed)
        report = Report.objects.create(
            code=code, pilot=pilot, gate=gate, evaluation=evaluation, kind=context["kind"], language=language,
            path=path, sha256=sha256, size=len(signed), simulated=bool(context["simulated"]), signatures=1,
            created=created, version=context["signing"]["version"], supersedes=supersedes, basis_sha256=stated,
        )
        audit(pilot, who or "reports", AuditAction.REPORT_CREATED, report, kind=report.kind,
              gate=gate.number if gate else None, language=language, sha256=sha256, simulated=report.simulated,
              version=report.version, supersedes=str(supersedes.code) if supersedes else "")
    return report


class SupersededMeanwhile(ReportError):
    """Another worker stored a version superseding the same one first (`offered_version` then looks again)."""


def _name(user) -> str:
    return user.get_full_name() or user.get_username()


def create_gate_report(gate: Gate, evaluation: Evaluation | None = None, *, language: str = "en", who=None) -> Report:
    """Render, sign and store the report of one gate evaluation (the latest when none is given)."""
    with translation.override(CONTEXT_LANGUAGE):
        context = gate_report_context(gate, evaluation)
    evaluation = evaluation or gate.latest_evaluation
    return _make(context, pilot=gate.pilot, gate=gate, evaluation=evaluation, language=language, who=who)


def create_procurement_report(pilot: Pilot, *, language: str = "en", who=None) -> Report:
    with translation.override(CONTEXT_LANGUAGE):
        context = procurement_report_context(pilot)
    return _make(context, pilot=pilot, gate=None, evaluation=None, language=language, who=who)


def verify_report_bytes(data: bytes) -> VerificationResult:
    """The vendor's roots, and every customer certificate enrolled (reports.customer_sign_store): each signature
    is said to be the vendor's or the customer's."""
    return verify_pdf(data, trust_roots(), customer_certs=customer_sign_store.enrolled_certificates())


# ── Versions, and what changed behind one ─────────────────────────────────────────────────────


class ReportChanged(ReportError):
    """What the signer read is no longer what the report would state, or not the version offered: nothing is
    signed. `.finding` says what changed as it was made (a catalogue sentence and its values, reports.findings:
    the page says it in the reader's language), `.reason` the same in English."""

    def __init__(self, report: Report, finding: Finding):
        self.report, self.finding, self.reason = report, finding, english(finding)
        super().__init__(f"report {report.code} (version {report.version}): {self.reason}; nothing was signed")


def versions_of(report: Report):
    """Every version of the report's subject: the procurement report of its pilot, or the report of one gate
    evaluation, in one language."""
    versions = Report.objects.filter(pilot_id=report.pilot_id, kind=report.kind, language=report.language)
    if report.kind == Report.Kind.GATE:
        versions = versions.filter(gate_id=report.gate_id, evaluation_id=report.evaluation_id)
    return versions


def latest_version(report: Report) -> Report:
    return versions_of(report).order_by("-created", "-pk").first() or report


def _context_now(report: Report) -> dict:
    """What the report would state if it were rendered now."""
    with translation.override(CONTEXT_LANGUAGE):
        return _context_now_built(report)


def _context_now_built(report: Report) -> dict:
    if report.kind == Report.Kind.GATE:
        if report.evaluation_id is None:
            raise ReportError(f"report {report.code} no longer names the evaluation it reported; make a new gate report")
        gate = Gate.objects.select_related("pilot").get(pk=report.gate_id)
        return gate_report_context(gate, Evaluation.objects.get(pk=report.evaluation_id))
    return procurement_report_context(Pilot.objects.get(pk=report.pilot_id))


def quick_change(report: Report) -> Finding | None:
    """What a request can tell at once (a few queries, no rendering): a later version, or a decision or an
    evaluation recorded after the report was made, as a finding (reports.findings). None does not mean current:
    `what_changed` says."""
    newer = latest_version(report)
    if newer.pk != report.pk:
        return said(gettext_noop("version %(number)s (%(code)s) was made after it"), number=newer.version,
                    code=newer.code)
    scope = {"gate_id": report.gate_id} if report.kind == Report.Kind.GATE else {}
    if (SignOff.objects.filter(pilot_id=report.pilot_id, created__gt=report.created, **scope).exists()
            or Evaluation.objects.filter(gate__pilot_id=report.pilot_id, created__gt=report.created,
                                         **({"gate_id": report.gate_id} if scope else {})).exists()):
        return said(gettext_noop("a decision or an evaluation was recorded after it was made"))
    return None


def what_changed(report: Report) -> Finding | None:
    """Why `report` is no longer what it would state now, or None when it still is: a later version, stored
    bytes that no longer hash to its row, or its content made again from the database differing. A finding
    (a catalogue sentence and its values, reports.findings), said in the reader's language where it is shown."""
    reason = quick_change(report)
    if reason:
        return reason
    try:
        report_bytes(report)
    except ReportError as error:
        return said(gettext_noop("its stored file differs from the one made (%(error)s)"), error=error)
    if not report.basis_sha256:  # made before bases were kept: only the quick checks can speak for it
        return None
    if basis(_context_now(report)) != report.basis_sha256:
        return said(gettext_noop("what it states changed since it was made (the gate's state, a decision, the "
                                 "evidence or the sizing)"))
    return None


def new_version(report: Report, *, who=None) -> Report:
    """The report's subject rendered now, signed by the vendor, superseding its latest version."""
    latest = latest_version(report)
    context = _context_now(latest)
    return _make(context, pilot=Pilot.objects.get(pk=latest.pilot_id), gate=latest.gate, evaluation=latest.evaluation,
                 language=latest.language, who=who, supersedes=latest)


def offered_version(report: Report, *, who=None, attempts: int = 3) -> Report:
    """The version to read and countersign: the latest one while it still states what the database says, else a
    new rendering that does. When another worker stored a new version meanwhile (two decisions in a row render at
    once), that one is looked at again in turn."""
    for attempt in range(attempts):
        latest = latest_version(report)
        if what_changed(latest) is None:
            return latest
        try:
            return new_version(latest, who=who)
        except SupersededMeanwhile:
            if attempt == attempts - 1:
                raise
    raise AssertionError("unreachable")


def countersign(report: Report, user, *, sha256: str, signed: bytes | None = None) -> Report:
    """The customer approver's signature, made on his own machine with his own key (reports.customer_sign) as an
    incremental PAdES revision to exactly the stored bytes of `report` — the version whose SHA-256 (`sha256`) the
    approver was shown and named — and uploaded as `signed` (None: the upload the portal kept for the worker,
    customer_sign_store.keep_upload, taken once). The control plane signs nothing here. Refused
    (ReportChanged, nothing stored) when that is not this version, a later version exists, the stored bytes differ,
    or what the report states changed since it was made; refused (customer_sign_store.Refused, naming why) when
    `signed` is not those bytes plus one revision adding one signature with the certificate enrolled for him. A new
    file and row (same version, `supersedes` the vendor-only one); the earlier file stays as it was."""

    pilot = report.pilot
    refused = policy.refusal(Act.COUNTERSIGN, pilot, policy.roles_of(pilot, user))  # the page's rule, gates.policy
    if refused is not None:
        raise PermissionDenied(refused.message)
    if not Membership.objects.filter(user=user, organisation=pilot.customer, role=Role.CUSTOMER_APPROVER).exists():
        raise PermissionDenied(f"{user.get_username()} is not a customer approver of {pilot.customer.name}")
    if signed is None:
        signed = customer_sign_store.take_upload(report, user)
    if (sha256 or "").strip().lower() != report.sha256:
        raise ReportChanged(report, said(gettext_noop("the version read has SHA-256 %(named)s…, not this one's "
                                                      "%(sha256)s…"), named=(sha256 or "")[:16], sha256=report.sha256[:16]))
    if report.countersigned_by_id is not None:
        raise ReportError(f"report {report.code} is countersigned already")
    reason = what_changed(report)
    if reason:
        raise ReportChanged(report, reason)
    data = report_bytes(report)
    check = verify_report_bytes(data)
    if not check.ok:
        raise ReportError(f"{report.path} does not verify, so it is not countersigned: {'; '.join(check.reasons)}")
    if signed is None:
        raise customer_sign_store.Refused(said(gettext_noop(
            "the control plane holds no customer key: countersign the file on your own machine with "
            "fxpilot-countersign and upload the result")))
    enrolment = customer_sign_store.enrolled(user)
    if enrolment is None:
        raise customer_sign_store.Refused(said(gettext_noop(
            "%(user)s has no countersigning certificate enrolled: make one with `fxpilot-countersign init` and "
            "upload approver-cert.pem first"), user=user.get_username()))
    customer_sign_store.check_upload(data, signed, enrolment, trust_roots())
    _require_verified(signed, "countersigned report")
    code, created = uuid.uuid4(), timezone.now()
    with transaction.atomic():
        Report.objects.select_for_update().get(pk=report.pk)  # one countersignature per version, however sent
        if Report.objects.filter(supersedes=report).exists():
            raise ReportChanged(report, said(gettext_noop("another version was made from it meanwhile")))
        path, digest = _store(pilot, code, signed)
        countersigned = Report.objects.create(
            code=code, pilot=pilot, gate=report.gate, evaluation=report.evaluation, kind=report.kind,
            language=report.language, path=path, sha256=digest, size=len(signed), simulated=report.simulated,
            signatures=report.signatures + 1, created=created, version=report.version, supersedes=report,
            countersigned_by=user, countersigned_at=created, basis_sha256=report.basis_sha256,
        )
        audit(pilot, user, AuditAction.REPORT_COUNTERSIGNED, countersigned, source=str(report.code),
              source_sha256=report.sha256, version=report.version, sha256=digest,
              certificate_sha256=enrolment.fingerprint)
    return countersigned


def _render(job: ReportJob) -> Report:
    """A rendering job: the subject's latest version while it still states what the database says, else a new
    version; the first one when there is none."""
    versions = Report.objects.filter(pilot_id=job.pilot_id, kind=job.report_kind, language=job.language)
    if job.report_kind == Report.Kind.GATE:
        versions = versions.filter(gate_id=job.gate_id, evaluation_id=job.evaluation_id)
    latest = versions.order_by("-created", "-pk").first()
    who = job.requested_by or "reports"
    if latest is not None:
        return offered_version(latest, who=who)
    if job.report_kind == Report.Kind.GATE:
        return create_gate_report(job.gate, job.evaluation, language=job.language, who=who)
    return create_procurement_report(job.pilot, language=job.language, who=who)


def carry_out(job: ReportJob) -> ReportJob:
    """Do one report job (a worker's part, reports.tasks): render, or countersign the version the approver named.
    The row ends `done` (result: the report made or countersigned), `stale` (nothing signed; result: the version
    to read now, the reason as made in `reason`, in English in `error`) or `error` (the reason) — never left
    running."""
    state, result, error, reason = ReportJob.State.ERROR, None, "", None
    try:
        if job.kind == ReportJob.Kind.COUNTERSIGN:
            try:
                result = countersign(job.source, job.requested_by, sha256=job.sha256)
                state = ReportJob.State.DONE
            except ReportChanged as changed:
                state, error, reason = ReportJob.State.STALE, changed.reason, changed.finding
                result = offered_version(changed.report, who=job.requested_by or "reports")
        else:
            result, state = _render(job), ReportJob.State.DONE
    except Exception as exc:  # noqa: BLE001 — said on the page that follows the job, logged by the task
        error = f"{type(exc).__name__}: {getattr(exc, 'message', None) or exc}"
        if state != ReportJob.State.STALE:
            state = ReportJob.State.ERROR
    ReportJob.objects.filter(pk=job.pk).update(state=state, result=result, error=error[:4000], reason=reason,
                                               finished=timezone.now())
    job.refresh_from_db()
    return job


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
