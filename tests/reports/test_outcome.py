"""One outcome (gates/outcome.py): the pure decision on a G4-marginal, a halted and a passed pilot, and the same words
on the overview, the API and the procurement report."""
from __future__ import annotations

import html
import subprocess

import pytest
from django.test import Client
from django.urls import reverse

from gates import lifecycle
from gates.models import ApiToken
from gates.outcome import ACCEPTED, ERROR, IN_PROGRESS, NOT_PROVEN, PROVEN, GateFacts, decide, outcome_of
from reports import service
from tests.reports.test_service import _evaluate
from tests.reports.test_truth import _walk_to

NAMES = {1: ("Readiness", "就绪"), 2: ("Function", "功能"), 3: ("Performance", "性能"), 4: ("Production fit", "生产适配")}
BOTH = frozenset({"vendor", "customer"})


def _gates(**overrides) -> list[GateFacts]:
    gates = []
    for number, (name, name_zh) in NAMES.items():
        facts = dict(number=number, name=name, name_zh=name_zh, state="signed_off", verdict="pass", approved_by=BOTH)
        facts.update(overrides.get(f"g{number}", {}))
        gates.append(GateFacts(**facts))
    return gates


def test_every_gate_passed_and_signed_off_is_proven():
    outcome = decide("completed", _gates())
    assert outcome.code == PROVEN and outcome.final
    assert outcome.sentence_in("en") == "Proven: every gate passed and was signed off by both parties."
    assert outcome.decision_in("en").startswith("Decision: proven — every gate passed")
    assert "证实" in outcome.sentence_in("zh-hans")


def test_a_g4_approved_marginal_in_joint_review_is_never_every_gate_passed():
    outcome = decide("completed", _gates(g4={"verdict": "marginal"}))
    assert outcome.code == ACCEPTED and outcome.gate == 4 and outcome.review == (4,)
    english = outcome.sentence_in("en")
    assert "every gate passed" not in english and "G4 Production fit" in english and "joint review" in english
    assert english.startswith("Accepted in joint review — not proven:")
    chinese = outcome.sentence_in("zh-hans")
    assert "G4 生产适配" in chinese and "联合评审" in chinese
    assert outcome.as_dict()["word"]["en"] == "Accepted in joint review — not proven"


def test_a_halted_pilot_names_the_gate_and_the_criteria_that_missed():
    gates = _gates(g3={"state": "failed", "verdict": "fail", "failed": ("g3-ttft-vs-recompute",), "approved_by": frozenset()},
                   g4={"state": "pending", "verdict": "", "approved_by": frozenset()})
    outcome = decide("halted", gates, "G3 failed: g3-ttft-vs-recompute")
    assert outcome.code == NOT_PROVEN and outcome.gate == 3
    assert outcome.sentence_in("en") == ("Not proven: the pilot stopped at G3 Performance, which failed (missed its "
                                         "bar: g3-ttft-vs-recompute).")
    assert "G3 性能" in outcome.sentence_in("zh-hans") and "g3-ttft-vs-recompute" in outcome.sentence_in("zh-hans")


def test_gates_still_running_are_in_progress_and_an_invalid_run_is_no_verdict():
    pending = {"state": "pending", "verdict": "", "approved_by": frozenset()}
    review = decide("active", _gates(g3={"state": "review", "verdict": "marginal", "approved_by": frozenset()},
                                     g4=pending))
    assert review.code == IN_PROGRESS and review.gate == 3 and "joint review" in review.sentence_in("en")
    waiting = decide("active", _gates(g4={"state": "awaiting_signoff", "approved_by": frozenset({"vendor"})}))
    assert waiting.code == IN_PROGRESS and "waits for sign-off" in waiting.sentence_in("en")
    invalid = decide("active", _gates(g2={"state": "open", "verdict": "invalid", "approved_by": frozenset()},
                                      g3=pending, g4=pending))
    assert invalid.code == ERROR and invalid.gate == 2 and "invalid" in invalid.sentence_in("en")
    assert decide("draft", _gates(g1=pending, g2=pending, g3=pending, g4=pending)).code == IN_PROGRESS


def _text(report) -> str:
    done = subprocess.run(["pdftotext", "-layout", str(service.report_path(report)), "-"], capture_output=True,
                          text=True, check=True)
    return " ".join(done.stdout.split())


@pytest.mark.django_db
def test_a_g4_marginal_pilot_reads_the_same_on_the_overview_the_api_and_the_procurement_report(walked, client):
    pilot = walked.pilot
    _walk_to(pilot, 4)
    g4 = _evaluate(pilot, 4)
    g4.verdict = "marginal"
    g4.result = dict(g4.result, verdict="marginal")
    g4.save()
    lifecycle.record_verdict(pilot.gate(4), g4, who="test")
    for person in (walked.alice, walked.bob):
        lifecycle.sign_off_gate(pilot.gate(4), person, decision="approve", comment="accepted in joint review")
    pilot.refresh_from_db()
    assert pilot.state == "completed"
    outcome = outcome_of(pilot)
    assert outcome.code == ACCEPTED
    sentence = outcome.sentence_in("en")

    client.force_login(walked.alice)
    page = html.unescape(client.get(reverse("pilot", args=[pilot.code])).content.decode())
    assert sentence in page and "every gate passed" not in page

    _, token = ApiToken.issue(walked.alice, name="outcome test")
    data = Client().get(f"/api/v1/pilots/{pilot.code}", HTTP_AUTHORIZATION=f"Bearer {token}").json()
    assert data["outcome"]["code"] == ACCEPTED and data["outcome"]["sentence"]["en"] == sentence

    text = _text(service.create_procurement_report(pilot))
    assert "Decision: accepted in joint review — not proven" in text, text[:1500]
    assert "every gate passed" not in text
    assert "is not established." in text and "was not tested. is not established" not in text


@pytest.fixture
def walked(signed_pilot):
    signed_pilot.pilot.signed_people = (signed_pilot.alice, signed_pilot.bob)
    return signed_pilot
