"""What a verdict does to the gate run that produced it: record it, extend the run, halt the pilot, or invalid.

`consequence(gate, evaluation, ran)` decides, from the gate, its evaluation and what the run measured:

* **extend** the run to the next planned look (judging.looks) before the gate is decided — a marginal
  verdict on G1–G3 at a look before the design's last, when the run allows it (`extend_marginal`, default
  true; gates.judge.can_extend); the verdict is not recorded. A decided look (pass or fail) stops the gate's
  measurements there;
* **record** the verdict (pass → awaiting sign-off; marginal → joint review);
* **halt**: record the failed verdict, which halts the pilot; the reason is the pilot's halted reason;
* **invalid**: record the invalid verdict (the gate stays open) and report the failed validity checks.

Deciding is all this module does; runners.steps.run_evaluate carries the decision out and
gates.lifecycle.record_verdict makes the state change.
"""
from __future__ import annotations

from dataclasses import dataclass

from gates import judge
from gates.lifecycle import failure_reason
from gates.models import Evaluation, Gate

EXTEND, RECORD, HALT, INVALID = "extend", "record", "halt", "invalid"
EXTENSIBLE_GATES = (1, 2, 3)
"""G4's replay, soak and fault window are not repeated to narrow an interval."""
EXTRA_REPETITIONS = 1
"""The fewest repetitions one extension adds (a verdict of judge version 2, which has no planned looks)."""


@dataclass(frozen=True)
class Ran:
    """What the gate run measured so far."""

    repetitions: int
    """Repetitions of every cell measured successfully (including earlier extensions)."""
    may_extend: bool = True
    """The run's `extend_marginal` parameter."""


@dataclass(frozen=True)
class Consequence:
    action: str
    """EXTEND, RECORD, HALT or INVALID."""
    reason: str = ""
    """HALT: the pilot's halted reason; INVALID: the validity checks that failed."""
    repetitions: int = 0
    """EXTEND: how many more repetitions of every cell."""

    @property
    def records(self) -> bool:
        """Whether the verdict is recorded now (everything but an extension)."""
        return self.action != EXTEND


def consequence(gate: Gate, evaluation: Evaluation, ran: Ran) -> Consequence:
    verdict = evaluation.verdict
    if verdict == Gate.Verdict.MARGINAL and gate.number in EXTENSIBLE_GATES and ran.may_extend \
            and judge.can_extend(evaluation.result, gate.pilot.signed_plan.verified_plan(), ran.repetitions):
        wanted = judge.next_look(evaluation.result)
        return Consequence(EXTEND, repetitions=max(wanted - ran.repetitions, EXTRA_REPETITIONS)
                           if wanted else EXTRA_REPETITIONS)
    if verdict == Gate.Verdict.FAIL:
        return Consequence(HALT, reason=failure_reason(gate, evaluation))
    if verdict == Gate.Verdict.INVALID:
        return Consequence(INVALID, reason=invalid_reason(evaluation))
    return Consequence(RECORD)


def invalid_reason(evaluation: Evaluation) -> str:
    checks = [f"{c['name']}: {c.get('detail', '')}" for c in evaluation.result.get("validity", {}).get("checks", [])
              if not c.get("ok")]
    return "the judge found the measurement invalid — " + ("; ".join(checks) or "see the evaluation")
