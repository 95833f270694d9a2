"""Who must act next, for many pilots at once, and telling them: a row on their home page and one email.

`sweep()` is idempotent (one notification per person and event, by key): the portal calls it after
each action, and a periodic task or `manage.py notify` may call it to catch what workers changed
(a host key seen on first contact, a run that ended, a verdict that awaits sign-off).

Emails are never sent inside the request or task that creates the notification: `email_notification`,
a Celery task on the control queue, sends each one once the row is committed and retries with a
growing delay while the mail server is down (the home page shows the notification meanwhile).
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Iterable
from datetime import timedelta

from celery import shared_task
from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.mail import send_mail
from django.db import IntegrityError, transaction
from django.urls import reverse
from django.utils import timezone, translation
from django.utils.translation import gettext as _

from gates.lifecycle import FINAL, NextAction
from gates.models import Membership, Notification, Pilot, Profile
from runners.models import FINISHED, Job, Node
from runners.pending import pending_actions_by_pilot

log = logging.getLogger(__name__)

RUN_NOTICE_WINDOW = timedelta(days=7)


def _members(pilot: Pilot, roles: Iterable[str] | None = None) -> list:
    memberships = Membership.objects.filter(
        organisation_id__in=[pilot.customer_id, pilot.vendor_id], user__is_active=True
    )
    if roles is not None:
        memberships = memberships.filter(role__in=list(roles))
    User = get_user_model()
    return list(User.objects.filter(pk__in=memberships.values("user_id")))


def notify(
    users: Iterable, *, pilot: Pilot | None, key: str, kind: str, subject: Callable[[], str], url: str = ""
) -> list[Notification]:
    """One notification per person and key; the first time only, with an email, both in the person's language."""
    key = key[:120]
    users = list(users)
    already = set(Notification.objects.filter(key=key, user__in=users).values_list("user_id", flat=True))
    languages = dict(Profile.objects.filter(user__in=users).values_list("user_id", "language"))
    created = []
    for user in users:
        if user.pk in already:
            continue
        with translation.override(languages.get(user.pk) or settings.LANGUAGE_CODE):
            text = str(subject())[:300]
            try:
                with transaction.atomic():
                    note = Notification.objects.create(
                        user=user, pilot=pilot, key=key, kind=kind, subject=text, url=url
                    )
            except IntegrityError:
                continue
            created.append(note)
            if user.email:
                queue_email(note)
    return created


def queue_email(note: Notification) -> None:
    """Send the email of a notification from a worker, once the row is committed."""
    transaction.on_commit(lambda: email_notification.apply_async((note.pk,)))


class MailDown(Exception):
    """The mail server refused or could not be reached: the task retries later."""


@shared_task(name="gates.notifications.email_notification", bind=True, autoretry_for=(MailDown,), retry_backoff=30,
             retry_backoff_max=1800, retry_jitter=True, max_retries=10, ignore_result=True, acks_late=True)
def email_notification(self, note_id: int) -> str:
    return send_email(note_id)


def send_email(note_id: int) -> str:
    """Email one notification in its recipient's language; idempotent (a sent one is not sent again)."""
    note = Notification.objects.select_related("user").filter(pk=note_id).first()
    if note is None or note.emailed or not note.user.email:
        return "nothing to send"
    user = note.user
    language = Profile.objects.filter(user=user).values_list("language", flat=True).first()
    with translation.override(language or settings.LANGUAGE_CODE):
        link = settings.SITE_URL.rstrip("/") + note.url if note.url else ""
        body = "\n\n".join(part for part in (note.subject, _("Open it in the portal:"), link) if part)
    try:
        send_mail(f"[fxpilot] {note.subject}", body, None, [user.email])
    except OSError as error:  # smtplib's errors are OSErrors
        log.warning("could not email notification %s to user %s (will retry): %s", note.key, user.pk, error)
        raise MailDown(str(error)) from None
    Notification.objects.filter(pk=note.pk).update(emailed=True)
    return "sent"


def _action_notice(action: str, pilot: Pilot, subject) -> tuple[str, Callable[[], str], str]:
    """(key, subject line, url) for a pending action."""
    if action == NextAction.ACCEPT_HOST_KEY:
        return (
            f"host_key:{subject.code}:{subject.pending_host_key_fingerprint}",
            lambda: _host_key_subject(subject, pilot),
            reverse("node", args=[subject.code]),
        )
    if action == NextAction.COUNTERSIGN_REPORT:
        return (
            f"countersign_report:{subject.code}",
            lambda: _("%(pilot)s: read and countersign the procurement report (version %(number)s)")
            % {"pilot": pilot.name, "number": subject.version},
            reverse("reports", args=[pilot.code]),
        )
    if action == NextAction.COUNTERSIGN_GATE_REPORT:
        return (
            f"countersign_gate_report:{subject.code}",
            lambda: _("%(pilot)s: read and countersign the %(gate)s report (version %(number)s)")
            % {"pilot": pilot.name, "gate": subject.gate.label, "number": subject.version},
            reverse("reports", args=[pilot.code]),
        )
    if action == NextAction.SIGN_PLAN:
        return (
            f"sign_plan:{subject.pk}",
            lambda: _("%(pilot)s: sign plan v%(number)s") % {"pilot": pilot.name, "number": subject.number},
            reverse("plan", args=[pilot.code]),
        )
    return (
        f"{action}:{subject.pk}",
        lambda: f"{pilot.name}: {NextAction(action).label} — {subject.label}",
        reverse("gate", args=[pilot.code, subject.number]),
    )


def _host_key_subject(node: Node, pilot: Pilot, fingerprint: str | None = None) -> str:
    return _("%(pilot)s: accept the host key of %(node)s (%(fingerprint)s)") % {
        "pilot": pilot.name, "node": node.name,
        "fingerprint": node.pending_host_key_fingerprint if fingerprint is None else fingerprint}


def _run_subject(job: Job, pilot: Pilot) -> str:
    return _("%(pilot)s: %(what)s run ended — %(status)s") % {
        "pilot": pilot.name, "what": job.gate.label if job.gate_id else job.get_kind_display(),
        "status": job.get_status_display()}


def _subject_again(note: Notification) -> str | None:
    """A notification's subject made again from what its key names, in the active language (None: it is gone)."""
    kind, _sep, rest = note.key.partition(":")
    ident = rest.split(":")[0]
    pilot = note.pilot
    if pilot is None or not ident:
        return None
    if note.kind == NextAction.ACCEPT_HOST_KEY:
        node = Node.objects.filter(code=ident).first() if _is_uuid(ident) else None
        return _host_key_subject(node, pilot, rest.partition(":")[2]) if node is not None else None
    if note.kind == "run_finished":
        job = Job.objects.filter(code=ident).select_related("gate").first() if _is_uuid(ident) else None
        return _run_subject(job, pilot) if job is not None else None
    if note.kind in (NextAction.COUNTERSIGN_REPORT, NextAction.COUNTERSIGN_GATE_REPORT):
        report = pilot.reports.filter(code=ident).select_related("gate").first() if _is_uuid(ident) else None
        return _action_notice(kind, pilot, report)[1]() if report is not None else None
    if note.kind == NextAction.SIGN_PLAN and ident.isdigit():
        version = pilot.plan_versions.filter(pk=int(ident)).first()
        return _action_notice(kind, pilot, version)[1]() if version is not None else None
    if note.kind in NextAction.values and ident.isdigit():
        gate = pilot.gates.filter(pk=int(ident)).first()
        return _action_notice(kind, pilot, gate)[1]() if gate is not None else None
    return None


def _is_uuid(text: str) -> bool:
    try:
        uuid.UUID(text)
    except ValueError:
        return False
    return True


def relocalise(user, language: str, limit: int = 100) -> int:
    """A person who changed their language reads their latest notifications in it; returns how many changed."""
    changed = 0
    with translation.override(language):
        for note in Notification.objects.filter(user=user).select_related("pilot")[:limit]:
            text = _subject_again(note)
            if text is not None and text[:300] != note.subject:
                Notification.objects.filter(pk=note.pk).update(subject=text[:300])
                changed += 1
    return changed


def sweep(pilots: Iterable[Pilot] | None = None) -> int:
    """Notify everyone who must act now, and everyone concerned by a run that ended. Returns how many were created."""
    if pilots is None:  # live pilots, and ended ones whose procurement or gate report may still await a countersignature
        pilots = list(Pilot.objects.exclude(state__in=FINAL)) + list(
            Pilot.objects.filter(state__in=FINAL, reports__countersigned_by__isnull=True).distinct())
    pilots = list(pilots)
    by_id = {p.pk: p for p in pilots}
    count = 0
    for pilot_id, actions in pending_actions_by_pilot(pilots).items():
        pilot = by_id[pilot_id]
        for action in actions:
            if action["action"] == NextAction.RUN_GATE:
                continue  # a standing task of the vendor engineer: shown on the home page, not emailed
            key, subject, url = _action_notice(action["action"], pilot, action["subject"])
            if action.get("evaluation_id"):
                key += f":{action['evaluation_id']}"
            count += len(
                notify(
                    _members(pilot, [action["role"]]),
                    pilot=pilot,
                    key=key,
                    kind=action["action"],
                    subject=subject,
                    url=url,
                )
            )
    since = timezone.now() - RUN_NOTICE_WINDOW
    for job in Job.objects.filter(pilot_id__in=list(by_id), status__in=FINISHED, finished__gte=since).select_related(
        "gate"
    ):
        pilot = by_id[job.pilot_id]
        count += len(
            notify(
                _members(pilot),
                pilot=pilot,
                kind="run_finished",
                key=f"run_finished:{job.code}",
                subject=lambda job=job, pilot=pilot: _run_subject(job, pilot),
                url=reverse("run", args=[job.code]),
            )
        )
    return count
