"""The one module that changes the state of pilots, plan versions and gates.

Views, tasks and commands call these functions; nothing else writes a state field. Every change
writes an append-only audit event (who, what, when, from → to). An illegal transition raises
TransitionRefused naming the rule that refused it.

    draft ──(both parties sign the plan)──▶ active, G1 open
    gate: pending ─▶ open ─(verdict)─▶ awaiting_signoff ─(both approve)─▶ signed_off ─▶ next gate open
                              │  └─▶ review (marginal) ─(extend)─▶ open    (both approve)─▶ signed_off
                              └─▶ failed ⇒ pilot halted (final)
    after G4 is signed off: pilot completed.
"""
from __future__ import annotations

import hashlib
import json
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass

from django.contrib.auth import get_user_model
from django.db import models, transaction
from django.db.models import F
from django.utils import timezone
from django.utils.translation import gettext_lazy as _

from gates.models import (
    CUSTOMER_ROLES,
    VENDOR_ROLES,
    AuditAction,
    AuditEvent,
    Criterion,
    Evaluation,
    Gate,
    Membership,
    Organisation,
    Party,
    Pilot,
    PlanVersion,
    Role,
    SignOff,
)
from gates.plan import TRACE_GATE, Plan, document_without_criteria, load_plan
from gates.policy import (
    FINAL,
    SIGNING_ROLE,
    Act,
    TransitionRefused,
    actor_roles,
    other_party_refusal,
    require,
    signing_party,
)


@dataclass(frozen=True)
class Actor:
    """Who acts: a person, or a named system component (worker, judge, command)."""

    user: object | None = None
    label: str = ""

    @property
    def name(self) -> str:
        if self.user is not None:
            return self.user.get_full_name() or self.user.get_username()
        return self.label or "system"


def as_actor(who) -> Actor:
    if isinstance(who, Actor):
        return who
    if who is None or isinstance(who, str):
        return Actor(label=who or "system")
    return Actor(user=who)


_PLAN_DECISION = {SignOff.Decision.APPROVE: AuditAction.PLAN_APPROVE, SignOff.Decision.REJECT: AuditAction.PLAN_REJECT}
_GATE_DECISION = {SignOff.Decision.APPROVE: AuditAction.GATE_APPROVE, SignOff.Decision.REJECT: AuditAction.GATE_REJECT}


def audit(pilot: Pilot | None, who, action: AuditAction | str, obj, from_state: str = "", to_state: str = "",
          **detail) -> AuditEvent:
    """Append one audit event; `action` must be one of AuditAction (ValueError names an unknown one)."""
    try:
        action = AuditAction(action)
    except ValueError:
        raise ValueError(f"{action!r} is not an audit action: add it to gates.models.AuditAction with its words") from None
    actor = as_actor(who)
    return AuditEvent.objects.create(
        actor=actor.user, actor_label=actor.name, pilot=pilot, action=action,
        object_type=obj._meta.model_name, object_id=str(obj.pk),
        from_state=from_state, to_state=to_state, detail=detail,
    )


def _set_state(obj, new_state: str, who, action: AuditAction, pilot: Pilot, **detail) -> None:
    old = obj.state
    obj.state = new_state
    audit(pilot, who, action, obj, old, new_state, **detail)


# ── Pilots and plans ──────────────────────────────────────────────────────────────────────────


@transaction.atomic
def create_pilot(*, name: str, customer: Organisation, vendor: Organisation, who, plan: Plan | None = None,
                 **fields) -> Pilot:
    if customer.kind != Organisation.Kind.CUSTOMER:
        raise TransitionRefused("pilot-parties", f"{customer} is not a customer organisation")
    if vendor.kind != Organisation.Kind.VENDOR:
        raise TransitionRefused("pilot-parties", f"{vendor} is not a vendor organisation")
    plan = plan or load_plan("default")
    pilot = Pilot.objects.create(name=name, customer=customer, vendor=vendor, **fields)
    audit(pilot, who, AuditAction.PILOT_CREATED, pilot, "", pilot.state, plan=plan.source)
    _create_plan_version(pilot, plan, number=1, who=who)
    for gate in plan.gates:
        Gate.objects.create(pilot=pilot, number=gate.number, name=gate.name, name_zh=gate.name_zh,
                            week_start=gate.weeks[0], week_end=gate.weeks[1])
    return pilot


def _create_plan_version(pilot: Pilot, plan: Plan, *, number: int, who) -> PlanVersion:
    actor = as_actor(who)
    version = PlanVersion.objects.create(pilot=pilot, number=number, source=plan.source,
                                         document=document_without_criteria(plan), created_by=actor.user)
    rows = []
    for gate in plan.gates:
        for position, spec in enumerate(gate.criteria):
            rows.append(Criterion(
                plan_version=version, gate_number=gate.number, key=spec.key, description=spec.description,
                description_zh=spec.description_zh, metric=spec.metric, statistic=spec.statistic,
                comparison=spec.comparison, candidate=spec.candidate, baseline=spec.baseline, phase=spec.phase,
                concurrency=list(spec.concurrency), op=spec.op, threshold=spec.threshold, unit=spec.unit,
                confidence=spec.confidence if spec.confidence is not None else plan.confidence, position=position,
            ))
    Criterion.objects.bulk_create(rows)
    audit(pilot, who, AuditAction.PLAN_VERSION_CREATED, version, "", version.state, number=number)
    return version


@transaction.atomic
def edit_criterion(criterion: Criterion, who, **changes) -> Criterion:
    """Change a criterion of a draft plan (threshold, op, concurrency, confidence); audited field by field."""
    criterion = Criterion.objects.select_for_update().select_related("plan_version__pilot").get(pk=criterion.pk)
    version = criterion.plan_version
    pilot = version.pilot
    require(Act.EDIT_PLAN, version, actor_roles(pilot, who))
    allowed = {"threshold", "op", "concurrency", "confidence", "description", "description_zh"}
    unknown = set(changes) - allowed
    if unknown:
        raise TransitionRefused("plan-editable-fields", f"these fields cannot be edited: {', '.join(sorted(unknown))}")
    before = {name: getattr(criterion, name) for name in changes}
    for name, value in changes.items():
        setattr(criterion, name, value)
    criterion.full_clean()
    criterion.save()
    # The edited plan must still be a valid plan.
    version.to_plan()
    audit(pilot, who, AuditAction.CRITERION_EDITED, criterion, detail_key=criterion.key,
          before=_jsonable(before), after=_jsonable(changes))
    return criterion


@transaction.atomic
def set_sample_trace(version: PlanVersion, allowed: bool, who) -> PlanVersion:
    """Allow (or no longer allow) G4 to replay a generated sample trace in a draft plan; audited.

    The permission is a value of G4's plan like any threshold: hashed with the plan, so both parties sign
    it, and frozen with it. For a demo or a rehearsal without the customer's traffic.
    """
    version = PlanVersion.objects.select_for_update().select_related("pilot").get(pk=version.pk)
    pilot = version.pilot
    require(Act.EDIT_PLAN, version, actor_roles(pilot, who))
    allowed = bool(allowed)
    before = version.to_plan().gate(TRACE_GATE).sample_trace
    if before == allowed:
        return version
    document = json.loads(json.dumps(version.document))
    for item in document.get("gates", []):
        if item.get("number") == TRACE_GATE:
            item.pop("sample_trace", None)
            if allowed:
                item["sample_trace"] = True
    version.document = document
    version.save(update_fields=["document"])
    version.to_plan()  # still a valid plan
    audit(pilot, who, AuditAction.PLAN_SAMPLE_TRACE, version, detail_key=f"G{TRACE_GATE}",
          before={"sample_trace": before}, after={"sample_trace": allowed})
    return version


def _jsonable(values: dict) -> dict:
    return json.loads(json.dumps(values, default=str))


@transaction.atomic
def amend_plan(pilot: Pilot, who) -> PlanVersion:
    """A change to a signed plan makes a new version that both parties must sign again."""
    pilot = Pilot.objects.select_for_update().get(pk=pilot.pk)
    require(Act.AMEND_PLAN, pilot, actor_roles(pilot, who))
    latest = pilot.latest_plan
    return _create_plan_version(pilot, latest.to_plan(), number=latest.number + 1, who=who)


def _signing_party(act: Act, subject, user, party: str | None) -> tuple[str, str]:
    """The party `user` signs for (the one asked, or the first their roles may still sign for) and its role; refused
    when the person has already signed this subject for the other party (gates.policy.other_party_refusal)."""
    roles = actor_roles(subject.pilot, user)
    if party is None:
        party = signing_party(act, subject, roles)
    elif SIGNING_ROLE.get(party) not in roles:
        raise TransitionRefused(
            "signing-role", f"{user.get_username()} holds none of the {party} party's signing roles (vendor lead for "
            "the vendor, customer approver for the customer)")
    refused = other_party_refusal(act, subject, user, party)  # one person never signs for both parties
    if refused is not None:
        raise refused
    return party, SIGNING_ROLE[party]


@transaction.atomic
def sign_plan(version: PlanVersion, user, *, decision: str = SignOff.Decision.APPROVE, comment: str = "",
              party: str | None = None) -> SignOff:
    version = PlanVersion.objects.select_for_update().select_related("pilot").get(pk=version.pk)
    pilot = version.pilot = Pilot.objects.select_for_update().get(pk=version.pilot_id)
    require(Act.SIGN_PLAN, version, actor_roles(pilot, user))
    if decision not in SignOff.Decision.values:
        raise TransitionRefused("signoff-decision", f"{decision!r} is not approve or reject")
    party, role = _signing_party(Act.SIGN_PLAN, version, user, party)
    if version.signoffs.filter(party=party, decision=SignOff.Decision.APPROVE).exists():
        raise TransitionRefused("one-signoff-per-party", f"the {party} party has already approved plan v{version.number}")
    plan_sha = version.to_plan().sha256
    signoff = SignOff.objects.create(pilot=pilot, plan_version=version, party=party, person=user, role=role,
                                     decision=decision, comment=comment, evidence_sha256=plan_sha)
    audit(pilot, user, _PLAN_DECISION[decision], version, version.state, version.state, party=party,
          comment=comment, plan_sha256=plan_sha)
    approvals = version.signoffs.filter(decision=SignOff.Decision.APPROVE)
    if {s.party for s in approvals} == {Party.VENDOR, Party.CUSTOMER}:
        if len({s.evidence_sha256 for s in approvals}) != 1:
            raise TransitionRefused("plan-same-evidence", "the two parties approved different plan contents")
        previous = pilot.plan_versions.filter(state=PlanVersion.State.SIGNED).exclude(pk=version.pk)
        for old in previous:
            _set_state(old, PlanVersion.State.SUPERSEDED, user, AuditAction.PLAN_SUPERSEDED, pilot)
            old.save(update_fields=["state"])
        version.sha256 = plan_sha
        version.signed_at = timezone.now()
        _set_state(version, PlanVersion.State.SIGNED, user, AuditAction.PLAN_SIGNED, pilot, plan_sha256=plan_sha)
        version.save(update_fields=["state", "sha256", "signed_at"])
        if pilot.state == Pilot.State.DRAFT:
            _set_state(pilot, Pilot.State.ACTIVE, user, AuditAction.PILOT_ACTIVATED, pilot)
            pilot.save(update_fields=["state"])
            _open_gate(pilot, 1, user)
    return signoff


# ── Gates ─────────────────────────────────────────────────────────────────────────────────────


def _open_gate(pilot: Pilot, number: int, who) -> Gate:
    gate = Gate.objects.select_for_update().get(pilot=pilot, number=number)
    if gate.state != Gate.State.PENDING:
        raise TransitionRefused("gate-open-once", f"{gate.label} is {gate.state}, not pending")
    if number > 1:
        before = Gate.objects.get(pilot=pilot, number=number - 1)
        if before.state != Gate.State.SIGNED_OFF:
            raise TransitionRefused(
                "gate-order", f"{gate.label} cannot open before G{number - 1} is signed off by both parties")
    gate.opened_at = timezone.now()
    gate.verdict = ""
    _set_state(gate, Gate.State.OPEN, who, AuditAction.GATE_OPENED, pilot)
    gate.save(update_fields=["state", "opened_at", "verdict"])
    pilot.current_gate = number
    pilot.save(update_fields=["current_gate"])
    return gate


@transaction.atomic
def open_gate(gate: Gate, who) -> Gate:
    pilot = Pilot.objects.select_for_update().get(pk=gate.pilot_id)
    if pilot.state != Pilot.State.ACTIVE:
        raise TransitionRefused("pilot-active", f"the pilot is {pilot.state}; gates open only while it is active")
    return _open_gate(pilot, gate.number, who)


def require_runnable(gate: Gate, who=None) -> None:
    """A run may start only on the open gate of an active pilot with a signed plan, by a vendor engineer (policy)."""
    require(Act.START_RUN, gate, actor_roles(gate.pilot, who))


def failure_reason(gate: Gate, evaluation: Evaluation) -> str:
    """Why a failed verdict halts the pilot: the gate and the criteria that missed their bar."""
    failed = [c["key"] for c in evaluation.result.get("criteria", []) if c.get("verdict") == "fail"]
    return f"{gate.label} failed: {', '.join(failed) or 'a criterion missed its bar'}"


@transaction.atomic
def record_verdict(gate: Gate, evaluation: Evaluation, who="judge") -> Gate:
    """The gate moves on the evaluation's verdict (see the module docstring); a failed verdict halts the pilot.

    Safe to call again for the same evaluation (a step retried after its worker died): an evaluation
    already recorded on its gate changes nothing and returns the gate as it is.
    """
    gate = Gate.objects.select_for_update().select_related("pilot").get(pk=gate.pk)
    pilot = Pilot.objects.select_for_update().get(pk=gate.pilot_id)
    if evaluation.gate_id != gate.pk:
        raise TransitionRefused("verdict-gate", "the evaluation belongs to another gate")
    if AuditEvent.objects.filter(pilot=pilot, action=AuditAction.GATE_VERDICT, object_type=gate._meta.model_name,
                                 object_id=str(gate.pk), detail__evaluation=evaluation.pk).exists():
        return gate
    if gate.state not in (Gate.State.OPEN, Gate.State.REVIEW):
        raise TransitionRefused("verdict-open-gate", f"{gate.label} is {gate.state}; verdicts are recorded on an open gate")
    if pilot.state != Pilot.State.ACTIVE:
        raise TransitionRefused("pilot-active", f"the pilot is {pilot.state}")
    gate.verdict = evaluation.verdict
    target = {
        Gate.Verdict.PASS: Gate.State.AWAITING_SIGNOFF,
        Gate.Verdict.MARGINAL: Gate.State.REVIEW,
        Gate.Verdict.FAIL: Gate.State.FAILED,
        Gate.Verdict.INVALID: Gate.State.OPEN,
    }[evaluation.verdict]
    if target == gate.state:
        audit(pilot, who, AuditAction.GATE_VERDICT, gate, gate.state, gate.state, verdict=evaluation.verdict, evaluation=evaluation.pk)
    else:
        _set_state(gate, target, who, AuditAction.GATE_VERDICT, pilot, verdict=evaluation.verdict, evaluation=evaluation.pk)
    if target == Gate.State.FAILED:
        gate.closed_at = timezone.now()
        failed = [c["key"] for c in evaluation.result.get("criteria", []) if c.get("verdict") == "fail"]
        pilot.halted_reason = failure_reason(gate, evaluation)
        _set_state(pilot, Pilot.State.HALTED, who, AuditAction.PILOT_HALTED, pilot, gate=gate.number, failed=failed)
        pilot.save(update_fields=["state", "halted_reason"])
    gate.save(update_fields=["state", "verdict", "closed_at"])
    return gate


@transaction.atomic
def extend_gate(gate: Gate, who) -> Gate:
    """A marginal gate under review goes back to open so a new run with more repetitions can decide it.

    (A person's decision. A run that extends itself on a marginal verdict is runners.runs.extend_run.)
    """
    gate = Gate.objects.select_for_update().select_related("pilot").get(pk=gate.pk)
    require(Act.EXTEND_GATE, gate, actor_roles(gate.pilot, who))
    _set_state(gate, Gate.State.OPEN, who, AuditAction.GATE_EXTENDED, gate.pilot)
    gate.save(update_fields=["state"])
    return gate


def evidence_sha256(evaluation: Evaluation) -> str:
    canonical = json.dumps(evaluation.result, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(canonical.encode()).hexdigest()


@transaction.atomic
def sign_off_gate(gate: Gate, user, *, decision: str, comment: str = "", party: str | None = None) -> SignOff:
    gate = Gate.objects.select_for_update().select_related("pilot").get(pk=gate.pk)
    pilot = gate.pilot = Pilot.objects.select_for_update().get(pk=gate.pilot_id)
    require(Act.SIGN_OFF_GATE, gate, actor_roles(pilot, user))
    if decision not in SignOff.Decision.values:
        raise TransitionRefused("signoff-decision", f"{decision!r} is not approve or reject")
    if decision == SignOff.Decision.REJECT and not comment.strip():
        raise TransitionRefused("reject-needs-comment", "a rejection must say why")
    party, role = _signing_party(Act.SIGN_OFF_GATE, gate, user, party)
    evaluation = gate.latest_evaluation
    if gate.signoffs.filter(evaluation=evaluation, party=party).exists():
        raise TransitionRefused("one-signoff-per-party", f"the {party} party has already decided on this {gate.label} evidence")
    signoff = SignOff.objects.create(pilot=pilot, gate=gate, evaluation=evaluation, party=party, person=user, role=role,
                                     decision=decision, comment=comment, evidence_sha256=evidence_sha256(evaluation))
    audit(pilot, user, _GATE_DECISION[decision], gate, gate.state, gate.state, party=party, comment=comment,
          evidence_sha256=signoff.evidence_sha256)
    if decision == SignOff.Decision.REJECT:
        # Evidence not accepted: the gate needs a new run; only a failed verdict halts a pilot.
        _set_state(gate, Gate.State.OPEN, user, AuditAction.GATE_REOPENED, pilot, reason=comment)
        gate.verdict = ""
        gate.save(update_fields=["state", "verdict"])
        return signoff
    approvals = gate.signoffs.filter(evaluation=evaluation, decision=SignOff.Decision.APPROVE)
    if {s.party for s in approvals} == {Party.VENDOR, Party.CUSTOMER}:
        gate.closed_at = timezone.now()
        _set_state(gate, Gate.State.SIGNED_OFF, user, AuditAction.GATE_SIGNED_OFF, pilot)
        gate.save(update_fields=["state", "closed_at"])
        if gate.number < 4:
            _open_gate(pilot, gate.number + 1, user)
        else:
            _set_state(pilot, Pilot.State.COMPLETED, user, AuditAction.PILOT_COMPLETED, pilot)
            pilot.save(update_fields=["state"])
    return signoff


class NextAction(models.TextChoices):
    """What somebody must do next on a pilot, with its words (runners.pending adds the nodes' host keys)."""

    SIGN_PLAN = "sign_plan", _("Sign the plan")
    RUN_GATE = "run_gate", _("Run the gate")
    SIGN_OFF_GATE = "sign_off_gate", _("Sign off the gate")
    REVIEW_GATE = "review_gate", _("Review the marginal gate")
    ACCEPT_HOST_KEY = "accept_host_key", _("Accept a host key")
    COUNTERSIGN_REPORT = "countersign_report", _("Countersign the procurement report")
    COUNTERSIGN_GATE_REPORT = "countersign_gate_report", _("Countersign the gate report")


def current_gates(pilots: Iterable[Pilot]) -> dict[int, Gate]:
    """Pilot id → its current gate, in one query."""
    return {g.pilot_id: g for g in Gate.objects.filter(pilot__in=list(pilots), number=F("pilot__current_gate"))}


def pending_actions_by_pilot(pilots: Iterable[Pilot], current: dict[int, Gate] | None = None) -> dict[int, list[dict]]:
    """Who must act next on each pilot, in a fixed number of queries: pilot id → actions.

    An action is {'role': ..., 'action': a NextAction (sign_plan, run_gate, sign_off_gate, review_gate), 'subject': the
    plan version or the gate, and for a gate decision 'evaluation_id'}; a halted or completed pilot has none. With
    the nodes' host keys: runners.pending.pending_actions_by_pilot, which the pages and the notifications use.
    """
    pilots = [p for p in pilots if p.state not in FINAL]
    ids = [p.pk for p in pilots]
    actions: dict[int, list[dict]] = defaultdict(list)
    if not ids:
        return actions
    latest: dict[int, PlanVersion] = {}
    for version in (
        PlanVersion.objects.filter(pilot_id__in=ids).only("id", "pilot_id", "number", "state").order_by("number")
    ):
        latest[version.pilot_id] = version
    drafts = [v.pk for v in latest.values() if v.state == PlanVersion.State.DRAFT]
    approved = set(
        SignOff.objects.filter(plan_version_id__in=drafts, decision=SignOff.Decision.APPROVE).values_list(
            "plan_version_id", "party"
        )
    )
    for pilot_id, version in latest.items():
        if version.state == PlanVersion.State.DRAFT:
            for party, role in SIGNING_ROLE.items():
                if (version.pk, party) not in approved:
                    actions[pilot_id].append({"role": role, "action": NextAction.SIGN_PLAN, "subject": version})
    current = current if current is not None else current_gates(pilots)
    gates = [current[pk] for pk in ids if pk in current]
    waiting = [g for g in gates if g.state in (Gate.State.AWAITING_SIGNOFF, Gate.State.REVIEW)]
    latest_eval: dict[int, int] = {}
    for gate_id, eval_id in (
        Evaluation.objects.filter(gate_id__in=[g.pk for g in waiting])
        .order_by("created", "id")
        .values_list("gate_id", "id")
    ):
        latest_eval[gate_id] = eval_id
    decided = set(
        SignOff.objects.filter(evaluation_id__in=list(latest_eval.values())).values_list("evaluation_id", "party")
    )
    for gate in gates:
        if gate.state == Gate.State.OPEN:
            actions[gate.pilot_id].append({"role": Role.VENDOR_ENGINEER, "action": NextAction.RUN_GATE, "subject": gate})
        elif gate in waiting:
            action = NextAction.REVIEW_GATE if gate.state == Gate.State.REVIEW else NextAction.SIGN_OFF_GATE
            for party, role in SIGNING_ROLE.items():
                if (latest_eval.get(gate.pk), party) not in decided:
                    actions[gate.pilot_id].append(
                        {"role": role, "action": action, "subject": gate, "evaluation_id": latest_eval.get(gate.pk)}
                    )
    return actions


def pending_actions(pilot: Pilot) -> list[dict]:
    """Who must act next on one pilot (pending_actions_by_pilot)."""
    return pending_actions_by_pilot([pilot])[pilot.pk]


def add_member(user, organisation: Organisation, role: str) -> Membership:
    membership, _ = Membership.objects.get_or_create(user=user, organisation=organisation, role=role)
    membership.full_clean()
    return membership


def role_organisation(pilot: Pilot, role: str) -> Organisation:
    """The organisation a role of this pilot belongs to: the vendor's for a vendor role, the customer's for a
    customer role (a viewer's is not for a pilot to say)."""
    if role in VENDOR_ROLES:
        return pilot.vendor
    if role in CUSTOMER_ROLES:
        return pilot.customer
    raise TransitionRefused("member-role", f"{role!r} is not a role a pilot gives (a vendor or a customer role)")


def people_of(organisation: Organisation):
    """The active people of an organisation (any role in it): the only ones who may be given one of its roles."""
    return get_user_model().objects.filter(is_active=True, memberships__organisation=organisation).distinct()


@transaction.atomic
def add_pilot_member(pilot: Pilot, user, role: str) -> Membership:
    """Give a person a role of this pilot, in the organisation the role belongs to (`role_organisation`); refused
    for anyone not already of that organisation, so a person of an unrelated organisation never becomes a member."""
    organisation = role_organisation(pilot, role)
    if not people_of(organisation).filter(pk=user.pk).exists():
        name = user.get_full_name() or user.get_username()
        raise TransitionRefused("member-organisation", f"{name} ({user.get_username()}) is not a person of "
                                f"{organisation.name}: only its own people may hold its roles")
    return add_member(user, organisation, role)
