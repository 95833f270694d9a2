"""Who may see and do what: the one access policy of the portal, the API and every download.

A capability is a set of roles; it travels with the query, so the portal's pages, the JSON API and the
file downloads ask the same question the same way:

    Pilot.objects.for_user(user, may=RAW_DATA)          pilots where the person may take raw data
    Artifact.objects.for_user(user, may=RAW_DATA)       (runners.models; Job and Report likewise)
    artifact_for(user, code, may=RAW_DATA)              one object: 404 outside the pilot, 403 without the role

Objects of a pilot the person does not belong to answer 404 (their existence is not revealed); a member
whose role lacks the capability gets 403, and the page does not offer the action. Stored files go out
through serve_stored (one place: the name stays inside the evidence store, the SHA-256 is checked while
streaming and sent as a header, the content type is fixed and not sniffed). What each role sees of the
evidence is written down in docs/portal.md ("Who sees what").
"""

from __future__ import annotations

import hashlib
import re
from uuid import UUID

from django.core.exceptions import PermissionDenied, SuspiciousFileOperation
from django.core.files.storage import storages
from django.http import Http404, HttpRequest, StreamingHttpResponse
from django.shortcuts import get_object_or_404

from gates import policy
from gates.models import Gate, Pilot, Report, Role
from gates.policy import Act, roles_of
from runners.models import Artifact, Job

CHUNK = 1 << 20

# Capabilities: the roles that hold them (gates.policy.ROLES). VIEW is any membership of the pilot's two organisations.
VIEW = frozenset(Role.values)
OPERATE = policy.ROLES[Act.OPERATE_NODES]
SIGN = policy.SIGNERS
EDIT_PLAN = policy.PLAN_EDITORS
# Raw records, server logs, every stored artifact and the signed reports (which carry them as attachments).
RAW_DATA = policy.ROLES[Act.TAKE_RAW_DATA]

REFUSED = {
    RAW_DATA: "Your role in this pilot does not include raw data (artifacts, logs and the reports that attach them).",
    OPERATE: "Only a vendor engineer of this pilot may do this.",
    SIGN: "Only the vendor lead or the customer approver of this pilot may sign.",
    EDIT_PLAN: "Your role in this pilot may not change the plan.",
}

__all__ = ["roles_of"]


def offers(pilot: Pilot, user, act: Act, subject) -> bool:
    """Whether a page offers `act` on `subject` to this person (gates.policy, the rule the action refuses by)."""
    if act in (Act.SIGN_PLAN, Act.SIGN_OFF_GATE):  # and never for a second party (policy.other_party_refusal)
        return policy.may_sign(act, subject, user, roles_of(pilot, user))
    return policy.may(act, subject, roles_of(pilot, user))


def require_act(pilot: Pilot, user, act: Act) -> frozenset[str]:
    """404 for a person outside the pilot, 403 for a member whose roles may never do `act` (its state is the action's)."""
    return require_role(pilot, user, policy.ROLES[act])


def require_role(pilot: Pilot, user, roles: frozenset[str]) -> frozenset[str]:
    """404 for a person outside the pilot, 403 for a member whose roles do not include one of `roles`."""
    mine = roles_of(pilot, user)
    if not mine:
        raise Http404("No such pilot")
    if not mine & roles:
        raise PermissionDenied(REFUSED.get(roles, "Your role in this pilot does not allow this."))
    return mine


# ── One object, for a person: 404 outside the pilot, 403 without the capability ───────────────


def pilot_for(user, code: UUID, may: frozenset[str] = VIEW) -> Pilot:
    pilot = get_object_or_404(Pilot.objects.for_user(user).select_related("customer", "vendor"), code=code)
    require_role(pilot, user, may)
    return pilot


def gate_for(user, code: UUID, number: int, may: frozenset[str] = VIEW) -> Gate:
    pilot = pilot_for(user, code, may)
    gate = get_object_or_404(Gate, pilot=pilot, number=number)
    gate.pilot = pilot
    return gate


def report_for(user, code: UUID, may: frozenset[str] = VIEW) -> Report:
    report = get_object_or_404(
        Report.objects.for_user(user).select_related("pilot__customer", "pilot__vendor", "gate"), code=code
    )
    require_role(report.pilot, user, may)
    return report


def job_for(user, code: UUID, may: frozenset[str] = VIEW) -> Job:
    job = get_object_or_404(
        Job.objects.for_user(user).select_related("gate", "pilot__customer", "pilot__vendor"), code=code
    )
    require_role(job.pilot, user, may)
    return job


def artifact_for(user, code: UUID, may: frozenset[str] = RAW_DATA) -> Artifact:
    artifact = get_object_or_404(
        Artifact.objects.for_user(user).select_related("job__pilot__customer", "job__pilot__vendor"), code=code
    )
    require_role(artifact.job.pilot, user, may)
    return artifact


def object_for(user, queryset, code: UUID, pilot_path: str, may: frozenset[str] = VIEW):
    """Any object reached through its parent pilot (`pilot_path` is the lookup to it, e.g. "site__pilot")."""
    obj = get_object_or_404(queryset, code=code, **{f"{pilot_path}__in": Pilot.objects.for_user(user)})
    pilot = obj
    for part in pilot_path.split("__"):
        pilot = getattr(pilot, part)
    require_role(pilot, user, may)
    return obj, pilot


# ── The portal's request-based forms of the same ──────────────────────────────────────────────


def pilots_for(request: HttpRequest, may: frozenset[str] | None = None):
    return Pilot.objects.for_user(request.user, may=may).select_related("customer", "vendor")


def get_pilot_for_user(request: HttpRequest, code: UUID, may: frozenset[str] = VIEW) -> Pilot:
    return pilot_for(request.user, code, may)


def get_gate_for_user(request: HttpRequest, code: UUID, number: int, may: frozenset[str] = VIEW) -> Gate:
    return gate_for(request.user, code, number, may)


def get_report_for_user(request: HttpRequest, code: UUID, may: frozenset[str] = VIEW) -> Report:
    return report_for(request.user, code, may)


def get_for_user(request: HttpRequest, queryset, code: UUID, pilot_path: str, may: frozenset[str] = VIEW):
    return object_for(request.user, queryset, code, pilot_path, may)


# ── Serving a stored file ─────────────────────────────────────────────────────────────────────

_SAFE_NAME = re.compile(r"[^A-Za-z0-9._-]+")


def _contained(name: str) -> str:
    """A storage name that cannot leave the evidence store: relative, no '..', no NUL or backslash."""
    parts = name.split("/")
    if not name or name.startswith("/") or "\\" in name or "\x00" in name or any(p in ("", ".", "..") for p in parts):
        raise Http404("The file is missing")
    return name


def download_name(text: str) -> str:
    """A file name for Content-Disposition: letters, digits and . _ - only."""
    return _SAFE_NAME.sub("_", text).strip("._") or "download"


def serve_stored(name: str, sha256: str, *, filename: str, content_type: str, size: int | None = None):
    """Stream a stored file (artifact or report) from the evidence store as an attachment.

    The name must stay inside the store (which refuses anything outside it too); a missing file answers
    404, and so does one whose first megabyte-chunks already show it no longer hashes to `sha256` (a small
    file is read whole before the answer starts); a large file whose end does not match stops before its
    last chunk. The SHA-256 goes out as X-Content-SHA256, the content type is fixed and not sniffed.
    """
    storage = storages["evidence"]
    try:
        handle = storage.open(_contained(name), "rb")
    except (OSError, SuspiciousFileOperation, ValueError):
        raise Http404("The file is missing") from None
    digest = hashlib.sha256()
    first = handle.read(CHUNK)
    digest.update(first)
    following = handle.read(CHUNK)
    if not following:
        handle.close()
        if digest.hexdigest() != sha256:
            raise Http404("The stored file no longer matches its hash")

    def stream():
        try:
            previous, block = first, following
            while block:
                digest.update(block)
                yield previous
                previous, block = block, handle.read(CHUNK)
            if digest.hexdigest() != sha256:
                raise OSError(f"{name}: the stored file no longer hashes to {sha256}; the download was cut short")
            yield previous
        finally:
            handle.close()

    response = StreamingHttpResponse(stream() if following else iter([first]), content_type=content_type)
    response["Content-Disposition"] = f'attachment; filename="{download_name(filename)}"'
    response["X-Content-SHA256"] = sha256
    response["X-Content-Type-Options"] = "nosniff"
    response["Cache-Control"] = "private, no-store"
    if size is not None:
        response["Content-Length"] = str(size)
    return response


def serve_artifact(artifact: Artifact) -> StreamingHttpResponse:
    return serve_stored(artifact.storage_name, artifact.sha256, filename=artifact.name.replace("/", "_"),
                        content_type="application/octet-stream", size=artifact.size)


def serve_report(report: Report) -> StreamingHttpResponse:
    gate = report.gate.label if report.gate_id else "pilot"
    return serve_stored(report.path, report.sha256, filename=f"fxpilot-{report.kind}-{gate}-{report.language}.pdf",
                        content_type="application/pdf", size=report.size)
