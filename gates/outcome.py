"""What a pilot proved, decided in one place: the overview's Outcome card, the API, the procurement report's
decision and the demo's last lines all print this, so they cannot disagree.

`decide` is a pure function of the pilot's state, its gates (state, latest verdict, the criteria that failed) and
the parties that approved each gate's latest evidence. `outcome_of(pilot)` reads those facts from the database.

The outcomes (`Outcome.code`):

* ``proven`` — every gate's latest verdict is pass and both parties signed each off;
* ``accepted`` — every gate signed off by both parties, but at least one was *marginal* (its bar neither met nor
  missed at the plan's confidence) and was accepted in joint review: that is not "every gate passed", and is said so;
* ``not-proven`` — a gate failed: the pilot stopped there (the gate and the criteria that missed their bar);
* ``halted`` — the pilot was halted without a failed gate on record (the reason recorded);
* ``error`` — the open gate's last evaluation was invalid (infrastructure trouble, not a result): no verdict yet;
* ``in-progress`` — anything else: the plan is not signed, a gate is open, under joint review or awaiting sign-off.

Words come in English and Simplified Chinese through the message catalogue (`sentence_in("zh-hans")`).
"""
from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from django.utils import translation
from django.utils.translation import gettext, gettext_noop

from gates.models import SignOff

PROVEN = "proven"
ACCEPTED = "accepted"
NOT_PROVEN = "not-proven"
HALTED = "halted"
ERROR = "error"
IN_PROGRESS = "in-progress"
CODES = (PROVEN, ACCEPTED, NOT_PROVEN, HALTED, ERROR, IN_PROGRESS)

LANGUAGES = ("en", "zh-hans")

WORDS = {
    PROVEN: gettext_noop("Proven"),
    ACCEPTED: gettext_noop("Accepted in joint review — not proven"),
    NOT_PROVEN: gettext_noop("Not proven"),
    HALTED: gettext_noop("Not proven — halted"),
    ERROR: gettext_noop("No verdict — a run was invalid"),
    IN_PROGRESS: gettext_noop("In progress"),
}


@dataclass(frozen=True)
class GateFacts:
    """What the outcome needs of one gate: its state, its latest verdict, the keys of the criteria that failed,
    and the parties ("vendor", "customer") whose approval of that latest evidence is on record."""

    number: int
    name: str
    state: str
    verdict: str = ""
    name_zh: str = ""
    failed: tuple[str, ...] = ()
    approved_by: frozenset[str] = frozenset()

    def label(self, language: str | None = None) -> str:
        name = self.name_zh if (language or translation.get_language() or "").lower().startswith("zh") and self.name_zh \
            else self.name
        return f"G{self.number} {name}".strip()


@dataclass(frozen=True)
class Outcome:
    code: str
    gate: int | None = None
    message: str = ""  # what the word rests on: a catalogue msgid with %(gate)s, %(criteria)s, %(reason)s
    gates: tuple[GateFacts, ...] = ()
    criteria: tuple[str, ...] = ()
    reason: str = ""  # a recorded reason (the pilot's halted_reason), as recorded
    review: tuple[int, ...] = field(default=())  # gates accepted in joint review while marginal

    def _gate_words(self, language: str | None) -> str:
        by_number = {g.number: g for g in self.gates}
        numbers = self.review if self.code == ACCEPTED else ((self.gate,) if self.gate else ())
        sep = "、" if (language or "").lower().startswith("zh") else ", "
        return sep.join(by_number[n].label(language) if n in by_number else f"G{n}" for n in numbers)

    def word(self) -> str:
        return gettext(WORDS[self.code])

    def detail(self) -> str:
        """What the word rests on, in the active language (the gate, its criteria, the recorded reason)."""
        language = translation.get_language()
        return gettext(self.message) % {"gate": self._gate_words(language), "criteria": ", ".join(self.criteria),
                                        "reason": self.reason}

    def sentence(self) -> str:
        """The word and what it rests on, e.g. "Not proven: the pilot stopped at G3 Performance, …"."""
        return gettext("%(word)s: %(detail)s") % {"word": self.word(), "detail": self.detail()}

    def decision(self) -> str:
        """The procurement report's decision line: "Decision: not proven — the pilot stopped at …"."""
        word = self.word()
        if not (translation.get_language() or "").lower().startswith("zh"):
            word = word[:1].lower() + word[1:]
        return gettext("Decision: %(word)s — %(detail)s") % {"word": word, "detail": self.detail()}

    def word_in(self, language: str) -> str:
        with translation.override(language):
            return self.word()

    def sentence_in(self, language: str) -> str:
        with translation.override(language):
            return self.sentence()

    def decision_in(self, language: str) -> str:
        with translation.override(language):
            return self.decision()

    @property
    def final(self) -> bool:
        """The pilot ended (nothing more will be measured)."""
        return self.code in (PROVEN, ACCEPTED, NOT_PROVEN, HALTED)

    def as_dict(self) -> dict[str, Any]:
        """Plain data for the API and a report's context: the code, the gate, and the words in both languages."""
        return {"code": self.code, "gate": self.gate, "review_gates": list(self.review), "criteria": list(self.criteria),
                "reason": self.reason, "final": self.final,
                "word": {language: self.word_in(language) for language in LANGUAGES},
                "sentence": {language: self.sentence_in(language) for language in LANGUAGES},
                "decision": {language: self.decision_in(language) for language in LANGUAGES}}


BOTH = frozenset({"vendor", "customer"})


def decide(pilot_state: str, gates: Iterable[GateFacts], halted_reason: str = "") -> Outcome:
    """The pilot's outcome from its state and its gates' facts (pure: no database, no clock)."""
    gates = tuple(sorted(gates, key=lambda g: g.number))
    failed = next((g for g in gates if g.state == "failed" or g.verdict == "fail"), None)
    if failed is not None:
        if failed.failed:
            return Outcome(NOT_PROVEN, failed.number, gettext_noop(
                "the pilot stopped at %(gate)s, which failed (missed its bar: %(criteria)s)."),
                gates, criteria=tuple(failed.failed), reason=halted_reason)
        return Outcome(NOT_PROVEN, failed.number, gettext_noop(
            "the pilot stopped at %(gate)s, which failed its bar."), gates, reason=halted_reason)
    if pilot_state == "halted":
        current = next((g for g in gates if g.state not in ("signed_off", "pending")), None)
        if current is not None:
            return Outcome(HALTED, current.number, gettext_noop(
                "the pilot was halted at %(gate)s (%(reason)s)." if halted_reason else
                "the pilot was halted at %(gate)s."), gates, reason=halted_reason)
        return Outcome(HALTED, None, gettext_noop("the pilot was halted (%(reason)s)." if halted_reason
                                                  else "Not proven: the pilot was halted."), gates, reason=halted_reason)
    if pilot_state == "draft" or not gates:
        return Outcome(IN_PROGRESS, None, gettext_noop("the plan is not signed by both parties yet."),
                       gates)
    signed = [g for g in gates if g.state == "signed_off" and BOTH <= g.approved_by]
    if len(signed) == len(gates):
        review = tuple(g.number for g in gates if g.verdict != "pass")
        if review:
            return Outcome(ACCEPTED, review[-1], gettext_noop(
                "%(gate)s ended marginal — its bar was neither met nor missed at the plan's confidence — "
                "and both parties accepted it in joint review; it did not pass."), gates, review=review)
        return Outcome(PROVEN, None, gettext_noop("every gate passed and was signed off by both parties."),
                       gates)
    current = next(g for g in gates if g not in signed)
    if current.state == "review" or (current.verdict == "marginal" and current.state != "open"):
        message = gettext_noop("%(gate)s ended marginal and waits for the joint review of both parties.")
    elif current.state == "awaiting_signoff" or (current.verdict == "pass" and current.state != "open"):
        message = gettext_noop("%(gate)s passed and waits for sign-off by both parties.")
    elif current.state == "open" and current.verdict == "invalid":
        return Outcome(ERROR, current.number, gettext_noop(
            "the last run of %(gate)s was invalid (trouble with the infrastructure, not a result); "
            "it must run again."), gates)
    elif current.state == "open":
        message = gettext_noop("%(gate)s is open; no verdict yet.")
    elif current.state == "signed_off":
        message = gettext_noop("%(gate)s waits for sign-off by both parties.")
    else:
        message = gettext_noop("%(gate)s has not opened yet.")
    return Outcome(IN_PROGRESS, current.number, message, gates)


def facts_of(pilot) -> tuple[str, list[GateFacts]]:
    """The pilot's state and its gates' facts, read from the database (a few queries)."""
    facts = []
    for gate in pilot.gates.order_by("number"):
        evaluation = gate.latest_evaluation
        verdict = evaluation.verdict if evaluation is not None else (gate.verdict or "")
        failed = tuple(c.get("key", "") for c in ((evaluation.result or {}).get("criteria") or [] if evaluation else [])
                       if c.get("verdict") == "fail")
        approved = frozenset(SignOff.objects.filter(gate=gate, evaluation=evaluation, decision=SignOff.Decision.APPROVE)
                             .values_list("party", flat=True)) if evaluation is not None else frozenset()
        facts.append(GateFacts(number=gate.number, name=gate.name, name_zh=gate.name_zh, state=gate.state,
                               verdict=verdict, failed=failed, approved_by=approved))
    return pilot.state, facts


def outcome_of(pilot) -> Outcome:
    """The pilot's outcome as the database stands now."""
    state, facts = facts_of(pilot)
    return decide(state, facts, pilot.halted_reason or "")
