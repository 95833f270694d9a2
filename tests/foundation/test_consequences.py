"""What a verdict does (gates.consequences) and recording one verdict twice (gates.lifecycle.record_verdict)."""
from __future__ import annotations

import pytest

from gates import consequences, lifecycle
from gates.consequences import EXTEND, HALT, INVALID, RECORD, Ran
from gates.models import AuditEvent, Evaluation, Gate, Pilot


def _evaluation(gate: Gate, verdict: str, **result) -> Evaluation:
    return Evaluation.objects.create(gate=gate, plan_version=gate.pilot.signed_plan, verdict=verdict,
                                     result={"verdict": verdict, "gate": gate.number, **result})


LOOKS = [8, 12, 16, 20, 24]  # the default plan's judging.looks


@pytest.mark.parametrize("verdict, action", [("pass", RECORD), ("marginal", EXTEND)])
def test_a_marginal_g1_before_the_last_look_continues_to_the_next_look_and_a_pass_is_recorded(signed_pilot, verdict,
                                                                                                 action):
    gate = signed_pilot.pilot.gate(1)
    evaluation = _evaluation(gate, verdict, sequential={"looks": LOOKS, "look": 1})
    decided = consequences.consequence(gate, evaluation, Ran(repetitions=8))
    assert decided.action == action
    assert decided.records is (action == RECORD)
    assert decided.repetitions == (4 if action == EXTEND else 0)  # up to the next look, 12: a decided look stops


@pytest.mark.parametrize(("look", "ran"), [(5, Ran(repetitions=24)), (1, Ran(repetitions=8, may_extend=False))])
def test_a_marginal_verdict_at_the_last_look_or_on_a_run_that_may_not_extend_is_recorded(signed_pilot, look, ran):
    gate = signed_pilot.pilot.gate(1)
    evaluation = _evaluation(gate, "marginal", sequential={"looks": LOOKS, "look": look})
    assert consequences.consequence(gate, evaluation, ran).action == RECORD


def test_a_verdict_of_judge_version_2_has_no_looks_and_is_recorded(signed_pilot):
    gate = signed_pilot.pilot.gate(1)
    assert consequences.consequence(gate, _evaluation(gate, "marginal"), Ran(repetitions=3)).action == RECORD


def test_a_marginal_g4_is_recorded_for_review_never_extended(signed_pilot):
    gate = signed_pilot.pilot.gate(4)
    assert consequences.consequence(gate, _evaluation(gate, "marginal"), Ran(repetitions=1)).action == RECORD


def test_a_fail_halts_with_the_reason_the_pilot_will_carry(signed_pilot):
    gate = signed_pilot.pilot.gate(1)
    evaluation = _evaluation(gate, "fail", criteria=[{"key": "g1-link", "verdict": "fail"},
                                                     {"key": "g1-cv", "verdict": "pass"}])
    decided = consequences.consequence(gate, evaluation, Ran(repetitions=3))
    assert (decided.action, decided.reason) == (HALT, "G1 failed: g1-link")
    lifecycle.record_verdict(gate, evaluation)
    assert Pilot.objects.get(pk=gate.pilot_id).halted_reason == decided.reason


def test_an_invalid_measurement_names_the_checks_that_failed(signed_pilot):
    gate = signed_pilot.pilot.gate(1)
    checks = {"checks": [{"name": "min-requests-per-cell", "ok": False, "detail": "3 < 8"},
                         {"name": "versions", "ok": True}]}
    decided = consequences.consequence(gate, _evaluation(gate, "invalid", validity=checks), Ran(repetitions=3))
    assert decided.action == INVALID
    assert decided.reason == "the judge found the measurement invalid — min-requests-per-cell: 3 < 8"


@pytest.mark.parametrize("verdict, state", [("pass", Gate.State.AWAITING_SIGNOFF), ("fail", Gate.State.FAILED),
                                            ("invalid", Gate.State.OPEN), ("marginal", Gate.State.REVIEW)])
def test_recording_one_evaluation_twice_changes_nothing_the_second_time(signed_pilot, verdict, state):
    gate = signed_pilot.pilot.gate(1)
    evaluation = _evaluation(gate, verdict, criteria=[{"key": "k", "verdict": verdict}])
    lifecycle.record_verdict(gate, evaluation, who="orchestrator")
    events = AuditEvent.objects.count()
    again = lifecycle.record_verdict(gate, evaluation, who="orchestrator")
    assert again.state == state and again.verdict == verdict
    assert AuditEvent.objects.count() == events


def test_a_new_evaluation_of_an_open_gate_is_recorded_after_an_invalid_one(signed_pilot):
    gate = signed_pilot.pilot.gate(1)
    lifecycle.record_verdict(gate, _evaluation(gate, "invalid"))
    assert lifecycle.record_verdict(gate, _evaluation(gate, "pass")).state == Gate.State.AWAITING_SIGNOFF
