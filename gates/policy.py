"""May this person do this now: one rule per action, over the subject's state and the person's roles.

The page asks it to offer an action (`may`), the action asks it to refuse one (`require`, inside the action's
locked transaction): the same function, so what a page offers is exactly what its action accepts. Each rule
names itself in the refusal (TransitionRefused.rule), and a person's roles come from one calculator
(`roles_of`, `roles_by_pilot`). A system actor (the judge, a worker, a command line) has no roles: only the
subject's state is checked for it (`actor_roles` answers None).

It lives in `gates` because the lifecycle must refuse by it and may import nothing above (docs/architecture.md).
A run is the runners' model: its rule reads the run's `is_finished` and `cancel_requested` without importing it.
"""
from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from enum import StrEnum

from gates.models import Gate, Membership, Party, Pilot, PlanVersion, Role, SignOff
from gates.plan import TRACE_GATE


class TransitionRefused(Exception):
    def __init__(self, rule: str, message: str):
        self.rule, self.message = rule, message
        super().__init__(f"{message} (rule: {rule})")


class Act(StrEnum):
    """What a person does in a pilot, each with its own rule below."""

    EDIT_PLAN = "edit_plan"            # a criterion's bar, G4's sample-trace permission (subject: the plan version)
    SIGN_PLAN = "sign_plan"            # subject: the plan version
    AMEND_PLAN = "amend_plan"          # a new draft version of a signed plan (subject: the pilot)
    START_RUN = "start_run"            # subject: the gate
    CANCEL_RUN = "cancel_run"          # subject: the run
    EXTEND_GATE = "extend_gate"        # a marginal gate under review opened again (subject: the gate)
    SIGN_OFF_GATE = "sign_off_gate"    # subject: the gate
    UPLOAD_TRACE = "upload_trace"      # the customer's trace for G4 (subject: the gate)
    OPERATE_NODES = "operate_nodes"    # sites, nodes, credentials, host keys, contact (subject: the pilot)
    MAKE_PROCUREMENT = "make_procurement"  # subject: the pilot
    COUNTERSIGN = "countersign"        # a report (subject: the pilot)
    TAKE_RAW_DATA = "take_raw_data"    # artifacts, logs, traces and the reports that attach them (subject: the pilot)


SIGNING_ROLE = {Party.VENDOR: Role.VENDOR_LEAD, Party.CUSTOMER: Role.CUSTOMER_APPROVER}
FINAL = (Pilot.State.HALTED, Pilot.State.COMPLETED)
"""A pilot in these states changes no more."""
SIGNERS = frozenset(SIGNING_ROLE.values())
PLAN_EDITORS = frozenset({Role.VENDOR_ENGINEER, Role.VENDOR_LEAD, Role.CUSTOMER_APPROVER})
RAW_DATA = frozenset({Role.VENDOR_ENGINEER, Role.VENDOR_LEAD, Role.CUSTOMER_ENGINEER, Role.CUSTOMER_APPROVER})

ROLES: dict[Act, frozenset[str]] = {
    Act.EDIT_PLAN: PLAN_EDITORS,
    Act.SIGN_PLAN: SIGNERS,
    Act.AMEND_PLAN: PLAN_EDITORS,
    Act.START_RUN: frozenset({Role.VENDOR_ENGINEER}),
    Act.CANCEL_RUN: frozenset({Role.VENDOR_ENGINEER}),
    Act.EXTEND_GATE: frozenset({Role.VENDOR_ENGINEER, *SIGNERS}),
    Act.SIGN_OFF_GATE: SIGNERS,
    Act.UPLOAD_TRACE: RAW_DATA,  # either party's engineers and signers may give G4 the customer's trace
    Act.OPERATE_NODES: frozenset({Role.VENDOR_ENGINEER}),
    Act.MAKE_PROCUREMENT: frozenset({Role.VENDOR_LEAD}),
    Act.COUNTERSIGN: frozenset({Role.CUSTOMER_APPROVER}),
    Act.TAKE_RAW_DATA: RAW_DATA,
}
"""Who may ever do each action; the rules below add the state."""

ROLE_REFUSED = {
    Act.EDIT_PLAN: ("plan-editor-role", "only a vendor engineer, a vendor lead or a customer approver may change the plan"),
    Act.AMEND_PLAN: ("plan-editor-role", "only a vendor engineer, a vendor lead or a customer approver may amend the plan"),
    Act.SIGN_PLAN: ("signing-role", "only the vendor lead or the customer approver of this pilot may sign"),
    Act.SIGN_OFF_GATE: ("signing-role", "only the vendor lead or the customer approver of this pilot may sign"),
    Act.START_RUN: ("operator-role", "only a vendor engineer of this pilot may start a run"),
    Act.CANCEL_RUN: ("operator-role", "only a vendor engineer of this pilot may cancel a run"),
    Act.OPERATE_NODES: ("operator-role", "only a vendor engineer of this pilot may do this"),
    Act.EXTEND_GATE: ("extend-role", "only a vendor engineer, the vendor lead or the customer approver may extend a gate"),
    Act.UPLOAD_TRACE: ("raw-data-role", "your role in this pilot does not include the customer's trace"),
    Act.TAKE_RAW_DATA: ("raw-data-role", "your role in this pilot does not include raw data (artifacts, logs and the "
                                         "reports that attach them)"),
    Act.MAKE_PROCUREMENT: ("vendor-lead-role", "only the vendor lead may make the procurement report"),
    Act.COUNTERSIGN: ("customer-approver-role", "only the customer approver may countersign a report"),
}


# ── The one role calculator ───────────────────────────────────────────────────────────────────


def _active(user) -> bool:
    return bool(getattr(user, "is_authenticated", False)) and getattr(user, "is_active", True)


def roles_by_pilot(user, pilots: Iterable[Pilot]) -> dict[int, frozenset[str]]:
    """A person's roles in each pilot (those of the pilot's customer and vendor organisations), in one query."""
    pilots = list(pilots)
    by_org: dict[int, set[str]] = defaultdict(set)
    if _active(user) and pilots:
        orgs = {p.customer_id for p in pilots} | {p.vendor_id for p in pilots}
        for org_id, role in Membership.objects.filter(user=user, organisation_id__in=orgs).values_list(
            "organisation_id", "role"
        ):
            by_org[org_id].add(role)
    roles = {p.pk: frozenset(by_org[p.customer_id] | by_org[p.vendor_id]) for p in pilots}
    for pilot in pilots:
        pilot._roles = (getattr(user, "pk", None), roles[pilot.pk])
    return roles


def roles_of(pilot: Pilot, user) -> frozenset[str]:
    """A person's roles in this pilot, computed once per pilot object."""
    cached = getattr(pilot, "_roles", None)
    if cached is None or cached[0] != getattr(user, "pk", None):
        return roles_by_pilot(user, [pilot])[pilot.pk]
    return cached[1]


def actor_roles(pilot: Pilot, who) -> frozenset[str] | None:
    """The roles a rule checks for `who`: a person's roles, or None for a system actor (a label, an Actor without user)."""
    user = getattr(who, "user", who)
    if user is None or isinstance(user, str):
        return None
    return roles_of(pilot, user)


# ── The rules ─────────────────────────────────────────────────────────────────────────────────


def _is_latest(version: PlanVersion) -> bool:
    return not PlanVersion.objects.filter(pilot_id=version.pilot_id, number__gt=version.number).exists()


def plan_editable(version: PlanVersion) -> bool:
    """A plan version's criteria may change while it is a draft that neither party has approved."""
    return not version.is_frozen and not version.signoffs.filter(decision=SignOff.Decision.APPROVE).exists()


def parties_left_to_sign(roles, decided) -> list[str]:
    """The parties a person with these roles may still sign for: their signing roles, less the parties decided."""
    return [party for party, role in SIGNING_ROLE.items() if role in roles and party not in decided]


def _plan_parties_decided(version: PlanVersion) -> set[str]:
    return set(version.signoffs.filter(decision=SignOff.Decision.APPROVE).values_list("party", flat=True))


def _gate_parties_decided(gate: Gate) -> set[str]:
    evaluation = gate.latest_evaluation
    if evaluation is None:
        return set()
    return set(gate.signoffs.filter(evaluation=evaluation).values_list("party", flat=True))


def _edit_plan(version: PlanVersion, roles=None) -> TransitionRefused | None:
    pilot = version.pilot
    if pilot.state in FINAL:
        return TransitionRefused("pilot-final", f"the pilot is {pilot.state}; its plan can no longer change")
    if version.is_frozen:
        return TransitionRefused("plan-frozen",
                                 f"plan v{version.number} is signed and frozen; amend the plan to change it")
    if version.signoffs.filter(decision=SignOff.Decision.APPROVE).exists():
        return TransitionRefused("plan-frozen", f"plan v{version.number} has already been approved by one party; "
                                                "amend the plan to change it")
    if not _is_latest(version):
        return TransitionRefused("plan-latest", f"plan v{version.number} is not the latest version")
    return None


def _sign_plan(version: PlanVersion, roles) -> TransitionRefused | None:
    pilot = version.pilot
    if pilot.state in FINAL:
        return TransitionRefused("pilot-final", f"the pilot is {pilot.state}; nothing more can be signed")
    if version.state != PlanVersion.State.DRAFT:
        return TransitionRefused("plan-frozen", f"plan v{version.number} is {version.state}; it cannot be signed again")
    if not _is_latest(version):
        return TransitionRefused("plan-latest", f"plan v{version.number} is not the latest version")
    if roles is not None and not parties_left_to_sign(roles, _plan_parties_decided(version)):
        return TransitionRefused("one-signoff-per-party", f"your party has already approved plan v{version.number}")
    return None


def _amend_plan(pilot: Pilot, roles=None) -> TransitionRefused | None:
    if pilot.state in FINAL:
        return TransitionRefused("pilot-final", f"the pilot is {pilot.state}; its plan can no longer change")
    latest = pilot.latest_plan
    if latest is None or latest.state == PlanVersion.State.DRAFT:
        return TransitionRefused("plan-draft", "the latest plan is still a draft: change it and sign it, "
                                               "there is nothing to amend")
    return None


def _start_run(gate: Gate, roles=None) -> TransitionRefused | None:
    pilot = gate.pilot
    if pilot.state != Pilot.State.ACTIVE:
        return TransitionRefused("pilot-active", f"the pilot is {pilot.state}; runs start only while it is active")
    if gate.state != Gate.State.OPEN:
        return TransitionRefused("gate-open", f"{gate.label} is {gate.get_state_display().lower()}; "
                                              "runs start only on an open gate")
    if pilot.signed_plan is None:
        return TransitionRefused("plan-signed", "the plan is not signed by both parties")
    return None


def _cancel_run(job, roles=None) -> TransitionRefused | None:
    if job.is_finished:
        return TransitionRefused("run-unfinished", "the run has already ended")
    if job.cancel_requested:
        return TransitionRefused("run-cancel-once", "a cancel has already been requested")
    return None


def _extend_gate(gate: Gate, roles=None) -> TransitionRefused | None:
    if gate.pilot.state != Pilot.State.ACTIVE:
        return TransitionRefused("pilot-active", f"the pilot is {gate.pilot.state}; gates are extended only while it is active")
    if gate.state != Gate.State.REVIEW:
        return TransitionRefused("extend-marginal",
                                 f"{gate.label} is {gate.state}; only a gate under review can be extended")
    return None


def _sign_off_gate(gate: Gate, roles) -> TransitionRefused | None:
    pilot = gate.pilot
    if pilot.state != Pilot.State.ACTIVE:
        return TransitionRefused("pilot-active",
                                 f"the pilot is {pilot.state}; gates are signed off only while it is active")
    if gate.state not in (Gate.State.AWAITING_SIGNOFF, Gate.State.REVIEW):
        return TransitionRefused(
            "signoff-needs-verdict", f"{gate.label} is {gate.get_state_display().lower()}; it can be signed off only "
            "after a pass verdict or during a joint review")
    if gate.latest_evaluation is None:
        return TransitionRefused("signoff-needs-verdict", f"{gate.label} has no evaluation to sign off")
    if roles is not None and not parties_left_to_sign(roles, _gate_parties_decided(gate)):
        return TransitionRefused("one-signoff-per-party",
                                 f"your party has already decided on this {gate.label} evidence")
    return None


def _upload_trace(gate: Gate, roles=None) -> TransitionRefused | None:
    pilot = gate.pilot
    if gate.number != TRACE_GATE:
        return TransitionRefused("trace-gate", f"a trace is replayed by G{TRACE_GATE} only, not by {gate.label}")
    if pilot.state in FINAL:
        return TransitionRefused("pilot-final", f"the pilot is {pilot.state}; nothing more can be uploaded")
    # at any stage before the pilot closes (issue 24, item 7: both parties see whether a pilot is worth running
    # before they sign); a G4 run replays the newest trace analysed without fault when it starts
    return None


RULES = {
    Act.EDIT_PLAN: _edit_plan, Act.SIGN_PLAN: _sign_plan, Act.AMEND_PLAN: _amend_plan, Act.START_RUN: _start_run,
    Act.CANCEL_RUN: _cancel_run, Act.EXTEND_GATE: _extend_gate, Act.SIGN_OFF_GATE: _sign_off_gate,
    Act.UPLOAD_TRACE: _upload_trace,
}
"""Each action's rule over its subject's state (and, for signing, the parties the roles may still sign for)."""


def refusal(act: Act, subject, roles: frozenset[str] | None) -> TransitionRefused | None:
    """Why `act` on `subject` is refused to a person with `roles` (None: a system actor, state only), or None."""
    act = Act(act)
    if roles is not None and not roles & ROLES[act]:
        return TransitionRefused(*ROLE_REFUSED[act])
    rule = RULES.get(act)
    return rule(subject, roles) if rule else None  # the role-only actions: any state


def may(act: Act, subject, roles: frozenset[str] | None) -> bool:
    """Whether a page offers `act` on `subject` to a person with `roles`."""
    return refusal(act, subject, roles) is None


def require(act: Act, subject, roles: frozenset[str] | None) -> None:
    """Raise the rule's TransitionRefused when `act` on `subject` is refused."""
    refused = refusal(act, subject, roles)
    if refused is not None:
        raise refused


def signing_party(act: Act, subject, roles: frozenset[str]) -> str | None:
    """The party a person signs for (a plan or a gate): the first of their signing roles whose party has not decided."""
    decided = _plan_parties_decided(subject) if act is Act.SIGN_PLAN else _gate_parties_decided(subject)
    parties = parties_left_to_sign(roles, decided)
    return parties[0] if parties else None


# ── Two different people: one person never signs for both parties ─────────────────────────────


def parties_signed_by(act: Act, subject, user) -> set[str]:
    """The parties this person has already decided for (approved or rejected) on this subject: a plan version, or
    a gate's current evidence (its latest evaluation, the one both sign-offs must be on)."""
    if act is Act.SIGN_PLAN:
        signoffs = subject.signoffs.all()
    else:
        evaluation = subject.latest_evaluation
        if evaluation is None:
            return set()
        signoffs = subject.signoffs.filter(evaluation=evaluation)
    return set(signoffs.filter(person=user).values_list("party", flat=True))


def _subject_words(act: Act, subject) -> str:
    return f"plan v{subject.number}" if act is Act.SIGN_PLAN else f"this {subject.label} evidence"


def other_party_refusal(act: Act, subject, user, party: str | None) -> TransitionRefused | None:
    """Why this person may not sign `subject` for `party`: they have already signed it for the other party.

    Each party's signature is one person's word; the same person on both sides would make the two-party rule one
    person's decision. Asked by the lifecycle where the signature is recorded (inside its locked transaction) and by
    the pages (`may_sign`), so a person holding both signing roles is offered, and accepted, for one party only."""
    if party is None or getattr(user, "pk", None) is None:
        return None
    others = parties_signed_by(act, subject, user) - {party}
    if not others:
        return None
    other = sorted(others)[0]
    name = user.get_full_name() or user.get_username()
    return TransitionRefused(
        "two-signers", f"{name} has already signed {_subject_words(act, subject)} for the {other} party; the {party} "
        "party must sign through another person")


def may_sign(act: Act, subject, user, roles: frozenset[str] | None) -> bool:
    """Whether a page offers this person to sign (a plan or a gate): the rule of `act`, and never for a second party."""
    if not may(act, subject, roles):
        return False
    return other_party_refusal(act, subject, user, signing_party(act, subject, roles or frozenset())) is None
