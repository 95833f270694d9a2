"""What must be proven and whether it was: organisations, pilots, plans, gates, sign-offs, audit.

State fields (Pilot.state, Gate.state, PlanVersion.state) are written only by gates.lifecycle.
"""
from __future__ import annotations

import uuid
from datetime import date, timedelta

from django.conf import settings
from django.db import models
from django.db.models import Q
from django.utils import timezone
from django.utils.translation import gettext_lazy as _

from gates.plan import plan_from_version


class Organisation(models.Model):
    class Kind(models.TextChoices):
        VENDOR = "vendor", _("Vendor")
        CUSTOMER = "customer", _("Customer")

    name = models.CharField(max_length=200, unique=True)
    kind = models.CharField(max_length=16, choices=Kind.choices)
    created = models.DateTimeField(default=timezone.now)

    def __str__(self) -> str:
        return self.name


class Role(models.TextChoices):
    VENDOR_ENGINEER = "vendor_engineer", _("Vendor engineer")
    VENDOR_LEAD = "vendor_lead", _("Vendor lead")
    CUSTOMER_ENGINEER = "customer_engineer", _("Customer engineer")
    CUSTOMER_APPROVER = "customer_approver", _("Customer approver")
    VIEWER = "viewer", _("Viewer")


VENDOR_ROLES = {Role.VENDOR_ENGINEER, Role.VENDOR_LEAD}
CUSTOMER_ROLES = {Role.CUSTOMER_ENGINEER, Role.CUSTOMER_APPROVER}


class Party(models.TextChoices):
    VENDOR = "vendor", _("Vendor")
    CUSTOMER = "customer", _("Customer")


class Membership(models.Model):
    """One role of one person in one organisation; a person may hold several roles."""

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="memberships")
    organisation = models.ForeignKey(Organisation, on_delete=models.CASCADE, related_name="memberships")
    role = models.CharField(max_length=32, choices=Role.choices)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["user", "organisation", "role"], name="unique_membership_role")]

    def clean(self) -> None:
        from django.core.exceptions import ValidationError

        if self.role in VENDOR_ROLES and self.organisation.kind != Organisation.Kind.VENDOR:
            raise ValidationError({"role": _("Vendor roles belong to a vendor organisation.")})
        if self.role in CUSTOMER_ROLES and self.organisation.kind != Organisation.Kind.CUSTOMER:
            raise ValidationError({"role": _("Customer roles belong to a customer organisation.")})

    def __str__(self) -> str:
        return f"{self.user} — {self.get_role_display()} @ {self.organisation}"


class PilotQuerySet(models.QuerySet):
    def for_user(self, user, may=None) -> PilotQuerySet:
        """The only way a request reaches pilots: those of an organisation the person belongs to.

        `may` (a set of roles, e.g. portal.access.RAW_DATA) keeps only the pilots where the person holds
        one of them, in the pilot's customer or vendor organisation; None means any role.
        """
        if not getattr(user, "is_authenticated", False) or not getattr(user, "is_active", True):
            return self.none()
        memberships = Membership.objects.filter(user=user)
        if may is not None:
            memberships = memberships.filter(role__in=list(may))
        org_ids = memberships.values("organisation_id")
        return self.filter(Q(customer_id__in=org_ids) | Q(vendor_id__in=org_ids))


class Pilot(models.Model):
    class State(models.TextChoices):
        DRAFT = "draft", _("Draft — plan not yet signed")
        ACTIVE = "active", _("Active")
        COMPLETED = "completed", _("Completed")
        HALTED = "halted", _("Halted")

    code = models.UUIDField(default=uuid.uuid4, unique=True, editable=False)
    name = models.CharField(max_length=200)
    customer = models.ForeignKey(Organisation, on_delete=models.PROTECT, related_name="customer_pilots")
    vendor = models.ForeignKey(Organisation, on_delete=models.PROTECT, related_name="vendor_pilots")
    model_under_test = models.CharField(max_length=100, default="FX100")
    llm_model = models.CharField(max_length=200, default="Qwen/Qwen3-Coder-480B-A35B-Instruct-FP8")
    start_date = models.DateField(default=date.today)
    state = models.CharField(max_length=16, choices=State.choices, default=State.DRAFT, editable=False)
    current_gate = models.PositiveSmallIntegerField(default=0, editable=False)
    halted_reason = models.TextField(blank=True, editable=False)
    # Deployment settings (model, ports, paths, FX target, sizes); validated by runners.config.
    deployment = models.JSONField(default=dict, blank=True)
    # The customer's traffic, for the projection and the sizing note of the procurement report.
    customer_concurrency = models.PositiveIntegerField(default=16)
    sessions_kept = models.PositiveIntegerField(default=10000)
    # Capacity sizing settings (gates.sizing.DEFAULTS): KV dtype, overhead, redundancy, headroom, FX unit capacity.
    sizing = models.JSONField(default=dict, blank=True)
    created = models.DateTimeField(default=timezone.now)

    objects = PilotQuerySet.as_manager()

    class Meta:
        ordering = ["-created"]

    def __str__(self) -> str:
        return self.name

    @property
    def signed_plan(self) -> PlanVersion | None:
        return self.plan_versions.filter(state=PlanVersion.State.SIGNED).order_by("-number").first()

    @property
    def latest_plan(self) -> PlanVersion | None:
        return self.plan_versions.order_by("-number").first()

    def gate(self, number: int) -> Gate:
        return self.gates.get(number=number)

    def week_start_date(self, week: int) -> date:
        return self.start_date + timedelta(weeks=week - 1)


class PlanFrozenError(Exception):
    """A change to a signed (or superseded) plan version or its criteria: refused, whoever asks."""


class PlanTamperedError(ValueError):
    """The rows of a signed plan no longer hash to what both parties signed: nothing may be judged with it."""


# A plan version in these states is frozen; the database refuses changes too (migration 0005).
FROZEN_PLAN_STATES = ("signed", "superseded")
# Of a frozen version only its state may move, from signed to superseded (a newer version was signed).
PLAN_VERSION_FIELDS = ("pilot_id", "number", "state", "source", "document", "sha256", "signed_at")


class PlanVersionQuerySet(models.QuerySet):
    def update(self, **kwargs):
        frozen = self.filter(state__in=FROZEN_PLAN_STATES)
        supersede_only = set(kwargs) == {"state"} and kwargs["state"] == "superseded"
        if supersede_only and not frozen.exclude(state="signed").exists():
            return super().update(**kwargs)
        if frozen.exists():
            raise PlanFrozenError(
                f"refused: {', '.join(sorted(kwargs))} of a signed plan version cannot change; amend the plan instead"
            )
        return super().update(**kwargs)

    def delete(self):
        if self.filter(state__in=FROZEN_PLAN_STATES).exists():
            raise PlanFrozenError("refused: a signed plan version cannot be deleted")
        return super().delete()


class CriterionQuerySet(models.QuerySet):
    def _refuse_if_frozen(self, what: str) -> None:
        frozen = self.filter(plan_version__state__in=FROZEN_PLAN_STATES).values_list("key", flat=True)[:5]
        if frozen:
            raise PlanFrozenError(
                f"refused: {what} criteria of a signed plan version ({', '.join(frozen)}); amend the plan instead"
            )

    def update(self, **kwargs):
        self._refuse_if_frozen(f"changing {', '.join(sorted(kwargs))} of")
        return super().update(**kwargs)

    def delete(self):
        self._refuse_if_frozen("deleting")
        return super().delete()

    def bulk_create(self, objs, *args, **kwargs):
        objs = list(objs)
        versions = {obj.plan_version_id for obj in objs}
        if PlanVersion.objects.filter(pk__in=versions, state__in=FROZEN_PLAN_STATES).exists():
            raise PlanFrozenError("refused: adding criteria to a signed plan version; amend the plan instead")
        return super().bulk_create(objs, *args, **kwargs)


class PlanVersion(models.Model):
    """The criteria both parties sign. Frozen once signed; a change makes version n+1."""

    class State(models.TextChoices):
        DRAFT = "draft", _("Draft")
        SIGNED = "signed", _("Signed by both parties")
        SUPERSEDED = "superseded", _("Superseded")

    pilot = models.ForeignKey(Pilot, on_delete=models.CASCADE, related_name="plan_versions")
    number = models.PositiveIntegerField()
    state = models.CharField(max_length=16, choices=State.choices, default=State.DRAFT, editable=False)
    source = models.CharField(max_length=200, help_text="Plan file this version started from")
    # The plan document without its criteria (gate names, weeks, workloads, caps); criteria are rows.
    document = models.JSONField(default=dict)
    sha256 = models.CharField(max_length=64, blank=True, editable=False, help_text="Of the canonical plan at signing")
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    created = models.DateTimeField(default=timezone.now)
    signed_at = models.DateTimeField(null=True, blank=True, editable=False)

    objects = PlanVersionQuerySet.as_manager()

    class Meta:
        constraints = [models.UniqueConstraint(fields=["pilot", "number"], name="unique_plan_number")]
        ordering = ["pilot", "number"]

    def __str__(self) -> str:
        return f"{self.pilot} plan v{self.number}"

    @property
    def is_frozen(self) -> bool:
        return self.state != self.State.DRAFT

    def save(self, *args, **kwargs):
        if self.pk is not None:
            stored = PlanVersion.objects.filter(pk=self.pk).values(*PLAN_VERSION_FIELDS).first()
            if stored is not None and stored["state"] in FROZEN_PLAN_STATES:
                changed = [name for name in PLAN_VERSION_FIELDS if getattr(self, name) != stored[name]]
                superseded = changed == ["state"] and stored["state"] == "signed" and self.state == "superseded"
                if changed and not superseded:
                    raise PlanFrozenError(
                        f"refused: plan v{stored['number']} is {stored['state']} and frozen; "
                        f"{', '.join(changed)} cannot change (amend the plan to make a new version)"
                    )
        super().save(*args, **kwargs)

    def delete(self, *args, **kwargs):
        if PlanVersion.objects.filter(pk=self.pk, state__in=FROZEN_PLAN_STATES).exists():
            raise PlanFrozenError(f"refused: plan v{self.number} is signed; a signed plan version cannot be deleted")
        return super().delete(*args, **kwargs)

    def verified_plan(self):
        """The plan to judge with, rebuilt from the rows and checked against what both parties signed.

        Raises PlanTamperedError when this version is not signed, or when its criteria or settings hash
        to anything but the signed SHA-256 (and the hash each party approved).
        """
        if self.state == self.State.DRAFT or not self.sha256:
            raise PlanTamperedError(f"plan v{self.number} is not signed by both parties; nothing is judged against it")
        plan = self.to_plan()
        approved = set(
            self.signoffs.filter(decision="approve").values_list("evidence_sha256", flat=True)
        )
        if plan.sha256 != self.sha256 or approved != {self.sha256}:
            raise PlanTamperedError(
                f"plan v{self.number} of {self.pilot.name} now hashes to {plan.sha256}, but both parties signed "
                f"{self.sha256}: its criteria or settings were changed after signing, so nothing is judged against it"
            )
        return plan

    def to_plan(self):
        """The plan as the judge sees it (gates.plan.Plan), built from the document and the criterion rows."""
        return plan_from_version(self)


class Criterion(models.Model):
    class Comparison(models.TextChoices):
        ABSOLUTE = "absolute", _("absolute value")
        SPEEDUP = "speedup", _("speed-up (baseline ÷ candidate)")
        REDUCTION = "reduction", _("reduction (1 − candidate ÷ baseline)")
        GAIN = "gain", _("gain (candidate ÷ baseline − 1)")
        DRIFT = "drift", _("drift (last window ÷ first window − 1)")

    plan_version = models.ForeignKey(PlanVersion, on_delete=models.CASCADE, related_name="criteria")
    gate_number = models.PositiveSmallIntegerField()
    key = models.SlugField(max_length=64)
    description = models.CharField(max_length=300)
    description_zh = models.CharField(max_length=300, blank=True)
    metric = models.CharField(max_length=32)
    statistic = models.CharField(max_length=16)
    comparison = models.CharField(max_length=16, choices=Comparison.choices)
    candidate = models.CharField(max_length=32, blank=True, help_text="Arm measured")
    baseline = models.CharField(max_length=32, blank=True, help_text="Arm compared against")
    phase = models.CharField(max_length=16, default="measure")
    concurrency = models.JSONField(default=list, blank=True, help_text="Concurrency levels; each must pass")
    op = models.CharField(max_length=2, choices=[(">=", "≥"), ("<=", "≤"), (">", ">"), ("<", "<"), ("==", "=")])
    threshold = models.FloatField()
    unit = models.CharField(max_length=32, blank=True)
    confidence = models.FloatField(default=0.95)
    position = models.PositiveSmallIntegerField(default=0)

    objects = CriterionQuerySet.as_manager()

    class Meta:
        ordering = ["gate_number", "position"]
        constraints = [models.UniqueConstraint(fields=["plan_version", "key"], name="unique_criterion_key")]

    def __str__(self) -> str:
        return f"G{self.gate_number} {self.key}"

    def _refuse_if_frozen(self, what: str) -> None:
        versions = {self.plan_version_id}
        if self.pk is not None:
            versions |= set(Criterion.objects.filter(pk=self.pk).values_list("plan_version_id", flat=True))
        frozen = PlanVersion.objects.filter(pk__in=versions, state__in=FROZEN_PLAN_STATES).values_list("number", flat=True)
        if frozen:
            raise PlanFrozenError(
                f"refused: {what} {self.key} of plan v{frozen[0]}, which is signed and frozen; amend the plan instead"
            )

    def save(self, *args, **kwargs):
        self._refuse_if_frozen("changing" if self.pk is not None else "adding")
        super().save(*args, **kwargs)

    def delete(self, *args, **kwargs):
        self._refuse_if_frozen("deleting")
        return super().delete(*args, **kwargs)


class Gate(models.Model):
    class State(models.TextChoices):
        PENDING = "pending", _("Not yet open")
        OPEN = "open", _("Open")
        REVIEW = "review", _("Paused for joint review")
        AWAITING_SIGNOFF = "awaiting_signoff", _("Passed — awaiting sign-off")
        SIGNED_OFF = "signed_off", _("Signed off")
        FAILED = "failed", _("Failed")

    class Verdict(models.TextChoices):
        NONE = "", _("Not evaluated")
        PASS = "pass", _("Pass")
        MARGINAL = "marginal", _("Marginal")
        FAIL = "fail", _("Fail")
        INVALID = "invalid", _("Invalid")

    pilot = models.ForeignKey(Pilot, on_delete=models.CASCADE, related_name="gates")
    number = models.PositiveSmallIntegerField()
    name = models.CharField(max_length=100)
    name_zh = models.CharField(max_length=100, blank=True)
    week_start = models.PositiveSmallIntegerField()
    week_end = models.PositiveSmallIntegerField()
    state = models.CharField(max_length=20, choices=State.choices, default=State.PENDING, editable=False)
    verdict = models.CharField(max_length=10, choices=Verdict.choices, default="", blank=True, editable=False)
    opened_at = models.DateTimeField(null=True, blank=True, editable=False)
    closed_at = models.DateTimeField(null=True, blank=True, editable=False)

    class Meta:
        ordering = ["pilot", "number"]
        constraints = [models.UniqueConstraint(fields=["pilot", "number"], name="unique_gate_number")]

    def __str__(self) -> str:
        return f"G{self.number} {self.name}"

    @property
    def label(self) -> str:
        return f"G{self.number}"

    @property
    def planned_start(self) -> date:
        return self.pilot.week_start_date(self.week_start)

    @property
    def planned_end(self) -> date:
        return self.pilot.week_start_date(self.week_end) + timedelta(days=6)

    @property
    def is_overdue(self) -> bool:
        return self.state in (self.State.PENDING, self.State.OPEN, self.State.REVIEW, self.State.AWAITING_SIGNOFF) and (
            timezone.localdate() > self.planned_end
        )

    @property
    def latest_evaluation(self) -> Evaluation | None:
        return self.evaluations.order_by("-created", "-id").first()


class Evaluation(models.Model):
    """One judgement of a gate: the verdicts with their explanations and the exact inputs."""

    gate = models.ForeignKey(Gate, on_delete=models.CASCADE, related_name="evaluations")
    job = models.ForeignKey("runners.Job", null=True, blank=True, on_delete=models.SET_NULL, related_name="evaluations")
    plan_version = models.ForeignKey(PlanVersion, on_delete=models.PROTECT, related_name="evaluations")
    verdict = models.CharField(max_length=10, choices=Gate.Verdict.choices)
    result = models.JSONField(default=dict, help_text="The judge's full output (see docs/judge.md)")
    inputs = models.JSONField(default=dict, help_text="Artifact name → SHA-256 of every input")
    simulated = models.BooleanField(default=False)
    created = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["-created"]

    def __str__(self) -> str:
        return f"{self.gate} {self.verdict} @ {self.created:%Y-%m-%d %H:%M}"


class SignOff(models.Model):
    """A decision by one party, with the hash of the evidence the person saw. Rows, never booleans."""

    class Decision(models.TextChoices):
        APPROVE = "approve", _("Approve")
        REJECT = "reject", _("Reject")

    pilot = models.ForeignKey(Pilot, on_delete=models.CASCADE, related_name="signoffs")
    plan_version = models.ForeignKey(PlanVersion, null=True, blank=True, on_delete=models.CASCADE, related_name="signoffs")
    gate = models.ForeignKey(Gate, null=True, blank=True, on_delete=models.CASCADE, related_name="signoffs")
    evaluation = models.ForeignKey(Evaluation, null=True, blank=True, on_delete=models.CASCADE, related_name="signoffs")
    party = models.CharField(max_length=16, choices=Party.choices)
    person = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="signoffs")
    role = models.CharField(max_length=32, choices=Role.choices)
    decision = models.CharField(max_length=10, choices=Decision.choices)
    comment = models.TextField(blank=True)
    evidence_sha256 = models.CharField(max_length=64)
    created = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["created"]
        constraints = [
            models.CheckConstraint(
                condition=Q(plan_version__isnull=False, gate__isnull=True) | Q(plan_version__isnull=True, gate__isnull=False),
                name="signoff_has_one_subject",
            ),
        ]

    def __str__(self) -> str:
        subject = self.gate or self.plan_version
        return f"{self.get_decision_display()} {subject} by {self.person} ({self.party})"


class AuditQuerySet(models.QuerySet):
    def update(self, **kwargs):  # noqa: ARG002
        raise PermissionError("The audit log is append-only.")

    def delete(self):
        raise PermissionError("The audit log is append-only.")


class AuditAction(models.TextChoices):
    """Every action the audit log records, with its words in the reader's language; nothing else can be written."""

    PILOT_CREATED = "pilot.created", _("pilot created")
    PILOT_ACTIVATED = "pilot.activated", _("pilot activated")
    PILOT_COMPLETED = "pilot.completed", _("pilot completed")
    PILOT_HALTED = "pilot.halted", _("pilot halted")
    PILOT_SIZING_SET = "pilot.sizing_set", _("capacity sizing settings set")
    PLAN_VERSION_CREATED = "plan.version_created", _("plan version created")
    PLAN_APPROVE = "plan.approve", _("plan approved")
    PLAN_REJECT = "plan.reject", _("plan rejected")
    PLAN_SIGNED = "plan.signed", _("plan signed by both parties")
    PLAN_SUPERSEDED = "plan.superseded", _("plan superseded")
    PLAN_SAMPLE_TRACE = "plan.sample_trace", _("G4's permission to replay a generated sample trace changed")
    PLAN_SAMPLE_TRACE_UNSIGNED = "plan.sample_trace_unsigned", _(
        "generated sample trace no longer allowed for G4: it was not part of what was signed")
    CRITERION_EDITED = "criterion.edited", _("criterion changed")
    GATE_OPENED = "gate.opened", _("gate opened")
    GATE_VERDICT = "gate.verdict", _("verdict recorded")
    GATE_APPROVE = "gate.approve", _("gate approved")
    GATE_REJECT = "gate.reject", _("gate rejected")
    GATE_SIGNED_OFF = "gate.signed_off", _("gate signed off")
    GATE_EXTENDED = "gate.extended", _("gate under review opened again for a run with more repetitions")
    GATE_REOPENED = "gate.reopened", _("gate reopened")
    RUN_STARTED = "run.started", _("run started")
    RUN_FINISHED = "run.finished", _("run finished")
    RUN_CANCEL_REQUESTED = "run.cancel_requested", _("run cancel requested")
    REPORT_CREATED = "report.created", _("report made and signed")
    REPORT_COUNTERSIGNED = "report.countersigned", _("report countersigned")
    TRACE_UPLOADED = "trace.uploaded", _("customer trace uploaded")
    SITE_CREATED = "site.created", _("site added")
    NODE_CREATED = "node.created", _("node registered")
    NODE_HOST_KEY_ACCEPTED = "node.host_key_accepted", _("host key accepted")
    CREDENTIAL_CREATED = "credential.created", _("SSH key uploaded")
    SITE_AGENT_CREATED = "site.agent_created", _("site agent credential made")
    SITE_AGENT_REVOKED = "site.agent_revoked", _("site agent credential revoked")


class AuditEvent(models.Model):
    """Append-only: who did what, when, and from which state to which."""

    created = models.DateTimeField(default=timezone.now, db_index=True)
    actor = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.PROTECT, related_name="+")
    actor_label = models.CharField(max_length=150, help_text="The person's name, or the system component that acted")
    pilot = models.ForeignKey(Pilot, null=True, blank=True, on_delete=models.PROTECT, related_name="audit_events")
    action = models.CharField(max_length=64, choices=AuditAction.choices)
    object_type = models.CharField(max_length=64)
    object_id = models.CharField(max_length=64)
    from_state = models.CharField(max_length=32, blank=True)
    to_state = models.CharField(max_length=32, blank=True)
    detail = models.JSONField(default=dict, blank=True)

    objects = AuditQuerySet.as_manager()

    class Meta:
        ordering = ["-created", "-id"]

    def save(self, *args, **kwargs):
        if self.pk is not None:
            raise PermissionError("The audit log is append-only.")
        super().save(*args, **kwargs)

    def delete(self, *args, **kwargs):
        raise PermissionError("The audit log is append-only.")

    def __str__(self) -> str:
        return f"{self.created:%Y-%m-%d %H:%M:%S} {self.actor_label} {self.action} {self.object_type}:{self.object_id}"


class ReportQuerySet(models.QuerySet):
    def for_user(self, user, may=None) -> ReportQuerySet:
        """Reports of the pilots where the person holds one of the roles in `may` (any role when None)."""
        return self.filter(pilot__in=Pilot.objects.for_user(user, may=may))


class Report(models.Model):
    """A signed PDF evidence report, stored under DATA_DIR/reports; immutable once written."""

    objects = ReportQuerySet.as_manager()

    class Kind(models.TextChoices):
        GATE = "gate", _("Gate report")
        PROCUREMENT = "procurement", _("Procurement report")

    code = models.UUIDField(default=uuid.uuid4, unique=True, editable=False)
    pilot = models.ForeignKey(Pilot, on_delete=models.CASCADE, related_name="reports")
    gate = models.ForeignKey(Gate, null=True, blank=True, on_delete=models.CASCADE, related_name="reports")
    evaluation = models.ForeignKey(Evaluation, null=True, blank=True, on_delete=models.SET_NULL, related_name="reports")
    kind = models.CharField(max_length=16, choices=Kind.choices)
    language = models.CharField(max_length=8, default="en")
    path = models.CharField(max_length=500, help_text="Its name in the evidence store (settings.STORAGES[\"evidence\"])")
    sha256 = models.CharField(max_length=64)
    size = models.BigIntegerField()
    simulated = models.BooleanField(default=False)
    signatures = models.PositiveSmallIntegerField(default=1)
    # A countersigned report is a new version rendered at signing; it supersedes the one the approver saw.
    version = models.PositiveSmallIntegerField(default=1)
    supersedes = models.OneToOneField("self", null=True, blank=True, on_delete=models.PROTECT, related_name="superseded_by")
    countersigned_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.PROTECT,
                                         related_name="+")
    countersigned_at = models.DateTimeField(null=True, blank=True)
    created = models.DateTimeField(default=timezone.now)
    # The SHA-256 of what the report states (reports.service.basis): rendered again from the database now, a
    # different hash means something behind the report changed since it was made (blank: made before this existed).
    basis_sha256 = models.CharField(max_length=64, blank=True)

    class Meta:
        ordering = ["-created"]

    def __str__(self) -> str:
        return f"{self.get_kind_display()} {self.gate or ''} v{self.version} ({self.language})"

    @property
    def is_superseded(self) -> bool:
        return Report.objects.filter(supersedes=self).exists()

    @property
    def is_final(self) -> bool:
        """Countersigned by the customer and not superseded by a later version."""
        return self.countersigned_by_id is not None and not self.is_superseded


class ReportJob(models.Model):
    """Report work a worker does for a page that follows it (reports.tasks): render a report, or countersign the
    exact version a customer approver read. No request waits on it; the page polls its state.

    A countersignature names the SHA-256 of the version the approver was shown (`sha256`); when anything behind
    that version changed, the job ends `stale`, nothing is signed, and `result` is the new version to read."""

    class Kind(models.TextChoices):
        RENDER = "render", _("Rendering")
        COUNTERSIGN = "countersign", _("Countersignature")

    class State(models.TextChoices):
        QUEUED = "queued", _("Queued")
        RUNNING = "running", _("Working")
        DONE = "done", _("Done")
        STALE = "stale", _("Changed since it was read")
        ERROR = "error", _("Error")

    code = models.UUIDField(default=uuid.uuid4, unique=True, editable=False)
    pilot = models.ForeignKey(Pilot, on_delete=models.CASCADE, related_name="report_jobs")
    kind = models.CharField(max_length=12, choices=Kind.choices)
    report_kind = models.CharField(max_length=16, choices=Report.Kind.choices)
    gate = models.ForeignKey(Gate, null=True, blank=True, on_delete=models.CASCADE, related_name="+")
    evaluation = models.ForeignKey(Evaluation, null=True, blank=True, on_delete=models.CASCADE, related_name="+")
    # countersign: the version read; render: nothing (the subject's latest version is superseded, if any)
    source = models.ForeignKey(Report, null=True, blank=True, on_delete=models.CASCADE, related_name="+")
    sha256 = models.CharField(max_length=64, blank=True, help_text="countersign: the SHA-256 the signer named")
    language = models.CharField(max_length=8, default="en")
    requested_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL,
                                     related_name="+")
    state = models.CharField(max_length=10, choices=State.choices, default=State.QUEUED)
    result = models.ForeignKey(Report, null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    # stale: why, in English (for logs and the admin); error: the worker's reason
    error = models.TextField(blank=True)
    # stale: why, as it was made (reports.findings: a catalogue sentence and its values), said in the reader's language
    reason = models.JSONField(null=True, blank=True)
    created = models.DateTimeField(default=timezone.now)
    finished = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created"]

    @property
    def is_finished(self) -> bool:
        return self.state in (self.State.DONE, self.State.STALE, self.State.ERROR)

    def __str__(self) -> str:
        return f"{self.kind} {self.report_kind} of {self.pilot} ({self.state})"


class CustomerTrace(models.Model):
    """The customer's trace: uploaded on the pilot page at any stage (or on the G4 page), kept hashed in the
    evidence store at once, read and analysed by a worker (`runners.tasks.analyse_trace`, docs/traces.md).

    G4 replays the latest trace whose analysis is `ready`; one `refused` (with the file, line and field at
    fault) or still being read replaces nothing."""

    class State(models.TextChoices):
        QUEUED = "queued", _("Queued")
        ANALYSING = "analysing", _("Being analysed")
        READY = "ready", _("Analysed")
        REFUSED = "refused", _("Refused")

    pilot = models.ForeignKey(Pilot, on_delete=models.CASCADE, related_name="traces")
    gate = models.ForeignKey(Gate, on_delete=models.CASCADE, related_name="traces")
    name = models.CharField(max_length=200, help_text="The uploaded file's name")
    path = models.CharField(max_length=500, help_text="Its name in the evidence store (settings.STORAGES[\"evidence\"])")
    sha256 = models.CharField(max_length=64)
    size = models.BigIntegerField()
    sessions = models.PositiveIntegerField(default=0)
    turns = models.PositiveIntegerField(default=0)
    state = models.CharField(max_length=10, choices=State.choices, default=State.READY)
    progress = models.FloatField(default=1.0, help_text="0–1 while a worker reads and analyses it")
    stage = models.CharField(max_length=40, blank=True, help_text="what the worker is doing: reading, reuse, …")
    format = models.CharField(max_length=16, blank=True, help_text="mooncake, azure, burstgpt or fxpilot")
    # gates.traces.analysis.report's JSON (docs/traces.md, "trace analyze --json") once the state is ready
    analysis = models.JSONField(default=dict, blank=True)
    # Why it was refused, in each language the portal speaks: {"en": …, "zh-hans": …}
    refusal = models.JSONField(default=dict, blank=True)
    analysed = models.DateTimeField(null=True, blank=True)
    # When the row was last queued or a worker last showed progress on it: the reconcile sweep queues an analysis
    # again for a row queued or being analysed whose heartbeat is older than FXPILOT_STALE_SECONDS (a lost message,
    # a worker that died mid-analysis), and a worker takes a row being analysed only once its heartbeat is that old.
    heartbeat = models.DateTimeField(null=True, blank=True)
    # Final context of each session (tokens): {"mean", "min", "p50", "p90", "max", "histogram": [[upper, count], …]}
    lengths = models.JSONField(default=dict)
    uploaded_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.PROTECT,
                                    related_name="+")
    party = models.CharField(max_length=16, choices=Party.choices)
    created = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["-created", "-id"]

    def __str__(self) -> str:
        return f"{self.name} ({self.sessions} sessions, sha256 {self.sha256[:12]}…)"


LANGUAGE_SESSION_KEY = "fxpilot_language"
"""The session key holding the language a signed-in person chose (Profile.language); portal.middleware reads it."""


class Profile(models.Model):
    """A person's portal preferences: the language they chose (kept across sessions and devices)."""

    user = models.OneToOneField(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="fxpilot_profile")
    language = models.CharField(max_length=16, blank=True)

    def __str__(self) -> str:
        return f"{self.user} ({self.language or 'default'})"


class Notification(models.Model):
    """Something a person must do or should know; shown on their home page and sent once by email."""

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="fxpilot_notifications")
    pilot = models.ForeignKey(Pilot, null=True, blank=True, on_delete=models.CASCADE, related_name="notifications")
    # Deduplication key, e.g. "sign_plan:12" or "run_finished:<job code>": one notification per person and event.
    key = models.CharField(max_length=120)
    kind = models.CharField(max_length=32)
    subject = models.CharField(max_length=300)
    url = models.CharField(max_length=300, blank=True)
    emailed = models.BooleanField(default=False)
    created = models.DateTimeField(default=timezone.now, db_index=True)
    read_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created", "-id"]
        constraints = [models.UniqueConstraint(fields=["user", "key"], name="unique_notification_per_user")]

    def __str__(self) -> str:
        return f"{self.user}: {self.subject}"


# How long a new API token lives when nobody says otherwise, and the longest it may (settings may change both).
API_TOKEN_DAYS = 90
API_TOKEN_MAX_DAYS = 365


def api_token_days() -> int:
    return int(getattr(settings, "FXPILOT_API_TOKEN_DAYS", API_TOKEN_DAYS))


def default_token_expiry():
    return timezone.now() + timedelta(days=api_token_days())


class ApiToken(models.Model):
    """A personal API token. Only its SHA-256 is stored; the token is shown once, when created.

    Every token expires (`expires`, by default FXPILOT_API_TOKEN_DAYS = 90 days after it was made; tokens made
    before expiry existed were given 90 days from the upgrade, migration gates.0012); its owner lists and revokes
    it on the account page, an operator with `manage.py api_token --list / --revoke`. The API refuses an expired
    or revoked token with 401 and says which.
    """

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="api_tokens")
    name = models.CharField(max_length=100)
    prefix = models.CharField(max_length=12, editable=False, help_text="First characters, to tell tokens apart")
    key_sha256 = models.CharField(max_length=64, unique=True, editable=False)
    created = models.DateTimeField(default=timezone.now)
    expires = models.DateTimeField(default=default_token_expiry)
    last_used = models.DateTimeField(null=True, blank=True, editable=False)
    revoked = models.BooleanField(default=False)
    revoked_at = models.DateTimeField(null=True, blank=True, editable=False)

    class Meta:
        ordering = ["-created"]

    def __str__(self) -> str:
        return f"{self.name} ({self.prefix}…) of {self.user}"

    @property
    def expired(self) -> bool:
        return self.expires <= timezone.now()

    @property
    def usable(self) -> bool:
        return not self.revoked and not self.expired

    @classmethod
    def issue(cls, user, name: str, *, days: int | None = None) -> tuple[ApiToken, str]:
        """A new token for `user`, valid `days` days (default FXPILOT_API_TOKEN_DAYS; 1 to API_TOKEN_MAX_DAYS)."""
        import hashlib
        import secrets

        days = api_token_days() if days is None else int(days)
        if not 1 <= days <= API_TOKEN_MAX_DAYS:
            raise ValueError(f"a token lives 1 to {API_TOKEN_MAX_DAYS} days, not {days}")
        key = "fxp_" + secrets.token_urlsafe(32)
        now = timezone.now()
        token = cls.objects.create(user=user, name=name, prefix=key[:12], created=now,
                                   expires=now + timedelta(days=days),
                                   key_sha256=hashlib.sha256(key.encode()).hexdigest())
        return token, key

    def revoke(self) -> bool:
        """Revoke it (once); False when it already was."""
        return bool(ApiToken.objects.filter(pk=self.pk, revoked=False).update(revoked=True, revoked_at=timezone.now()))


class UploadVerification(models.Model):
    """A PDF someone uploaded to be verified: kept in the upload area with its SHA-256, checked by a worker; or a
    stored report someone asked to check (`report`: read from the evidence store and hashed again by the worker,
    `path` blank). Both are the same checks on the same queue, counted against the same hourly limit.

    Only the person who asked may see it. `error` is infrastructure trouble (no trust root, the file gone,
    the worker failing), never a verdict on the PDF; `done` carries the verification result as JSON.
    """

    class State(models.TextChoices):
        QUEUED = "queued", _("Queued")
        RUNNING = "running", _("Verifying")
        DONE = "done", _("Done")
        ERROR = "error", _("Error")

    code = models.UUIDField(default=uuid.uuid4, unique=True, editable=False)
    requested_by = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE,
                                     related_name="upload_verifications")
    created = models.DateTimeField(default=timezone.now, db_index=True)
    started = models.DateTimeField(null=True, blank=True)
    finished = models.DateTimeField(null=True, blank=True)
    filename = models.CharField(max_length=255, blank=True)
    size = models.PositiveBigIntegerField(default=0)
    sha256 = models.CharField(max_length=64)
    path = models.CharField(max_length=500, blank=True)
    report = models.ForeignKey(Report, null=True, blank=True, on_delete=models.CASCADE, related_name="+")
    state = models.CharField(max_length=10, choices=State.choices, default=State.QUEUED)
    result = models.JSONField(null=True, blank=True)
    error = models.TextField(blank=True)

    class Meta:
        ordering = ["-created"]

    @property
    def is_finished(self) -> bool:
        return self.state in (self.State.DONE, self.State.ERROR)

    def __str__(self) -> str:
        return f"{self.requested_by}: {self.filename} ({self.state})"
