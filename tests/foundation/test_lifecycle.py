"""Every legal transition of pilots, plans and gates, and the illegal ones refused by name."""
from __future__ import annotations

import pytest

from gates import lifecycle
from gates.lifecycle import TransitionRefused
from gates.models import AuditEvent, Evaluation, Gate, Pilot, PlanVersion, SignOff
from gates.plan import load_plan


def _evaluate(gate: Gate, verdict: str) -> Evaluation:
    criteria = [{"key": "k", "verdict": verdict}]
    evaluation = Evaluation.objects.create(gate=gate, plan_version=gate.pilot.signed_plan, verdict=verdict,
                                           result={"verdict": verdict, "criteria": criteria})
    lifecycle.record_verdict(gate, evaluation)
    gate.refresh_from_db()
    return evaluation


def _pass_and_sign_off(demo, number: int) -> Gate:
    gate = demo.pilot.gate(number)
    _evaluate(gate, "pass")
    lifecycle.sign_off_gate(gate, demo.alice, decision="approve")
    lifecycle.sign_off_gate(gate, demo.bob, decision="approve")
    gate.refresh_from_db()
    return gate


def test_a_new_pilot_is_a_draft_with_four_pending_gates(demo):
    assert demo.pilot.state == Pilot.State.DRAFT
    assert [(g.number, g.state, g.week_start, g.week_end) for g in demo.pilot.gates.all()] == [
        (1, "pending", 1, 2), (2, "pending", 3, 4), (3, "pending", 5, 7), (4, "pending", 8, 10)]
    # every criterion of the default plan, one row each
    assert demo.pilot.latest_plan.criteria.count() == sum(len(g.criteria) for g in load_plan("default").gates) == 27


def test_signing_the_plan_by_both_parties_freezes_it_and_opens_g1(demo):
    version = demo.pilot.latest_plan
    lifecycle.sign_plan(version, demo.alice)
    version.refresh_from_db()
    assert version.state == PlanVersion.State.DRAFT
    lifecycle.sign_plan(version, demo.bob)
    version.refresh_from_db()
    demo.pilot.refresh_from_db()
    assert version.state == PlanVersion.State.SIGNED and len(version.sha256) == 64
    assert demo.pilot.state == Pilot.State.ACTIVE and demo.pilot.current_gate == 1
    assert demo.pilot.gate(1).state == Gate.State.OPEN
    actions = set(AuditEvent.objects.filter(pilot=demo.pilot).values_list("action", flat=True))
    assert {"plan.approve", "plan.signed", "pilot.activated", "gate.opened"} <= actions


def test_it_refuses_a_second_signoff_by_the_same_party(demo):
    version = demo.pilot.latest_plan
    lifecycle.sign_plan(version, demo.alice)
    with pytest.raises(TransitionRefused) as refused:
        lifecycle.sign_plan(version, demo.alice)
    assert refused.value.rule == "one-signoff-per-party"


def test_it_refuses_a_plan_signature_from_a_customer_engineer(demo):
    with pytest.raises(TransitionRefused) as refused:
        lifecycle.sign_plan(demo.pilot.latest_plan, demo.carol)
    assert refused.value.rule == "signing-role"


def test_thresholds_are_editable_until_a_party_approves_and_each_change_is_audited(demo):
    criterion = demo.pilot.latest_plan.criteria.get(key="g3-ttft-vs-local")
    lifecycle.edit_criterion(criterion, demo.bob, threshold=0.25)
    criterion.refresh_from_db()
    assert criterion.threshold == 0.25
    event = AuditEvent.objects.get(action="criterion.edited")
    assert event.detail["before"] == {"threshold": 0.2} and event.detail["after"] == {"threshold": 0.25}
    lifecycle.sign_plan(demo.pilot.latest_plan, demo.alice)
    with pytest.raises(TransitionRefused) as refused:
        lifecycle.edit_criterion(criterion, demo.bob, threshold=0.1)
    assert refused.value.rule == "plan-frozen"


def test_a_change_to_a_signed_plan_is_refused_and_an_amendment_needs_both_signatures_again(signed_pilot):
    demo = signed_pilot
    signed = demo.pilot.signed_plan
    criterion = signed.criteria.get(key="g3-speedup-recompute")
    with pytest.raises(TransitionRefused) as refused:
        lifecycle.edit_criterion(criterion, demo.alice, threshold=5)
    assert refused.value.rule == "plan-frozen"
    amended = lifecycle.amend_plan(demo.pilot, demo.alice)
    assert amended.number == 2 and amended.state == PlanVersion.State.DRAFT
    lifecycle.edit_criterion(amended.criteria.get(key="g3-speedup-recompute"), demo.alice, threshold=5)
    lifecycle.sign_plan(amended, demo.alice)
    assert demo.pilot.signed_plan.pk == signed.pk  # still the old one until both sign
    lifecycle.sign_plan(amended, demo.bob)
    signed.refresh_from_db()
    assert demo.pilot.signed_plan.pk == amended.pk and signed.state == PlanVersion.State.SUPERSEDED
    assert demo.pilot.signed_plan.to_plan().gate(3).criteria[0].threshold == 5


def test_an_edit_that_breaks_the_plan_is_refused_and_nothing_is_saved(demo):
    from django.core.exceptions import ValidationError

    from gates.plan import PlanError

    criterion = demo.pilot.latest_plan.criteria.get(key="g3-ttft-vs-local")
    with pytest.raises(ValidationError) as invalid:
        lifecycle.edit_criterion(criterion, demo.alice, op="~")
    assert "op" in invalid.value.message_dict
    with pytest.raises(PlanError) as error:
        lifecycle.edit_criterion(criterion, demo.alice, concurrency=[8, 0])
    assert "G3 › criteria[2] › concurrency" in str(error.value)
    criterion.refresh_from_db()
    assert criterion.concurrency == [8, 16, 32] and criterion.op == ">="
    assert not AuditEvent.objects.filter(action="criterion.edited").exists()


def test_a_pass_verdict_waits_for_both_signoffs_then_opens_the_next_gate(signed_pilot):
    demo = signed_pilot
    gate = demo.pilot.gate(1)
    _evaluate(gate, "pass")
    assert gate.state == Gate.State.AWAITING_SIGNOFF
    lifecycle.sign_off_gate(gate, demo.bob, decision="approve", comment="looks right")
    assert demo.pilot.gate(2).state == Gate.State.PENDING
    lifecycle.sign_off_gate(gate, demo.alice, decision="approve")
    gate.refresh_from_db()
    assert gate.state == Gate.State.SIGNED_OFF
    assert demo.pilot.gate(2).state == Gate.State.OPEN
    assert SignOff.objects.filter(gate=gate).count() == 2
    assert all(len(s.evidence_sha256) == 64 for s in SignOff.objects.filter(gate=gate))


def test_g2_cannot_open_before_g1_is_signed_off_by_both_parties(signed_pilot):
    demo = signed_pilot
    gate1 = demo.pilot.gate(1)
    _evaluate(gate1, "pass")
    lifecycle.sign_off_gate(gate1, demo.bob, decision="approve")
    with pytest.raises(TransitionRefused) as refused:
        lifecycle.open_gate(demo.pilot.gate(2), demo.alice)
    assert refused.value.rule == "gate-order"
    with pytest.raises(TransitionRefused) as refused:
        lifecycle.require_runnable(demo.pilot.gate(2))
    assert refused.value.rule == "gate-open"


def test_a_vendor_engineer_cannot_sign_off_in_place_of_the_customer_approver(signed_pilot):
    demo = signed_pilot
    gate = demo.pilot.gate(1)
    _evaluate(gate, "pass")
    with pytest.raises(TransitionRefused) as refused:
        lifecycle.sign_off_gate(gate, demo.alice, decision="approve", party="customer")
    assert refused.value.rule == "signing-role"
    with pytest.raises(TransitionRefused) as refused:
        lifecycle.sign_off_gate(gate, demo.carol, decision="approve")
    assert refused.value.rule == "signing-role"


def test_a_second_gate_signoff_by_the_same_party_is_refused(signed_pilot):
    demo = signed_pilot
    gate = demo.pilot.gate(1)
    _evaluate(gate, "pass")
    lifecycle.sign_off_gate(gate, demo.bob, decision="approve")
    with pytest.raises(TransitionRefused) as refused:
        lifecycle.sign_off_gate(gate, demo.bob, decision="approve")
    assert refused.value.rule == "one-signoff-per-party"


def test_a_rejection_reopens_the_gate_for_a_new_run_and_needs_a_reason(signed_pilot):
    demo = signed_pilot
    gate = demo.pilot.gate(1)
    _evaluate(gate, "pass")
    with pytest.raises(TransitionRefused) as refused:
        lifecycle.sign_off_gate(gate, demo.bob, decision="reject")
    assert refused.value.rule == "reject-needs-comment"
    lifecycle.sign_off_gate(gate, demo.bob, decision="reject", comment="node2 ran an old ROCm")
    gate.refresh_from_db()
    assert gate.state == Gate.State.OPEN and demo.pilot.state == Pilot.State.ACTIVE


def test_a_failed_verdict_halts_the_pilot_and_a_halted_pilot_cannot_be_reopened(signed_pilot):
    demo = signed_pilot
    gate = demo.pilot.gate(1)
    _evaluate(gate, "fail")
    demo.pilot.refresh_from_db()
    assert gate.state == Gate.State.FAILED
    assert demo.pilot.state == Pilot.State.HALTED and "G1 failed" in demo.pilot.halted_reason
    with pytest.raises(TransitionRefused):
        lifecycle.sign_off_gate(gate, demo.bob, decision="approve")
    with pytest.raises(TransitionRefused) as refused:
        lifecycle.amend_plan(demo.pilot, demo.alice)
    assert refused.value.rule == "pilot-final"


def test_a_marginal_verdict_pauses_for_review_and_can_be_extended(signed_pilot):
    demo = signed_pilot
    gate = demo.pilot.gate(1)
    _evaluate(gate, "marginal")
    assert gate.state == Gate.State.REVIEW
    actions = {a["action"] for a in lifecycle.pending_actions(demo.pilot)}
    assert actions == {"review_gate"}
    lifecycle.extend_gate(gate, demo.alice)
    gate.refresh_from_db()
    assert gate.state == Gate.State.OPEN
    with pytest.raises(TransitionRefused) as refused:
        lifecycle.extend_gate(gate, demo.alice)
    assert refused.value.rule == "extend-marginal"


def test_a_person_without_the_role_cannot_extend_a_gate_and_nothing_changes(signed_pilot):
    gate = signed_pilot.pilot.gate(1)
    _evaluate(gate, "marginal")
    with pytest.raises(TransitionRefused) as refused:
        lifecycle.extend_gate(gate, signed_pilot.carol)  # a customer engineer
    assert refused.value.rule == "extend-role"
    with pytest.raises(TransitionRefused) as refused:
        lifecycle.extend_gate(gate, signed_pilot.charlie)  # not of this pilot
    assert refused.value.rule == "extend-role"
    gate.refresh_from_db()
    assert gate.state == Gate.State.REVIEW and not AuditEvent.objects.filter(action="gate.extended").exists()
    lifecycle.extend_gate(gate, "judge")  # a system actor: the state alone decides
    gate.refresh_from_db()
    assert gate.state == Gate.State.OPEN


def test_an_invalid_verdict_keeps_the_gate_open(signed_pilot):
    gate = signed_pilot.pilot.gate(1)
    _evaluate(gate, "invalid")
    assert gate.state == Gate.State.OPEN and gate.verdict == "invalid"


def test_signing_off_g4_completes_the_pilot(signed_pilot):
    demo = signed_pilot
    for number in (1, 2, 3, 4):
        assert _pass_and_sign_off(demo, number).state == Gate.State.SIGNED_OFF
    demo.pilot.refresh_from_db()
    assert demo.pilot.state == Pilot.State.COMPLETED
    assert lifecycle.pending_actions(demo.pilot) == []


def test_a_verdict_on_a_gate_that_is_not_open_is_refused(signed_pilot):
    gate = signed_pilot.pilot.gate(2)
    evaluation = Evaluation.objects.create(gate=gate, plan_version=signed_pilot.pilot.signed_plan, verdict="pass")
    with pytest.raises(TransitionRefused) as refused:
        lifecycle.record_verdict(gate, evaluation)
    assert refused.value.rule == "verdict-open-gate"


def test_the_audit_log_is_append_only(demo):
    event = AuditEvent.objects.first()
    event.action = "tampered"
    with pytest.raises(PermissionError):
        event.save()
    with pytest.raises(PermissionError):
        AuditEvent.objects.all().delete()
    with pytest.raises(PermissionError):
        AuditEvent.objects.update(action="x")


def test_seed_demo_is_idempotent(demo):
    from portal.management.commands.seed_demo import seed

    before = (Pilot.objects.count(), AuditEvent.objects.count())
    seed()
    assert (Pilot.objects.count(), AuditEvent.objects.count()) == before


def test_pilots_are_scoped_to_the_persons_organisations(demo):
    assert list(Pilot.objects.for_user(demo.alice)) == [demo.pilot]
    assert list(Pilot.objects.for_user(demo.bob)) == [demo.pilot]
    assert list(Pilot.objects.for_user(demo.charlie)) == []
